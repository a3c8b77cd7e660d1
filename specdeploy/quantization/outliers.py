"""Activation outlier channels computed in float beside MatMulNBits.

MatMulNBits (accuracy level 4) rounds each activation row to int8 per block of K, so one channel
far larger than its neighbours sets its block's step and the other 31 round to a few levels. The
example's matmul inputs have such channels in fixed places (down projections up to 4600x the
median channel, norm outputs 15-60x: lab/scripts/outlier_channels.py). Those channels are masked to zero
before the MatMulNBits and their product is added in float32 from the same (dequantized) weight
rows: x @ W = (x * mask) @ W + x[:, c] @ W[c, :]. Every op in the term (Mul, Gather, a small float
matmul, Add) computes a row from that row alone, so rows stay independent (the bundle's row check
asserts it); the channels are found once, from the fp32 graphs on the calibration text.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

import numpy as np

from .activations import matmul_activations

FACTOR = 6.0            # a channel whose largest |x| is this many times the median channel's
MAX_FRACTION = 1 / 16   # at most this share of K (the term's float matmul stays small)


def channel_maxima(graph_file: Path, feeds: list[Callable[[], dict]]) -> dict[str, np.ndarray]:
    """Largest |x| per channel [K] of every weight matmul's input, over the calibration feeds."""
    maxima: dict[str, np.ndarray] = {}
    for values in matmul_activations(graph_file, feeds):
        for name, rows in values.items():
            top = np.abs(rows).max(axis=0)                                           # [K]
            maxima[name] = np.maximum(maxima[name], top) if name in maxima else top
    return maxima


def outlier_channels(maxima: dict[str, np.ndarray], factor: float = FACTOR,
                     max_fraction: float = MAX_FRACTION) -> dict[str, np.ndarray]:
    """Per activation, the channels to compute in float (the largest, up to the cap; by index)."""
    chosen = {}
    for name, top in maxima.items():
        median = float(np.median(top))
        candidates = np.flatnonzero(top > factor * median) if median > 0 else np.zeros(0, np.int64)
        limit = max(1, int(len(top) * max_fraction))
        if len(candidates):
            keep = candidates[np.argsort(top[candidates])[::-1][:limit]]
            chosen[name] = np.sort(keep).astype(np.int64)
    return chosen


def symmetric_rows(blocks, channels: np.ndarray) -> np.ndarray:
    """Rows `channels` [C, N] of the weight a MatMulNBits over `blocks` computes (an offset term,
    where there is one, reads the whole activation and stays as it is)."""
    return np.ascontiguousarray(dataclasses.replace(blocks, offsets=None).dequantize()[channels])


def outlier_nodes(model, x: str, k: int, product: str, out: str, rows: np.ndarray, channels: np.ndarray,
                  shared: dict) -> tuple[str, list, list]:
    """(the masked input the MatMulNBits reads, nodes making it, nodes adding x[..., channels] @ rows
    to `product` as `out`) for an activation of width `k`. The mask and the gathered channels are
    made once per activation (`shared`), for every matmul reading it."""
    from onnx import helper, numpy_helper

    prelude = []
    if x not in shared:
        shared[x] = (f"{x}.inliers", f"{x}.outliers")
        mask = np.ones(k, np.float32)
        mask[channels] = 0.0
        model.graph.initializer.extend([numpy_helper.from_array(mask, f"{x}.inlier_mask"),
                                        numpy_helper.from_array(channels, f"{x}.outlier_channels")])
        prelude += [helper.make_node("Mul", [x, f"{x}.inlier_mask"], [f"{x}.inliers"], name=f"{x}.inliers"),
                    helper.make_node("Gather", [x, f"{x}.outlier_channels"], [f"{x}.outliers"],
                                     name=f"{x}.outliers", axis=-1)]
    inliers, gathered = shared[x]
    weight = f"{out}.outlier_rows"
    model.graph.initializer.append(numpy_helper.from_array(rows.astype(np.float32), weight))  # [C, N]
    term = [helper.make_node("MatMul", [gathered, weight], [f"{out}.outlier_term"], name=f"{out}.outlier_term"),
            helper.make_node("Add", [product, f"{out}.outlier_term"], [out], name=f"{out}.add_outliers")]
    return inliers, prelude, term
