"""int4 blocks of 32 with a float16 scale and minimum each, computed by specdeploy's `Q4_1MatMul`
(kernels/q4_k_matmul.c, beside Q4_KMatMul): GGUF's Q4_1 (the example model's layers) read in
place, nibbles in Q4_0MatMul's interleave and each block's d and m as float16, 5 bits a weight as
the file holds them. MatMulNBits computes such blocks as symmetric ones plus an offset folded in as
K/32 more rows (6 bits a weight packed, and those rows); this applies each minimum exactly, times
the activation's block sum.
"""
from __future__ import annotations

import numpy as np

from ..kernels import DOMAIN
from .nbits import Blocks, SuperScales
from .q4_0 import COLUMNS, nibbles, unpack_nibbles

OP = "Q4_1MatMul"
BLOCK = 32


def takes(blocks: Blocks) -> bool:
    """Whether `blocks` carry a Q4_1 source's own d and m: blocks of 32, a multiple of sixteen columns."""
    own = blocks.super_scales
    n, _, block = blocks.q.shape
    return own is not None and own.kind == "Q4_1" and blocks.bits == 4 and block == BLOCK and not n % COLUMNS


def pack(blocks: Blocks) -> tuple[np.ndarray, np.ndarray]:
    """(qs uint8 [N/16, K/32, 256] as Q4_0MatMul's, of q in 0..15; dm float16 [N/16, K/32, 32]: per
    block the sixteen columns' d, then their m)."""
    return nibbles(blocks.q), scale_halves(blocks.super_scales)


def scale_halves(own: SuperScales) -> np.ndarray:
    """dm float16 [N/16, K/32, 32] of a Q4_1 (or Q5_1) weight's own d and m (see `pack`)."""
    n, nb = own.d.shape
    by_group = lambda a: a.astype(np.float16).reshape(n // COLUMNS, COLUMNS, nb).transpose(0, 2, 1)  # noqa: E731
    return np.ascontiguousarray(np.concatenate([by_group(own.d), by_group(own.dmin)], axis=-1))


def own_scales(dm: np.ndarray, kind: str = "Q4_1") -> SuperScales:
    """Inverse of `scale_halves`."""
    groups, nb, _ = dm.shape
    rows = lambda a: np.ascontiguousarray(a.transpose(0, 2, 1).reshape(groups * COLUMNS, nb))  # noqa: E731
    return SuperScales(kind, rows(dm[..., :COLUMNS]), dmin=rows(dm[..., COLUMNS:]))


def symmetric(own: SuperScales, top: int) -> tuple[np.ndarray, np.ndarray]:
    """(scales d, offsets m + top·d) float32 [N, K/32]: BlockIndex's symmetric form of q in 0..2·top−1."""
    d = own.d.astype(np.float32)
    return d, own.dmin.astype(np.float32) + np.float32(top) * d


def unpack(qs: np.ndarray, dm: np.ndarray) -> Blocks:
    """Inverse of `pack`, in BlockIndex's symmetric form (q − 8, scale d, offset m + 8·d)."""
    own = own_scales(dm)
    d, offsets = symmetric(own, 8)
    return Blocks(unpack_nibbles(qs), d, 4, offsets, own)


def matmul_node(model, node, weight_name: str, blocks: Blocks):
    """MatMul `node` (x @ initializer `weight_name`) as a Q4_1MatMul over `blocks` (`takes`)."""
    from onnx import helper, numpy_helper

    qs, dm = pack(blocks)
    q_name, s_name = f"{weight_name}.q4_1", f"{weight_name}.q4_1_scales"
    model.graph.initializer.extend([numpy_helper.from_array(qs, q_name), numpy_helper.from_array(dm, s_name)])
    n, nb, _ = blocks.q.shape
    return helper.make_node(OP, [node.input[0], q_name, s_name], list(node.output), name=node.name + ".q4_1",
                            domain=DOMAIN, K=nb * BLOCK, N=n)
