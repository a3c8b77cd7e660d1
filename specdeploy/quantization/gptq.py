"""GPTQ: a weight's K rows rounded in turn, each row's error folded into the rows not yet rounded.

Round-to-nearest leaves every weight's error where it falls; what the model feels is the error of
x @ W over the activations it sees. GPTQ (Frantar et al., 2022) rounds the rows of W one at a time
and moves each row's rounding error onto the rows still to come, weighted by how the input
channels correlate (the inverse of H = Xᵀ X over calibration activations), so that later rows
cancel it. The result keeps MatMulNBits' layout and grid (nbits.py: the same kernels, the same
row independence) and round-to-nearest's block scales. It applies where weights are re-quantized; a GGUF's own blocks
are carried as they are.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Callable

import numpy as np

from . import nbits
from .activations import graph_activations

DAMP = 0.01   # share of H's mean diagonal added to it: channels the text rarely uses stay invertible
CHUNK = 128   # rows whose updates to the later rows are applied as one matmul
STRIDE = 16   # rows within a CHUNK whose updates to the rest of it are applied as one matmul
INVERSE_LEAF = 512  # a triangular factor this small is inverted by one triangular solve
COLUMNS = 1 << 24  # weights (K x columns) walked at once: 64 MB of float32
GRAM_ROWS = 2048  # activation rows multiplied into the Gram matrices at once
GRAM_BLOCK = 512  # H's rows made by one product (the blocks below the diagonal are mirrored)


class SpilledGrams:
    """H = Xᵀ X [K, K] of each weight matmul's input over the calibration feeds, made when GPTQ asks
    for that input's (`get`), only the last one kept (float32: GPTQ damps H anyway).

    A graph's matrices all at once were its largest allocation: K² floats per input, ~7 GB for a
    1.5B model's verify graph. Here one pass of the fp32 graph spills every input's rows to a file
    of their own (rows x K floats: a few hundred KB a token), and one input's H is summed from its
    file GRAM_ROWS rows at a time when its weight is rounded: 0.3 GB at K = 8,960. The files live in
    a temporary directory beside the bundle, removed by `close` (or with this object). The same pass
    keeps the graph's `outputs` per feed (`self.outputs`): the next graph's calibration input."""

    def __init__(self, graph_file: Path, feeds: list[Callable[[], dict]], outputs: tuple[str, ...] = ()):
        import tempfile

        self._dir = tempfile.TemporaryDirectory(dir=graph_file.parent.parent, prefix=".activations-")
        self._files: dict[str, tuple[Path, int]] = {}
        self._last: tuple[str | None, Hessian | None] = (None, None)
        self.outputs: dict[str, list[np.ndarray]] = {name: [] for name in outputs}
        handles = {}
        try:
            for values, made in graph_activations(graph_file, feeds, outputs):
                for name, value in made.items():
                    self.outputs[name].append(value)
                for name, rows in values.items():
                    if name not in handles:
                        path = Path(self._dir.name) / f"{len(handles)}.f32"
                        handles[name], self._files[name] = open(path, "wb"), (path, rows.shape[1])
                    handles[name].write(np.ascontiguousarray(rows, dtype=np.float32).tobytes())
        finally:
            for handle in handles.values():
                handle.close()

    def get(self, name: str) -> Hessian | None:
        """The input's H; the last one asked for is kept (with its factor, once made), as the
        matmuls reading one input (q, k and v; gate and up) are rounded one after another."""
        if name not in self._files:
            return None
        if self._last[0] != name:
            self._last = (None, None)  # freed before the next is made
            path, k = self._files[name]
            self._last = (name, Hessian(_gram(np.memmap(path, dtype=np.float32, mode="r").reshape(-1, k))))
        return self._last[1]

    def close(self) -> None:
        self._last = (None, None)
        self._dir.cleanup()


class Hessian:
    """H = Xᵀ X of one matmul input and, made when first asked for, GPTQ's walk order and the
    inverse's factor over it: once for all the weights that read that input."""

    def __init__(self, gram: np.ndarray):
        self.gram = np.asarray(gram)

    @functools.cached_property
    def factor(self) -> tuple[np.ndarray, np.ndarray]:
        """(order [K], U [K, K]): rows walked busiest channel first (see `quantize`)."""
        order = np.argsort(-np.diag(self.gram), kind="stable")
        return order, _inverse_factor(self.gram[np.ix_(order, order)])


