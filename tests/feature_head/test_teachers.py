"""The teachers of train-head: the bundle's own graphs give the features and top-k the PyTorch model
gives (to fp32 rounding), whatever the prefill chunk, and a bundle without the features is refused
in one line."""
import numpy as np
import pytest

from specdeploy.bundle import manifest as manifest_io
from specdeploy.errors import ConfigError
from specdeploy.feature_head.config import default_feature_layers
from specdeploy.feature_head.teachers import BundleTeacher, TorchTeacher, top_k

pytestmark = pytest.mark.integration
LAYERS = default_feature_layers(4)  # the tiny model's head reads (2, 2, 1)


@pytest.mark.unit
def test_top_k_is_the_softmax_top_k_renormalised():
    import torch

    from specdeploy.feature_head.teachers import _numpy_top_k

    logits = np.random.default_rng(0).normal(0, 3, (7, 50)).astype(np.float32)
    expected = torch.softmax(torch.from_numpy(logits), -1).topk(5, -1)
    want = expected.values / expected.values.sum(-1, keepdim=True)
    for ids, probs in (top_k(logits, 5), _numpy_top_k(logits, 5)):  # PyTorch's where installed, else NumPy's
        assert np.array_equal(ids, expected.indices.numpy())
        np.testing.assert_allclose(probs, want.numpy(), rtol=1e-5)


def test_export_features_outputs_the_layers_a_head_reads(features_bundle):
    assert manifest_io.read(features_bundle).feature_layers == tuple(sorted(set(LAYERS))) == (1, 2)


def test_the_bundle_teaches_what_the_model_computes(features_bundle, tiny_model_and_tokenizer):
    from specdeploy.runtime.engine import Engine

    model, _ = tiny_model_and_tokenizer
    ids = [int(i) for i in np.random.default_rng(1).integers(3, 90, 40)]
    feats, top_ids, probs = TorchTeacher(model, LAYERS)(ids, 5)
    with Engine(features_bundle) as engine:
        whole = BundleTeacher(engine.model, LAYERS)(ids, 5)
        chunked = BundleTeacher(engine.model, LAYERS, chunk=7)(ids, 5)
    np.testing.assert_allclose(whole[0], feats, rtol=1e-3, atol=1e-4)
    assert np.array_equal(whole[1], top_ids)
    np.testing.assert_allclose(whole[2], probs, rtol=1e-3, atol=1e-5)
    for got, want in zip(chunked, whole):  # prefill chunks are rows like any other: bitwise the same
        assert np.array_equal(got, want)


def test_a_bundle_without_features_is_refused_in_one_line(tiny_engine):
    with pytest.raises(ConfigError, match=r"outputs the features of none.*export --features"):
        BundleTeacher(tiny_engine.model, LAYERS)
