import json

import numpy as np

import pytest
from click.testing import CliRunner

from specdeploy.bench import prompts
from specdeploy.bench.runner import BenchConfig, CategoryResult, GreedyMismatch, bench, check_identical
from specdeploy.bench.sweep import expected_tokens_per_round
from specdeploy.bench.timing import ModeResult
from specdeploy.cli import main


def test_builtin_prompt_set_has_seven_categories_of_eight():
    p = prompts.builtin()
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
    assert results["machine"]["packages"]["onnxruntime"]


def test_greedy_mismatch_fails_the_run():
    res = CategoryResult(0.0, "x", {"plain": ModeResult(outputs=[[1, 2, 3]]), "lookup": ModeResult(outputs=[[1, 2, 4]])})
    with pytest.raises(GreedyMismatch, match="lookup output differs"):
        check_identical(res)


def test_formula():
    assert expected_tokens_per_round(0.0, 4) == 1.0
    assert expected_tokens_per_round(1.0, 4) == 5.0
    assert abs(expected_tokens_per_round(0.5, 2) - 1.75) < 1e-12


def test_compare_without_model_says_why(tiny_bundle, tmp_path):
    result = CliRunner().invoke(main, ["bench", str(tiny_bundle), "--quick", "--greedy-only", "--compare",
                                       "--prompts-per-category", "1", "--no-plots", "-o", str(tmp_path),
                                       "--prompts", str(_one_prompt(tmp_path))])
    assert result.exit_code == 0, result.output
    assert "needs --model" in result.output


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


def test_clairvoyant_copy_takes_a_repeated_passage_in_long_rounds():
    from specdeploy.bench.bound import best_copy, clairvoyant_rounds

    passage = list(range(10, 40))
    history = np.array(passage + passage[:3])
    assert best_copy(history, np.array(passage[3:]), (2, 4), 8) == 8
    assert best_copy(history, np.array([99] + passage[4:]), (2, 4), 8) == 0
    rounds = clairvoyant_rounds(passage, passage, (2, 4), 8)
    assert sum(rounds) + len(rounds) == len(passage) - 1  # every token after the prefill's
    assert max(rounds) == 8 and len(rounds) <= 6


def test_nothing_to_copy_bounds_lookup_at_plain_speed():
    from specdeploy.bench.bound import bound, clairvoyant_rounds

    rounds = clairvoyant_rounds([1, 2], list(range(3, 30)), (2, 4), 8)
    assert rounds == [0] * 26
    result = bound(rounds, _costs())
    assert result["tokens_per_round"] == 1.0 and result["speedup_bound"] == 1.0


def test_bound_prices_rows_with_the_measured_pass_costs():
    from specdeploy.bench.bound import bound

    # one round of 4 accepted drafts: 5 tokens for one 5-row pass (2.0) vs five 1-row passes (5 x 1.0)
    assert bound([4], _costs())["speedup_bound"] == 2.5


def test_real_lookup_never_takes_fewer_rounds_than_the_bound(tiny_engine):
    from specdeploy.bench.bound import clairvoyant_rounds
    from specdeploy.config import GenerationConfig
    from specdeploy.runtime.stats import GenerationStats

    rng = np.random.default_rng(3)
    for ngram in ((1, 2), (2, 4)):
        prompt = [int(t) for t in rng.integers(2, 96, 30)]
        base = dict(max_new_tokens=48, ignore_eos=True, temperature=0.0)
        plain = tiny_engine.generate_ids(prompt, GenerationConfig(speculative=False, **base))
        stats = GenerationStats()
        tiny_engine.generate_ids(prompt, GenerationConfig(draft_source="lookup", num_draft_tokens=4,
                                                          lookup_ngram=ngram, **base), stats)
        best = clairvoyant_rounds(prompt, plain, ngram, 4)
        assert sum(best) + len(best) == len(plain) - 1
        assert stats.accepted + stats.rounds == len(plain) - 1  # replay and decoder count alike
        assert stats.rounds >= len(best)
        if ngram == (1, 2):
            assert stats.accepted > 0 and sum(best) > 0  # the comparison is not vacuous


def _costs():
    from specdeploy.calibration.costs import CostModel

    rows = {r: (1.0 + 0.25 * (r - 1)) / 2 for r in range(1, 10)}  # per layer: 2 layers make a pass
    return CostModel(num_layers=2, shallow_layer_s=0.5, deep_layer_s=rows, head_s={r: 0.0 for r in rows},
                     draft_head_s=0.0)
