"""Each layer's op-by-op attention as one ONNX Runtime `GroupQueryAttention` kernel.

The exported attention (export/split.py) is written op by op so that its rows do not depend on how
many a call carries: split into heads, two rotary embeddings, two KV writes, two KV slices, a
scale, a stacking reshape, two matmuls, the mask, a softmax and three reshapes back: some
eighteen small kernels a layer (lab/notes/benchmarks-history.md has what they cost). ONNX Runtime's CPU
`GroupQueryAttention` does all of it in one (rotary, the in-place KV write into the shared buffer,
causal attention) and is bitwise row-independent for two query rows or more, but its one-row path
is another kernel. So the fused form always hands it one row more than the call carries: a zero
row, padded after the last, whose output is dropped and whose KV row lands one past the call's
last, where the next call writes before anything reads it. The KV buffers get that spare row
(`Manifest.kv_spare_rows`).

Which layers qualify (attention_match.py): plain causal, sliding-window and soft-capped attention,
rotated or not (NoPE), with q/k/v packed in one projection or apart (QK-norm families). The
runtime feeds positions equal to the rows written and an all-ones attention mask, which
SplitModel does.
"""
from __future__ import annotations

import numpy as np

from ..backends import attention_window
from ..bundle import io_names
from . import attention_match
from .attention_match import Layer
from .fusion import _drop_dead, _topological
from .graph import MS_DOMAIN, array, use_ms_domain

OP = "GroupQueryAttention"


def _tables(model, names: set, rows: int) -> dict:
    """Each of `names` [1, rows, D/2] for positions 0 .. rows-1, computed by the graph's own nodes;
    {} unless they read `position_ids` alone."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

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
    values = [numpy_helper.from_array(np.asarray(array(inits[n])), n) for n in needed]  # lazily loaded graphs too
    graph = helper.make_graph(nodes, "tables", [inputs[io_names.POSITION_IDS]], outputs, values)
    probe = helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version)
    try:
        session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
        values = session.run(None, {io_names.POSITION_IDS: np.arange(rows, dtype=np.int64)[None]})
    except Exception:  # ONNX Runtime raises its own types: the tables are not a function of positions
        return {}
    return {n: v.reshape(rows, -1) for n, v in zip(sorted(names), values)}  # [rows, D/2]


def _lengths(model, layer: Layer) -> tuple[str, str]:
    """Nodes for the kernel's seqlens_k [1] (= write_index + S: the padded call's last row) and
    total_sequence_length (scalar, one more), int32, made once a graph; their names."""
    from onnx import TensorProto, helper

    axis = 2 if layer.layouts[0] == "heads_first" else 1  # the rows' axis
    model.graph.node.extend([
        helper.make_node("Shape", [layer.sources[0]], ["attention.rows"], start=axis, end=axis + 1,
                         name="attention.rows"),
        helper.make_node("Add", [io_names.WRITE_INDEX, "attention.rows"], ["attention.end"], name="attention.end"),
        helper.make_node("Cast", ["attention.end"], ["attention.seqlens_k"], to=TensorProto.INT32,
                         name="attention.seqlens_k"),
        helper.make_node("Add", ["attention.seqlens_k", "attention.one"], ["attention.total1"],
                         name="attention.total1"),
        helper.make_node("Squeeze", ["attention.total1"], ["attention.total"], name="attention.total")])
    return "attention.seqlens_k", "attention.total"


def _padded(layer: Layer, name: str) -> tuple[list, list]:
    """Nodes handing the kernel each source as [B, S, H D] with one zero row after the last; their outputs."""
    from onnx import helper

    nodes, outputs = [], []
    for i, (source, layout) in enumerate(zip(layer.sources, layer.layouts)):
        if layout == "heads_first":  # [B, H, S, D]
            nodes.append(helper.make_node("Transpose", [source], [f"{name}.{i}.rows"], perm=[0, 2, 1, 3],
                                          name=f"{name}.{i}.rows"))
            source = f"{name}.{i}.rows"
        if layout in ("heads_first", "heads_last"):  # [B, S, H, D]
            nodes.append(helper.make_node("Reshape", [source, "attention.flat"], [f"{name}.{i}.flat"],
                                          name=f"{name}.{i}.flat"))
            source = f"{name}.{i}.flat"
        nodes.append(helper.make_node("Pad", [source, "attention.pads"], [f"{name}.{i}.padded"], name=f"{name}.{i}.pad"))
        outputs.append(f"{name}.{i}.padded")
    return nodes, outputs


def kernel_attributes(form: attention_match.KernelForm) -> dict:
    """The kernel's attributes for `form` (the rewrite's node and the probe's alike)."""
    attributes = {"num_heads": form.q_heads, "kv_num_heads": form.kv_heads, "do_rotary": int(form.rotary)}
    if form.softcap:
        attributes["softcap"] = form.softcap
    if form.window:  # keys a row sees, its own included, as this ONNX Runtime counts them
        attributes["local_window_size"] = form.window - attention_window.shift()
    return attributes


