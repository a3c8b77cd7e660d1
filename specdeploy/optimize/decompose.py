"""Standard ONNX operators in place of ones a target's parser does not import.

RMSNormalization (opset 23) has no importer in TensorRT before 10.14 (JetPack 6 ships 10.3): it
becomes what it is defined as, Y = X / sqrt(mean(X², last axis) + ε) · scale, computed in float32
(its stash_type), from operators every TensorRT since 8 reads. The arithmetic differs from the fused
kernel's by rounding only; the bundle's own graphs (what ONNX Runtime runs) keep the fused node.
"""
from __future__ import annotations

import numpy as np

from .graph import attrs, set_nodes


def rms_norms(model) -> int:
    """Replace every RMSNormalization node in `model` in place; returns how many."""
    from onnx import TensorProto, helper, numpy_helper

    out, count = [], 0
    for node in model.graph.node:
        if node.op_type != "RMSNormalization" or node.domain not in ("", "ai.onnx"):
            out.append(node)
            continue
        a = attrs(node)
        if a.get("axis", -1) != -1:
            raise ValueError(f"{node.name}: RMSNormalization over axis {a['axis']} (only the last is decomposed)")
        p = f"{node.name or node.output[0]}/rms"
        eps = numpy_helper.from_array(np.array(a.get("epsilon", 1e-5), np.float32), p + "/eps")
        axes = numpy_helper.from_array(np.array([-1], np.int64), p + "/axes")
        model.graph.initializer.extend([eps, axes])
        x, scale = node.input[0], node.input[1]
        out += [
            helper.make_node("Cast", [x], [p + "/x"], to=TensorProto.FLOAT, name=p + "/cast"),
            helper.make_node("Mul", [p + "/x", p + "/x"], [p + "/sq"], name=p + "/square"),
            helper.make_node("ReduceMean", [p + "/sq", axes.name], [p + "/mean"], keepdims=1, name=p + "/mean"),
            helper.make_node("Add", [p + "/mean", eps.name], [p + "/var"], name=p + "/add_eps"),
            helper.make_node("Sqrt", [p + "/var"], [p + "/rms"], name=p + "/sqrt"),
            helper.make_node("Div", [p + "/x", p + "/rms"], [p + "/normed"], name=p + "/div"),
            helper.make_node("CastLike", [p + "/normed", x], [p + "/back"], name=p + "/cast_back"),
            helper.make_node("Mul", [p + "/back", scale], [node.output[0]], name=p + "/scale"),
        ]
        count += 1
    set_nodes(model, out)
    return count


def sequence_splits(model) -> int:
    """SplitToSequence whose every use is a SequenceAt of a constant index, as one Split.

    torch's exporter writes `tensor.chunk(n)` (Phi-3's fused gate and up projection) as a sequence;
    ONNX Runtime's CUDA provider and TensorRT's parser have no kernel for SplitToSequence, and a
    Split computes the same slices. Returns how many were replaced."""
    from onnx import helper, numpy_helper

    if not any(n.op_type == "SplitToSequence" for n in model.graph.node):
        return 0
    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer if _inline(t)}
    consts.update({n.output[0]: numpy_helper.to_array(a.t) for n in model.graph.node if n.op_type == "Constant"
                   for a in n.attribute if a.name == "value"})
    shapes = _shapes(model)
    uses: dict = {}
    for node in model.graph.node:
        for name in node.input:
            uses.setdefault(name, []).append(node)
    replaced, dropped, out = 0, set(), []
    for node in model.graph.node:
        sizes = _split_sizes(node, consts, shapes, uses)
        if sizes is None:
            out.append(node)
            continue
        readers = sorted(uses[node.output[0]], key=lambda n: int(consts[n.input[1]]))
        names = [f"{node.output[0]}/{i}" for i in range(len(sizes))]
        for reader in readers:
            names[int(consts[reader.input[1]])] = reader.output[0]
            dropped.add(id(reader))
        sizes_name = f"{node.output[0]}/sizes"
        model.graph.initializer.append(numpy_helper.from_array(np.array(sizes, np.int64), sizes_name))
        out.append(helper.make_node("Split", [node.input[0], sizes_name], names, axis=attrs(node).get("axis", 0),
                                    name=node.name + "/split"))
        replaced += 1
    set_nodes(model, [n for n in out if id(n) not in dropped])
    return replaced


def _inline(tensor) -> bool:
    from onnx import TensorProto

    return tensor.data_location != TensorProto.EXTERNAL


def _shapes(model) -> dict[str, list[int]]:
    """Static dimensions of the graph's values, inferred without reading weights (which an export
    may not have written yet): initializers stand in as inputs of their shape."""
    from onnx import helper, shape_inference

    copy = type(model)()
    copy.CopyFrom(model)
    stand_ins = [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in copy.graph.initializer]
    del copy.graph.initializer[:]
    copy.graph.input.extend(stand_ins)
    inferred = shape_inference.infer_shapes(copy)
    return {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in [*inferred.graph.value_info, *inferred.graph.input]}


def _split_sizes(node, consts: dict, shapes: dict, uses: dict) -> list[int] | None:
    """The slice sizes a SplitToSequence makes, where it can be one Split (else None)."""
    if node.op_type != "SplitToSequence" or attrs(node).get("keepdims", 1) != 1 or len(node.input) < 2:
        return None
    readers = uses.get(node.output[0], [])
    if not readers or any(r.op_type != "SequenceAt" or r.input[1] not in consts for r in readers):
        return None
    split = consts.get(node.input[1])
    if split is None:
        return None
    if split.ndim == 1:
        sizes = [int(s) for s in split]
    else:
        dims = shapes.get(node.input[0])
        axis = attrs(node).get("axis", 0)
        dim = dims[axis] if dims else 0
        if not dim:
            return None
        size = int(split)
        sizes = [size] * (dim // size) + ([dim % size] if dim % size else [])
    indices = [int(consts[r.input[1]]) for r in readers]
    if len(set(indices)) != len(indices) or not all(0 <= i < len(sizes) for i in indices):
        return None  # a slice read twice, or from the end: left as the exporter wrote it
    return sizes
