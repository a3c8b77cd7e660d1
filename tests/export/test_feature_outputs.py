"""Feature outputs for a feature head: the draft and verify graphs also output the residual stream
entering chosen layers, validated with the rest, equal to Hugging Face's hidden states, and
without changing what the bundle decodes."""
import numpy as np
import pytest
import torch

from conftest import export_tiny
from specdeploy.bundle import io_names
from specdeploy.bundle import manifest as manifest_io
from specdeploy.config import GenerationConfig
from specdeploy.errors import ConfigError
from specdeploy.export import ExportConfig
from specdeploy.runtime.engine import Engine

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def feature_bundle(tmp_path_factory):
    return export_tiny("llama", tmp_path_factory.mktemp("features"), feature_layers=(4, 0, 1, 3, 2))


def test_each_graph_outputs_the_layers_whose_input_it_computes(feature_bundle):
    m = manifest_io.read(feature_bundle)
    assert m.feature_layers == (0, 1, 2, 3, 4)
    assert [o for o in m.graphs["draft"].outputs if o.startswith("feature.")] == ["feature.0", "feature.1"]
    assert [o for o in m.graphs["verify"].outputs if o.startswith("feature.")] == ["feature.3"]
    assert io_names.feature_output(2, 2, 4) == ("draft", "hidden_out")
    assert io_names.feature_output(4, 2, 4) == ("verify", "hidden_out")
    assert any(name.startswith("prefill.feature.") for name in m.extra["validation_max_abs_diff"])


def test_features_are_the_models_hidden_states(feature_bundle, tiny_model_dir):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    ids = [3, 17, 42, 8, 9, 60]
    with torch.no_grad():
        want = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    with Engine(feature_bundle) as engine:
        split = engine.model
        split.verify_pass(split.draft_pass(ids, 0).copy(), 0)
        got = split.features()                                   # [S, 5, H]
    for slot, layer in enumerate(range(5)):
        expected = want[layer][0].numpy() if layer < 4 else None
        if expected is not None:
            np.testing.assert_allclose(got[:, slot], expected, rtol=1e-4, atol=1e-4)
    final = model.model.norm  # the last feature is the pre-norm final hidden state
    with torch.no_grad():
        np.testing.assert_allclose(final(torch.from_numpy(got[:, 4])).numpy(), want[4][0].numpy(),
                                   rtol=1e-4, atol=1e-4)


def test_decoding_is_unchanged(feature_bundle, tiny_bundle):
    config = GenerationConfig(max_new_tokens=24, ignore_eos=True)
    with Engine(feature_bundle) as with_features, Engine(tiny_bundle) as without:
        ids = [5, 6, 7, 5, 6, 7, 5]
        assert with_features.generate_ids(ids, config) == without.generate_ids(ids, config)
        plain = GenerationConfig(max_new_tokens=24, ignore_eos=True, speculative=False)
        assert with_features.generate_ids(ids, plain) == with_features.generate_ids(ids, config)


def test_a_layer_the_model_lacks_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"feature layers \[9\].*pick 0..4"):
        export_tiny("llama", tmp_path, feature_layers=(2, 9))
    assert ExportConfig(source=tmp_path, exit_layer=2, feature_layers=(3, 1, 3)).feature_layers == (1, 3)
