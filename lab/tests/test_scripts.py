"""The lab's scripts run and measure what they say (opt-in: `pytest lab/tests`, never the default set)."""
import ast
import importlib
import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]   # lab/
FILES = sorted(ROOT.glob("scripts/*.py"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_imports_of_specdeploy_resolve(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "specdeploy":
            module = importlib.import_module(node.module)  # the package's names the lab reads
            for alias in node.names:
                assert hasattr(module, alias.name) or importlib.util.find_spec(f"{node.module}.{alias.name}"), \
                    f"{path.name}: {node.module} has no {alias.name}"


def test_copy_length_ab_runs_and_checks_identity(tiny_bundle):
    """The A/B prints a line per category and overall (and exits non-zero if greedy output differs)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "copy_length_ab.py"), str(tiny_bundle),
                          "--prompts-per-category", "1", "--repeats", "1", "--max-tokens", "8"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if not line.startswith("round ms by verify rows")]
    assert len(lines) == 8 and lines[-1].startswith("overall") and "priced" in lines[0] and "pooled" in lines[0]


def test_memory_breakdown_reports_every_loading_step(tiny_bundle):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "memory_breakdown.py"), str(tiny_bundle)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    steps = [line.split("VmRSS")[0].strip() for line in out.stdout.splitlines()]
    assert steps[:3] == ["start", "imports", "tokenizer"] and steps.count("+ KV buffers") == 3
    assert steps[-1].startswith("generated") and all("VmHWM" in line for line in out.stdout.splitlines())


def test_quality_compare_measures_each_bundle_over_each_text_length(tiny_bundle, tmp_path):
    """The reference against itself agrees fully; a bad bundle path is one line and a non-zero exit."""
    import subprocess
    import sys

    script = str(ROOT / "scripts" / "quality_compare.py")
    out = subprocess.run([sys.executable, script, str(tiny_bundle), str(tiny_bundle), "--passages", "1", "2"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    line, = out.stdout.splitlines()
    assert "1 passages: top-1 100.0%" in line and "2 passages: top-1 100.0%" in line
    bad = subprocess.run([sys.executable, script, str(tiny_bundle), str(tmp_path / "none")],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


def test_outlier_channels_lists_the_inputs_quantize_would_split(tiny_bundle):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "outlier_channels.py"), str(tiny_bundle), "--top", "3"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    head, *rows = out.stdout.splitlines()
    assert head.endswith("channels") and " matmul inputs, " in head and len(rows) == 3
    ratios = [float(row.split("median channel")[1].split("x")[0]) for row in rows]
    assert ratios == sorted(ratios, reverse=True) and ratios[-1] >= 1.0


def test_arena_ab_times_and_measures_every_side(tiny_bundle):
    import subprocess
    import sys

    from specdeploy.bundle import manifest as manifest_io

    context = manifest_io.read(tiny_bundle).max_context
    script = [sys.executable, str(ROOT / "scripts" / "arena_ab.py"), str(tiny_bundle), "--repeats", "1",
              "--max-tokens", "8"]
    out = subprocess.run(script + ["--long-prompt", str(context - 8)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["plain", "speculative", "peak", f"{context - 8}-token", "resident"]
    assert all("shared arena (default)" in line and "arena per session" in line and "no arena (malloc)" in line
               for line in lines)
    assert all("(1.000x)" in line for line in lines[:2]) and all(line.endswith(" MB") for line in lines[2:])
    out = subprocess.run(script + ["--long-prompt", str(context)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and out.stderr.startswith("error: --long-prompt") and "lower it" in out.stderr


def test_prefill_ab_measures_every_chunk_size_and_one_pass(tiny_bundle):
    import subprocess
    import sys

    script = [sys.executable, str(ROOT / "scripts" / "prefill_ab.py"), str(tiny_bundle), "--repeats", "1",
              "--prompt-tokens", "100"]
    out = subprocess.run(script + ["--chunks", "16,64"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split(" prefill")[0].strip() for line in lines] == ["chunk 16", "chunk 64", "one pass"]
    assert lines[2].split("(")[1].startswith("1.000x one pass") and all(line.endswith(" MB") for line in lines)
    for bad, complaint in (("--chunks", "16,none"), ("--prompt-tokens", "128")):
        out = subprocess.run(script + [bad, complaint], capture_output=True, text=True, timeout=300)
        assert out.returncode == 1 and out.stderr.startswith(f"error: {bad}"), out.stderr


def test_huge_pages_ab_times_both_modes_on_both_sides(tiny_bundle):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "huge_pages_ab.py"), str(tiny_bundle), "--repeats",
                          "1", "--max-tokens", "8"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["plain", "speculative", "peak"]
    assert all("huge pages:" in line and "4 KB pages:" in line and line.endswith("x)") for line in lines[:2])
    assert lines[2].endswith("MB")
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "huge_pages_ab.py"), str(tiny_bundle), "--load-order",
                          "3", "--small-pages", "--repeats", "1", "--max-tokens", "4"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    relative = out.stdout.strip().rsplit(": ", 1)[1].split(" / ")
    assert len(relative) == 3 and relative[0] == "1.000"


def test_round_overhead_times_the_drafters_choices_while_decoding(tiny_bundle):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "round_overhead.py"), str(tiny_bundle),
                          "--prompts", "2", "--max-tokens", "8", "--category", "summarisation"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    labels = {line[:24].strip() for line in out.stdout.splitlines()}
    assert {"lookup search", "draft() -> plain step", "round (all kinds)"} <= labels
    assert "100.00% of a round" in out.stdout


def test_pass_costs_prints_each_runs_row_prices_both_ways_and_their_spread(tiny_bundle):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "pass_costs.py"), str(tiny_bundle),
                          "--runs", "2", "--max-rows", "3"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    runs = [line.split() for line in out.stdout.splitlines() if line.startswith("run ")]
    assert len(runs) == 4 and all(len(run[-2:]) == 2 and float(run[-1]) > 0 for run in runs)
    for label in ("mean", "sd", "min", "max"):
        assert sum(line.split()[0] == label for line in out.stdout.splitlines()) == 2


def test_offset_cost_prices_the_term_on_probe_copies_that_keep_its_ops_or_drop_it(tiny_bundle, tmp_path):
    """The probes are what they say: folded is what `quantize` makes by default (the same arrays);
    thin tables keep every op with one-column tables; no term leaves the graphs with no offset op at
    all; then all four decode and the split is printed."""
    import subprocess
    import sys

    import onnx

    from specdeploy.bundle import manifest as manifest_io
    from specdeploy.quantization.compute import ComputeOptions
    from specdeploy.quantization.quantize import QuantizeOptions, quantize

    spec = importlib.util.spec_from_file_location("offset_cost", ROOT / "scripts" / "offset_cost.py")
    offset_cost = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(offset_cost)
    bundle = quantize(tiny_bundle, tmp_path / "minmax", QuantizeOptions("int4", method="minmax", compute=ComputeOptions(exact_offsets=True, int4_kernel="matmulnbits")),
                      echo=lambda line: None)  # the term is MatMulNBits' form
    verify = manifest_io.read(bundle).graph("verify").file

    def graph(path):
        return onnx.load(str(path / verify))

    ops = lambda model: sorted(n.op_type for n in model.graph.node)  # noqa: E731
    tables = lambda model: [t.dims for t in model.graph.initializer if t.name.endswith(".offsets")]  # noqa: E731
    assert offset_cost.probe_copy(bundle, tmp_path / "thin", offset_cost.thin_tables) > 0
    assert ops(graph(tmp_path / "thin")) == ops(graph(bundle))
    assert {tuple(d)[1] for d in tables(graph(tmp_path / "thin"))} == {1} != {tuple(d)[1] for d in tables(graph(bundle))}
    assert offset_cost.probe_copy(bundle, tmp_path / "none", offset_cost.drop_terms) > 0
    gone = graph(tmp_path / "none")
    assert not offset_cost._offset_matmuls(gone) and "ReduceSum" not in ops(gone)
    assert ops(gone).count("MatMulNBits") == ops(graph(bundle)).count("MatMulNBits")
    assert offset_cost.probe_copy(bundle, tmp_path / "folded", offset_cost.fold_terms) > 0
    nbits = ComputeOptions(int4_kernel="matmulnbits")
    default = quantize(tiny_bundle, tmp_path / "default", QuantizeOptions("int4", method="minmax", report=False, compute=nbits),
                       echo=lambda line: None)
    mine, made = _folded_arrays(graph(tmp_path / "folded")), _folded_arrays(graph(default))
    assert len(mine) == len(made) == len(offset_cost._offset_matmuls(graph(bundle))) and not tables(graph(default))
    for a, b in zip(mine, made):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)

    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "offset_cost.py"), str(bundle), "--repeats", "1",
                          "--max-tokens", "8"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    *rows, split, saved = out.stdout.splitlines()
    assert [row[:12].strip() for row in rows] == ["bundle", "folded", "thin tables", "no term"]
    assert "(1.000x the bundle)" in rows[0] and split.startswith("offset term: ") and "tables' bytes" in split
    assert saved.startswith("folded: ") and "of the term's time saved" in saved
    for other in (tiny_bundle, default):
        plain = subprocess.run([sys.executable, str(ROOT / "scripts" / "offset_cost.py"), str(other)],
                               capture_output=True, text=True, timeout=300)
        assert plain.returncode == 1 and "has no exact offset term" in plain.stderr and "Traceback" not in plain.stderr


def _folded_arrays(model) -> list:
    """The initializers of each folded MatMulNBits (values, scales, zero points), in graph order."""
    from onnx import numpy_helper

    arrays = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return [[arrays[name] for name in n.input[1:]] for n in model.graph.node
            if n.op_type == "MatMulNBits" and len(n.input) == 4]


def test_step_profile_counts_each_op_types_kernels_a_step(tiny_bundle):
    """On the tiny fp32 bundle: a line a step's op type from ONNX Runtime's own profiles, the
    shares of all kernel time adding up, the float matmuls among them."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "step_profile.py"), str(tiny_bundle),
                          "--max-tokens", "4", "--top", "50"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    head, *rows = out.stdout.splitlines()
    assert head.startswith("4 plain steps (and the prefill)") and "kernels a step" in head
    shares = {row.split()[0]: float(row.split()[3].rstrip("%")) for row in rows}
    assert "MatMul" in shares and abs(sum(shares.values()) - 100) < 1


def test_pass_profile_sets_each_op_types_time_over_many_rows_against_one(tiny_bundle):
    """On the tiny fp32 bundle: the two passes' totals, then a line per op type whose columns add
    up to them (a pass over 4 rows costs at least the one-row pass's kernels)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "pass_profile.py"), str(tiny_bundle),
                          "--rows", "4", "--repeats", "3", "--top", "100"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    total, _, *rows = out.stdout.splitlines()
    one, many = (float(x) for x in re.findall(r"one row (\d+), 4 rows (\d+)", total)[0])
    cells = [row.split() for row in rows]
    assert "MatMul" in {c[0] for c in cells} and many >= one > 0
    assert abs(sum(float(c[1]) for c in cells) - one) <= len(cells) and abs(sum(float(c[2]) for c in cells) - many) <= len(cells)


@pytest.mark.parametrize("script, bundles", [("arena_ab", 1), ("huge_pages_ab", 1), ("prefill_ab", 1), ("copy_length_ab", 1), ("outlier_channels", 1),
                                             ("quality_compare", 2), ("round_overhead", 1),
                                             ("offset_cost", 1), ("step_profile", 1), ("pass_profile", 1), ("pass_costs", 1), ("embedding_pages", 1),
                                             ("head_share", 1), ("packed_size", 1), ("lookup_ngram_ab", 1),
                                             ("requant_error", 1), ("static_ngram_bound", 1)])
def test_a_script_given_no_bundle_says_so_in_one_line(script, bundles, tmp_path):
    import subprocess
    import sys

    missing = [str(tmp_path / "no-such.plan")] * bundles
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / f"{script}.py"), *missing],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert out.stderr.startswith("error: ") and len(out.stderr.strip().splitlines()) == 1, out.stderr


def _script(name: str):
    """A script of lab/scripts/ imported as a module, for its functions."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_requant_error_tells_weights_already_on_a_4_bit_grid_from_the_rest():
    """A weight as an export of a Q4_1 file holds it (min + d * q, d and min in fp16, every 32 using
    levels 0 and 15) is on the grid; float weights are not, and GPTQ's output error on them is below
    round-to-nearest's."""
    script = _script("requant_error")
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 24)).astype(np.float32)                          # [K, N]
    assert not script.on_grid(w)
    q = rng.integers(0, 16, (2, 32, 24)).astype(np.float32)                       # [K/32, 32, N]
    q[:, 0], q[:, 1] = 0, 15
    d = rng.uniform(0.01, 0.1, (2, 1, 24)).astype(np.float16).astype(np.float32)
    low = rng.uniform(-0.8, -0.2, (2, 1, 24)).astype(np.float16).astype(np.float32)
    assert script.on_grid((low + d * q).reshape(64, 24))
    x = rng.standard_normal((512, 64)).astype(np.float32) * np.linspace(0.1, 3, 64, dtype=np.float32)
    found, alpha = script.errors(w, x.T @ x, [0.2, 0.5])
    assert found["gptq"] < found["minmax"] < found["rtn"] and alpha in (0.2, 0.5)
    assert len(found) == 6 and all(0 < e < 0.1 for e in found.values())
    lines = script.summary([found, {**found, "rtn": found["gptq"] / 2}])
    assert lines[0].split()[:2] == ["rtn", f"{np.sqrt(found['rtn'] / found['gptq'] / 2):.3f}×"]
    assert lines[0].endswith("lowest on 1 of 2") and lines[3].endswith("lowest on 1 of 2")  # gptq on the first


def test_requant_error_runs_on_a_bundle(tiny_bundle):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "requant_error.py"), str(tiny_bundle),
                          "--alphas", "0.3"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    first, *priced = out.stdout.splitlines()
    on, total = (int(first.split()[i]) for i in (0, 2))
    priced, summed = priced[:-6], priced[-6:]
    assert on == 0 and total == len(priced) > 0  # random float weights: every one priced
    assert all("α 0.3:" in line and "gptq+awq" in line for line in priced)
    assert [line.split()[0] for line in summed] == ["rtn", "mse", "minmax", "gptq", "minmax+awq", "gptq+awq"]
    assert summed[3].split()[1] == "1.000×"


