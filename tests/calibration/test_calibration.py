"""Calibration on a tiny model: adapter, draft vocabulary, threshold and autotune end to end."""
import json

import numpy as np
import pytest

from specdeploy.bundle import manifest as manifest_io
from specdeploy import prompts
from specdeploy.calibration import autotune
from specdeploy.calibration.steps import CalibrationConfig, candidate_exits
from specdeploy.config import GenerationConfig
from specdeploy.errors import ConfigError
from specdeploy.export import ExportConfig, export
from specdeploy.runtime.engine import Engine
from specdeploy.runtime.stats import GenerationStats

pytestmark = pytest.mark.integration  # calibration end to end, exports included: not the fast tier

SMALL = CalibrationConfig(gammas=(2, 3), draft_vocab_size=48, max_new_tokens=12, train_steps=40,
                          measure_prompts=2, measure_tokens=12)


@pytest.fixture(scope="module")
def calibrated(tiny_model_dir, tmp_path_factory, monkeypatch_module):
    out = tmp_path_factory.mktemp("cal") / "bundle"
    monkeypatch_module.setenv("SPECDEPLOY_CACHE", str(out.parent / "cache"))
    lines = []
    config = ExportConfig(source=tiny_model_dir, exit_layer=None, num_draft_tokens=None,
                          max_context=128, output=out)
    export(config, lines.append, SMALL)
    return out, lines


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_calibration_records_its_choice(calibrated):
    bundle, lines = calibrated
    m = manifest_io.read(bundle)
    assert m.exit_layer in (1, 2) and m.num_draft_tokens in (2, 3)
    assert "draft_head" in m.graphs and m.draft_vocab == "draft_vocab.npy"
    vocab = np.load(bundle / m.draft_vocab)
    assert len(vocab) == 48 and np.all(np.diff(vocab) > 0)
    cal = m.calibration
    assert set(cal["exit_layers"]) == {"1", "2"} and "measured_speedup" in cal
    assert "| k | γ |" in cal["table"] and any("held-out greedy agreement" in l for l in lines)
    assert max(m.extra["validation_max_abs_diff"].values()) < 1e-3


def test_calibrated_bundle_is_exact(calibrated):
    bundle, _ = calibrated
    with Engine(bundle) as engine:
        for source in ("early_exit", "hybrid"):
            for seed in range(3):
                prompt = [int(t) for t in np.random.default_rng(seed).integers(2, 96, 6)]
                base = dict(max_new_tokens=30, ignore_eos=True)
                plain = engine.generate_ids(prompt, GenerationConfig(speculative=False, **base))
                stats = GenerationStats()
                spec = engine.generate_ids(prompt, GenerationConfig(draft_source=source, **base), stats)
                assert spec == plain


def test_draft_vocabulary_restricts_draft_tokens(calibrated):
    bundle, _ = calibrated
    with Engine(bundle) as engine:
        vocab = set(np.load(bundle / engine.manifest.draft_vocab).tolist())
        drafter = engine.decoder.drafters["early_exit"]
        engine.generate_ids([3, 4, 5], GenerationConfig(max_new_tokens=4, ignore_eos=True))
        rng = np.random.default_rng(0)
        settings = engine.settings(GenerationConfig(temperature=1.0))
        draft = drafter.draft(None, 7, 10, 3, settings, rng)
        assert set(draft.tokens) <= vocab
        assert np.allclose(draft.probs.sum(1), 1.0)
        outside = sorted(set(range(96)) - vocab)
        assert np.all(draft.probs[:, outside] == 0)


def test_replay_counts_rounds_exactly():
    match = np.array([1, 1, 0, 1, 1, 1], bool)
    conf = np.ones(6)
    seg = np.zeros(6, int)
    committed, drafted, accepted, cost, rounds = autotune.replay(
        match, conf, seg, 3, None, 1.0, lambda rows: 10.0)
    # round 1 from 0: drafts 0,1,2 -> accepts 2, commits 3 (j=3); round 2 from 3: drafts 3,4 (n-j-1=2) -> 2 accepted, commits 3
    assert (committed, drafted, accepted, rounds) == (6, 5, 4, 2)
    assert cost == (4 * 1.0 + 10) + (3 * 1.0 + 10)


def test_candidate_exits_spread_over_lower_half():
    assert candidate_exits(30) == (5, 8, 10, 15)
    assert all(1 <= k < 4 for k in candidate_exits(4))


def test_user_prompt_file(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "hi"}) + "\n" + json.dumps({"messages": [{"role": "user", "content": "x"}]}) + "\n")
    assert prompts.load_calibration_prompts(f) == [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "x"}]]
    f.write_text("{not json}\n")
    with pytest.raises(ConfigError, match="p.jsonl:1"):
        prompts.load_calibration_prompts(f)


def test_held_out_task_kinds_are_disjoint():
    train = {c[0]["content"] for c in prompts.calibration_conversations(False)}
    held = {c[0]["content"] for c in prompts.calibration_conversations(True)}
    assert train and held and not train & held


def test_calibrated_bundle_keeps_the_sampling_distribution(calibrated):
    from distribution import CHI2_999_10DOF, histogram, homogeneity_chi2

    bundle, _ = calibrated
    with Engine(bundle) as engine:
        plain = histogram(engine, [12, 13, 14], 500, temperature=1.0, speculative=False)
        spec = histogram(engine, [12, 13, 14], 500, temperature=1.0, draft_source="early_exit", num_draft_tokens=2)
    assert homogeneity_chi2(plain, spec) < CHI2_999_10DOF


