"""MatMulNBits that never sees one row: blocks of 32 kept row-independent on CPUs without VNNI.

ONNX Runtime's CPU `MatMulNBits` at 4 bits takes one kernel for a one-row call and another for
two rows or more. On AVX2 alone the two differ in the last bits at blocks of 32 and larger, so a
verify row would not be bitwise the one-row step, and a bundle in blocks of 32 fails the row
check; only blocks of 16 pass there, which ONNX Runtime packs at 8 bits a weight. But every call of
two rows or more computes each row as the two-row call does (probed here: rows 0..8 of calls of
2, 3, 4, 5 and 9 rows, bitwise). So such a node reads its input with one zero row padded after
the last, and its output drops that row: a one-row step becomes a two-row call, every row of
every call comes from the same kernel, and the bundle's row check passes with blocks of 32 (6
bits a weight packed; the two-row call is still cheaper than the one-row call in blocks of 16).
The same trick the fused attention plays on its kernel (optimize/attention.py).

Whether a node needs it is measured on this CPU by a one-node probe (`kernel_rows`); the bundle's
row check then covers the whole graphs, here and at load elsewhere.
"""
from __future__ import annotations

import functools

import numpy as np

from ..optimize.graph import MS_DOMAIN, attrs, set_nodes

OP = "MatMulNBits"
PROBE_ROWS = (2, 3, 4, 5, 9)   # call sizes compared with the same rows computed alone / two at a time
CONSTANTS = {"two_rows.pads": [0, 1], "two_rows.axes": [-2], "two_rows.first": [0], "two_rows.last": [-1]}


def _probe_session(bits: int, block: int, zero_points: bool, k: int, n: int, seed: int):
    import onnxruntime as ort
    from onnx import TensorProto as T, helper, numpy_helper

    rng, blocks = np.random.default_rng(seed), k // block
    inits = [numpy_helper.from_array(rng.integers(0, 256, (n, blocks, block * bits // 8), dtype=np.uint8), "b"),
             numpy_helper.from_array((rng.random(n * blocks) * 0.02 + 1e-3).astype(np.float32), "scales")]
    if zero_points:
        packed = n * ((blocks * bits + 7) // 8)
        inits.append(numpy_helper.from_array(rng.integers(0, 256, packed, dtype=np.uint8), "zero_points"))
    node = helper.make_node(OP, ["x", *(t.name for t in inits)], ["y"], domain=MS_DOMAIN, K=k, N=n, bits=bits,
                            block_size=block, accuracy_level=4)
    graph = helper.make_graph([node], "probe", [helper.make_tensor_value_info("x", T.FLOAT, ["M", k])],
                              [helper.make_tensor_value_info("y", T.FLOAT, ["M", n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS_DOMAIN, 1)])
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@functools.lru_cache(maxsize=None)
def kernel_rows(bits: int, block: int, zero_points: bool = False, k: int = 1536, n: int = 512,
                seed: int = 0) -> int | None:
    """The fewest rows from which this CPU's MatMulNBits in this form computes each row bitwise
    the same however many rows a call carries: 1 (row-independent as it is), 2 (once a call never
    carries one row alone), or None (neither: the form is not offered here)."""
    session = _probe_session(bits, block, zero_points, k, n, seed)
    x = np.random.default_rng(seed + 1).standard_normal((max(PROBE_ROWS), k)).astype(np.float32)  # [M, K]
    run = lambda rows: session.run(None, {"x": rows})[0]  # noqa: E731
    alone = np.concatenate([run(x[i:i + 1]) for i in range(len(x))])
    if all(np.array_equal(run(x[:m]), alone[:m]) for m in PROBE_ROWS):
        return 1
    zero = np.zeros((1, k), np.float32)
    paired = np.concatenate([run(np.concatenate([x[i:i + 1], zero]))[:1] for i in range(len(x))])
    return 2 if all(np.array_equal(run(x[:m]), paired[:m]) for m in PROBE_ROWS) else None


def node_rows(node) -> int | None:
    """`kernel_rows` for a MatMulNBits node's own form."""
    a = attrs(node)
    return kernel_rows(a["bits"], a["block_size"], len(node.input) > 3 and bool(node.input[3]))


def policy(asked: bool | None):
    """`pad_rows`' `needs` for ComputeOptions.two_rows: None, as this CPU's kernel needs; True,
    every int4 node in blocks of 32 or more (a bundle made on a VNNI machine for AVX2 devices);
    False, none (to measure what it costs)."""
    if asked is None:
        return node_rows
    return lambda node: 2 if asked and attrs(node)["bits"] == 4 and attrs(node)["block_size"] >= 32 else 1


def pad_rows(model, needs=node_rows) -> int:
    """Every MatMulNBits of `model` whose kernel `needs(node)` two rows reads its input with a zero
    row padded after the last (one Pad per input, shared by the nodes reading it) and writes its
    output without it; in place; how many nodes. Activations are [B, S, K]: rows are axis -2."""
    from onnx import helper, numpy_helper

    nodes, padded, count = [], {}, 0
    for node in model.graph.node:
        if node.op_type != OP or needs(node) != 2:
            nodes.append(node)
            continue
        x, out = node.input[0], node.output[0]
        if x not in padded:
            padded[x] = f"{x}.two_rows"
            nodes.append(helper.make_node("Pad", [x, "two_rows.pads", "", "two_rows.axes"], [padded[x]],
                                          name=padded[x]))
        node.input[0], node.output[0] = padded[x], f"{out}.two_rows"
        nodes += [node, helper.make_node("Slice", [node.output[0], "two_rows.first", "two_rows.last", "two_rows.axes"],
                                         [out], name=f"{out}.two_rows.drop")]
        count += 1
    if count:
        present = {t.name for t in model.graph.initializer}
        model.graph.initializer.extend(numpy_helper.from_array(np.array(v, np.int64), k)
                                       for k, v in CONSTANTS.items() if k not in present)
        set_nodes(model, nodes)
    return count


def unpad(model) -> int:
    """`pad_rows` undone in place (for TensorRT's form, whose kernels are not these); how many nodes."""
    pads = {n.output[0]: n for n in model.graph.node if n.op_type == "Pad" and n.name.endswith(".two_rows")}
    drops = {n.input[0]: n for n in model.graph.node if n.op_type == "Slice" and n.name.endswith(".two_rows.drop")}
    count = 0
    for node in model.graph.node:
        if node.op_type == OP and node.input[0] in pads and node.output[0] in drops:
            node.input[0], node.output[0] = pads[node.input[0]].input[0], drops[node.output[0]].output[0]
            count += 1
    gone = {id(n) for n in [*pads.values(), *drops.values()]}
    set_nodes(model, [n for n in model.graph.node if id(n) not in gone])
    return count


def padded_count(graph) -> int:
    """How many MatMulNBits of the ONNX file `graph` read a padded row."""
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    return sum(n.op_type == OP and n.input[0].endswith(".two_rows") for n in model.graph.node)
