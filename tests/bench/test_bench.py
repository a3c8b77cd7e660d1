import json

import pytest
from click.testing import CliRunner

from specdeploy import prompts
from specdeploy.bench.runner import BenchConfig, CategoryResult, GreedyMismatch, bench, check_identical
from specdeploy.bench.sweep import expected_tokens_per_round
from specdeploy.runtime.timing import ModeResult
from specdeploy.cli import main


def test_builtin_prompt_set_has_seven_categories_of_eight():
    p = prompts.bench_prompts()
    assert set(p) == {"chat", "code", "summarisation", "rewriting", "reasoning", "qa", "translation"}
    assert all(len(v) >= 8 for v in p.values())


def test_quick_bench_writes_json_markdown_and_plots(tiny_bundle, tmp_path):
    pfile = tmp_path / "p.jsonl"
    pfile.write_text("\n".join(json.dumps({"category": c, "prompt": f"w{i} w{i + 1} w{i + 2}"})
                               for i, c in enumerate(["a", "a", "b"], 3)))
    config = BenchConfig.quick(bundle=tiny_bundle, prompts_file=pfile, output_dir=tmp_path / "out", sweep=True)
    results, files = bench(config)
    assert results["greedy_identical_to_plain"]
    assert set(results["results"]["0.0"]) == {"a", "b"}
    greedy = results["overall"]["0.0"]
    assert {"plain", "early_exit", "lookup", "hybrid"} <= set(greedy) and greedy["plain"]["speedup"] == 1.0
    assert results["sweep"]["grid"] and "predicted_speedup" in results["sweep"]["grid"][0]
    assert {f.name for f in files} >= {"results.json", "results.md", "speedup_by_category_t0.0.png", "sweep.png"}
    markdown = (tmp_path / "out" / "results.md").read_text()
    assert "| **overall** |" in markdown and "## lookup bound" in markdown
    bound = results["lookup_bound"]["categories"]
    assert "overall" in bound and set(bound) <= {"a", "b", "overall"}  # outputs of one token have no rounds
    assert bound["overall"]["speedup_bound"] >= 1.0
    priced = results["priced"]
    assert "overall" in priced and set(priced) <= {"a", "b", "overall"}  # categories with rounds to price
    assert all(set(p) == {"early_exit", "lookup", "hybrid"} and min(p.values()) > 0 for p in priced.values())
    assert "hybrid priced / measured" in markdown
    assert results["machine"]["packages"]["onnxruntime"]
    assert list(results["passes"]) == list(range(1, 9)) and results["passes"][1] == 1.0
    roof = results["roofline"]
    assert roof["weight_gb"] > 0 and roof["read_gb_s"] > 0 and 0 < roof["fraction"]
    assert "one-row steps" in markdown and "of the memory roofline" in markdown


def test_greedy_mismatch_fails_the_run():
    res = CategoryResult(0.0, "x", {"plain": ModeResult(outputs=[[1, 2, 3]]), "lookup": ModeResult(outputs=[[1, 2, 4]])})
    with pytest.raises(GreedyMismatch, match="lookup output differs"):
        check_identical(res)


def test_formula():
    assert expected_tokens_per_round(0.0, 4) == 1.0
    assert expected_tokens_per_round(1.0, 4) == 5.0
    assert abs(expected_tokens_per_round(0.5, 2) - 1.75) < 1e-12


def test_compare_without_model_says_why(tiny_bundle, tmp_path):
    result = CliRunner().invoke(main, ["bench", str(tiny_bundle), "--compare", "--no-plots", "-o", str(tmp_path)])
    assert result.exit_code != 0 and "needs --model" in result.output and "Traceback" not in result.output


def test_compare_runs_peers_side_by_side_with_greedy_agreement(tiny_bundle, tiny_model_dir, tmp_path):
    """Our plain and default rows, Hugging Face generate on the same ids, and a peer that cannot run."""
    args = ["bench", str(tiny_bundle), "--compare", "--model", str(tiny_model_dir), "--peers", "hf,llama.cpp",
            "--max-tokens", "8", "--repeats", "1", "--prompts-per-category", "1", "-o", str(tmp_path)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "peers.json").read_text())
    rows = {r["runtime"]: r for r in saved["rows"]}
    assert saved["reference"] == "specdeploy fp32 plain" and len(saved["categories"]) == 7
    default = rows["specdeploy fp32 default"]
    assert default["prompts_equal"] == default["prompts"] == 7  # speculative == plain, bitwise
    hf = rows["hf"]
    assert hf["tokens_per_second"] > 0 and hf["mean_leading_equal"] >= 1  # same model, same ids
    assert "gguf" in rows["llama.cpp"]["skipped"]
    assert (tmp_path / "peers.png").is_file() and "| hf |" in (tmp_path / "peers.md").read_text()


def test_lookup_ngram_override_reaches_the_runs_and_the_bound(tiny_bundle, tmp_path):
    args = ["bench", str(tiny_bundle), "--quick", "--greedy-only", "--no-plots", "-o", str(tmp_path),
            "--prompts", str(_one_prompt(tmp_path))]
    result = CliRunner().invoke(main, args + ["--lookup-ngram", "3", "5"])
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["bundle"]["lookup_ngram"] == [3, 5] and saved["lookup_bound"]["ngram"] == [3, 5]
    from specdeploy.bench.runner import modes_for

    modes = modes_for(0.0, "hybrid", 8, (3, 5))
    assert modes["lookup"].lookup_ngram == modes["hybrid"].lookup_ngram == (3, 5)
    result = CliRunner().invoke(main, args + ["--lookup-ngram", "5", "3"])
    assert result.exit_code == 1 and "lookup_ngram=(5, 3)" in result.output and "Traceback" not in result.output