def test_copy_replay_prices_the_rounds_decoding_would_run():
    """A passage said twice: the second time every copy holds; text that never repeats never copies."""
    replay = _script("copy_replay")
    passage = list(range(10, 30))
    prompt, output = [1, 2, *passage], [3, *passage]
    flat = lambda rows: 1.0  # rows cost nothing extra: the speedup is the tokens per round
    emitted, steps = replay.replay_output(replay.CopyAll(), prompt, output, flat, (1, 4), 4)
    # a plain step (nothing before "3"), then rounds of four copies and a verified token, the last cut short
    assert (emitted, steps) == (len(output) - 1, 6.0)
    fresh = list(range(100, 120))
    assert replay.replay_output(replay.CopyAll(), [1, 2], fresh, flat, (1, 4), 4) == (len(fresh) - 1, len(fresh) - 1)
    dear = lambda rows: 1.0 + 0.5 * (rows - 1)
    priced = replay.replay(replay.FixedRule(), [("a", prompt, output), ("b", [1, 2], fresh)], dear, (1, 4), 4, 1)
    assert priced["b"] == 1.0 and priced["a"] > 1.0 and priced["a"] > priced["overall"] > 1.0


def test_copy_replay_counts_first_copies_by_evidence_class():
    """[3] went on with 9, then 4: the next [3] is contested (its copy, 4, is wrong: 7 follows);
    7 has no match; [5] and then [5, 6] went on one way once: uncontested (both right)."""
    replay = _script("copy_replay")
    counts = replay.first_copy_acceptance([("a", [3, 9, 3, 4, 5, 6, 8], [3, 7, 5, 6, 8])], (1, 4), 4)
    assert counts == {(1, True): [1, 0], (1, False): [1, 1], (2, False): [1, 1]}