def _gram(x: np.ndarray) -> np.ndarray:
    """Xᵀ X [K, K] of the rows X [rows, K] (a memory map), GRAM_ROWS rows at a time: the blocks on
    and above the diagonal in matrix products, the rest mirrored (H is symmetric: at K = 8,960 over
    10,816 rows 4.8 s against 7.5 s for the whole product, lab/scripts/gptq_parts.py)."""
    import torch

    k = x.shape[1]
    gram = torch.zeros((k, k), dtype=torch.float32)                                       # [K, K]
    for start in range(0, len(x), GRAM_ROWS):
        rows = torch.from_numpy(np.array(x[start : start + GRAM_ROWS]))                   # [rows, K], read
        for first in range(0, k, GRAM_BLOCK):
            last = min(first + GRAM_BLOCK, k)
            gram[first:last, first:].addmm_(rows[:, first:last].T, rows[:, first:])
    for first in range(GRAM_BLOCK, k, GRAM_BLOCK):
        gram[first:, first - GRAM_BLOCK:first] = gram[first - GRAM_BLOCK:first, first:].T
    return gram.numpy()


def gram_matrices(graph_file: Path, feeds: list[Callable[[], dict]]) -> dict[str, np.ndarray]:
    """Every input's H at once (what tests and probes compare against SpilledGrams)."""
    spilled = SpilledGrams(graph_file, feeds)
    try:
        return {name: spilled.get(name).gram for name in spilled._files}
    finally:
        spilled.close()


def _inverse_factor(gram: np.ndarray) -> np.ndarray:
    """Upper U with Uᵀ U = (H + damping)⁻¹: row i of U spreads row i's error over rows i+1…

    From one Cholesky factor of H with its rows and columns reversed (J H J = L Lᵀ, so H⁻¹ =
    (J L⁻¹ J)ᵀ (J L⁻¹ J), and J L⁻¹ J is upper) and L's inverse by halves in matrix products, in
    float32 (the damping keeps H well conditioned): at K = 8,960, a 1.5B model's MLP down
    projection, 4.9 s on 2 cores against 6.0 s for factoring H, inverting it and factoring the
    inverse (lab/scripts/gptq_parts.py)."""
    import torch

    h = torch.tensor(np.asarray(gram), dtype=torch.float32)
    unused = torch.nonzero(torch.diagonal(h) <= 0).flatten()
    h[unused, unused] = 1.0  # a channel the text never uses: rounded to nearest, its error kept
    h.diagonal().add_(DAMP * float(torch.diagonal(h).mean()))
    lower = torch.linalg.cholesky(torch.flip(h, (0, 1)))                            # [K, K]
    return torch.flip(_lower_inverse(lower), (0, 1)).numpy()


def _lower_inverse(lower):
    """L⁻¹ of a lower-triangular L [K, K]: [[A, 0], [B, C]]⁻¹ = [[A⁻¹, 0], [-C⁻¹ B A⁻¹, C⁻¹]], the
    halves recursively and the corner by two triangular solves (C X A = -B), about K³/3 operations
    in all (a triangular solve against the identity computes through its zeros: K³; the corner as two
    dense products: 2K³/3). At K = 8,960 2.3 s against 2.8 s as products (lab/scripts/gptq_parts.py)."""
    import torch

    k = len(lower)
    if k <= INVERSE_LEAF:
        return torch.linalg.solve_triangular(lower, torch.eye(k, dtype=lower.dtype), upper=False)
    half = k // 2
    first, second = _lower_inverse(lower[:half, :half]), _lower_inverse(lower[half:, half:])
    inverse = torch.zeros_like(lower)
    inverse[:half, :half], inverse[half:, half:] = first, second
    corner = torch.linalg.solve_triangular(lower[half:, half:], lower[half:, :half], upper=False)  # C⁻¹ B
    inverse[half:, :half] = -torch.linalg.solve_triangular(lower[:half, :half], corner, upper=False, left=False)
    return inverse


