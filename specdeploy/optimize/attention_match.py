"""Which layers' op-by-op attention is a form ONNX Runtime's `GroupQueryAttention` computes.

The exported attention (export/split.py) reads, from the softmax outwards: scores = (q · scale)
stacked per KV head, times the keys sliced from the KV buffer the call just wrote; optionally
soft-capped (Gemma 2: cap · tanh(scores / cap)); masked by `keys <= queries` and the attention
mask, and for a sliding-window layer by `queries - keys < window` too; softmax; times the values
sliced from their buffer. q and k are rotated by one cos / sin pair (or neither is: SmolLM3's NoPE
layers). Those are exactly the kernel's scale, `softcap`, `local_window_size` (the window itself:
ONNX Runtime 1.32's CPU kernel lets row i see keys j with i - j < local_window_size, measured) and
`do_rotary`.

What the kernel reads is what the heads were made from, a row-wise tensor per call row:
* packed: one [B, S, (Hq + 2 Hkv) D] projection split into heads in one Reshape → Transpose →
  Split (fusion.fuse_head_split);
* or q, k and v apart, each [B, S, H D] before its Reshape → Transpose into heads (OLMo 2's norms
  over all heads stay before it), or [B, S, H, D] after a per-head norm (Qwen3 and Gemma 3's
  QK-norm), which the rewrite flattens again.
Anything else (one-to-one MHA, which the export stacks twice; partial rotary; a mask of another
shape) is left op by op.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..bundle import io_names
from .fusion import _Graph
from .graph import attrs as _attrs

WRITES = {"TensorScatter": 1, "ScatterND": 2}  # KV write op -> which input holds the new rows
LAYOUT = {"Reshape", "Transpose", "Identity"}
KERNEL_DIM = 16  # the kernel takes head sizes in multiples of this


@dataclass(frozen=True)
class KernelForm:
    """One configuration of the kernel, as the row-independence probe tries it."""
    q_heads: int
    kv_heads: int
    head_dim: int
    packed: bool = True     # q/k/v one input; else three
    softcap: float = 0.0    # 0: the scores are not capped
    window: int = 0         # keys a row sees, its own included; 0: every key before it
    rotary: bool = True


@dataclass(frozen=True)
class Layer:
    sources: tuple     # (packed q/k/v,) or (q, k, v), each laid out as `layouts` says
    layouts: tuple     # per source: "packed" / "flat" [B, S, H D], "heads_last" [B, S, H, D], "heads_first" [B, H, S, D]
    form: KernelForm
    scale: float
    tables: tuple      # (cos, sin) half tables [B, S, D/2] the rotary embeddings read; () for NoPE
    kv: tuple          # (past_key, past_value, present_key, present_value)
    out: str           # [B, S, Hq D], what the output projection reads
    gone: tuple        # the nodes the kernel replaces outright (the rest die unread)


def _only(g: _Graph, name: str, op_type: str):
    """The one node reading `name` (through Identity copies), if it is an `op_type`."""
    readers = g.consumers.get(name, [])
    while len(readers) == 1 and readers[0].op_type == "Identity" and op_type != "Identity":
        readers = g.consumers.get(readers[0].output[0], [])
    return readers[0] if len(readers) == 1 and readers[0].op_type == op_type else None


def _made_by(g: _Graph, name: str, op_type: str):
    """The node making `name` (through Identity copies), if it is an `op_type`."""
    node = g.producer.get(name)
    while node is not None and node.op_type == "Identity" and op_type != "Identity":
        node = g.producer.get(node.input[0])
    return node if node is not None and node.op_type == op_type else None


def _traced(g: _Graph, name: str, through: set):
    """The first node behind `name` that is not one of `through` (followed by their first input)."""
    node = g.producer.get(name)
    while node is not None and node.op_type in through:
        node = g.producer.get(node.input[0])
    return node


def _constant(g: _Graph, name: str) -> float | None:
    value = g.value(name)
    return float(np.ravel(value)[0]) if value is not None and np.size(value) == 1 else None


def _plain_rotary(node) -> bool:
    a = _attrs(node)
    return node.domain in ("", "ai.onnx") and len(node.input) == 3 and not (
        a.get("interleaved", 0) or a.get("rotary_embedding_dim", 0) or a.get("num_heads", 0))


def _softcap(g: _Graph, name: str):
    """(scores MatMul, cap) behind what the mask reads: the MatMul itself (cap 0) or
    cap · tanh(MatMul / cap); (None, 0) for anything else."""
    if (scores := _made_by(g, name, "MatMul")) is not None:
        return scores, 0.0
    mul = _made_by(g, name, "Mul")
    tanh = mul and _made_by(g, mul.input[0], "Tanh")
    div = tanh and _made_by(g, tanh.input[0], "Div")
    scores = div and _made_by(g, div.input[0], "MatMul")
    cap = scores and _constant(g, div.input[1])
    if not cap or cap <= 0 or _constant(g, mul.input[1]) != cap:
        return None, 0.0
    return scores, cap


def _root_input(g: _Graph, name: str) -> str:
    """The tensor behind `name` through casts and reshapes."""
    while (node := g.producer.get(name)) is not None and node.op_type in {"Unsqueeze", "Cast", "Reshape"}:
        name = node.input[0]
    return name


def _window(g: _Graph, mask: str) -> int | None:
    """Keys a row sees when the mask is `keys <= queries`, the attention mask and, for a sliding
    layer, `queries - keys < window` (split.causal_mask); 0 for no window; None for another mask."""
    root = _traced(g, mask, {"Expand", "Tile", "Unsqueeze", "Reshape", "Identity"})
    leaves, stack = [], [root]
    while stack:
        node = stack.pop()
        if node is not None and node.op_type == "And" and len(node.input) == 2:
            stack += [g.producer.get(i) for i in node.input]
            leaves += [i for i in node.input if getattr(g.producer.get(i), "op_type", None) != "And"]
    causal = [g.producer[i] for i in leaves if getattr(g.producer.get(i), "op_type", None) == "LessOrEqual"]
    less = [g.producer[i] for i in leaves if getattr(g.producer.get(i), "op_type", None) == "Less"]
    padding = [i for i in leaves if _root_input(g, i) == io_names.ATTENTION_MASK]
    if len(causal) != 1 or len(padding) != 1 or len(less) > 1 or len(leaves) != 2 + len(less):
        return None
    if not less:
        return 0
    keys, queries = causal[0].input
    sub = _made_by(g, less[0].input[0], "Sub")
    window = _constant(g, less[0].input[1])
    if sub is None or list(sub.input) != [queries, keys] or not window or window != int(window) or window < 1:
        return None
    return int(window)


def _head_reshape(g: _Graph, name: str, dim: int):
    """The Reshape to [B, S, H, D] (its last dimension a constant `dim`) making `name`, or None."""
    reshape = g.op(name, "Reshape")
    shape = reshape and g.value(reshape.input[1])
    concat = reshape and shape is None and g.op(reshape.input[1], "Concat")
    last = g.value(concat.input[-1]) if concat and len(concat.input) == 4 else None
    if shape is not None:
        last = shape[-1] if len(shape) == 4 else None
    return reshape if last is not None and int(np.ravel(last)[0]) == dim else None


def _packed(g: _Graph, q: str, k: str, v: str, dim: int):
    """(packed q/k/v, Hq) when q, k, v are one head-axis Split of one projection, in that order."""
    split = g.op(q, "Split")
    if split is None or list(split.output) != [q, k, v] or _attrs(split).get("axis") != 1 or len(split.input) != 2:
        return None
    transpose = g.op(split.input[0], "Transpose")
    reshape = transpose and list(_attrs(transpose).get("perm", [])) == [0, 2, 1, 3] and \
        _head_reshape(g, transpose.input[0], dim)
    sizes = g.value(split.input[1])
    return (reshape.input[0], int(sizes[0])) if reshape and sizes is not None else None


def _split_part(g: _Graph, name: str):
    """(Split, sizes, index) when `name` is a part of a Split with constant sizes, else None."""
    split = g.producer.get(name)
    sizes = g.value(split.input[1]) if split is not None and split.op_type == "Split" and len(split.input) == 2 else None
    return (split, sizes, list(split.output).index(name)) if sizes is not None else None


def _width(g: _Graph, name: str) -> int | None:
    """Columns of the [B, S, N] `name` was made from (through norms and reshapes): a split part's,
    or a projection's of its own (a MatMul over a weight [K, N], with or without a bias Add: q, k
    and v kept apart because their GGUF types differ)."""
    node = g.producer.get(name)
    while node is not None and node.op_type in {"Reshape", "RMSNormalization", "Identity"}:
        name, node = node.input[0], g.producer.get(node.input[0])
    part = _split_part(g, name)
    if part is not None:
        return int(part[1][part[2]])
    if node is not None and node.op_type == "Add" and node.input[1] in g.init_dims:
        node = g.producer.get(node.input[0])
    dims = g.init_dims.get(node.input[1]) if node is not None and node.op_type == "MatMul" else None
    return int(dims[1]) if dims is not None and len(dims) == 2 else None


def _per_head_norm(g: _Graph, name: str):
    norm = g.op(name, "RMSNormalization")
    return norm if norm is not None and _attrs(norm).get("axis", -1) in (-1, 3) else None


def _source(g: _Graph, heads: str, dim: int):
    """(source, layout, width) for the [B, H, S, D] `heads`: the row-wise tensor they were made from
    and how it lies: "flat" [B, S, H D] before the Reshape → Transpose into heads, "heads_last"
    [B, S, H, D] after a per-head norm between them, or "heads_first": `heads` itself, a head-axis
    Split part (through a per-head norm: Gemma 3), which the rewrite lays out again."""
    transpose = g.op(heads, "Transpose")
    if transpose is not None and list(_attrs(transpose).get("perm", [])) == [0, 2, 1, 3]:
        inner = transpose.input[0]
        norm = _per_head_norm(g, inner)
        if norm is not None and _head_reshape(g, norm.input[0], dim):
            return inner, "heads_last", _width(g, inner)
        reshape = _head_reshape(g, inner, dim)
        return (reshape.input[0], "flat", _width(g, reshape.input[0])) if reshape is not None else None
    norm = _per_head_norm(g, heads)
    part = _split_part(g, norm.input[0] if norm is not None else heads)
    if part is None or _attrs(part[0]).get("axis") != 1:
        return None
    return heads, "heads_first", int(part[1][part[2]]) * dim


PACKED = "packed"


def _heads(g: _Graph, q: str, k: str, v: str, kv_heads: int, dim: int):
    """(sources, layouts, Hq) of the kernel's inputs for the [B, H, S, D] heads q, k, v."""
    packed = _packed(g, q, k, v, dim)
    if packed is not None:
        return (packed[0],), (PACKED,), packed[1]
    found = [_source(g, name, dim) for name in (q, k, v)]
    if not all(found) or not all(f[2] for f in found) or found[1][2] != kv_heads * dim \
            or found[2][2] != found[1][2] or found[0][2] % dim:
        return None
    return tuple(f[0] for f in found), tuple(f[1] for f in found), found[0][2] // dim


