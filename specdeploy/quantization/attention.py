"""Each layer's op-by-op attention as one ONNX Runtime `GroupQueryAttention` kernel.

The exported attention (export/split.py) is written op by op so that its rows do not depend on how
many a call carries: split into heads, two rotary embeddings, two KV writes, two KV slices, a
scale, a stacking reshape, two matmuls, the mask, a softmax and three reshapes back: some
eighteen small kernels a layer (docs/benchmarks.md has what they cost). ONNX Runtime's CPU
`GroupQueryAttention` does all of it in one (rotary, the in-place KV write into the shared buffer,
causal attention) and is bitwise row-independent for two query rows or more, but its one-row path
is another kernel. So the fused form always hands it one row more than the call carries: a zero
row, padded after the last, whose output is dropped and whose KV row lands one past the call's
last, where the next call writes before anything reads it. The KV buffers get that spare row
(`Manifest.kv_spare_rows`).

What the rewrite relies on, checked per layer before it touches one: q/k/v come from one matmul
split into heads (fusion.fuse_head_split); q and k are rotated by one cos / sin pair that depends
on `position_ids` alone (its table for every position is computed once, by the graph's own nodes,
and becomes the kernel's cache); the scores meet the plain causal mask (no sliding window, no
soft-capping); a KV head serves several query heads (the one-to-one case is stacked differently
and left alone); and the runtime feeds positions equal to the rows written and an all-ones
attention mask, which SplitModel does. Anything else stays op by op.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..bundle import io_names
from .fusion import _drop_dead, _Graph, _topological
from .rewrites import MS_DOMAIN, attrs as _attrs, use_ms_domain

OP = "GroupQueryAttention"
WRITES = {"TensorScatter": 1, "ScatterND": 2}  # KV write op -> which input holds the new rows
LAYOUT = {"Reshape", "Transpose", "Identity"}
KERNEL_DIM = 16  # the kernel takes head sizes in multiples of this


@dataclass(frozen=True)
class _Layer:
    qkv: str           # [B, S, (Hq + 2 Hkv) D], the fused projection before its split into heads
    q_heads: int
    kv_heads: int
    head_dim: int
    scale: float
    tables: tuple      # (cos, sin) half tables [B, S, D/2] the rotary embeddings read
    kv: tuple          # (past_key, past_value, present_key, present_value)
    out: str           # [B, S, Hq D], what the output projection reads
    gone: tuple        # ids of the nodes the kernel replaces outright


def _only(g: _Graph, name: str, op_type: str):
    """The one node reading `name` (through Identity copies), if it is an `op_type`."""
    readers = g.consumers.get(name, [])
    while len(readers) == 1 and readers[0].op_type == "Identity" and op_type != "Identity":
        readers = g.consumers.get(readers[0].output[0], [])
    return readers[0] if len(readers) == 1 and readers[0].op_type == op_type else None


def _rotary(g: _Graph, name: str):
    node = _only(g, name, "RotaryEmbedding")
    if node is None or node.domain not in ("", "ai.onnx") or len(node.input) != 3:
        return None
    a = _attrs(node)
    return None if a.get("interleaved", 0) or a.get("rotary_embedding_dim", 0) or a.get("num_heads", 0) else node


def _write(g: _Graph, name: str):
    """The KV write storing `name`'s rows, if that is all that reads them."""
    readers = g.consumers.get(name, [])
    node = readers[0] if len(readers) == 1 else None
    if node is None or WRITES.get(node.op_type) is None or node.input[WRITES[node.op_type]] != name:
        return None
    return node


def _traced(g: _Graph, name: str, through: set):
    """The first node behind `name` that is not one of `through` (followed by their first input)."""
    node = g.producer.get(name)
    while node is not None and node.op_type in through:
        node = g.producer.get(node.input[0])
    return node


def _root_input(g: _Graph, name: str) -> str:
    """The tensor behind `name` through casts and reshapes."""
    while (node := g.producer.get(name)) is not None and node.op_type in {"Unsqueeze", "Cast", "Reshape"}:
        name = node.input[0]
    return name


