"""Graph input/output names and dynamic axes, declared once as data.

The exporter, the manifest, the validators and every backend read these; nothing else spells a
tensor name. KV buffers are static `[1, num_kv_heads, max_context, head_dim]` (one row more for
fused attention's padded row: Manifest.kv_spare_rows); the only dynamic
dimensions are `seq` (rows fed this call) and `total` (valid length after this call).
"""
from __future__ import annotations

INPUT_IDS = "input_ids"          # int64 [1, seq]
HIDDEN_IN = "hidden_in"          # float [1, seq, hidden]   (verify, head graphs)
POSITION_IDS = "position_ids"    # int64 [1, seq]
WRITE_INDEX = "write_index"      # int64 [1]: first KV row this call writes
ATTENTION_MASK = "attention_mask"  # int64 [1, total], total = write_index + seq
HIDDEN_OUT = "hidden_out"        # float [1, seq, hidden]
LOGITS = "logits"                # float [1, seq, vocab]

SEQ = "seq"
TOTAL = "total"

DRAFT = "draft"
VERIFY = "verify"
HEAD = "head"
DRAFT_HEAD = "draft_head"
GRAPH_NAMES = (DRAFT, VERIFY, HEAD, DRAFT_HEAD)


def past_key(layer: int) -> str:
    return f"past_key.{layer}"


def past_value(layer: int) -> str:
    return f"past_value.{layer}"


def present_key(layer: int) -> str:
    return f"present_key.{layer}"


def present_value(layer: int) -> str:
    return f"present_value.{layer}"


def is_kv(name: str) -> bool:
    """Whether `name` is a KV buffer input or output of some layer."""
    _, _, layer = name.rpartition(".")
    return layer.isdigit() and name in (past_key(int(layer)), past_value(int(layer)), present_key(int(layer)),
                                        present_value(int(layer)))


def kv_inputs(layers: range) -> list[str]:
    return [past_key(i) for i in layers] + [past_value(i) for i in layers]


def kv_outputs(layers: range) -> list[str]:
    return [present_key(i) for i in layers] + [present_value(i) for i in layers]


def kv_aliases(layers: range) -> dict[str, str]:
    """present (output) name -> past (input) name bound to the same buffer."""
    return dict(zip(kv_outputs(layers), kv_inputs(layers)))


def decoder_io(first_input: str, layers: range) -> tuple[list[str], list[str]]:
    """I/O names of a graph that runs decoder layers over the shared KV buffers."""
    inputs = [first_input, POSITION_IDS, WRITE_INDEX, ATTENTION_MASK, *kv_inputs(layers)]
    outputs = [HIDDEN_OUT, *kv_outputs(layers)]
    return inputs, outputs


def head_io() -> tuple[list[str], list[str]]:
    return [HIDDEN_IN], [LOGITS]


def dynamic_axes(name: str) -> dict[int, str]:
    """Dynamic axes of a tensor by name (KV buffers are fully static)."""
    if name in (INPUT_IDS, POSITION_IDS):
        return {1: SEQ}
    if name in (HIDDEN_IN, HIDDEN_OUT, LOGITS):
        return {1: SEQ}
    if name == ATTENTION_MASK:
        return {1: TOTAL}
    return {}