def test_copy_replay_runs_on_a_bundle(tiny_bundle):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "copy_replay.py"), str(tiny_bundle),
                          "--prompts-per-category", "1", "--max-tokens", "8", "--repeats", "1", "--row-costs", "0.2"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert sum(line.startswith("rounds priced at") for line in lines) == 2
    assert lines[1].split() == ["category", "default", "pooled", "copy", "all", "fixed", "rule", "bound"]
    assert sum(line.startswith("overall") for line in lines) == 2
    assert lines[-5].startswith("first copies accepted") and lines[-1].startswith("  4:")


def test_static_ngram_table_offers_the_most_frequent_follower_backing_off():
    """[1, 2, 3] went on with 4 twice and 5 once: the table offers 4; an n-gram it never saw backs
    off to the shorter ones it did."""
    script = _script("static_ngram_bound")
    table = script.build_table([[1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3, 4]])
    assert table[(1, 2, 3)] == (4, 2 / 3, 3) and table[(3,)][0] == 4 and (9,) not in table
    assert script.chain(table, [9, 1, 2], 4, 3) == [3, 4, 1]  # (9, 1, 2) unseen: (1, 2) -> 3, then (1, 2, 3) -> 4
    assert script.chain(table, [9], 4, 3) == []
    assert script.table_copy(table, [9, 1, 2], [3, 4, 1, 7], 3) == 3
    assert script.table_copy(table, [9, 1, 2], [3, 5], 3) == 1
    assert script.evidence(table, [9, 1, 2, 3]) == ((3, 0.5, False), 4)  # (1, 2, 3): share 2/3, followed 3 times
    assert script.evidence(table, [9]) is None


