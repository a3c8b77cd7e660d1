"""What re-quantizing an fp32 bundle's weights to int4 costs, per method, and what its source left to measure.

Usage: python lab/scripts/requant_error.py BUNDLE [--graphs draft verify head] [--alphas 0.1 0.2 0.3 0.4 0.5]
BUNDLE is an fp32 bundle; `--graphs` limits the run to those graphs (a 262k-row head takes long).
First: how many weight matmuls are already on a 4-bit grid, i.e. reproduced bitwise by minmax int4
in blocks of 32 (`quantize --method minmax`'s grid, GGUF Q4_1's). An export of a Q4_1 GGUF is:
every such weight comes back exactly from any method on that grid, so comparing methods on them
measures nothing but the symmetric grids' loss. Then, for each weight NOT on that grid, the
relative output error over the calibration text (what `quantize` calibrates with),
trace(ΔWᵀ H ΔW) / trace(Wᵀ H W) with H = XᵀX of its input, for: rtn, mse, minmax, gptq (the
quantizer's methods) and activation-aware scaling (AWQ-style: input channel k scaled by
s_k = rms(x_k)^α before rounding, 1/s_k applied to the activation) over minmax and over gptq, at
the α of the grid best for minmax, chosen per weight (optimistic: weights reading one activation
would have to share it). Last, per method, the geometric mean of its error over gptq's and on how
many weights it is the lowest. The scaling is measured here only; `quantize` does not offer it.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def on_grid(w: np.ndarray) -> bool:
    from specdeploy.quantization import nbits

    return w.shape[0] % nbits.OFFSET_BLOCK == 0 and np.array_equal(nbits.quantize(w, 4, 32, "minmax").dequantize(), w)


def weights(graph_file: Path) -> list[tuple[str, str, np.ndarray]]:
    """(activation, weight name, W [K, N]) of every initializer-weight MatMul, as the quantizer sees them."""
    import onnx
    from onnx import numpy_helper

    from specdeploy.quantization.rewrites import fold_weight_transposes

    model = onnx.load(str(graph_file))
    fold_weight_transposes(model)
    inits = {t.name: t for t in model.graph.initializer}
    return [(n.input[0], n.input[1], numpy_helper.to_array(inits[n.input[1]]))
            for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in inits
            and len(inits[n.input[1]].dims) == 2]


def relative_error(w: np.ndarray, approx: np.ndarray, gram: np.ndarray) -> float:
    delta = np.asarray(w, np.float64) - np.asarray(approx, np.float64)           # [K, N]
    h = np.asarray(gram, np.float64)
    return float(np.sum(delta * (h @ delta)) / np.sum(w * (h @ np.asarray(w, np.float64))))


def errors(w: np.ndarray, gram: np.ndarray, alphas: list[float]) -> tuple[dict[str, float], float]:
    from specdeploy.quantization import gptq, nbits

    found = {m: relative_error(w, nbits.quantize(w, 4, 32, m).dequantize(), gram) for m in ("absmax", "mse", "minmax")}
    found = {"rtn" if m == "absmax" else m: e for m, e in found.items()}
    found["gptq"] = relative_error(w, gptq.quantize(w, gram, 4, 32, "minmax").dequantize(), gram)
    rms = np.sqrt(np.maximum(np.diag(gram), 1e-12))                                # [K]

    def scaled(alpha: float, rounding) -> float:
        s = rms ** alpha
        s = s / np.sqrt(s.max() * s.min())                                         # [K], centred as AWQ does
        ws = (w * s[:, None]).astype(np.float32)                                   # [K, N] on the scaled input
        return relative_error(w, rounding(ws, gram / np.outer(s, s)) / s[:, None], gram)

    by_alpha = {a: scaled(a, lambda ws, g: nbits.quantize(ws, 4, 32, "minmax").dequantize()) for a in alphas}
    best = min(by_alpha, key=by_alpha.get)
    found["minmax+awq"] = by_alpha[best]
    found["gptq+awq"] = scaled(best, lambda ws, g: gptq.quantize(ws, g.astype(np.float32), 4, 32, "minmax").dequantize())
    return found, best


def summary(rows: list[dict]) -> list[str]:
    """Per method: geometric mean of its error over gptq's, and on how many weights it is lowest."""
    lowest = [min(r, key=r.get) for r in rows]
    return [f"{m:10s} {np.exp(np.mean([np.log(r[m] / r['gptq']) for r in rows])):8.3f}× gptq's error, "
            f"lowest on {lowest.count(m)} of {len(rows)}" for m in rows[0]]


def main() -> None:
    from specdeploy.bundle import manifest as manifest_io
    from specdeploy.quantization import feeds, gptq

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--graphs", nargs="+", help="graphs whose weights off the grid are priced (default: all)")
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.1, 0.2, 0.3, 0.4, 0.5])
    args = parser.parse_args()
    manifest = manifest_io.read(args.bundle)
    off_grid, total = {}, 0
    for name, graph in manifest.graphs.items():
        if args.graphs and name not in args.graphs:
            continue
        for activation, weight, w in weights(args.bundle / graph.file):
            total += 1
            if not on_grid(w):
                off_grid.setdefault(name, []).append((activation, weight, w))
    print(f"{total - sum(map(len, off_grid.values()))} of {total} weight matmuls are on minmax int4's grid "
          f"already (reproduced bitwise in blocks of 32)")
    if not off_grid:
        return
    samples = feeds.calibration_feeds(args.bundle, manifest, feeds.calibration_texts(None, every=True))
    rows = []
    for name, found in off_grid.items():
        grams = gptq.gram_matrices(args.bundle / manifest.graphs[name].file, samples[name])
        for activation, weight, w in found:
            row, alpha = errors(w, grams[activation], args.alphas)
            rows.append(row)
            print(f"{name} {weight} K={w.shape[0]} N={w.shape[1]} α {alpha}: relative output error "
                  + ", ".join(f"{m} {e:.3e}" for m, e in row.items()), flush=True)
    print("\n".join(summary(rows)))


if __name__ == "__main__":
    from sides import run_script

    run_script(main)
