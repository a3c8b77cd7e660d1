"""The head's PyTorch module: its state dict is the EAGLE-3 format, its rotary embedding and
attention are transformers' and PyTorch's own, and a pass in pieces equals one pass."""
import numpy as np
import pytest
import torch

from specdeploy.feature_head import eagle3
from specdeploy.feature_head.model import FeatureHead, _rotate, rotary


pytestmark = pytest.mark.unit


@pytest.fixture
def head(head_config, head_tensors) -> FeatureHead:
    model = FeatureHead(head_config)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in head_tensors.items()})
    return model.eval()


def test_the_state_dict_is_the_checkpoint_format(head_config):
    state = FeatureHead(head_config).state_dict()
    assert {k: tuple(v.shape) for k, v in state.items()} == eagle3.shapes(head_config)


def test_rotary_is_llamas():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    config = LlamaConfig(hidden_size=32, num_attention_heads=4, head_dim=8, rope_theta=500000.0)
    positions = torch.tensor([[0, 3, 7, 100]])
    q, k = torch.randn(1, 4, 4, 8), torch.randn(1, 2, 4, 8)
    cos, sin = LlamaRotaryEmbedding(config)(q, positions)
    want_q, want_k = apply_rotary_pos_emb(q, k, cos, sin)
    cos, sin = rotary(positions, 8, 500000.0)
    torch.testing.assert_close(_rotate(q, cos, sin), want_q)
    torch.testing.assert_close(_rotate(k, cos, sin), want_k)


def test_attention_is_causal_grouped_sdpa(head):
    attention = head.midlayer.self_attn
    q, k, v = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    want = attention.o_proj(want.transpose(1, 2).flatten(2))
    torch.testing.assert_close(attention.attend(q, k, v, mask), want)


def test_a_pass_in_pieces_equals_one_pass(head):
    """Rows computed after a cached prefix equal the same rows of one pass: what drafting relies on."""
    model = head
    torch.manual_seed(0)
    hidden, embeds = torch.randn(1, 7, 32), torch.randn(1, 7, 32)
    positions = torch.arange(7)[None]
    with torch.no_grad():
        logits, out, _ = model(hidden, embeds, positions)
        _, _, past = model(hidden[:, :4], embeds[:, :4], positions[:, :4])
        tail, tail_out, (keys, _) = model(hidden[:, 4:], embeds[:, 4:], positions[:, 4:], past)
    torch.testing.assert_close(tail, logits[:, 4:], rtol=1e-4, atol=1e-4)  # other matmul shapes: float rounding
    torch.testing.assert_close(tail_out, out[:, 4:], rtol=1e-4, atol=1e-4)
    assert keys.shape == (1, 2, 7, 8)
    assert np.isfinite(logits.numpy()).all()


@pytest.mark.parametrize("arch", ["llama", "gemma3_text", "granite"])
def test_the_head_reads_the_embedding_and_final_norm_the_target_computes(arch, tiny_config_for):
    """Gemma scales its embedding by √H and offsets its norms by one, Granite multiplies its
    embedding: a head started from the target's own final norm and fed its embedding must see what
    the target's layers see."""
    import transformers

    from specdeploy.feature_head.model import RMSNorm, TokenEmbedding, final_norm_weight

    torch.manual_seed(0)
    target = transformers.AutoModelForCausalLM.from_config(tiny_config_for(arch)).eval()
    with torch.no_grad():
        target.model.norm.weight.normal_()  # a trained norm's weight is not its initial one
        ids = torch.tensor([[3, 17, 42, 8]])
        states = target(ids, output_hidden_states=True).hidden_states
        assert torch.allclose(TokenEmbedding(target)(ids), states[0])
        norm = RMSNorm(target.config.hidden_size, target.config.rms_norm_eps)
        norm.weight.copy_(final_norm_weight(target))
        x = torch.randn(1, 4, target.config.hidden_size)
        assert torch.allclose(norm(x), target.model.norm(x), atol=1e-5)