def test_static_ngram_bound_counts_rounds_the_table_alone_wins():
    """The output repeats nothing of its short prompt: the context copies only its own second half,
    the table (built from the same text) the first half too, in fewer rounds."""
    from specdeploy.bench.bound import clairvoyant_rounds

    script = _script("static_ngram_bound")
    output = [1, 2, 3, 4, 1, 2, 3, 4, 9]
    context = clairvoyant_rounds([7, 8], output, (1, 4), 4)
    assert context == [0, 0, 0, 0, 3]
    assert script.rounds_with_table([7, 8], output, {}, (1, 4), 4) == (context, 0)  # an empty table adds nothing
    table = script.build_table([output])
    rounds, won = script.rounds_with_table([7, 8], output, table, (1, 4), 4)
    assert rounds == [4, 2] and won == 1
    assert sum(rounds) + len(rounds) == sum(context) + len(context) == len(output) - 1


def test_static_ngram_bound_drafts_one_table_token_where_its_class_pays():
    """Where no context copy holds, a paying class drafts the table's token (accepted or not, it costs
    a row); a class that does not pay leaves a plain step; the priced speedup counts drafted rows."""
    script = _script("static_ngram_bound")
    table = script.build_table([[1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3, 4]])
    prompt, output = [9], [1, 2, 3, 4, 6]
    proposals = script.first_proposals(table, [(prompt, output)], (1, 4))
    assert proposals == {(1, 0.9, False): [1, 1], (2, 0.9, False): [1, 1], (3, 0.5, False): [1, 1],
                         (4, 0.9, False): [1, 0]}
    paying = {(2, 0.9, False), (4, 0.9, False)}
    rounds = script.rounds_with_classes(prompt, output, table, paying, (1, 4), 4)
    # (1,) -> 2 does not pay: a plain step; then (1, 2) -> 3 drafted and accepted; the last round has no room
    assert rounds == [(0, 0), (1, 1), (0, 0)]
    from specdeploy.runtime.costs import CostModel

    costs = CostModel(1, 1.0, {1: 1.0, 2: 1.5}, {1: 0.0, 2: 0.0}, 0.0)
    assert script.speedup([(1, 1), (0, 0)], costs) == 3 / 2.5
    assert script.speedup([(0, 1)], costs) == 1 / 1.5


def test_static_ngram_bound_runs_on_a_bundle(tiny_bundle):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "static_ngram_bound.py"), str(tiny_bundle),
                          "--corpus-prompts", "2", "--corpus-tokens", "8", "--prompts-per-category", "1",
                          "--max-tokens", "8"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    first, price, header, *rows = out.stdout.splitlines()
    assert first.startswith("table: ") and "from 2 answers" in first
    assert price.startswith("a second row costs ") and "evidence classes pay" in price
    assert rows[-1].startswith("overall") and len(rows) == 8
    context, table, _paying = (float(rows[-1].split()[i].rstrip("×")) for i in (1, 2, 3))
    assert table >= context > 0  # the table only adds candidates to the clairvoyant copy


def test_bundles_ab_measures_each_bundle_against_the_first(tiny_bundle, tmp_path):
    import subprocess
    import sys

    script = str(ROOT / "scripts" / "bundles_ab.py")
    out = subprocess.run([sys.executable, script, str(tiny_bundle), str(tiny_bundle), "--repeats", "1",
                          "--max-tokens", "4"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 6 and lines[0].startswith("plain") and lines[0].endswith("(1.000x)")
    assert sum(line.startswith("peak memory") for line in lines) == 2
    bad = subprocess.run([sys.executable, script, str(tiny_bundle), str(tmp_path / "none")],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


def test_gptq_parts_times_each_part_against_its_former_form():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "gptq_parts.py"), "--k", "1088", "--n", "48",
                          "--rows", "3000", "--repeats", "1"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["gram", "factor", "inverse", "walk"] and all(line.endswith("x)") for line in lines)


def test_calibration_rows_counts_each_bundles_windows(tiny_bundle):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "calibration_rows.py"), str(tiny_bundle)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    first, line = out.stdout.splitlines()
    assert first.startswith("built-in calibration text: 180 replies")
    rows, windows = int(line.split(": ")[1].split()[0].replace(",", "")), int(line.split("(")[1].split()[0])
    assert rows == 32 * windows > 0


def test_q4_0_kernel_checks_its_rows_and_times_both_sides():
    import shutil
    import subprocess
    import sys

    if shutil.which("gcc") is None:
        pytest.skip("builds its kernel with gcc")
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "q4_0_kernel.py"), "--k", "64", "--n", "96",
                          "--pairs", "1", "--tokens", "2", "--repeats", "1"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    first, *_ = lines = out.stdout.splitlines()
    assert first.startswith("rows bitwise independent")
    errors = [float(part.split()[-1]) for part in first.split(": ")[1].split(", ")]
    assert len(errors) in (2, 3) and max(errors) < 0.05  # each near the float product of the same weights
    ratios = [line for line in lines if line.endswith("x") and " / MatMulNBits speed: " in line]
    assert [line.split()[0] for line in ratios] == ["ours", "interleaved"][: len(errors) - 1]