def _output(g: _Graph, probs_matmul) -> str | None:
    """[B, S, Hq D] behind the second matmul: Reshape / Transpose [0, 2, 1, 3] / Identity, then Reshape."""
    node, seen = probs_matmul, []
    while (nxt := g.consumers.get(node.output[0], [])) and len(nxt) == 1 and nxt[0].op_type in LAYOUT:
        node = nxt[0]
        seen.append(node)
    transposes = [n for n in seen if n.op_type == "Transpose"]
    if not seen or seen[-1].op_type != "Reshape" or len(transposes) != 1 or \
            list(_attrs(transposes[0]).get("perm", [])) != [0, 2, 1, 3]:
        return None
    return seen[-1].output[0]


def _rotations(g: _Graph, q_rot: str, k_rot: str):
    """(q heads, k heads, tables) before the rotary embeddings ((q_rot, k_rot, ()) where neither
    rotates); None where one does and the other not, or they rotate differently."""
    rq, rk = g.op(q_rot, "RotaryEmbedding"), g.op(k_rot, "RotaryEmbedding")
    if rq is None and rk is None:
        return q_rot, k_rot, ()
    if rq is None or rk is None or not _plain_rotary(rq) or not _plain_rotary(rk) or rq.input[1:] != rk.input[1:]:
        return None
    return rq.input[0], rk.input[0], tuple(rq.input[1:])


