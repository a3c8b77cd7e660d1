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
FEATURES = "features"            # float [1, seq, 3 * hidden]: a feature head's three features (feature_fc)
LOGITS = "logits"                # float [1, seq, vocab]

SEQ = "seq"
TOTAL = "total"

DRAFT = "draft"
VERIFY = "verify"
HEAD = "head"
DRAFT_HEAD = "draft_head"
FEATURE_FC = "feature_fc"        # a feature head's projection of the features it reads
FEATURE_HEAD = "feature_head"    # a feature head's decoder layer (export/feature_graphs.py)
GRAPH_NAMES = (DRAFT, VERIFY, HEAD, DRAFT_HEAD, FEATURE_FC, FEATURE_HEAD)
FEATURE_GRAPHS = (FEATURE_FC, FEATURE_HEAD)


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


def feature(layer: int) -> str:
    """float [1, seq, hidden]: the residual stream entering `layer`, for a feature head."""
    return f"feature.{layer}"


def graph_features(feature_layers, first: int, last: int) -> tuple[int, ...]:
    """The feature layers a graph running layers [first, last) outputs as `feature.j`: those whose
    input it computes (the draft graph's own input, layer 0's, is the embedding); the input of
    `last` is its hidden_out and the verify graph's input is the draft graph's hidden_out."""
    return tuple(j for j in feature_layers if first <= j < last and not (first > 0 and j == first))


def feature_output(layer: int, exit_layer: int, num_layers: int) -> tuple[str, str]:
    """(graph, output name) a feature layer is read from."""
    if layer == exit_layer:
        return DRAFT, HIDDEN_OUT
    if layer == num_layers:
        return VERIFY, HIDDEN_OUT
    return (DRAFT if layer < exit_layer else VERIFY), feature(layer)


def decoder_io(first_input: str, layers: range, features: tuple[int, ...] = ()) -> tuple[list[str], list[str]]:
    """I/O names of a graph that runs decoder layers over the shared KV buffers."""
    inputs = [first_input, POSITION_IDS, WRITE_INDEX, ATTENTION_MASK, *kv_inputs(layers)]
    outputs = [HIDDEN_OUT, *(feature(j) for j in features), *kv_outputs(layers)]
    return inputs, outputs


def head_io() -> tuple[list[str], list[str]]:
    return [HIDDEN_IN], [LOGITS]


def dynamic_axes(name: str) -> dict[int, str]:
    """Dynamic axes of a tensor by name (KV buffers are fully static)."""
    if name in (INPUT_IDS, POSITION_IDS):
        return {1: SEQ}
    if name in (HIDDEN_IN, HIDDEN_OUT, LOGITS, FEATURES) or name.startswith("feature."):
        return {1: SEQ}
    if name == ATTENTION_MASK:
        return {1: TOTAL}
    return {}
