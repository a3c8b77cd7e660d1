"""specdeploy's Q4_0MatMul (or Q8MatMul) against MatMulNBits inside ONNX Runtime, by rows a call.

    python lab/scripts/q4_0_op_rows.py [--pairs 14] [--rows 1,5,16,64] [--repeats 10] [--head]

--head: instead, a 1.5B model's 8-bit LM head (1,536 -> 151,936, 233 MB) as Q8MatMul and as an
8-bit MatMulNBits over the same blocks.

Two sessions, built with the runtime's own session options: a chain of --pairs MLP matmul pairs
of a 1.5B model's shape (1,536 -> 8,960 -> 1,536; 14 pairs = 28 weights, 193 MB as Q4_0, beyond
the caches), every weight once as Q4_0MatMul and once as MatMulNBits (blocks of 32, accuracy level
4: the bundle's form) over the same blocks. Each row count is timed interleaved, median of
--repeats: one row is decoding, five a verify pass, more a prefill chunk. The weights here live
in ONNX Runtime's own memory on 4 KB pages (the runtime reads a bundle's Q4_0 weights onto 2 MB
pages, and MatMulNBits' packed copy is collapsed onto them), so this measures the kernels, not
the pages. Needs the operator built (`specdeploy build-kernels`).
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

HIDDEN, FFN = 1536, 8960


def session(kind: str, pairs: int):
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from specdeploy import kernels
    from specdeploy.backends.onnxruntime import session_options
    from specdeploy.quantization import nbits, operators, q4_0

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, None, HIDDEN])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    model = helper.make_model(helper.make_graph([], "chain", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    current = "x"
    for i in range(2 * pairs):
        k, n = (HIDDEN, FFN) if i % 2 == 0 else (FFN, HIDDEN)
        w = (np.random.default_rng(i).standard_normal((k, n)) * 0.02).astype(np.float32)
        blocks = q4_0.half_scales(nbits.quantize(w, 4, 32, "absmax"))
        out = "y" if i == 2 * pairs - 1 else f"h{i}"
        node = helper.make_node("MatMul", [current, f"w{i}"], [out], name=f"m{i}")
        made = (q4_0.matmul_node(model, node, f"w{i}", blocks) if kind == "q4_0"
                else nbits.matmul_node(model, node, f"w{i}", blocks, 4))
        model.graph.node.append(made)
        current = out
    operators.use_domain(model)
    options = session_options(operators=(kernels.Q4_0,) if kind == "q4_0" else ())
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def head_session(kind: str):
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from specdeploy import kernels
    from specdeploy.backends.onnxruntime import session_options
    from specdeploy.quantization import nbits, operators, q8

    vocab = 151936
    w = (np.random.default_rng(0).standard_normal((HIDDEN, vocab)) * 0.02).astype(np.float32)
    blocks = nbits.quantize(w, 8, 32, "absmax")
    del w
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, None, HIDDEN])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    model = helper.make_model(helper.make_graph([], "head", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="m")
    model.graph.node.append(q8.matmul_node(model, node, "w", blocks) if kind == "q4_0"
                            else nbits.matmul_node(model, node, "w", blocks, 4))
    operators.use_domain(model)
    options = session_options(operators=(kernels.Q4_0,) if kind == "q4_0" else ())
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=14)
    parser.add_argument("--rows", default="1,5,16,64")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--head", action="store_true")
    args = parser.parse_args()
    make = head_session if args.head else lambda kind: session(kind, args.pairs)
    sessions = {kind: make(kind) for kind in ("q4_0", "matmulnbits")}
    rng = np.random.default_rng(0)
    ours = "Q8MatMul" if args.head else "Q4_0MatMul"
    what = "a 1.5B model's 8-bit LM head" if args.head else f"{2 * args.pairs} weights of a 1.5B model's MLP"
    print(f"{what}; ms a call, median of {args.repeats}, interleaved")
    print(f"| rows | {ours} | MatMulNBits | MatMulNBits / {ours} |")
    print("|---|---|---|---|")
    for rows in (int(r) for r in args.rows.split(",")):
        x = rng.standard_normal((1, rows, HIDDEN)).astype(np.float32)
        times = {kind: [] for kind in sessions}
        for s in sessions.values():
            s.run(None, {"x": x})
        for _ in range(args.repeats):
            for kind, s in sessions.items():
                began = time.perf_counter()
                s.run(None, {"x": x})
                times[kind].append(time.perf_counter() - began)
        ours, theirs = (1000 * statistics.median(times[k]) for k in ("q4_0", "matmulnbits"))
        print(f"| {rows} | {ours:.2f} | {theirs:.2f} | {theirs / ours:.2f}× |")


if __name__ == "__main__":
    main()