def match(g: _Graph, softmax) -> Layer | None:
    """The layer whose attention `softmax` normalises, if it is a form the kernel computes."""
    masked = _made_by(g, softmax.input[0], "Where")
    probs = _attrs(softmax).get("axis", -1) in (-1, 3) and _only(g, softmax.output[0], "MatMul")
    scores, softcap = _softcap(g, masked.input[1]) if masked is not None else (None, 0.0)
    window = _window(g, masked.input[0]) if scores is not None else None
    stack = scores and _made_by(g, scores.input[0], "Reshape")
    scale = stack and _made_by(g, stack.input[0], "Mul")
    factor = scale and _constant(g, scale.input[1])
    write_k, write_v = (_traced(g, n, through) for n, through in
                        ((scores and scores.input[1], {"Transpose", "Slice"}), (probs and probs.input[1], {"Slice"})))
    if not probs or window is None or not factor or getattr(write_k, "op_type", None) not in WRITES \
            or getattr(write_v, "op_type", None) not in WRITES:
        return None
    kv_shape = g.shapes.get(write_k.input[0]) or []
    rotations = _rotations(g, scale.input[0], write_k.input[WRITES[write_k.op_type]])
    out = _output(g, probs)
    if len(kv_shape) != 4 or not kv_shape[3] or kv_shape[3] % KERNEL_DIM or rotations is None or out is None:
        return None
    kv_heads, dim = int(kv_shape[1]), int(kv_shape[3])
    heads = _heads(g, rotations[0], rotations[1], write_v.input[WRITES[write_v.op_type]], kv_heads, dim)
    if heads is None or heads[2] == kv_heads:  # one-to-one heads are stacked twice: not this form
        return None
    form = KernelForm(heads[2], kv_heads, dim, heads[1] == (PACKED,), softcap, window, bool(rotations[2]))
    return Layer(heads[0], heads[1], form, factor, rotations[2],
                 (write_k.input[0], write_v.input[0], write_k.output[0], write_v.output[0]), out,
                 (write_k, write_v, g.producer[out]))


def layers(model) -> list[Layer]:
    """Every layer of `model` the kernel computes, in graph order."""
    g = _Graph(model)
    return [layer for node in model.graph.node if node.op_type == "Softmax" for layer in [match(g, node)] if layer]