def _run(script: str, *args, python: str | None = None, env: dict | None = None, timeout: int = 120):
    """lab/scripts/SCRIPT.py run with `args` in a process of its own (the interpreter: this one by default)."""
    import os
    import subprocess
    import sys

    return subprocess.run([python or sys.executable, str(ROOT / "scripts" / f"{script}.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def tiny_head(tmp_path_factory) -> Path:
    """A random EAGLE-3 head for the tiny Llama (features from layers 1, 2, 3), as tests/conftest.py makes one."""
    from specdeploy.feature_head import eagle3
    from specdeploy.feature_head.config import HeadConfig

    config = HeadConfig(hidden_size=64, target_hidden_size=64, intermediate_size=48, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, vocab_size=96, draft_vocab_size=40,
                        feature_layers=(1, 2, 3), target_num_layers=4, rms_norm_eps=1e-6)
    rng = np.random.default_rng(3)
    tensors = {k: (0.2 * rng.standard_normal(s)).astype(np.float32) for k, s in eagle3.shapes(config).items()
               if k not in ("d2t", "t2d")}
    tensors["d2t"], tensors["t2d"] = eagle3.vocab_maps(np.sort(rng.choice(96, 40, replace=False)), 96)
    head = tmp_path_factory.mktemp("head") / "head"
    eagle3.write(head, config, tensors)
    return head


def _conversations(path: Path, count: int, seed: int, user: int = 12, reply: int = 30) -> list[str]:
    """`count` conversations of random vocabulary words (the tiny tokenizer's 'w6' .. 'w95') as JSONL;
    their user turns."""
    import json

    rng = np.random.default_rng(seed)
    words = lambda n: " ".join(f"w{i}" for i in rng.integers(6, 96, n))  # noqa: E731
    users = [words(user) for _ in range(count)]
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": u},
                                                     {"role": "assistant", "content": words(reply)}]}) + "\n"
                            for u in users))
    return users


def _acceptance(line: str) -> tuple[list[float], float, int]:
    """(acceptance per draft position, tau, rounds) of an `Acceptance.line()`; tau must be what the
    rates make of it (1 + the chance each draft prefix is accepted)."""
    rates, tau, rounds = re.search(r"draft position ([\d. ]+); tau ([\d.]+) at gamma 4 over (\d+) rounds", line).groups()
    rates = [float(r) for r in rates.split()]
    assert len(rates) == 4 and all(0 <= r <= 1 for r in rates)
    assert abs(float(tau) - 1 - np.cumprod(rates).sum()) <= 0.03, line  # each printed to 2 decimals
    return rates, float(tau), int(rounds)


def test_embedding_pages_reads_the_weights_files_residency_after_each_kind_of_pass(tiny_bundle):
    """Each reading is of the bundle's weights file (never more KB than it has), and the growth a
    distinct token is what the two draft readings differ by."""
    out = _run("embedding_pages", tiny_bundle, "--tokens", "3")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["after load", "3 draft passes of one token",
                                                      "3 draft passes of distinct tokens", "3 verify passes",
                                                      "3 LM-head passes"]
    assert lines[0].endswith("KB of weights.bin resident")
    kb = [int(line.split(": ")[1].split()[0].replace(",", "")) for line in lines]
    assert 0 <= min(kb) and max(kb) <= (tiny_bundle / "weights.bin").stat().st_size / 1024
    per_token = int(lines[2].split("(")[1].split()[0].replace(",", ""))
    assert abs(per_token - (kb[2] - kb[1]) / 3) <= 1


def test_feature_head_curve_trains_a_head_per_budget_and_replays_the_same_replies(tiny_bundle, tmp_path):
    _conversations(tmp_path / "train.jsonl", 30, seed=1, user=20, reply=50)  # > 2,000 positions: both budgets filled
    _conversations(tmp_path / "held.jsonl", 4, seed=2)
    out = _run("feature_head_curve", tiny_bundle.parent / "llama-model", "--data", tmp_path / "train.jsonl",
               "--held", tmp_path / "held.jsonl", "--budgets", "1000,2000", "--epochs", "1", "--draft-vocab", "40",
               "--intermediate-size", "32", "--held-prompts", "2", "--ttt-steps", "1",
               env={"SPECDEPLOY_CACHE": str(tmp_path / "cache")}, timeout=300)  # its features cached here, not in ~
    assert out.returncode == 0, out.stderr
    assert int(re.search(r"features: ([\d,]+) positions", out.stdout)[1].replace(",", "")) >= 2000
    budgets = [line for line in out.stdout.splitlines() if " tokens, " in line]
    assert [line.split()[0] for line in budgets] == ["1,000", "2,000"] and all("50 steps" in b for b in budgets)
    rounds = {_acceptance(line)[2] for line in budgets}
    assert len(rounds) == 1 and rounds.pop() > 0  # every head is replayed over the same replies


def test_feature_head_gap_replays_one_head_over_three_kinds_of_text(tiny_bundle, tiny_head, tmp_path):
    _conversations(tmp_path / "train.jsonl", 4, seed=1)
    _conversations(tmp_path / "held.jsonl", 4, seed=2)
    out = _run("feature_head_gap", tiny_bundle.parent / "llama-model", tiny_head, "--train", tmp_path / "train.jsonl",
               "--held", tmp_path / "held.jsonl", "--conversations", "4", timeout=300)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if "acceptance per draft position" in line]
    assert [line.split(" (")[0].split(":")[0] for line in lines] == \
        ["training text", "held-out text", "the model's greedy replies to held-out prompts"]
    positions = [int(re.search(r"\(([\d,]+) positions\)", line)[1].replace(",", "")) for line in lines[:2]]
    assert all(p >= 4 * (12 + 30 + 4) for p in positions)  # all 4 read: a token at least a word, template's too
    assert _acceptance(lines[2])[2] > 0 and all(_acceptance(line) for line in lines)