def quantize(w: np.ndarray, gram: np.ndarray | Hessian, bits: int, block: int, grid: str = "absmax",
             half: bool = False) -> nbits.Blocks:
    """Blocks of W [K, N] (x @ W) by GPTQ over H = `gram` [K, K] on round-to-nearest's grid: its
    block scales (and, for "minmax", its float offset per 32 of K), set from W before the walk
    (`half`: minmax's in float16, Q4_1's form, for specdeploy's Q4_1MatMul).

    Rows are rounded busiest channel first (largest H diagonal: the outlier channels, whose errors
    cost most, go while every other row can still absorb them); a block's rows are then no longer
    contiguous, which is why its scale is fixed beforehand. Output columns never mix (each is its
    own least-squares problem over the same H), so W is walked COLUMNS weights at a time: a 1.5B
    model's 151,936-column LM head in float32 slices of 64 MB, not float64 copies of 1.9 GB."""
    k, n = w.shape
    if k % block or (grid == "minmax" and k % nbits.OFFSET_BLOCK):
        raise ValueError(f"K={k} is not a multiple of the block size {block}")
    order, u = (gram if isinstance(gram, Hessian) else Hessian(gram)).factor      # [K], [K, K]
    width = max(1, COLUMNS // k)
    return nbits.Blocks.joined([_walk(np.asarray(w[:, c:c + width], np.float32), u, order, bits, block, grid, half)
                                for c in range(0, n, width)])


def _walk(w: np.ndarray, u: np.ndarray, order: np.ndarray, bits: int, block: int, grid: str,
          half: bool = False) -> nbits.Blocks:
    """`quantize` for the columns W [K, n] (float32), over H's factor `u` in walk `order`.

    A row's error reaches the rows after it in three steps: the rest of its STRIDE rows at once (an
    outer product in place), the rest of its CHUNK when its STRIDE is done, the rows after the
    CHUNK when that is done (matmuls): the same sums as row by row, most of them in BLAS, in place
    (at [1,536, 8,960] 0.37 s against 0.49 s for numpy's row by row; at [8,960, 1,536] no faster:
    lab/scripts/gptq_parts.py)."""
    import torch

    k, n = w.shape
    base = nbits.quantize(w, bits, block, grid, half)                              # q [n, K/block, block]
    scales = torch.from_numpy(np.ascontiguousarray(base.scales.T[order // block], np.float32))   # [K, n]
    offsets = (torch.zeros_like(scales) if base.offsets is None else
               torch.from_numpy(np.ascontiguousarray(base.offsets.T[order // nbits.OFFSET_BLOCK], np.float32)))
    w = torch.from_numpy(np.ascontiguousarray(w[order], np.float32))               # [K, n], updated
    u = torch.from_numpy(np.ascontiguousarray(u, np.float32))                      # [K, K]
    top = 2 ** (bits - 1)
    q = torch.empty((k, n), dtype=torch.int8)
    for start in range(0, k, CHUNK):
        end = min(start + CHUNK, k)
        errors = torch.empty((end - start, n), dtype=torch.float32)                 # [chunk, n]
        for first in range(start, end, STRIDE):
            last = min(first + STRIDE, end)
            for i in range(first, last):
                rounded = torch.clamp(torch.round((w[i] - offsets[i]) / scales[i]), -top, top - 1)  # [n]
                q[i] = rounded
                errors[i - start] = (w[i] - rounded * scales[i] - offsets[i]) / u[i, i]
                w[i + 1:last].addr_(u[i, i + 1:last], errors[i - start], alpha=-1)
            w[last:end].addmm_(u[first:last, last:end].T, errors[first - start:last - start], alpha=-1)
        w[end:].addmm_(u[start:end, end:].T, errors, alpha=-1)
    restored = np.empty((k, n), np.int8)
    restored[order] = q.numpy()
    return nbits.Blocks(np.ascontiguousarray(restored.T).reshape(n, k // block, block), base.scales, bits,
                        base.offsets, base.super_scales)


def output_error(w: np.ndarray, dequantized: np.ndarray, gram: np.ndarray) -> float:
    """Σ over the calibration rows of |x @ W - x @ Ŵ|², from H alone: trace(ΔWᵀ H ΔW)."""
    delta = np.asarray(w, np.float64) - np.asarray(dequantized, np.float64)       # [K, N]
    return float(np.einsum("kn,kj,jn->", delta, gram, delta))