def _plain_causal(g: _Graph, mask: str) -> bool:
    """The mask is `keys <= queries` and the attention mask, nothing more (no sliding window)."""
    root = _traced(g, mask, {"Expand", "Tile", "Unsqueeze", "Reshape", "Identity"})
    if root is None or root.op_type != "And" or len(root.input) != 2:
        return False
    kinds = {getattr(g.producer.get(i), "op_type", None) for i in root.input}
    padding = [_root_input(g, i) for i in root.input]
    return "LessOrEqual" in kinds and io_names.ATTENTION_MASK in padding


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


def _match(g: _Graph, split) -> _Layer | None:
    """The layer whose q/k/v `split` into heads starts, if it is the plain form the kernel computes."""
    transpose = g.op(split.input[0], "Transpose")
    reshape = transpose and g.op(transpose.input[0], "Reshape")
    sizes = g.value(split.input[1]) if len(split.input) == 2 else None
    shape = reshape and g.value(reshape.input[1])
    if shape is None or sizes is None or len(split.output) != 3 or _attrs(split).get("axis") != 1 \
            or sizes[1] != sizes[2] or sizes[0] == sizes[1] or shape[-1] % KERNEL_DIM:
        return None
    rot_q, rot_k, write_v = _rotary(g, split.output[0]), _rotary(g, split.output[1]), _write(g, split.output[2])
    if rot_q is None or rot_k is None or write_v is None or rot_q.input[1:] != rot_k.input[1:]:
        return None
    write_k, scale = _write(g, rot_k.output[0]), _only(g, rot_q.output[0], "Mul")
    factor = scale and g.value(scale.input[1])
    stack = scale and _only(g, scale.output[0], "Reshape")
    scores = stack and _only(g, stack.output[0], "MatMul")
    masked = scores and _only(g, scores.output[0], "Where")
    softmax = masked and masked.input[1] == scores.output[0] and _only(g, masked.output[0], "Softmax")
    probs = softmax and _attrs(softmax).get("axis", -1) in (-1, 3) and _only(g, softmax.output[0], "MatMul")
    if not probs or write_k is None or factor is None or np.size(factor) != 1 or not _plain_causal(g, masked.input[0]):
        return None
    if _traced(g, scores.input[1], {"Transpose", "Slice"}) is not write_k or \
            _traced(g, probs.input[1], {"Slice"}) is not write_v:
        return None
    out = _output(g, probs)
    if out is None:
        return None
    return _Layer(reshape.input[0], int(sizes[0]), int(sizes[1]), int(shape[-1]), float(np.ravel(factor)[0]),
                  (rot_q.input[1], rot_q.input[2]),
                  (write_k.input[0], write_v.input[0], write_k.output[0], write_v.output[0]), out,
                  (id(write_k), id(write_v), id(g.producer[out])))