@pytest.fixture(scope="module")
def head_bundle(tiny_bundle, tiny_head, tmp_path_factory) -> Path:
    """The tiny bundle's model exported again (as the fixture exports it) with the random feature head."""
    from specdeploy.export import ExportConfig, export

    return export(ExportConfig(source=tiny_bundle.parent / "llama-model", exit_layer=2, max_context=128,
                               feature_head=tiny_head, output=tmp_path_factory.mktemp("head") / "bundle"))


def test_head_share_counts_only_the_bytes_the_head_alone_reads(tiny_bundle, head_bundle):
    """No head, nothing of its own; with one, some of the file but not all of it (the embedding it
    shares with the draft graph is not its own)."""
    assert _run("head_share", tiny_bundle).stdout.startswith("feature head's own weights: 0.0 MB of ")
    out = _run("head_share", head_bundle)
    assert out.returncode == 0, out.stderr
    own, total, share = re.fullmatch(r"feature head's own weights: ([\d.]+) MB of ([\d.]+) MB \(([\d.]+)%\)\n",
                                     out.stdout).groups()
    assert 0 < float(own) < float(total) == round((head_bundle / "weights.bin").stat().st_size / 1e6, 1)
    assert abs(float(share) - 100 * float(own) / float(total)) <= 100 * 0.05 / float(total) + 0.05


def test_lookup_ngram_ab_prints_both_ranges_for_every_category(tiny_bundle):
    """Exit 0 is the greedy identity check passing; then a line per bench category, α a share and τ at
    least the verified token."""
    from specdeploy.prompts import bench_prompts

    out = _run("lookup_ngram_ab", tiny_bundle, "--a", "2", "3", "--prompts-per-category", "1", "--max-tokens", "8",
               "--repeats", "1")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split()[0] for line in lines] == list(bench_prompts())
    for line in lines:
        cells = re.findall(r"lookup (\d\.\.\d): α ([\d.]+) τ ([\d.]+) ([\d.]+)×", line)
        assert [c[0] for c in cells] == ["2..3", "1..4"], line
        assert all(0 <= float(a) <= 1 and float(t) >= 1 and float(x) > 0 for _, a, t, x in cells)


def test_packed_size_prices_each_graphs_session_against_its_matmulnbits_bytes(tiny_bundle, tmp_path):
    """On an int4 bundle of MatMulNBits (what the script measures): a line per graph of the manifest,
    the decoder graphs' MatMulNBits bytes among the weights file's; the fp32 bundle has none."""
    from specdeploy.bundle import manifest as manifest_io
    from specdeploy.quantization.compute import ComputeOptions
    from specdeploy.quantization.quantize import QuantizeOptions, quantize

    bundle = quantize(tiny_bundle, tmp_path / "int4", QuantizeOptions(
        "int4", method="minmax", report=False, compute=ComputeOptions(int4_kernel="matmulnbits")), echo=lambda line: None)
    out = _run("packed_size", bundle)
    assert out.returncode == 0, out.stderr
    graphs = manifest_io.read(bundle).graphs
    assert [line.split()[0] for line in out.stdout.splitlines()] == list(graphs)
    assert all(re.search(r"session anonymous \+ *-?[\d.]+ MB = -?[\d.]+x MatMulNBits'$", line)
               for line in out.stdout.splitlines())
    sizes = {name: _script("packed_size").initializer_mb(bundle / graph.file) for name, graph in graphs.items()}
    assert sizes["draft"]["MatMulNBits"] > 0 and sizes["verify"]["MatMulNBits"] > 0
    assert all(sum(mb.values()) <= (bundle / "weights.bin").stat().st_size / 2**20 for mb in sizes.values())
    fp32 = manifest_io.read(tiny_bundle).graph("draft").file
    assert "MatMulNBits" not in _script("packed_size").initializer_mb(tiny_bundle / fp32)


PEERS = ROOT.parent / ".venv-peers" / "bin" / "python"  # the interpreter with llama-cpp-python (scripts/setup_peers.sh)
_GGUF_LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
               "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
               "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


