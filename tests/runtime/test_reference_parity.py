"""Against the unsplit Hugging Face model: logits, greedy generate, and the KV caches."""
import numpy as np
import pytest
import torch
import transformers

from conftest import export_tiny
from distribution import CHI2_999_10DOF, histogram, homogeneity_chi2
from specdeploy.config import GenerationConfig
from specdeploy.quantization.quality import teacher_forced_logits
from specdeploy.runtime.engine import Engine


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    model.config._attn_implementation = "sdpa"
    return model


def test_draft_then_verify_equals_the_unsplit_model(tiny_engine, hf_model):
    ids = [5, 17, 33, 8, 61, 2, 90, 41]
    ours = teacher_forced_logits(tiny_engine, ids)
    with torch.no_grad():
        theirs = hf_model(torch.tensor([ids])).logits[0].double().numpy()
    assert np.abs(ours - theirs).max() < 1e-4


@pytest.mark.integration  # a whole export (or Hugging Face generate): not the fast tier
@pytest.mark.parametrize("exit_layer", [1, 3])
def test_greedy_equals_hugging_face_generate(hf_model, tiny_model_dir, tmp_path, exit_layer):
    bundle = export_tiny("llama", tmp_path, exit_layer=exit_layer)
    with Engine(bundle) as engine:
        for seed in range(3):
            prompt = [int(t) for t in np.random.default_rng(seed).integers(2, 96, 6)]
            with torch.no_grad():
                hf = hf_model.generate(torch.tensor([prompt]), max_new_tokens=20, min_new_tokens=20, do_sample=False,
                                       attention_mask=torch.ones(1, len(prompt), dtype=torch.long))[0, len(prompt):]
            for gamma in (2, 5):
                spec = engine.generate_ids(prompt, GenerationConfig(max_new_tokens=20, num_draft_tokens=gamma,
                                                                    ignore_eos=True))
                assert spec == hf.tolist()


def test_caches_after_rejections_equal_a_plain_run(tiny_bundle):
    prompt = [7, 8, 9, 10]
    with Engine(tiny_bundle) as spec_engine, Engine(tiny_bundle) as plain_engine:
        from specdeploy.runtime.stats import GenerationStats

        stats = GenerationStats()
        spec = spec_engine.generate_ids(prompt, GenerationConfig(max_new_tokens=30, num_draft_tokens=4,
                                                                 ignore_eos=True), stats)
        plain = plain_engine.generate_ids(prompt, GenerationConfig(max_new_tokens=30, speculative=False,
                                                                   ignore_eos=True))
        assert spec == plain and stats.accepted < stats.drafted  # rejections happened
        valid = len(prompt) + len(spec) - 1  # the last token is never fed
        for name in ("draft", "verify"):
            a, b = spec_engine.model.stages[name], plain_engine.model.stages[name]
            for layer in a.graph.layers:
                for kind in ("past_key", "past_value"):
                    x = a.kv_buffer(f"{kind}.{layer}")[:, :, :valid]
                    y = b.kv_buffer(f"{kind}.{layer}")[:, :, :valid]
                    assert np.allclose(x, y, atol=1e-5)


def test_sampling_with_top_k_and_top_p_matches_plain_distribution(tiny_engine):
    opts = dict(temperature=1.3, top_k=12, top_p=0.9)
    plain = histogram(tiny_engine, [20, 21, 22], 500, speculative=False, **opts)
    spec = histogram(tiny_engine, [20, 21, 22], 500, num_draft_tokens=2, draft_source="early_exit", **opts)
    assert homogeneity_chi2(plain, spec) < CHI2_999_10DOF


def test_lookup_drafts_keep_the_sampling_distribution(tiny_engine):
    """A repetitive prompt makes lookup propose every round; sampling must stay exact."""
    prompt = [30, 31, 32, 33] * 4
    plain = histogram(tiny_engine, prompt, 500, temperature=1.0, speculative=False)
    spec = histogram(tiny_engine, prompt, 500, temperature=1.0, draft_source="lookup", num_draft_tokens=3)
    assert homogeneity_chi2(plain, spec) < CHI2_999_10DOF


def test_the_distribution_check_detects_a_different_distribution(tiny_engine):
    """Control: a different temperature is caught by the same statistic."""
    a = histogram(tiny_engine, [20, 21, 22], 500, temperature=1.0, speculative=False)
    b = histogram(tiny_engine, [20, 21, 22], 500, temperature=0.3, speculative=False)
    assert homogeneity_chi2(a, b) > CHI2_999_10DOF