def _countable_window(form: attention_match.KernelForm) -> bool:
    """No window, or one this ONNX Runtime's count can express (at least one key)."""
    return not form.window or form.window - attention_window.shift() >= 1


def _kernel_nodes(layer: Layer, caches: tuple, lengths: tuple) -> list:
    """Pad one zero row, GroupQueryAttention over the shared KV buffers, drop the padded row."""
    from onnx import helper

    name = layer.out + ".attention"
    past_k, past_v, present_k, present_v = layer.kv
    pads, inputs = _padded(layer, name)
    inputs += [""] * (3 - len(inputs))
    return [*pads,
            helper.make_node(OP, [*inputs, past_k, past_v, *lengths, *caches],
                             [name + ".out", present_k, present_v], name=name, domain=MS_DOMAIN,
                             scale=layer.scale, **kernel_attributes(layer.form)),
            helper.make_node("Slice", [name + ".out", "attention.first", "attention.last", "attention.rows_axis"],
                             [layer.out], name=name + ".rows")]


def _resize_kv(model, rows: int) -> None:
    """Every KV buffer input and output of the graph as [1, Hkv, rows, D]."""
    for value in [*model.graph.input, *model.graph.output]:
        dims = value.type.tensor_type.shape.dim
        if io_names.is_kv(value.name) and len(dims) == 4:
            dims[2].dim_value = rows


CONSTANTS = {"attention.pads": [0, 0, 0, 0, 1, 0], "attention.first": [0], "attention.last": [-1],
             "attention.rows_axis": [1], "attention.flat": [0, 0, -1]}


def fuse_attention(model, max_context: int, kernel_ok=None) -> int:
    """Every layer of a form the kernel computes as one GroupQueryAttention, in place; how many.
    `kernel_ok(KernelForm) -> bool`: whether the kernel keeps rows independent for that form here
    (gqa_probe; None: assumed). The graph's KV buffers become max_context + 1 rows (the padded
    row's) whether or not any layer is fused, so that every graph of a bundle takes the same buffers."""
    from onnx import numpy_helper

    _resize_kv(model, max_context + 1)
    found = attention_match.layers(model)
    tables = _tables(model, {t for layer in found for t in layer.tables}, max_context + 1) if found else {}
    found = [layer for layer in found if all(t in tables and tables[t].shape[1] * 2 == layer.form.head_dim
                                             for t in layer.tables)
             and _countable_window(layer.form)
             and (kernel_ok is None or kernel_ok(layer.form))]
    if not found:
        return 0
    model.graph.initializer.extend([
        *(numpy_helper.from_array(tables[t].astype(np.float32), t + ".cache") for t in {t for x in found for t in x.tables}),
        *(numpy_helper.from_array(np.array(v, np.int64), k) for k, v in CONSTANTS.items()),
        numpy_helper.from_array(np.array([1], np.int32), "attention.one")])
    lengths = _lengths(model, found[0])
    gone = {id(n) for layer in found for n in layer.gone}
    nodes = [n for n in model.graph.node if id(n) not in gone]
    for layer in found:
        nodes += _kernel_nodes(layer, tuple(t + ".cache" for t in layer.tables), lengths)
    _drop_dead(model, _topological(model, nodes))
    use_ms_domain(model)
    return len(found)


def fused_count(graph, windowed: bool = False) -> int:
    """How many GroupQueryAttention kernels the ONNX file `graph` runs (`windowed`: sliding ones only)."""
    import onnx

    return sum(n.op_type == OP and (not windowed or any(a.name == "local_window_size" for a in n.attribute))
               for n in onnx.load(str(graph), load_external_data=False).graph.node)
