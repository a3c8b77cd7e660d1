"""The feature head as two graphs of the bundle, beside draft / verify / head.

`feature_fc` projects the three features of each row ([1, S, 3 T] -> [1, S, H]); `feature_head`
runs the head's decoder layer over its own static KV buffer (one layer, indexed after the model's
last, `past_key.{L}`), reading for each row a hidden state (projected features, or its own output
while drafting) and a token, and returns draft logits over its vocabulary, its output hidden state
and the updated KV. The token's embedding is the target's own table: the same bytes as the draft
graph's, stored once in the shared weights file. Rows past the valid length are never visible,
so the head's KV rolls back with the model's for free.
"""
from __future__ import annotations

import torch

from ..bundle import io_names
from ..feature_head.model import FeatureHead, TokenEmbedding, rotary
from .split import _row_independent_attention, _write_rows, causal_mask

FEATURES = io_names.FEATURES  # [1, seq, 3 T]: each row's features, concatenated in feature_layers order


def fc_io() -> tuple[list[str], list[str]]:
    return [FEATURES], [io_names.HIDDEN_OUT]


def head_io(layer: int) -> tuple[list[str], list[str]]:
    inputs, outputs = io_names.decoder_io(io_names.HIDDEN_IN, range(layer, layer + 1))
    inputs.insert(1, io_names.INPUT_IDS)
    return inputs, [io_names.LOGITS, *outputs]


class FeatureFc(torch.nn.Module):
    def __init__(self, head: FeatureHead):
        super().__init__()
        self.fc = head.fc

    def forward(self, features):  # [1, S, 3T] -> [1, S, H]
        return self.fc(features)


class FeatureHeadStep(torch.nn.Module):
    """One call of the head over S rows written at `write_index` (static KV, explicit mask)."""

    def __init__(self, head: FeatureHead, target):
        super().__init__()
        self.head, self.embed_tokens = head, TokenEmbedding(target)

    def forward(self, hidden_in, input_ids, position_ids, write_index, attention_mask, past: list):
        layer, attn, config = self.head.midlayer, self.head.midlayer.self_attn, self.head.config
        embeds = self.embed_tokens(input_ids)                                 # [1, S, H]
        cos, sin = rotary(position_ids, config.head_dim, config.rope_theta)
        x, residual = layer.inputs(hidden_in, embeds)                          # [1, S, 2H], [1, S, H]
        q, k, v = attn.project(x, cos, sin)                                   # [1, heads, S, D], [1, kv, S, D]
        keys, values = _write_rows(past[0], k, write_index), _write_rows(past[1], v, write_index)
        total = attention_mask.shape[1]
        mask = causal_mask(write_index, q.shape[2], attention_mask)           # [1, 1, S, T]
        out = _row_independent_attention(q, keys[:, :, :total], values[:, :, :total], mask, None)
        hidden = layer.finish(attn.o_proj(out.transpose(1, 2).flatten(2)), residual)  # [1, S, H]
        return self.head.logits(hidden), hidden, keys, values


def load_for_export(path, target) -> FeatureHead:
    """An EAGLE-3 head read for `target` (a transformers model), checked to fit beside it."""
    import numpy as np

    from ..errors import ModelSourceError
    from ..feature_head import eagle3

    config, tensors = eagle3.read(path, target.config.num_hidden_layers)
    t = target.config
    kv_heads = getattr(t, "num_key_value_heads", None) or t.num_attention_heads
    head_dim = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
    wanted = {"vocab_size": t.vocab_size, "target_hidden_size": t.hidden_size, "hidden_size": t.hidden_size,
              "num_key_value_heads": kv_heads, "head_dim": head_dim, "target_num_layers": t.num_hidden_layers}
    wrong = [f"{k} {getattr(config, k)} (the model's: {v})" for k, v in wanted.items() if getattr(config, k) != v]
    if wrong:
        raise ModelSourceError(f"the head in {path} was not made for this model: {', '.join(wrong)}; "
                               f"train one for it with 'specdeploy train-head'")
    head = FeatureHead(config)
    head.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in tensors.items()})
    return head.eval()


def graph_infos(num_layers: int, precision: str = "fp32") -> dict:
    from ..bundle.manifest import GraphInfo

    (fc_in, fc_out), (head_in, head_out) = fc_io(), head_io(num_layers)
    return {io_names.FEATURE_FC: GraphInfo("feature_fc.onnx", tuple(fc_in), tuple(fc_out), precision=precision),
            io_names.FEATURE_HEAD: GraphInfo("feature_head.onnx", tuple(head_in), tuple(head_out),
                                             (num_layers, num_layers + 1), precision)}


def export_graphs(head: FeatureHead, target, raw, max_context: int, opset: int) -> dict:
    """{graph name: Traced} for the two head graphs, traced into `raw`."""
    from .onnx_export import _decoder_args, _decoder_shapes, _export, sample_kv

    seq = torch.export.Dim(io_names.SEQ, min=1, max=4096)
    fc = _export(FeatureFc(head), (torch.randn(1, 3, head.config.feature_size),), fc_io(),
                 raw / "feature_fc.onnx", {FEATURES: {1: seq}}, opset)
    layer = target.config.num_hidden_layers
    kv = sample_kv(target, range(1), max_context)
    hidden, position_ids, write_index, mask, past = _decoder_args(torch.randn(1, 3, head.config.hidden_size), 3, 2, kv)
    shapes = _decoder_shapes(io_names.HIDDEN_IN, len(kv))
    shapes[io_names.INPUT_IDS] = {1: shapes[io_names.HIDDEN_IN][1]}
    shapes = {name: shapes[name] for name in (io_names.HIDDEN_IN, io_names.INPUT_IDS, io_names.POSITION_IDS,
                                              io_names.WRITE_INDEX, io_names.ATTENTION_MASK, "past")}
    step = _export(FeatureHeadStep(head, target), (hidden, torch.tensor([[1, 2, 3]]), position_ids, write_index,
                                                   mask, past), head_io(layer), raw / "feature_head.onnx", shapes,
                   opset)
    return {io_names.FEATURE_FC: fc, io_names.FEATURE_HEAD: step}


class ReferenceStage:
    """The head graphs' PyTorch reference, on the Stage protocol (export/reference.py)."""

    def __init__(self, module: torch.nn.Module, kv_shape=None):
        self.module = module.eval()
        self.kv = [torch.zeros(kv_shape), torch.zeros(kv_shape)] if kv_shape else None

    @torch.no_grad()
    def run(self, feeds: dict) -> dict:
        import numpy as np

        t = {k: torch.from_numpy(np.array(v)) for k, v in feeds.items()}
        if self.kv is None:
            return {io_names.HIDDEN_OUT: self.module(t[FEATURES]).numpy()}
        logits, hidden, *self.kv = self.module(t[io_names.HIDDEN_IN], t[io_names.INPUT_IDS], t[io_names.POSITION_IDS],
                                               t[io_names.WRITE_INDEX], t[io_names.ATTENTION_MASK], self.kv)
        return {io_names.LOGITS: logits.numpy(), io_names.HIDDEN_OUT: hidden.numpy()}

    def close(self) -> None:
        pass


def reference_stages(head: FeatureHead, target, kv_shape) -> dict:
    return {io_names.FEATURE_FC: ReferenceStage(FeatureFc(head)),
            io_names.FEATURE_HEAD: ReferenceStage(FeatureHeadStep(head, target), kv_shape)}
