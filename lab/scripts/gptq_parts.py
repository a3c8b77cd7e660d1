"""GPTQ's parts at one weight's shape, each against the form it replaced, in one process.

    python lab/scripts/gptq_parts.py [--k 8960] [--n 1536] [--rows 10816]

The shape defaults to a 1.5B model's MLP down projection over the calibration rows a byte-level
tokenizer makes of the built-in text. Random activations spanning 64 directions plus noise, one
channel 20x the rest (as in LLMs); times are the best of --repeats.
  gram:   H = Xᵀ X, the blocks on and above the diagonal mirrored (gptq._gram) / the whole product;
  factor: one Cholesky of the reversed H, its inverse by halves (gptq._inverse_factor) /
          Cholesky -> cholesky_inverse -> upper Cholesky of the inverse;
  inverse: L⁻¹ by halves, the corner by two triangular solves (gptq._lower_inverse) / by two
          dense products;
  walk:   the column walk (gptq.quantize with the factor made) / row-by-row numpy updates.
"""
from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np

from specdeploy.quantization import gptq, nbits


def _best(fn, repeats: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def _full_gram(x: np.ndarray) -> np.ndarray:
    gram = np.zeros((x.shape[1],) * 2, np.float32)
    for start in range(0, len(x), 512):
        rows = np.asarray(x[start:start + 512])
        gram += rows.T @ rows
    return gram


def _cholesky_factor(gram: np.ndarray) -> np.ndarray:
    import torch

    h = torch.tensor(gram)
    h.diagonal().add_(gptq.DAMP * float(torch.diagonal(h).mean()))
    return torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True).numpy()


def _products_inverse(lower):
    """L⁻¹ by halves with the corner -C⁻¹ B A⁻¹ as two dense products (the form before the solves)."""
    import torch

    k = len(lower)
    if k <= gptq.INVERSE_LEAF:
        return torch.linalg.solve_triangular(lower, torch.eye(k, dtype=lower.dtype), upper=False)
    half = k // 2
    first, second = _products_inverse(lower[:half, :half]), _products_inverse(lower[half:, half:])
    inverse = torch.zeros_like(lower)
    inverse[:half, :half], inverse[half:, half:] = first, second
    inverse[half:, :half] = -(second @ lower[half:, :half]) @ first
    return inverse


def _numpy_walk(w: np.ndarray, u: np.ndarray, order: np.ndarray, block: int) -> np.ndarray:
    """The walk as numpy row by row (4 bits, symmetric grid): each row's error over its chunk by an outer product."""
    base = nbits.quantize(w, 4, block, "absmax")
    scales, w, k = base.scales.T[order // block], w[order].copy(), w.shape[0]
    q = np.zeros(w.shape, np.int8)
    for start in range(0, k, gptq.CHUNK):
        end = min(start + gptq.CHUNK, k)
        errors = np.zeros((end - start, w.shape[1]), np.float32)
        for i in range(start, end):
            q[i] = np.clip(np.rint(w[i] / scales[i]), -8, 7)
            errors[i - start] = (w[i] - q[i] * scales[i]) / u[i, i]
            w[i + 1:end] -= np.outer(u[i, i + 1:end], errors[i - start])
        w[end:] -= u[start:end, end:].T @ errors
    return q


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=8960)
    parser.add_argument("--n", type=int, default=1536)
    parser.add_argument("--rows", type=int, default=10816)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.NamedTemporaryFile(suffix=".f32") as spilled:
        for start in range(0, args.rows, 2048):
            part = rng.normal(size=(min(2048, args.rows - start), 64)) @ rng.normal(size=(64, args.k))
            part += 0.3 * rng.normal(size=part.shape)
            part[:, 7] *= 20
            part.astype(np.float32).tofile(spilled)
        spilled.flush()
        x = np.memmap(spilled.name, dtype=np.float32, mode="r").reshape(-1, args.k)      # [rows, K]
        new, gram = _best(lambda: gptq._gram(x), args.repeats)
        old, _ = _best(lambda: _full_gram(x), args.repeats)
    print(f"gram   K {args.k} x {args.rows} rows: mirrored {new:.2f} s, whole {old:.2f} s ({old / new:.2f}x)")
    order = np.argsort(-np.diag(gram), kind="stable")
    ordered = np.ascontiguousarray(gram[np.ix_(order, order)])
    new, u = _best(lambda: gptq._inverse_factor(ordered), args.repeats)
    old, _ = _best(lambda: _cholesky_factor(ordered), args.repeats)
    print(f"factor K {args.k}: reversed Cholesky + halves {new:.2f} s, Cholesky inverse route {old:.2f} s "
          f"({old / new:.2f}x)")
    import torch

    damped = torch.from_numpy(ordered).flip((0, 1)) + gptq.DAMP * float(np.diag(ordered).mean()) * torch.eye(args.k)
    lower = torch.linalg.cholesky(damped)                                                # [K, K]
    new, _ = _best(lambda: gptq._lower_inverse(lower), args.repeats)
    old, _ = _best(lambda: _products_inverse(lower), args.repeats)
    print(f"inverse K {args.k}: corners by solves {new:.2f} s, by products {old:.2f} s ({old / new:.2f}x)")
    w = (rng.normal(size=(args.k, args.n)) * 0.02).astype(np.float32)
    hessian = gptq.Hessian(gram)
    hessian.__dict__["factor"] = (order, u)  # made above: time the walk alone
    new, _ = _best(lambda: gptq.quantize(w, hessian, 4, 32), args.repeats)
    old, _ = _best(lambda: _numpy_walk(w, u, order, 32), args.repeats)
    print(f"walk   [{args.k}, {args.n}]: torch strides {new:.2f} s, numpy rows {old:.2f} s ({old / new:.2f}x)")


if __name__ == "__main__":
    main()
