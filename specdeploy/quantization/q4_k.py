"""int4 weights as GGUF's Q4_K super-blocks, computed by specdeploy's `Q4_KMatMul`
(kernels/q4_k_matmul.c): the file's nibbles, 6-bit scales and minima, and float16 d / dmin, read in
place from the weights file, sixteen output columns interleaved as Q4_0MatMul's.

Q4_K is most of a Q4_K_M file (the quantization most GGUF users download). MatMulNBits computes it
as symmetric blocks plus a folded offset (6 bits a weight packed, and K/32 more rows); this reads
4.625 bits a weight and applies each block's minimum exactly, times the activation's block sum.
"""
from __future__ import annotations

import numpy as np

from ..kernels import DOMAIN
from .nbits import Blocks, SuperScales
from .q4_0 import COLUMNS, nibbles, unpack_nibbles

OP = "Q4_KMatMul"
BLOCK = 32
SUB = 8                  # blocks of 32 a super-block
SUPER = BLOCK * SUB      # 256 weights of K
SUPER_BYTES = 4 * COLUMNS + 2 * COLUMNS * SUB  # d, dmin (float16), then sc, mn per block: 320


def takes(blocks: Blocks) -> bool:
    """Whether `blocks` carry a Q4_K source's own scales that Q4_KMatMul reads: blocks of 32, whole
    super-blocks of K, a multiple of sixteen columns."""
    n, nb, block = blocks.q.shape
    own = blocks.super_scales
    return own is not None and own.kind == "Q4_K" and blocks.bits == 4 and block == BLOCK and not nb % SUB \
        and not n % COLUMNS


def pack(blocks: Blocks) -> tuple[np.ndarray, np.ndarray]:
    """(qs uint8 [N/16, K/32, 256] as Q4_0MatMul's, of q in 0..15; sc uint8 [N/16, K/256, 320]: per
    super-block the sixteen columns' d then dmin as float16 bytes, then per block their sc then mn)."""
    return nibbles(blocks.q), scale_bytes(blocks.super_scales)


def scale_bytes(own: SuperScales) -> np.ndarray:
    """sc uint8 [N/16, K/256, 320] of a Q4_K (or Q5_K) weight's own scales (see `pack`)."""
    n, nb = own.sc.shape
    groups, supers = n // COLUMNS, nb // SUB
    column_major = lambda a: a.reshape(groups, COLUMNS, supers, -1).transpose(0, 2, 3, 1)  # noqa: E731 [G, s, j, c]
    halves = np.concatenate([column_major(own.d.astype(np.float16)).reshape(groups, supers, COLUMNS),
                             column_major(own.dmin.astype(np.float16)).reshape(groups, supers, COLUMNS)], axis=-1)
    per_block = np.stack([column_major(own.sc), column_major(own.mn)], axis=3)            # [G, s, j, 2, c]
    return np.ascontiguousarray(np.concatenate([np.ascontiguousarray(halves).view(np.uint8).reshape(groups, supers, -1),
                                                per_block.reshape(groups, supers, -1)], axis=-1))


def own_scales(sc: np.ndarray, kind: str = "Q4_K") -> SuperScales:
    """Inverse of `scale_bytes`."""
    groups, supers, _ = sc.shape
    rows = lambda a: a.transpose(0, 3, 1, 2).reshape(groups * COLUMNS, -1)  # noqa: E731 [G, s, j, c] -> [N, s*j]
    halves = np.ascontiguousarray(sc[..., :4 * COLUMNS]).view(np.float16).reshape(groups, supers, 2, COLUMNS)
    per_block = sc[..., 4 * COLUMNS:].reshape(groups, supers, SUB, 2, COLUMNS)
    return SuperScales(kind, rows(halves[:, :, :1]), rows(per_block[..., 0, :]), rows(halves[:, :, 1:]),
                       rows(per_block[..., 1, :]))


def symmetric(own: SuperScales, top: int) -> tuple[np.ndarray, np.ndarray]:
    """(scales d·sc, offsets top·d·sc − dmin·mn) float32 [N, K/32]: BlockIndex's symmetric form of
    q in 0..2·top−1."""
    d = np.repeat(own.d.astype(np.float32), SUB, axis=1) * own.sc.astype(np.float32)      # [N, nb]
    minimum = np.repeat(own.dmin.astype(np.float32), SUB, axis=1) * own.mn.astype(np.float32)
    return d, -minimum + np.float32(top) * d


def unpack(qs: np.ndarray, sc: np.ndarray) -> Blocks:
    """Inverse of `pack`, in BlockIndex's symmetric form (q − 8, scale d·sc, offset 8·d·sc − dmin·mn)."""
    own = own_scales(sc)
    d, offsets = symmetric(own, 8)
    return Blocks(unpack_nibbles(qs), d, 4, offsets, own)


def matmul_node(model, node, weight_name: str, blocks: Blocks):
    """MatMul `node` (x @ initializer `weight_name`) as a Q4_KMatMul over `blocks` (`takes`)."""
    from onnx import helper, numpy_helper

    qs, sc = pack(blocks)
    q_name, s_name = f"{weight_name}.q4_k", f"{weight_name}.q4_k_scales"
    model.graph.initializer.extend([numpy_helper.from_array(qs, q_name), numpy_helper.from_array(sc, s_name)])
    n, nb, _ = blocks.q.shape
    return helper.make_node(OP, [node.input[0], q_name, s_name], list(node.output), name=node.name + ".q4_k",
                            domain=DOMAIN, K=nb * BLOCK, N=n)
