"""The TensorRT-facing form of an int4 / int8 graph, from the same quantized weights.

TensorRT builds block-wise weight-only quantization from `DequantizeLinear` with `block_size`
(signed INT4 or INT8 weights, float32 scales of the same rank, blocked along K, zero points
absent) feeding a MatMul; it does not run ONNX Runtime's `MatMulNBits` / `GatherBlockQuantized`.
So each of those becomes DequantizeLinear(W_q [K, N], scales [K/block, N], axis=0, block_size) →
MatMul (or Gather for the embedding), holding exactly the values the ONNX Runtime graph computes
with. TensorRT requires strictly positive scales: blocks with a negative scale (4-bit blocks whose
largest magnitude is positive) are stored with both signs flipped, in INT8 where 4 bits would
need +8 (so an int4 graph's TensorRT weights may be INT8: exact values, twice the bytes), and
refused where 8 bits would need +128 (ONNX Runtime's own 8-bit quantizer), so values stay exact.
The fused rotary and residual-norm nodes of the ONNX Runtime graph go back to standard ops first
(`unfuse`), and matmuls handed a padded second row (two_rows.py) take their own rows again; fused
sibling matmuls stay one MatMul and a Split, and a GGUF Q4_1 weight's offset term
(nbits.offset_nodes) is standard ops already and stays as it is. A folded one (folding.py: integer
zero points and block-sum rows, which TensorRT's weight-only path does not take) goes back to that
offset form over the input before the block sums were appended, holding the offsets the folded
node computes with.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from . import folding, nbits, two_rows
from ..optimize.graph import attrs as _attrs, set_nodes, use_ms_domain

SUFFIX = ".trt.onnx"  # beside graph.onnx: what build-engines parses for an int4/int8 graph


def positive_blocks(blocks: nbits.Blocks) -> tuple[np.ndarray, np.ndarray, int]:
    """(q [N, nb, block], scales [N, nb] > 0, bits) holding the same values as `blocks`."""
    sign = np.where(blocks.scales < 0, -1, 1).astype(np.int16)                  # [N, nb]
    q = blocks.q.astype(np.int16) * sign[..., None]
    scales = np.abs(blocks.scales)
    bits = blocks.bits if q.max() < 2 ** (blocks.bits - 1) else 8
    if q.max() > 127:
        raise ValueError("int8 blocks at -128 with a negative scale have no positive-scale form; "
                         "quantize with --method rtn or mse (positive scales)")
    return q, np.where(scales == 0, np.float32(1e-30), scales).astype(np.float32), bits


def _dq_weight(model, name: str, blocks: nbits.Blocks, transpose: bool) -> list:
    """DequantizeLinear nodes producing float `name` ([K, N], or [N, K] for a gathered table)."""
    import ml_dtypes
    from onnx import helper, numpy_helper

    q, scales, bits = positive_blocks(blocks)
    n, nb, block = q.shape
    values = q.reshape(n, nb * block)                                            # [N, K]
    scale_2d = scales                                                             # [N, nb]
    if not transpose:
        values, scale_2d, axis = values.T, scale_2d.T, 0                         # [K, N], [nb, N]
    else:
        axis = 1
    dtype = ml_dtypes.int4 if bits == 4 else np.int8
    model.graph.initializer.extend([
        numpy_helper.from_array(np.ascontiguousarray(values).astype(dtype), name + ".w"),
        numpy_helper.from_array(np.ascontiguousarray(scale_2d), name + ".s")])
    return [helper.make_node("DequantizeLinear", [name + ".w", name + ".s"], [name], axis=axis,
                             block_size=block, name=name + ".dq")]


def _unfused_norm(node) -> list:
    from onnx import helper

    total = node.output[3] if len(node.output) > 3 and node.output[3] else node.name + ".sum"
    return [helper.make_node("Add", list(node.input[:2]), [total], name=node.name + ".add"),
            helper.make_node("RMSNormalization", [total, node.input[2]], [node.output[0]], name=node.name + ".norm",
                             axis=-1, epsilon=_attrs(node).get("epsilon", 1e-5), stash_type=1)]


def _unfused_rotary(model, node, tables: dict) -> list:
    """x * cos + rotate_half(x) * sin with the [B, 1, S, D] tables rebuilt from the half ones."""
    from onnx import helper, numpy_helper

    nodes = []
    x, name = node.input[0], node.name
    for half in node.input[1:3]:
        if half not in tables:
            tables[half] = half + ".full"
            axis = half + ".axis"
            model.graph.initializer.append(numpy_helper.from_array(np.array([1], np.int64), axis))
            nodes += [helper.make_node("Concat", [half, half], [half + ".both"], axis=-1, name=half + ".both"),
                      helper.make_node("Unsqueeze", [half + ".both", axis], [tables[half]], name=half + ".full")]
    cos, sin = tables[node.input[1]], tables[node.input[2]]
    return nodes + [
        helper.make_node("Split", [x], [name + ".x1", name + ".x2"], axis=-1, num_outputs=2, name=name + ".split"),
        helper.make_node("Neg", [name + ".x2"], [name + ".neg"], name=name + ".neg"),
        helper.make_node("Concat", [name + ".neg", name + ".x1"], [name + ".rot"], axis=-1, name=name + ".rot"),
        helper.make_node("Mul", [x, cos], [name + ".xcos"], name=name + ".xcos"),
        helper.make_node("Mul", [name + ".rot", sin], [name + ".rsin"], name=name + ".rsin"),
        helper.make_node("Add", [name + ".xcos", name + ".rsin"], list(node.output), name=name + ".sum")]


def unfuse(model) -> int:
    """Rotary and residual-norm nodes of `fusion.fuse_float` back as standard ONNX ops (TensorRT runs
    neither contrib op); how many."""
    nodes, tables, count = [], {}, 0
    for node in model.graph.node:
        if node.op_type == "SkipSimplifiedLayerNormalization":
            nodes += _unfused_norm(node)
        elif node.op_type == "RotaryEmbedding" and node.domain in ("", "ai.onnx") and len(node.input) == 3:
            nodes += _unfused_rotary(model, node, tables)
        else:
            nodes.append(node)
            continue
        count += 1
    set_nodes(model, nodes)
    return count


def convert(model) -> int:
    """Rewrite `model` in place; returns how many quantized nodes were converted."""
    from onnx import helper, numpy_helper

    unfuse(model)
    two_rows.unpad(model)
    inits = {t.name: t for t in model.graph.initializer}
    array = lambda name: numpy_helper.to_array(inits[name])                      # noqa: E731
    joined = {n.output[0]: n.input for n in model.graph.node if n.op_type == "Concat"}
    nodes, count, sums = [], 0, {}
    for node in model.graph.node:
        a = _attrs(node)
        if node.op_type == "MatMulNBits" and len(node.input) == 4 and node.input[0] in joined:
            nodes += _unfolded(model, node, a, array, joined[node.input[0]], sums)
        elif node.op_type == "MatMulNBits" and len(node.input) == 3:
            blocks = nbits.unpack(array(node.input[1]), array(node.input[2]), a["bits"], a["block_size"])
            weight = node.name + ".weight"
            nodes += _dq_weight(model, weight, blocks, transpose=False)
            nodes.append(helper.make_node("MatMul", [node.input[0], weight], list(node.output), name=node.name))
        elif node.op_type == "GatherBlockQuantized":
            data = array(node.input[0])
            blob = data.reshape(data.shape[0], -1, a["block_size"] * a["bits"] // 8)
            blocks = nbits.unpack(blob, array(node.input[2]), a["bits"], a["block_size"])
            table = node.name + ".table"
            nodes += _dq_weight(model, table, blocks, transpose=True)
            nodes.append(helper.make_node("Gather", [table, node.input[1]], list(node.output), name=node.name))
        else:
            nodes.append(node)
            continue
        count += 1
    set_nodes(model, _read(nodes, {o.name for o in model.graph.output}))
    use_ms_domain(model, used=False)
    return count


def _unfolded(model, node, a: dict, array, joined, sums: dict) -> list:
    """A folded MatMulNBits over [x, block sums of x] as DequantizeLinear → MatMul over x plus the
    offset term over the same block sums."""
    from onnx import helper

    x, block_sums = joined
    sums.setdefault(x, block_sums)
    blocks = folding.unfold(array(node.input[1]), array(node.input[2]), array(node.input[3]), a["K"], a["bits"],
                            a["block_size"])
    weight, product = node.name + ".weight", node.name + ".product"
    return [*_dq_weight(model, weight, blocks, transpose=False),
            helper.make_node("MatMul", [x, weight], [product], name=node.name),
            *nbits.offset_nodes(model, x, product, node.output[0], blocks.offsets, sums)]


def _read(nodes: list, outputs: set) -> list:
    """`nodes` without the Concats nothing reads any more (those the folded matmuls read)."""
    read = outputs | {name for n in nodes for name in n.input}
    return [n for n in nodes if n.op_type != "Concat" or n.output[0] in read]


def write(src: Path, dst: Path, standard_norms: bool = False) -> int:
    """The TensorRT-facing copy of graph `src` at `dst` (its own external data file); `standard_norms`:
    RMSNormalization as the operators it is defined by (TensorRT before 10.14: optimize/decompose.py)."""
    import onnx

    model = onnx.load(str(src))
    if any(n.op_type == "GroupQueryAttention" for n in model.graph.node):
        raise ValueError("its attention is ONNX Runtime's GroupQueryAttention; quantize with --tensorrt "
                         "(or --attention ops), which keeps attention op by op")
    count = convert(model)
    if standard_norms:
        from ..optimize.decompose import rms_norms

        rms_norms(model)
    onnx.save(model, str(dst), save_as_external_data=True, location=dst.name + ".data")
    return count
