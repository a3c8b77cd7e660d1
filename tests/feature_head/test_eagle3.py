"""The EAGLE-3 checkpoint format: round trip, a checkpoint written the way the EAGLE repository
writes one (without our writer), and the errors a bad checkpoint gets."""
import json

import numpy as np
import pytest

from specdeploy.errors import ConfigError, ModelSourceError
from specdeploy.feature_head import eagle3
from specdeploy.feature_head.config import HeadConfig, default_feature_layers

pytestmark = pytest.mark.unit

def test_round_trip_keeps_every_tensor_and_the_config(tmp_path, head_config, head_tensors):
    tensors = head_tensors
    eagle3.write(tmp_path / "head", head_config, tensors)
    config, read = eagle3.read(tmp_path / "head")
    assert config == head_config
    assert set(read) == set(tensors)
    for name, value in tensors.items():
        assert read[name].dtype == value.dtype and np.array_equal(read[name], value), name


def test_a_checkpoint_in_the_eagle_repositorys_layout_loads(tmp_path):
    """Written as the EAGLE repository saves a head: pytorch_model.bin from a state dict in fp16,
    its config without our fields (no target_hidden_size, layer ids or target layer count), and the
    target's embedding included."""
    import torch

    h, vocab, draft = 32, 96, 40
    rng = np.random.default_rng(1)
    ids = np.sort(rng.choice(vocab, draft, replace=False))
    state = {
        "fc.weight": torch.randn(h, 3 * h), "midlayer.hidden_norm.weight": torch.ones(h),
        "midlayer.input_layernorm.weight": torch.ones(h), "midlayer.post_attention_layernorm.weight": torch.ones(h),
        "midlayer.self_attn.q_proj.weight": torch.randn(4 * 8, 2 * h),
        "midlayer.self_attn.k_proj.weight": torch.randn(2 * 8, 2 * h),
        "midlayer.self_attn.v_proj.weight": torch.randn(2 * 8, 2 * h),
        "midlayer.self_attn.o_proj.weight": torch.randn(h, 4 * 8),
        "midlayer.mlp.gate_proj.weight": torch.randn(48, h), "midlayer.mlp.up_proj.weight": torch.randn(48, h),
        "midlayer.mlp.down_proj.weight": torch.randn(h, 48), "norm.weight": torch.ones(h),
        "lm_head.weight": torch.randn(draft, h), "embed_tokens.weight": torch.randn(vocab, h),
        "d2t": torch.from_numpy(ids - np.arange(draft)), "t2d": torch.from_numpy(np.isin(np.arange(vocab), ids)),
    }
    state = {k: v.half() if v.is_floating_point() else v for k, v in state.items()}
    (tmp_path / "head").mkdir()
    torch.save(state, tmp_path / "head" / "pytorch_model.bin")
    (tmp_path / "head" / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": h,
        "intermediate_size": 48, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "vocab_size": vocab, "draft_vocab_size": draft,
        "max_position_embeddings": 2048, "torch_dtype": "float16"}))
    config, tensors = eagle3.read(tmp_path / "head", target_num_layers=30)
    assert config.feature_layers == default_feature_layers(30) == (2, 15, 27)
    assert config.head_dim == 8 and config.target_hidden_size == h
    assert "embed_tokens.weight" not in tensors
    assert np.array_equal(eagle3.vocab_ids(tensors["d2t"]), ids)
    assert np.array_equal(tensors["fc.weight"], state["fc.weight"].float().numpy())


def test_a_checkpoint_with_a_wrong_shape_is_named(tmp_path, head_config, head_tensors):
    eagle3.write(tmp_path / "head", head_config, head_tensors)
    raw = json.loads((tmp_path / "head" / "config.json").read_text())
    raw["intermediate_size"] = 64
    (tmp_path / "head" / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ModelSourceError, match=r"midlayer.mlp.gate_proj.weight is \[48, 32\], expected \[64, 32\]"):
        eagle3.read(tmp_path / "head")


def test_maps_that_disagree_are_refused(head_config, head_tensors):
    head_tensors["t2d"] = np.roll(head_tensors["t2d"], 1)
    with pytest.raises(ModelSourceError, match="t2d and d2t name different draft vocabularies"):
        eagle3.check(head_config, head_tensors, "head")


def test_not_a_head_directory(tmp_path):
    with pytest.raises(ModelSourceError, match="point at an EAGLE-3 head's directory"):
        eagle3.read(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8, "num_hidden_layers": 2}))
    with pytest.raises(ModelSourceError, match="one decoder layer"):
        eagle3.read(tmp_path)


def test_config_names_what_is_wrong(head_config):
    with pytest.raises(ConfigError, match="feature_layers=.*0..8"):
        HeadConfig(**{**head_config.__dict__, "feature_layers": (2, 3, 9)})
    with pytest.raises(ConfigError, match="draft_vocab_size=200 exceeds"):
        HeadConfig(**{**head_config.__dict__, "draft_vocab_size": 200})