def _tables(model, names: set, rows: int) -> dict:
    """Each of `names` [1, rows, D/2] for positions 0 .. rows-1, computed by the graph's own nodes;
    {} unless they read `position_ids` alone."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    producer = {o: n for n in model.graph.node for o in n.output}
    inits = {t.name: t for t in model.graph.initializer}
    inputs = {i.name: i for i in model.graph.input}
    used, needed, stack = set(), set(), list(names)
    while stack:
        name = stack.pop()
        if not name or name in needed or id(producer.get(name)) in used:
            continue
        if name in inputs and name != io_names.POSITION_IDS:
            return {}
        if name in inits:
            needed.add(name)
        elif name in producer:
            used.add(id(producer[name]))
            stack.extend(producer[name].input)
    nodes = [n for n in model.graph.node if id(n) in used]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in sorted(names)]
    graph = helper.make_graph(nodes, "tables", [inputs[io_names.POSITION_IDS]], outputs, [inits[n] for n in needed])
    probe = helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version)
    try:
        session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
        values = session.run(None, {io_names.POSITION_IDS: np.arange(rows, dtype=np.int64)[None]})
    except Exception:  # ONNX Runtime raises its own types: the tables are not a function of positions
        return {}
    return {n: v.reshape(rows, -1) for n, v in zip(sorted(names), values)}  # [rows, D/2]


def _lengths(model, qkv: str) -> tuple[str, str]:
    """Nodes for the kernel's seqlens_k [1] (= write_index + S: the padded call's last row) and
    total_sequence_length (scalar, one more), int32, made once a graph; their names."""
    from onnx import TensorProto, helper, numpy_helper

    model.graph.initializer.append(numpy_helper.from_array(np.array([1], np.int32), "attention.one"))
    model.graph.node.extend([
        helper.make_node("Shape", [qkv], ["attention.rows"], start=1, end=2, name="attention.rows"),
        helper.make_node("Add", [io_names.WRITE_INDEX, "attention.rows"], ["attention.end"], name="attention.end"),
        helper.make_node("Cast", ["attention.end"], ["attention.seqlens_k"], to=TensorProto.INT32,
                         name="attention.seqlens_k"),
        helper.make_node("Add", ["attention.seqlens_k", "attention.one"], ["attention.total1"],
                         name="attention.total1"),
        helper.make_node("Squeeze", ["attention.total1"], ["attention.total"], name="attention.total")])
    return "attention.seqlens_k", "attention.total"


def _kernel_nodes(layer: _Layer, caches: tuple, lengths: tuple) -> list:
    """Pad one zero row, GroupQueryAttention over the shared KV buffers, drop the padded row."""
    from onnx import helper

    name = layer.qkv + ".attention"
    past_k, past_v, present_k, present_v = layer.kv
    return [
        helper.make_node("Pad", [layer.qkv, "attention.pads"], [name + ".padded"], name=name + ".pad"),
        helper.make_node(OP, [name + ".padded", "", "", past_k, past_v, *lengths, *caches],
                         [name + ".out", present_k, present_v], name=name, domain=MS_DOMAIN,
                         num_heads=layer.q_heads, kv_num_heads=layer.kv_heads, scale=layer.scale, do_rotary=1),
        helper.make_node("Slice", [name + ".out", "attention.first", "attention.last", "attention.rows_axis"],
                         [layer.out], name=name + ".rows")]


def _resize_kv(model, rows: int) -> None:
    """Every KV buffer input and output of the graph as [1, Hkv, rows, D]."""
    for value in [*model.graph.input, *model.graph.output]:
        dims = value.type.tensor_type.shape.dim
        if io_names.is_kv(value.name) and len(dims) == 4:
            dims[2].dim_value = rows


def fuse_attention(model, max_context: int, kernel_ok=None) -> int:
    """Every layer of the plain form as one GroupQueryAttention, in place; how many. `kernel_ok`
    (q_heads, kv_heads, head_dim) -> bool: whether the kernel keeps rows independent for that
    configuration here (gqa_probe; None: assumed). The graph's KV buffers become max_context + 1
    rows (the padded row's) whether or not any layer is fused, so that every graph of a bundle
    takes the same buffers."""
    from onnx import numpy_helper

    _resize_kv(model, max_context + 1)
    g = _Graph(model)
    layers = [layer for node in model.graph.node if node.op_type == "Split" for layer in [_match(g, node)] if layer]
    tables = _tables(model, {t for layer in layers for t in layer.tables}, max_context + 1) if layers else {}
    layers = [layer for layer in layers if all(t in tables and tables[t].shape[1] * 2 == layer.head_dim
                                               for t in layer.tables)
              and (kernel_ok is None or kernel_ok(layer.q_heads, layer.kv_heads, layer.head_dim))]
    if not layers:
        return 0
    model.graph.initializer.extend([
        *(numpy_helper.from_array(tables[t].astype(np.float32), t + ".cache") for t in {t for x in layers for t in x.tables}),
        numpy_helper.from_array(np.array([0, 0, 0, 0, 1, 0], np.int64), "attention.pads"),
        numpy_helper.from_array(np.array([0], np.int64), "attention.first"),
        numpy_helper.from_array(np.array([-1], np.int64), "attention.last"),
        numpy_helper.from_array(np.array([1], np.int64), "attention.rows_axis")])
    lengths = _lengths(model, layers[0].qkv)
    gone = {i for layer in layers for i in layer.gone}
    nodes = [n for n in model.graph.node if id(n) not in gone]
    for layer in layers:
        nodes += _kernel_nodes(layer, tuple(t + ".cache" for t in layer.tables), lengths)
    _drop_dead(model, _topological(model, nodes))
    use_ms_domain(model)
    return len(layers)


def fused_count(graph) -> int:
    """How many GroupQueryAttention kernels the ONNX file `graph` runs."""
    import onnx

    return sum(n.op_type == OP for n in onnx.load(str(graph), load_external_data=False).graph.node)

