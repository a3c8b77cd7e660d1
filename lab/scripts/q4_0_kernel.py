"""A Q4_0 matmul kernel of our own (q4_0_kernel.c) against ONNX Runtime's MatMulNBits, same weights.

    python lab/scripts/q4_0_kernel.py [--pairs 14] [--tokens 20] [--repeats 5]

At 1.5B decoding streams the weights; ONNX Runtime's int4 kernel packs 6 bits a weight, a Q4_0
file stores 4.5. This asks what reading the file's own blocks would buy: a chain of --pairs MLP
matmul pairs of a 1.5B model's shape (1,536 -> 8,960 -> 1,536, 2 x 14 = 28 weights, 217 MB of
Q4_0, far beyond the caches), one row at a time as decoding runs it, through one ONNX Runtime
session of MatMulNBits nodes (blocks of 32, accuracy level 4: the bundle's form) and through the C
kernel called per weight, interleaved. It also checks the kernel's rows are bitwise independent
and that both agree with the float product of the dequantized weights. Needs gcc; builds with
-march=native into a temporary directory.
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
QK = 32


def build(directory: Path) -> ctypes.CDLL:
    library = directory / "q4_0_kernel.so"
    subprocess.run(["gcc", "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", str(HERE / "q4_0_kernel.c"),
                    "-o", str(library)], check=True)
    lib = ctypes.CDLL(str(library))
    for kernel in (lib.q4_0_matmul, lib.q4_0x4_matmul):
        kernel.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                           ctypes.c_int, ctypes.c_void_p]
    return lib


def interleaved(qs: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The same bytes, 4 columns a block together: qs [N/4, K/32, 4, 16], d [N/4, K/32, 4]."""
    n, nb = d.shape
    return (np.ascontiguousarray(qs.reshape(n // 4, 4, nb, 16).transpose(0, 2, 1, 3)),
            np.ascontiguousarray(d.reshape(n // 4, 4, nb).transpose(0, 2, 1)))


def random_q4_0(k: int, n: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """(qs [N, K/32, 16] uint8, d [N, K/32] float16), scaled so that a product keeps its input's norm."""
    qs = rng.integers(0, 256, (n, k // QK, 16), dtype=np.uint8)
    d = (rng.uniform(0.5, 1.5, (n, k // QK)) / (4.6 * np.sqrt(k))).astype(np.float16)
    return qs, d


def values(qs: np.ndarray) -> np.ndarray:
    """The 4-bit values [N, K/32, 32] in block order (byte j: weights j and j + 16)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def dequantized(qs: np.ndarray, d: np.ndarray) -> np.ndarray:
    """W [K, N] float32."""
    w = (values(qs).astype(np.float32) - 8) * d.astype(np.float32)[..., None]         # [N, K/32, 32]
    return w.reshape(len(qs), -1).T


def matmulnbits_inputs(qs: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """MatMulNBits' B [N, K/32, 16] (byte i: weights 2i, 2i + 1) and scales [N * K/32] float32."""
    v = values(qs)
    return (v[..., 0::2] | (v[..., 1::2] << 4)).astype(np.uint8), d.astype(np.float32).ravel()


def session(weights: list[tuple[np.ndarray, np.ndarray]]):
    import onnxruntime as ort
    from onnx import TensorProto as T, helper, numpy_helper

    nodes, inits, name = [], [], "x"
    for i, (qs, d) in enumerate(weights):
        b, scales = matmulnbits_inputs(qs, d)
        n, k = qs.shape[0], qs.shape[1] * QK
        inits += [numpy_helper.from_array(b, f"b{i}"), numpy_helper.from_array(scales, f"s{i}")]
        nodes.append(helper.make_node("MatMulNBits", [name, f"b{i}", f"s{i}"], [f"y{i}"], domain="com.microsoft",
                                      K=k, N=n, bits=4, block_size=QK, accuracy_level=4))
        name = f"y{i}"
    k_in, n_out = weights[0][0].shape[1] * QK, weights[-1][0].shape[0]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", T.FLOAT, ["M", k_in])],
                              [helper.make_tensor_value_info(name, T.FLOAT, ["M", n_out])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def ours(lib, x: np.ndarray, qs: np.ndarray, d: np.ndarray, four: bool = False) -> np.ndarray:
    """x [M, K] @ W through the kernel: `four`, the interleaved layout (qs, d from `interleaved`)."""
    x = np.ascontiguousarray(x, dtype=np.float32)                                      # [M, K]
    n = d.shape[0] * d.shape[2] if four else len(qs)
    y = np.empty((len(x), n), np.float32)                                              # [M, N]
    kernel = lib.q4_0x4_matmul if four else lib.q4_0_matmul
    status = kernel(x.ctypes.data, len(x), x.shape[1], qs.ctypes.data, d.ctypes.data, n, y.ctypes.data)
    if status:
        raise RuntimeError(f"{kernel.__name__} returned {status} (-3: built without AVX-512 VNNI)")
    return y


def checks(lib, weights, rng) -> str:
    qs, d = weights[0]
    x = rng.standard_normal((5, qs.shape[1] * QK)).astype(np.float32)                  # [5, K]
    together = ours(lib, x, qs, d)
    alone = np.concatenate([ours(lib, x[i:i + 1], qs, d) for i in range(len(x))])
    if not np.array_equal(together, alone):
        raise SystemExit("the kernel's rows are not independent")
    exact = x @ dequantized(qs, d)
    runtime = session([weights[0]]).run(None, {"x": x})[0]
    error = lambda y: float(np.linalg.norm(y - exact) / np.linalg.norm(exact))  # noqa: E731
    line = (f"rows bitwise independent (5 rows = each alone); relative error against the float product: "
            f"ours {error(together):.4f}, MatMulNBits {error(runtime):.4f}")
    if not wide(lib):
        return line
    four = interleaved(qs, d)
    together = ours(lib, x, *four, four=True)
    if not np.array_equal(together, np.concatenate([ours(lib, x[i:i + 1], *four, four=True) for i in range(len(x))])):
        raise SystemExit("the interleaved kernel's rows are not independent")
    return f"{line}, ours interleaved {error(together):.4f}"


def wide(lib) -> bool:
    """Whether the interleaved kernel was built (AVX-512 VNNI)."""
    probe = np.zeros((1, QK), np.float32), np.zeros((1, 1, 4, 16), np.uint8), np.zeros((1, 1, 4), np.float16)
    y = np.zeros((1, 4), np.float32)
    return lib.q4_0x4_matmul(probe[0].ctypes.data, 1, QK, probe[1].ctypes.data, probe[2].ctypes.data, 4,
                             y.ctypes.data) == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=1536)
    parser.add_argument("--n", type=int, default=8960)
    parser.add_argument("--pairs", type=int, default=14)
    parser.add_argument("--tokens", type=int, default=20, help="one-row chains timed per repeat")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    weights = [random_q4_0(k, n, rng) for _ in range(args.pairs) for k, n in ((args.k, args.n), (args.n, args.k))]
    stored = sum(qs.nbytes + d.nbytes for qs, d in weights)
    with tempfile.TemporaryDirectory() as directory:
        lib = build(Path(directory))
        print(checks(lib, weights, rng))
        runtime = session(weights)
        x = rng.standard_normal((1, args.k)).astype(np.float32)                        # [1, K]

        four = [interleaved(qs, d) for qs, d in weights] if wide(lib) else []

        def chain(layouts, **kind):
            y = x
            for qs, d in layouts:
                y = ours(lib, y, qs, d, **kind)
            return y
        sides = {"MatMulNBits": lambda: runtime.run(None, {"x": x}), "ours": lambda: chain(weights)}
        if four:
            sides["interleaved"] = lambda: chain(four, four=True)
        times = {name: [] for name in sides}
        for _ in range(args.repeats + 1):  # the first round warms both up and is dropped
            for name, run in sides.items():
                start = time.perf_counter()
                for _ in range(args.tokens):
                    run()
                times[name].append((time.perf_counter() - start) / args.tokens)
    per = {name: statistics.median(t[1:]) * 1e3 for name, t in times.items()}
    print(f"{len(weights)} weights [{args.k} <-> {args.n}], {stored / 1e6:.0f} MB as Q4_0; median ms a row:")
    for name, ms in per.items():
        print(f"  {name:12s} {ms:7.2f} ms  {stored / ms / 1e6:5.1f} GB/s of Q4_0 bytes")
    for name in sides:
        if name != "MatMulNBits":
            print(f"{name} / MatMulNBits speed: {per['MatMulNBits'] / per[name]:.2f}x")


if __name__ == "__main__":
    main()
