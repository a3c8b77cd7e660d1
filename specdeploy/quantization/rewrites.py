"""ONNX graph rewrites behind weight-only quantization: weights become initializers a quantizer
sees, activation Q/DQ pairs are dropped, INT8 weights become E4M3, FP32 weights become FP16 behind Casts.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..optimize.graph import array, deferred, set_nodes

KEEP_FLOAT = ("down_proj",)  # MatMuls whose weights' names contain these stay in float
def float_matmuls(model, keep=KEEP_FLOAT) -> list[str]:
    """Names of MatMul nodes whose weight (directly or through a Transpose) is one to keep in float."""
    inits = {t.name for t in model.graph.initializer if any(k in t.name for k in keep)}
    transposed = {n.output[0] for n in model.graph.node if n.op_type == "Transpose" and n.input[0] in inits}
    return [n.name for n in model.graph.node
            if n.op_type == "MatMul" and any(i in inits or i in transposed for i in n.input)]


def fold_weight_transposes(model) -> None:
    """Replace Transpose(initializer) with the transposed initializer, so quantizers see weights.

    The export keeps weights untransposed (so a tied LM head is stored once); a quantized weight is
    a new tensor anyway, and a quantizer only recognises a MatMul weight that is an initializer.
    """
    from onnx import helper

    inits = {t.name: t for t in model.graph.initializer}
    keep = []
    for node in model.graph.node:
        if node.op_type == "Transpose" and node.input[0] in inits:
            source = inits[node.input[0]]
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
            dims = [source.dims[i] for i in perm] if perm else list(source.dims)[::-1]
            transposed = lambda t=source, p=perm: np.transpose(array(t), p)  # noqa: E731
            model.graph.initializer.append(
                deferred(node.output[0], dims, helper.tensor_dtype_to_np_dtype(source.data_type), transposed))
        else:
            keep.append(node)
    set_nodes(model, keep)


E4M3_MAX = 448.0


def drop_activation_qdq(model) -> None:
    """Remove activation Quantize/Dequantize pairs, keeping weight-only dequantization.

    Quantizing activations on a coarse FP8 grid turns the last-bit differences between a one-row
    and a many-row matmul into whole quantization steps; weight-only FP8 keeps the verify pass
    batch-invariant, so greedy speculative output stays identical to plain output.
    """
    from onnx import helper

    producers = {n.output[0]: n for n in model.graph.node if n.op_type == "QuantizeLinear"}
    nodes, dropped = [], set()
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and node.input[0] in producers:
            q = producers[node.input[0]]
            dropped.add(id(q))
            nodes.append(helper.make_node("Identity", [q.input[0]], [node.output[0]], name=node.name + "_fp"))
        else:
            nodes.append(node)
    set_nodes(model, (n for n in nodes if id(n) not in dropped))


def int8_weights_to_fp8(model):
    """Turn the INT8 weight dequantization into FLOAT8E4M3FN with per-channel scales."""
    import ml_dtypes
    from onnx import numpy_helper

    inits = {t.name: t for t in model.graph.initializer}

    def replace(name, array):
        new = numpy_helper.from_array(array, name)
        inits[name].CopyFrom(new)

    done = set()
    for node in model.graph.node:
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear") or node.input[1] in done:
            continue
        x, scale, zero = node.input[0], node.input[1], node.input[2]
        s = numpy_helper.to_array(inits[scale]).astype(np.float32)
        if node.op_type == "DequantizeLinear" and x in inits:  # a weight: re-quantize per channel
            axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
            w = numpy_helper.to_array(inits[x]).astype(np.float32) * np.expand_dims(s, 1 - axis if s.ndim else 0)
            amax = np.abs(w).max(axis=1 - axis, keepdims=True)
            new_s = np.maximum(amax, 1e-12) / E4M3_MAX
            replace(x, (w / new_s).astype(ml_dtypes.float8_e4m3fn))
            replace(scale, new_s.reshape(s.shape).astype(np.float32))
        else:
            continue
        replace(zero, np.zeros(numpy_helper.to_array(inits[zero]).shape, ml_dtypes.float8_e4m3fn))
        done.add(scale)
    return model


def to_fp16(src: Path, dst: Path) -> None:
    """FP16 weights with FP32 activations and KV: each weight is stored in float16 behind a Cast.

    Float16 activations round every intermediate result, which turns the last-bit differences
    between a one-row and a many-row matmul into different tokens (measured on the example model:
    an exact float16 tie between the top two logits, broken differently by plain and speculative
    decoding). Weight-only float16 halves the weights and keeps greedy identity; ONNX Runtime folds
    the casts when it loads the graph.
    """
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(src))
    casts = []
    for tensor in model.graph.initializer:
        if tensor.data_type != onnx.TensorProto.FLOAT or np.prod(tensor.dims) < 1024:
            continue
        name = tensor.name
        half = numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float16), name + ".fp16")
        tensor.CopyFrom(half)
        casts.append(helper.make_node("Cast", [name + ".fp16"], [name], to=onnx.TensorProto.FLOAT,
                                      name=name + ".cast"))
    set_nodes(model, casts + list(model.graph.node))
    onnx.save(model, str(dst), save_as_external_data=True, location=dst.name + ".data")
