"""The feature head as a PyTorch module, for training and for tracing into the bundle's head graph.

Its parameters carry the EAGLE-3 names (eagle3.py), so a state dict is the checkpoint format.
One position of the head pairs a feature with the embedding of the token that follows it: at
position p it reads the target's features at p (projected by `fc`) or, while drafting, its own
output for p, and the embedding of token p + 1, and predicts token p + 2. Rotary positions are p.
"""
from __future__ import annotations

import torch
from torch import nn

from .config import HeadConfig


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rotary(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [B, S, D] for Llama's rotate-half rotary embedding."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim)
    angles = positions.float()[..., None] * inv                                         # [B, S, D/2]
    angles = torch.cat([angles, angles], -1)                                            # [B, S, D]
    return angles.cos(), angles.sin()


def _rotate(x, cos, sin):  # x [B, heads, S, D]
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos[:, None] + turned * sin[:, None]


class Attention(nn.Module):
    def __init__(self, config: HeadConfig):
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.heads, self.kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, d
        self.q_proj = nn.Linear(2 * h, self.heads * d, bias=False)
        self.k_proj = nn.Linear(2 * h, self.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(2 * h, self.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.heads * d, h, bias=False)

    def project(self, x, cos, sin):
        """q [B, heads, S, D], k and v [B, kv_heads, S, D], rotated."""
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        return _rotate(q, cos, sin), _rotate(k, cos, sin), v

    def attend(self, q, keys, values, mask):
        """Softmax attention of q [B, heads, S, D] over keys / values [B, kv_heads, T, D];
        mask [S, T] or [B, 1, S, T], True where a query may look."""
        groups = self.heads // self.kv_heads
        keys, values = keys.repeat_interleave(groups, 1), values.repeat_interleave(groups, 1)
        scores = q @ keys.transpose(-1, -2) / self.head_dim ** 0.5                   # [B, heads, S, T]
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        out = scores.softmax(-1) @ values                                            # [B, heads, S, D]
        return self.o_proj(out.transpose(1, 2).flatten(2))                           # [B, S, H]


class MLP(nn.Module):
    def __init__(self, config: HeadConfig):
        super().__init__()
        h, i = config.hidden_size, config.intermediate_size
        self.gate_proj, self.up_proj = nn.Linear(h, i, bias=False), nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class HeadLayer(nn.Module):
    """One decoder layer whose attention reads [normed embedding, normed hidden] (2 H wide)."""

    def __init__(self, config: HeadConfig):
        super().__init__()
        eps = config.rms_norm_eps
        self.hidden_norm, self.input_layernorm = RMSNorm(config.hidden_size, eps), RMSNorm(config.hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps)
        self.self_attn, self.mlp = Attention(config), MLP(config)
        self.norm_before_residual = config.norm_before_residual

    def inputs(self, hidden, embeds):
        """The attention's input [B, S, 2 H] and the residual [B, S, H]."""
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        return torch.cat([self.input_layernorm(embeds), normed], -1), residual

    def finish(self, attended, residual):
        hidden = residual + attended
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class FeatureHead(nn.Module):
    def __init__(self, config: HeadConfig):
        super().__init__()
        self.config = config
        self.fc = nn.Linear(config.feature_size, config.hidden_size, bias=False)
        self.midlayer = HeadLayer(config)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))

    def logits(self, hidden):  # [B, S, H] -> [B, S, V']
        return self.lm_head(self.norm(hidden))

    def forward(self, hidden, embeds, positions, past: tuple | None = None):
        """One pass over S positions after `past` (keys, values [B, kv_heads, P, D]) with causal
        attention. hidden [B, S, H]: projected features (`fc`) or the head's own outputs.
        Returns (logits [B, S, V'], hidden out [B, S, H], (keys, values) including these rows)."""
        cos, sin = rotary(positions, self.config.head_dim, self.config.rope_theta)
        x, residual = self.midlayer.inputs(hidden, embeds)
        q, k, v = self.midlayer.self_attn.project(x, cos, sin)
        if past is not None:
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
        s, t = q.shape[2], k.shape[2]
        mask = torch.ones(s, t, dtype=torch.bool, device=q.device).tril(t - s)
        out = self.midlayer.finish(self.midlayer.self_attn.attend(q, k, v, mask), residual)
        return self.logits(out), out, (k, v)


class TokenEmbedding(nn.Module):
    """The target's token embedding as its first layer reads it, frozen: Gemma's embedding module
    scales by √H itself and Granite multiplies by its `embedding_multiplier`. Training, the
    acceptance replay and the exported head graph all read the token through this one module, so a
    head trained here sees the same embedding it drafts with."""

    def __init__(self, target, copy: bool = False):
        super().__init__()
        import copy as copying

        table = target.get_input_embeddings()
        self.table = copying.deepcopy(table) if copy else table  # a copy can move to another device alone
        self.table.requires_grad_(False)
        self.multiplier = float(getattr(target.model, "embedding_multiplier", 1.0))

    def forward(self, ids):  # [B, S] -> [B, S, H]
        return self.table(ids) * self.multiplier


def final_norm_weight(target) -> torch.Tensor:
    """The target's final norm as the head's RMSNorm computes it (x · w): Gemma's norms compute
    x · (1 + w), so its weight is offset by one."""
    weight = target.model.norm.weight.detach()
    return weight + 1.0 if target.config.model_type.startswith("gemma") else weight.clone()
