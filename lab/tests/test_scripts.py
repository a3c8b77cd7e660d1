"""The lab's scripts run and measure what they say (opt-in: `pytest lab/tests`, never the default set)."""
import ast
import importlib
import importlib.util
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
    bundle = quantize(tiny_bundle, tmp_path / "minmax", QuantizeOptions("int4", method="minmax", compute=ComputeOptions(exact_offsets=True)), echo=lambda line: None)
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
    default = quantize(tiny_bundle, tmp_path / "default", QuantizeOptions("int4", method="minmax", report=False), echo=lambda line: None)
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


@pytest.mark.parametrize("script, bundles", [("arena_ab", 1), ("huge_pages_ab", 1), ("prefill_ab", 1), ("copy_length_ab", 1), ("outlier_channels", 1),
                                             ("quality_compare", 2), ("round_overhead", 1),
                                             ("offset_cost", 1), ("step_profile", 1), ("pass_costs", 1),
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