@pytest.fixture(scope="module")
def tiny_gguf(tiny_bundle, tmp_path_factory) -> Path:
    """The tiny bundle's model as a GGUF llama.cpp loads, for the scripts run against it. Its vocabulary
    is the words alone (the scripts hand llama.cpp token ids) and q / k keep Hugging Face's rotary
    layout: llama.cpp's outputs differ from ours, which timing does not mind."""
    import json
    import subprocess

    if not PEERS.is_file() or subprocess.run([str(PEERS), "-c", "import llama_cpp"], capture_output=True).returncode:
        pytest.skip(f"needs llama-cpp-python in {PEERS} (scripts/setup_peers.sh)")
    import gguf
    from safetensors.numpy import load_file

    model = tiny_bundle.parent / "llama-model"
    config = json.loads((model / "config.json").read_text())
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_dimension_count(config["hidden_size"] // config["num_attention_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_tokenizer_model("llama")
    writer.add_token_list([f"w{i}" for i in range(config["vocab_size"])])
    writer.add_token_scores([0.0] * config["vocab_size"])
    writer.add_token_types([1] * config["vocab_size"])  # normal tokens
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    for name, tensor in load_file(model / "model.safetensors").items():
        layer = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.weight", name)
        named = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
        gguf_name = f"blk.{layer[1]}.{_GGUF_LAYER[layer[2]]}.weight" if layer else named.get(name)
        if gguf_name:  # the tied LM head, where saved, is the embedding llama.cpp reuses
            writer.add_tensor(gguf_name, tensor.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_prefill_decode_split_times_each_categorys_prompt_on_both_runtimes(tiny_bundle, tiny_gguf, tmp_path):
    """A row per bench category, each prompt cut to leave room for the decoded tokens, every time
    positive and each ratio the two times' (to the printed precision)."""
    from specdeploy.prompts import BENCH_PROMPTS

    # decode is timed as (prefill + 32 tokens) - prefill: fewer tokens drown in the other run's noise
    out = _run("prefill_decode_split", tiny_bundle, tiny_gguf, "--max-tokens", "32", "--repeats", "1", python=PEERS)
    assert out.returncode == 0, out.stderr
    rows = [line.strip("|").split("|") for line in out.stdout.splitlines()[3:]]
    assert len(rows) == len(BENCH_PROMPTS) and all(len(row) == 7 for row in rows)
    for tokens, _, _, pre_ratio, ours_dec, their_dec, dec_ratio in rows:
        assert 0 < int(tokens) <= 128 - 33  # the tiny bundle's context less 1 + --max-tokens
        assert min(float(ours_dec), float(their_dec), float(pre_ratio.strip(" ×")), float(dec_ratio.strip(" ×"))) > 0
    bad = _run("prefill_decode_split", tmp_path / "none", tiny_gguf, python=PEERS)
    assert bad.returncode == 1 and bad.stderr.startswith("error: ") and bad.stderr.count("\n") == 1, bad.stderr


def test_first_token_times_each_bundle_and_llama_cpp(tiny_bundle, tiny_gguf, tmp_path):
    """A row per bundle and llama.cpp's, which is its own baseline (1.00×)."""
    out = _run("first_token", tiny_gguf, tiny_bundle, "--prompt-tokens", "50", "--repeats", "2", python=PEERS)
    assert out.returncode == 0, out.stderr
    first, header, _, *rows = out.stdout.splitlines()
    assert first == "50-token prompt, median of 2: seconds to the first token" and header.startswith("| runtime |")
    cells = [row.strip("|").split("|") for row in rows]
    assert [c[0].strip() for c in cells] == [tiny_bundle.name, "llama.cpp"] and cells[1][2].strip() == "1.00×"
    assert all(float(c[1]) >= 0 and float(c[2].strip(" ×")) > 0 for c in cells)
    bad = _run("first_token", tiny_gguf, tmp_path / "none", python=PEERS)
    assert bad.returncode == 1 and bad.stderr.startswith("error: ") and bad.stderr.count("\n") == 1, bad.stderr


def test_q4_0_op_rows_times_every_requested_row_count():
    from specdeploy import kernels

    if kernels.find_include() is None and not kernels.library_path().is_file():
        pytest.skip("needs specdeploy's operators: run `specdeploy build-kernels --fetch-headers`")
    out = _run("q4_0_op_rows", "--pairs", "1", "--rows", "1,3", "--repeats", "2", timeout=300)
    assert out.returncode == 0, out.stderr
    first, header, _, *rows = out.stdout.splitlines()
    assert first.startswith("2 weights of a 1.5B model's MLP; ") and "median of 2" in first
    assert header == "| rows | Q4_0MatMul | MatMulNBits | MatMulNBits / Q4_0MatMul |"
    cells = [[float(c.strip(" ×")) for c in row.strip("|").split("|")] for row in rows]
    assert [c[0] for c in cells] == [1, 3]
    assert all(ours > 0 and abs(ratio - theirs / ours) <= 0.05 * ratio + 0.01 for _, ours, theirs, ratio in cells)


def test_self_replies_writes_a_reply_to_each_chosen_first_user_turn(tiny_bundle, tmp_path):
    """Conversations that do not open with a user's words (plain text, a system turn, a blank turn) are
    passed over; --skip and --count pick from the rest; each reply holds at most --tokens words."""
    import json

    users = _conversations(tmp_path / "data.jsonl", 5, seed=4)
    passed = [{"text": "w7 w8"}, {"messages": [{"role": "system", "content": "w9"}, {"role": "user", "content": "w10"}]},
              {"messages": [{"role": "user", "content": "  "}]}]
    with (tmp_path / "data.jsonl").open("a") as data:
        data.write("".join(json.dumps(p) + "\n" for p in passed))
    lines = (tmp_path / "data.jsonl").read_text().splitlines()
    (tmp_path / "data.jsonl").write_text("\n".join(lines[:2] + lines[5:] + lines[2:5]) + "\n")  # the passed-over amid
    out = _run("self_replies", tiny_bundle.parent / "llama-model", tmp_path / "data.jsonl", "-o", tmp_path / "out.jsonl",
               "--count", "3", "--skip", "1", "--tokens", "5", "--batch", "2", timeout=300)
    assert out.returncode == 0, out.stderr
    assert [line.split(" prompts")[0] for line in out.stdout.splitlines()] == ["2/3", "3/3"]
    written = [json.loads(line)["messages"] for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert sorted(m[0]["content"] for m in written) == sorted(users[1:4])
    assert all([t["role"] for t in m] == ["user", "assistant"] and len(m[1]["content"].split()) <= 5 for m in written)


def test_policies_learn_as_the_default_does_and_change_only_their_choice():
    """Fed the same rounds, every policy's measurements are the default's; CopyAll offers all of it,
    FixedRule goes by the agreement alone, and Pooled prices a contested match as the default prices
    its uncontested length (how it learns contested rounds: lab/tests/test_policies.py)."""
    from policies import CopyAll, FixedRule, Pooled

    from specdeploy.runtime.copy_length import CONTESTED, CopyLength

    rng = np.random.default_rng(0)
    rounds = [(1 + d, m, d, int(rng.integers(0, d + 1)), 0.01 + 0.002 * d)
              for m, d in zip(rng.integers(1, CONTESTED, 200), rng.integers(1, 5, 200))]  # uncontested only
    default, policies = CopyLength(), (CopyAll(), FixedRule(), Pooled())
    for policy in (default, *policies):
        for observed in [(1, 0, 0, 0, 0.01), *rounds]:
            policy.observe(*observed)
    for policy in policies:
        np.testing.assert_array_equal(policy.acceptance.tried, default.acceptance.tried)
        np.testing.assert_array_equal(policy.acceptance.accepted, default.acceptance.accepted)
    all_of, fixed, pooled = policies
    for match in range(1, CONTESTED):
        assert [all_of.choose(match + CONTESTED, a) for a in (1, 4)] == [1, 4]
        assert fixed.choose(match, 4) == fixed.choose(match + CONTESTED, 4) == (0 if match < 2 else 1 if match < 4 else 4)
        assert pooled.choose(match + CONTESTED, 4) == default.choose(match, 4)


def test_kernel_forms_times_both_forms_of_each_operator_at_every_row_count():
    """One line a form and operator, three row counts each, every time positive."""
    out = _run("kernel_forms", "--copies", "2", "--k", "256", "--n", "32", timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split()[:2] for line in lines] == [[form, f"{kind}_matmul"] for form in ("native", "avx2")
                                                    for kind in ("q4_k", "q5_k", "q6_k")]
    for line in lines:
        times = [float(t) for t in re.findall(r"rows ([0-9.]+) ms", line)]
        assert re.findall(r"(\d+) rows", line) == ["1", "5", "8"] and len(times) == 3 and min(times) > 0


def _quick(rounds: dict, rows_ms: float = 1.0) -> dict:
    """A quick bench's results.json holding what priced_at.py reads: one greedy category's modes,
    each {source: (rounds, draft tokens)}, and pass costs where a layer over any rows costs `rows_ms`."""
    modes = {mode: {"by_source": {source: {"rounds": r, "draft_tokens": d} for source, (r, d) in sources.items()}}
             for mode, sources in rounds.items()}
    table = {str(r): rows_ms for r in range(1, 9)}
    return {"bundle": {"model": "m", "num_layers": 2, "exit_layer": 1}, "results": {"0.0": {"chat": modes}},
            "lookup_bound": {"costs": {"layer_step_ms": rows_ms, "layer_rows_ms": table, "head_ms": table,
                                       "draft_head_ms": rows_ms}}}


def test_priced_at_prices_one_runs_rounds_at_anothers_pass_costs(tmp_path):
    """Rows free in the costs' run: a lookup mode ending 9 tokens in 6 passes instead of 9 is priced
    1.5x, the same overall; a missing file is one line."""
    import json

    drafts = tmp_path / "drafts.json"
    drafts.write_text(json.dumps(_quick({"plain": {"plain": (9, 0)}, "lookup": {"plain": (3, 0), "lookup": (3, 6)}})))
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps(_quick({})))
    out = _run("priced_at", str(drafts), str(costs), timeout=120)
    assert out.returncode == 0, out.stderr
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in out.stdout.splitlines()[3:]}
    assert rows == {"chat": "1.50×", "overall": "1.50×"}
    missing = _run("priced_at", str(tmp_path / "none.json"), str(costs), timeout=120)
    assert missing.returncode == 1 and missing.stderr.startswith("error: ") and len(missing.stderr.strip().splitlines()) == 1


def test_teacher_rate_times_both_teachers_over_the_same_texts(features_bundle, tmp_path):
    _conversations(tmp_path / "train.jsonl", 6, seed=1)
    out = _run("teacher_rate", features_bundle.parent / "llama-model", features_bundle, "--data",
               tmp_path / "train.jsonl", "--positions", "100", timeout=300)
    assert out.returncode == 0, out.stderr
    positions, texts = re.search(r"([\d,]+) positions, (\d+) texts", out.stdout).groups()
    assert int(positions.replace(",", "")) >= 100 and 1 <= int(texts) <= 6
    rates = re.search(r"pytorch \(fp32\): ([\d,]+) positions/s; bundle's graphs: ([\d,]+) positions/s \(([\d.]+)×\)",
                      out.stdout).groups()
    assert all(float(r.replace(",", "")) > 0 for r in rates)
    share = float(re.search(r"fp32 model's at ([\d.]+)% of positions", out.stdout)[1])
    assert share >= 99.0  # an fp32 bundle: the same model, to rounding
    missing = _run("teacher_rate", features_bundle.parent / "llama-model", tmp_path / "none", "--data",
                   tmp_path / "train.jsonl")
    assert missing.returncode != 0 and missing.stderr.startswith("error:") and "Traceback" not in missing.stderr


def test_feature_head_curve_teaches_with_a_bundle_when_given_one(features_bundle, tmp_path):
    _conversations(tmp_path / "train.jsonl", 12, seed=1, user=20, reply=50)
    _conversations(tmp_path / "held.jsonl", 4, seed=2)
    out = _run("feature_head_curve", features_bundle.parent / "llama-model", "--data", tmp_path / "train.jsonl",
               "--held", tmp_path / "held.jsonl", "--budgets", "1000", "--epochs", "1", "--draft-vocab", "40",
               "--intermediate-size", "32", "--held-prompts", "2", "--ttt-steps", "1", "--bundle", features_bundle,
               env={"SPECDEPLOY_CACHE": str(tmp_path / "cache")}, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "teacher: the bundle's graphs" in out.stdout and " tokens, " in out.stdout


def test_prefill_depth_times_passes_shallow_and_deep(tiny_bundle):
    out = _run("prefill_depth", tiny_bundle, "--depth", "20", "--repeats", "1")  # within its 128 rows
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split(" rows")[0] for line in lines] == ["95", "78", "8", "1"] and all("at 20" in line for line in lines)