def test_adapter_training_raises_exit_agreement(tiny_model_dir):
    """Teacher = the head applied to a rotated hidden state; the residual adapter must learn it."""
    import torch
    import transformers

    from specdeploy.calibration.adapter import TrainConfig, draft_predictions, train
    from specdeploy.calibration.data import Activations

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(2000, 64, generator=gen)
    rotation = torch.eye(64) + 0.6 * torch.randn(64, 64, generator=gen) / 8
    with torch.no_grad():
        probs = torch.softmax(model.lm_head(model.model.norm(hidden @ rotation)), -1)
    top = probs.topk(16, -1)
    acts = Activations({2: hidden.numpy()}, top.indices.int().numpy(),
                       (top.values / top.values.sum(-1, keepdim=True)).numpy(), np.zeros(2000, np.int32))
    vocab_ids = np.arange(96)
    before, _ = draft_predictions(model, acts, 2, vocab_ids, None)
    adapter = train(model, acts, 2, vocab_ids, TrainConfig(steps=300, learning_rate=5e-3))
    after, _ = draft_predictions(model, acts, 2, vocab_ids, adapter)
    assert (after == acts.greedy).mean() > (before == acts.greedy).mean() + 0.2


def test_defaults_fall_back_to_plain_when_speculation_loses():
    from specdeploy.calibration.steps import decide_defaults

    assert decide_defaults({"early_exit/4": 0.8, "hybrid/4": 0.95}) == ("hybrid", 4, False)
    assert decide_defaults({"early_exit/3": 1.2, "hybrid/3": 1.1}) == ("early_exit", 3, True)
    # noise-sized differences keep the safer choice: hybrid over early exit, plain over a 1.02x "gain"
    assert decide_defaults({"early_exit/3": 1.12, "hybrid/4": 1.11, "hybrid/3": 1.05}) == ("hybrid", 4, True)
    assert decide_defaults({"early_exit/3": 1.01, "hybrid/3": 1.02}) == ("hybrid", 3, False)


def test_autotune_prefers_short_drafts_when_acceptance_is_low():
    from specdeploy.runtime.costs import CostModel

    costs = CostModel(4, 1.0, {r: 1.0 for r in range(1, 10)}, {r: 1.0 for r in range(1, 10)}, 1.0)
    rng = np.random.default_rng(0)
    low = autotune.best(autotune.evaluate(2, rng.random(500) < 0.05, np.ones(500), np.zeros(500, int), costs))
    assert low.predicted_speedup < 1.0  # speculation cannot win: calibration then defaults to plain
    high = autotune.best(autotune.evaluate(1, rng.random(500) < 0.95, np.ones(500), np.zeros(500, int), costs))
    assert high.predicted_speedup > 1.0 and high.num_draft_tokens >= 4


def test_empty_prompt_file_is_a_clear_error(tmp_path):
    f = tmp_path / "empty.jsonl"
    f.write_text("\n")
    with pytest.raises(ConfigError, match="holds no prompts"):
        prompts.load_calibration_prompts(f)


def test_recalibrating_a_bundle_uses_its_recorded_source(tiny_bundle, tmp_path):
    from specdeploy.export.pipeline import resolve_source

    request = ExportConfig(source=tiny_bundle, exit_layer=None, num_draft_tokens=None, output=tmp_path / "x")
    assert resolve_source(request).source == (tiny_bundle.parent / "llama-model").resolve()
    orphan = tmp_path / "orphan"
    import shutil

    shutil.copytree(tiny_bundle, orphan)
    m = manifest_io.read(orphan)
    manifest_io.write(orphan, m.replace(extra={}))
    with pytest.raises(ConfigError, match="source model"):
        resolve_source(ExportConfig(source=orphan, exit_layer=None, num_draft_tokens=None))


def test_a_quantized_calibration_prices_rows_with_its_own_kernels(tiny_model_dir, tmp_path, monkeypatch):
    """Costs are timed, and defaults measured, on int8 graphs (MatMulNBits), not on the fp32 ones."""
    import specdeploy.runtime.costs as costs_module
    import specdeploy.calibration.steps as steps

    timed, measured = [], []
    real_measure, real_e2e = costs_module.measure, steps.measure_end_to_end

    def measure(split, max_rows):
        timed.append({g.precision for g in split.manifest.graphs.values()})
        return real_measure(split, max_rows, repeats=2)

    def end_to_end(bundle, *args):
        measured.append(manifest_io.read(bundle).precision)
        return real_e2e(bundle, *args)

    monkeypatch.setattr(costs_module, "measure", measure)
    monkeypatch.setattr("specdeploy.export.calibrate.measure_end_to_end", end_to_end)
    config = ExportConfig(source=tiny_model_dir, exit_layer=2, num_draft_tokens=None, max_context=128,
                          output=tmp_path / "cal-int8", precision="int8")
    export(config, lambda line: None, SMALL)
    assert timed == [{"int8"}] and measured[-1] == "int8"
    m = manifest_io.read(tmp_path / "cal-int8")
    assert m.precision == "int8" and m.calibration["measured_speedup"] and m.row_check["passed"]
