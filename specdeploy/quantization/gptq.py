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

from pathlib import Path
from typing import Callable

import numpy as np

from . import nbits
from .activations import matmul_activations

DAMP = 0.01   # share of H's mean diagonal added to it: channels the text rarely uses stay invertible
CHUNK = 128   # rows whose updates to the later rows are applied as one matmul
GRAM_ROWS = 512  # activation rows multiplied into the Gram matrices at once


def gram_matrices(graph_file: Path, feeds: list[Callable[[], dict]]) -> dict[str, np.ndarray]:
    """H = Xᵀ X [K, K] of every weight matmul's input over the calibration feeds (float32: GPTQ
    damps H anyway, and these are the quantizer's largest allocation).

    A feed carries 32 rows; Xᵀ X over so few rewrites all K² sums for each 32 rows (memory-bound:
    1.7 s per 4,096 rows at K = 1,536 on a 2-core CPU), so rows are gathered and multiplied
    GRAM_ROWS at a time (0.2 s)."""
    grams: dict[str, np.ndarray] = {}
    pending: dict[str, list[np.ndarray]] = {}

    def add(name: str) -> None:
        x = np.concatenate(pending.pop(name))                                       # [rows, K]
        if name in grams:
            grams[name] += x.T @ x
        else:
            grams[name] = x.T @ x

    for values in matmul_activations(graph_file, feeds):
        for name, rows in values.items():
            pending.setdefault(name, []).append(rows.astype(np.float32))            # [rows, K]
            if sum(len(r) for r in pending[name]) >= GRAM_ROWS:
                add(name)
    for name in list(pending):
        add(name)
    return grams


def _inverse_factor(gram: np.ndarray) -> np.ndarray:
    """Upper U with Uᵀ U = (H + damping)⁻¹: row i of U spreads row i's error over rows i+1…"""
    h = np.array(gram, np.float64)
    diag = np.diag(h).copy()
    unused = diag <= 0
    h[unused, unused] = 1.0  # a channel the text never uses: rounded to nearest, its error kept
    h[np.diag_indices_from(h)] += DAMP * float(np.mean(np.diag(h)))
    return np.linalg.cholesky(np.linalg.inv(h)).T


def quantize(w: np.ndarray, gram: np.ndarray, bits: int, block: int, grid: str = "absmax") -> nbits.Blocks:
    """Blocks of W [K, N] (x @ W) by GPTQ over H = `gram` [K, K] on round-to-nearest's grid: its
    block scales (and, for "minmax", its float offset per 32 of K), set from W before the walk.

    Rows are rounded busiest channel first (largest H diagonal: the outlier channels, whose errors
    cost most, go while every other row can still absorb them); a block's rows are then no longer
    contiguous, which is why its scale is fixed beforehand."""
    k, n = w.shape
    if k % block or (grid == "minmax" and k % nbits.OFFSET_BLOCK):
        raise ValueError(f"K={k} is not a multiple of the block size {block}")
    base = nbits.quantize(np.asarray(w, np.float32), bits, block, grid)            # q [N, K/block, block]
    order = np.argsort(-np.diag(gram), kind="stable")                              # [K]
    row_scales = base.scales.T[order // block].astype(np.float64)                 # [K, N], walk order
    row_offsets = (np.zeros_like(row_scales) if base.offsets is None
                   else base.offsets.T[order // nbits.OFFSET_BLOCK].astype(np.float64))
    u = _inverse_factor(np.asarray(gram)[np.ix_(order, order)])                   # [K, K]
    w = np.array(w, np.float64)[order]                                            # [K, N], updated
    top = 2 ** (bits - 1)
    q = np.zeros((k, n), np.int8)
    for start in range(0, k, CHUNK):
        end = min(start + CHUNK, k)
        errors = np.zeros((end - start, n))                                       # [chunk, N]
        for i in range(start, end):
            q[i] = np.clip(np.rint((w[i] - row_offsets[i]) / row_scales[i]), -top, top - 1)
            errors[i - start] = (w[i] - q[i] * row_scales[i] - row_offsets[i]) / u[i, i]
            w[i + 1:end] -= np.outer(u[i, i + 1:end], errors[i - start])
        w[end:] -= u[start:end, end:].T @ errors
    restored = np.empty_like(q)
    restored[order] = q
    return nbits.Blocks(np.ascontiguousarray(restored.T).reshape(n, k // block, block), base.scales, bits,
                        base.offsets)


def output_error(w: np.ndarray, dequantized: np.ndarray, gram: np.ndarray) -> float:
    """Σ over the calibration rows of |x @ W - x @ Ŵ|², from H alone: trace(ΔWᵀ H ΔW)."""
    delta = np.asarray(w, np.float64) - np.asarray(dequantized, np.float64)       # [K, N]
    return float(np.einsum("kn,kj,jn->", delta, gram, delta))