def _one_prompt(tmp_path):
    f = tmp_path / "one.jsonl"
    f.write_text(json.dumps({"category": "c", "prompt": "w3 w4"}) + "\n")
    return f


def test_sweep_colours_use_meaningful_ranges():
    import numpy as np

    from specdeploy.bench.report import heat_scale

    assert heat_scale("acceptance_rate", np.array([[0.34, 0.36]])) == ("viridis", 0.0, 1.0)
    cmap, low, high = heat_scale("measured_speedup", np.array([[0.98, 1.02, np.nan]]))
    assert (low, high) == (0.75, 1.25) and cmap == "RdBu"  # centred on plain decoding
    assert heat_scale("measured_speedup", np.array([[0.5, 1.9]]))[1:] == pytest.approx((0.1, 1.9))


def test_compare_times_two_bundles_of_one_precision_apart(tiny_bundle, tmp_path, monkeypatch):
    """Rows of bundles sharing a precision carry the bundle's name and their own timings."""
    import shutil
    import time

    from specdeploy.bench import peers

    slow = tmp_path / "slow.plan"
    shutil.copytree(tiny_bundle, slow)
    config = peers.PeerConfig(bundles=(tiny_bundle, slow), model=tmp_path, peers=(), output_dir=tmp_path,
                              max_new_tokens=4, repeats=1, prompts_per_category=1)
    rows = peers._rows(config)
    names = [r.name for r in rows]
    assert len(set(names)) == 4 and f"specdeploy fp32 [{slow.name}] plain" in names
    runner = rows[2].runner
    generate = runner.generate
    monkeypatch.setattr(runner, "generate", lambda ids, n: (time.sleep(0.02), generate(ids, n))[1])
    monkeypatch.setattr(peers, "_rows", lambda config: rows)
    speeds = {r["runtime"]: r["tokens_per_second"] for r in peers.run(config, echo=lambda s: None)["rows"]}
    assert speeds[f"specdeploy fp32 [{slow.name}] plain"] < speeds[f"specdeploy fp32 [{tiny_bundle.name}] plain"] / 2


def test_compare_prompts_a_base_model_with_the_text_itself(tiny_bundle, tmp_path):
    """A bundle without a chat template (a base model: Gemma 3 270M's GGUF) is compared on the
    prompts' text, as `bench` does, instead of failing on the template."""
    import shutil

    from specdeploy.bench import peers
    from specdeploy.bundle import manifest as manifest_io
    from specdeploy.prompts import BENCH_PROMPTS
    from specdeploy.runtime.engine import Engine

    base = tmp_path / "base.plan"
    shutil.copytree(tiny_bundle, base)
    manifest_io.write(base, manifest_io.read(base).replace(chat_template=None))
    categories, ids = peers._prompt_ids(base, 1)
    with Engine(base) as engine:
        assert ids == [engine.encode_prompt(ps[0]) for ps in BENCH_PROMPTS.values()]
    assert len(categories) == len(BENCH_PROMPTS)


def test_overall_speedup_pairs_repeats_summed_over_categories():
    from specdeploy.bench.report import _overall

    def cat(name, plain, hybrid):
        return CategoryResult(0.0, name, {"plain": ModeResult(seconds=plain, outputs=[[1] * 10]),
                                          "hybrid": ModeResult(seconds=hybrid, outputs=[[1] * 10])})
    # repeat 2 ran slow for plain only in category a, repeat 3 slow for both: 1.25x in each pair but one
    rows = [cat("a", [1.0, 3.0, 2.0], [0.8, 0.8, 1.6]), cat("b", [1.0, 1.0, 2.0], [0.8, 0.8, 1.6])]
    overall = _overall(rows, 0.0)
    ratios = sorted([2.0 / 1.6, 4.0 / 1.6, 4.0 / 3.2])
    assert overall["hybrid"]["speedup"] == round(ratios[1], 3) == 1.25
    assert overall["hybrid"]["speedup_range"] == [1.25, 2.5]
    assert overall["plain"]["speedup"] == 1.0


def test_report_shows_each_speedups_spread_over_the_repeats(tmp_path):
    from types import SimpleNamespace

    from specdeploy.bench.report import markdown, summarise

    plain = ModeResult(seconds=[1.0, 1.0, 1.0], outputs=[[1] * 10], first_token_s=[0.01])
    hybrid = ModeResult(seconds=[0.8, 1.25, 1.0], outputs=[[1] * 10], first_token_s=[0.01])
    manifest = SimpleNamespace(model=SimpleNamespace(name="m", num_layers=4), exit_layer=2, num_draft_tokens=4,
                               draft_source="hybrid", precision="int4", lookup_ngram=(1, 4), calibration=None)
    results = summarise(manifest, [CategoryResult(0.0, "chat", {"plain": plain, "hybrid": hybrid})],
                        BenchConfig(bundle=tmp_path))
    chat = results["results"]["0.0"]["chat"]["hybrid"]
    assert chat["speedup"] == 1.0 and chat["speedup_range"] == [0.8, 1.25]
    assert chat["seconds_per_repeat"] == [0.8, 1.25, 1.0]
    assert "**1.00×** (0.80–1.25)" in markdown(results)
