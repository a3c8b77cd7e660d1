"""Draft / verify / head halves of one Hugging Face decoder, as thin wrappers over its own modules.

`DraftModule` = embeddings + layers [0, k); `VerifyModule` = layers [k, L); `HeadModule` = final
norm + LM head (optionally behind an exit adapter and over a subset of the vocabulary). The
wrappers run eagerly as the PyTorch reference and export to ONNX unchanged.
"""
from __future__ import annotations

import contextlib
import functools
import inspect

import torch
import torch.nn.functional as F
import transformers

from ..constants import DEFAULT_OPSET

ATTN_IMPLEMENTATION = "specdeploy"


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention over the valid prefix of the static cache with the caller's explicit bool mask.

    Written out op by op (not ONNX's `Attention` op, whose kernel takes another path for one query
    row than for several) so that each row's result is bitwise the same however many query rows a
    call carries: a verify row then equals the one-row step, and speculative output equals plain
    output by construction at every precision (the bundle's row-independence check asserts it).
    """
    # query [B, Hq, S, D]; key/value [B, Hkv, T, D]; attention_mask bool [B, 1, S, T]
    out = _row_independent_attention(query, key, value, attention_mask, scaling, kwargs.get("softcap"))
    return out.transpose(1, 2).contiguous(), None  # [B, S, Hq, D]


def _row_independent_attention(query, key, value, attention_mask, scaling, softcap=None):
    """Softmax(q k^T) v with the query rows of the heads sharing a KV head stacked into one matmul.

    Stacking gives native GQA without repeating K/V and keeps every matmul at two rows or more
    (one-row matmuls take a separate kernel); a KV head serving one query head stacks its rows
    twice. Soft-capping (Gemma 2: cap * tanh(scores / cap)) precedes the mask, as in the model.
    """
    batch, q_heads, rows, dim = query.shape
    kv_heads = key.shape[1]
    groups = q_heads // kv_heads
    scaling = dim ** -0.5 if scaling is None else scaling
    stacked = (query * scaling).reshape(batch, kv_heads, -1, dim)               # [B, Hkv, G*S, D]
    # [B, 1, G*S, T]: expanded and reshaped, not repeated (Tile has no boolean kernel on CUDA)
    mask = attention_mask.expand(batch, 1, rows, -1).unsqueeze(2).expand(batch, 1, groups, rows, -1)
    mask = mask.reshape(batch, 1, groups * rows, -1)
    if groups == 1:
        stacked, mask = torch.cat([stacked, stacked], dim=2), torch.cat([mask, mask], dim=2)
    scores = torch.matmul(stacked, key.transpose(2, 3))                        # [B, Hkv, G*S, T]
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    scores = torch.where(mask, scores, torch.finfo(scores.dtype).min)
    out = torch.matmul(torch.softmax(scores, dim=-1), value)                   # [B, Hkv, G*S, D]
    if groups == 1:
        out = out[:, :, :rows]
    return out.reshape(batch, q_heads, rows, dim)                              # [B, Hq, S, D]


transformers.AttentionInterface.register(ATTN_IMPLEMENTATION, _attention)


def _rms_forward(module, plus_one: bool, hidden):
    weight = module.weight.float() + 1.0 if plus_one else module.weight.float()
    eps = getattr(module, "variance_epsilon", None) or module.eps
    return F.rms_norm(hidden.float(), (hidden.shape[-1],), weight, eps).to(hidden.dtype)


def fuse_rms_norms(model) -> int:
    """Every RMS norm of `model` as one `F.rms_norm` (ONNX RMSNormalization, one kernel per row)
    instead of the family's six elementwise ops; returns how many were replaced.

    A module qualifies by behaviour, not name: a 1-D weight, an epsilon, and an output equal to
    rms_norm with `weight` (Llama, Qwen, Phi-3, ...) or `1 + weight` (Gemma) on a random input.
    """
    count = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        eps = getattr(module, "variance_epsilon", None) or getattr(module, "eps", None)
        if getattr(module, "_fused_rms", False) or not isinstance(weight, torch.nn.Parameter) \
                or weight.dim() != 1 or not isinstance(eps, float) or getattr(module, "bias", None) is not None:
            continue
        probe = torch.randn(2, 3, weight.shape[0], generator=torch.Generator().manual_seed(0))
        with torch.no_grad(), _probe_weight(module, weight):
            try:
                expected = module(probe)
            except Exception:  # not a norm over the last axis
                continue
            for plus_one in (False, True):
                if torch.allclose(_rms_forward(module, plus_one, probe), expected, atol=1e-5, rtol=1e-4):
                    module.forward = functools.partial(_rms_forward, module, plus_one)
                    module._fused_rms = True
                    count += 1
                    break
    return count


@contextlib.contextmanager
def _probe_weight(module, weight):
    """A skeleton's norm (its weight on the meta device: export/streamed.py) is probed with a random
    stand-in weight, which tells `weight` from `1 + weight` as well as the real one does."""
    if not weight.is_meta:
        yield
        return
    module.weight = torch.nn.Parameter(torch.rand(weight.shape, generator=torch.Generator().manual_seed(1)) + 0.5)
    try:
        yield
    finally:
        module.weight = weight


EXPORT_OPSET = {"value": DEFAULT_OPSET}  # set by the exporter: 24 (TensorScatter) or 23 (ScatterND)


def _scatter_nd_indices(buffer, rows: int, write_index):
    """[1, Hkv, S, 3] (batch, head, row) indices of the rows a call writes (batch 1)."""
    heads = buffer.shape[1]
    h = torch.arange(heads, device=buffer.device).view(1, heads, 1, 1).expand(1, heads, rows, 1)
    s = (write_index.view(1, 1, 1, 1) + torch.arange(rows, device=buffer.device).view(1, 1, rows, 1)).expand(1, heads, rows, 1)
    return torch.cat([torch.zeros_like(h), h, s], dim=-1)


def _write_rows(buffer: torch.Tensor, update: torch.Tensor, write_index: torch.Tensor):
    """Write `update` rows into `buffer` at `write_index` along the sequence axis, in place.

    Exported as ONNX TensorScatter (opset 24), which ONNX Runtime and TensorRT run in place when
    input and output are bound to the same memory; for runtimes without opset 24 (ONNX Runtime
    1.23, the newest on Python 3.10) as ScatterND, which ONNX Runtime also runs in place.
    """
    # buffer [B, Hkv, S_max, D]; update [B, Hkv, S, D]; write_index [B]
    if torch.onnx.is_in_onnx_export():
        if EXPORT_OPSET["value"] >= 24:
            return torch.onnx.ops.symbolic(
                "TensorScatter", [buffer, update, write_index], {"axis": -2, "mode": "linear"},
                dtype=buffer.dtype, shape=buffer.shape, version=24,
            )
        indices = _scatter_nd_indices(buffer, update.shape[2], write_index)
        return torch.onnx.ops.symbolic("ScatterND", [buffer, indices, update], {},
                                       dtype=buffer.dtype, shape=buffer.shape, version=18)
    rows = update.shape[2]
    index = (write_index.view(-1, 1) + torch.arange(rows, device=buffer.device)).view(buffer.shape[0], 1, rows, 1)
    return buffer.scatter(2, index.expand(-1, buffer.shape[1], -1, buffer.shape[3]), update)


class StaticKV:
    """Duck-typed transformers cache over preallocated buffers; returns the valid prefix only."""

    def __init__(self, keys, values, write_index, total: int, first_layer: int):
        self.keys, self.values = list(keys), list(values)
        self.write_index, self.total, self.first_layer = write_index, total, first_layer

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        i = layer_idx - self.first_layer
        self.keys[i] = _write_rows(self.keys[i], key_states, self.write_index)
        self.values[i] = _write_rows(self.values[i], value_states, self.write_index)
        return self.keys[i][:, :, : self.total], self.values[i][:, :, : self.total]


def causal_mask(write_index, seq: int, attention_mask, window: int | None = None):
    """bool [1, 1, S, T]: key j is visible to query i iff j <= write_index + i and not padding,
    and, for a sliding-window layer, i - j < window (as Hugging Face's sliding mask).

    Rows past the valid length are never visible, which is what makes rollback free; the window
    is applied per row, so it holds inside a verify pass that crosses the window's edge.
    """
    total = attention_mask.shape[1]
    keys = torch.arange(total, device=attention_mask.device).view(1, 1, 1, -1)
    queries = write_index.view(-1, 1, 1, 1) + torch.arange(seq, device=attention_mask.device).view(1, 1, -1, 1)
    visible = (keys <= queries) & attention_mask.bool()[:, None, None, :]
    if window is not None:
        visible = visible & (queries - keys < window)
    return visible


def layer_types(config) -> list[str]:
    """Per layer "full_attention" or "sliding_attention". A config without layer types but with a
    window (Mistral, Phi-3) slides in every layer, as Hugging Face's model does; else all full."""
    types = getattr(config, "layer_types", None)
    if types:
        return list(types)
    window = isinstance(getattr(config, "sliding_window", None), int) and getattr(config, "use_sliding_window", True)
    return ["sliding_attention" if window else "full_attention"] * config.num_hidden_layers


def _rotary_by_type(inner, hidden, position_ids, types) -> dict:
    """Rotary embeddings per layer type: Gemma 3 gives local (sliding) layers their own base."""
    # without transformers' per-call frequency update: LongRoPE inside its original context (the only
    # context the exporter accepts, arch.check_context) always uses its short factors, and a traced
    # update would stay in the graph as a buffer mutation
    forward = type(inner.rotary_emb).forward
    rotary = functools.partial(getattr(forward, "__wrapped__", forward), inner.rotary_emb)
    if "layer_type" in inspect.signature(forward).parameters:
        return {t: rotary(hidden, position_ids, t) for t in set(types)}
    shared = rotary(hidden, position_ids)
    return {t: shared for t in set(types)}


class _LayerRange(torch.nn.Module):
    def __init__(self, model, first: int, last: int, features: tuple[int, ...] = ()):
        super().__init__()
        self.model, self.first, self.last = model, first, last
        self.features = features  # layers whose input is also an output (io_names.graph_features)
        model.config._attn_implementation = ATTN_IMPLEMENTATION
        fuse_rms_norms(model)

    def run_layers(self, hidden, position_ids, write_index, attention_mask, past):
        inner, config = self.model.model, self.model.config
        n = self.last - self.first
        cache = StaticKV(past[:n], past[n:], write_index, attention_mask.shape[1], self.first)
        types = layer_types(config)[self.first : self.last]
        window = getattr(config, "sliding_window", None)
        masks = {t: causal_mask(write_index, hidden.shape[1], attention_mask,
                                window if t == "sliding_attention" else None) for t in set(types)}
        rotary = _rotary_by_type(inner, hidden, position_ids, types)
        features = []
        for index, (layer, kind) in enumerate(zip(inner.layers[self.first : self.last], types), self.first):
            if index in self.features:
                features.append(hidden)
            hidden = layer(
                hidden, attention_mask=masks[kind], position_ids=position_ids, cache=cache,
                position_embeddings=rotary[kind],
            )
            if isinstance(hidden, tuple):
                hidden = hidden[0]
        return (hidden, *features, *cache.keys, *cache.values)


class DraftModule(_LayerRange):
    """Embeddings + layers [0, k): returns h_k for every row (and the inputs of `features`, for a
    feature head) and the updated shallow KV."""

    def __init__(self, model, exit_layer: int, features: tuple[int, ...] = ()):
        super().__init__(model, 0, exit_layer, features)

    def forward(self, input_ids, position_ids, write_index, attention_mask, past: list):
        hidden = self.model.model.embed_tokens(input_ids)  # [1, S, H] (Gemma scales inside)
        hidden = hidden * getattr(self.model.model, "embedding_multiplier", 1.0)  # Granite
        return self.run_layers(hidden, position_ids, write_index, attention_mask, past)


class VerifyModule(_LayerRange):
    """Layers [k, L) from cached h_k rows: returns the final (pre-norm) hidden rows and deep KV."""

    def __init__(self, model, exit_layer: int, features: tuple[int, ...] = ()):
        super().__init__(model, exit_layer, model.config.num_hidden_layers, features)

    def forward(self, hidden_in, position_ids, write_index, attention_mask, past: list):
        return self.run_layers(hidden_in, position_ids, write_index, attention_mask, past)


class HeadModule(torch.nn.Module):
    """Optional exit adapter -> final norm -> LM head, over all or a subset of the vocabulary.

    The subset is gathered from the one LM-head weight inside the graph, so no second copy of the
    head is stored.
    """

    def __init__(self, model, adapter: torch.nn.Module | None = None, vocab_ids=None):
        super().__init__()
        fuse_rms_norms(model)
        self.norm, self.lm_head, self.adapter = model.model.norm, model.lm_head, adapter
        self.vocab_ids = None if vocab_ids is None else torch.as_tensor(vocab_ids, dtype=torch.int64)
        self.logits_scaling = getattr(model.config, "logits_scaling", None)       # Granite divides
        self.softcap = getattr(model.config, "final_logit_softcapping", None)     # Gemma caps

    def forward(self, hidden_in):
        hidden = hidden_in if self.adapter is None else self.adapter(hidden_in)
        hidden = self.norm(hidden)  # [1, S, H]
        if self.vocab_ids is None:
            logits = self.lm_head(hidden)  # [1, S, V]
        else:
            logits = hidden @ self.lm_head.weight[self.vocab_ids].t()  # [1, S, V']
        if self.logits_scaling:
            logits = logits / self.logits_scaling
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits
