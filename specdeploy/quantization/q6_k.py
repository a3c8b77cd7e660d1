"""6-bit weights as GGUF's Q6_K super-blocks, computed by specdeploy's `Q6_KMatMul`
(kernels/q6_k_matmul.c): the file's 6-bit values, int8 scales and float16 d, read in place from the
weights file, sixteen output columns interleaved as Q4_0MatMul's.

A Q4_K_M file keeps its output (or tied embedding) and some attn_v / ffn_down weights in Q6_K.
MatMulNBits computes them as int8 blocks of 16 (8 bits a weight and a float32 scale a block: 10);
this reads the file's 6.5625.
"""
from __future__ import annotations

import numpy as np

from ..kernels import DOMAIN
from .nbits import Blocks, SuperScales
from .q4_0 import CHUNK, COLUMNS

OP = "Q6_KMatMul"
BLOCK = 32               # weights of K the layout interleaves at a time (two sub-blocks of 16)
SUB = 8                  # blocks of 32 a super-block
BLOCK_BYTES = 384        # a group's block: 256 bytes of low nibbles, 128 of high bit pairs
SUPER_BYTES = 2 * COLUMNS + 2 * COLUMNS * SUB  # d (float16), then per block sc of each half: 288


def takes(blocks: Blocks) -> bool:
    """Whether `blocks` carry a Q6_K source's own scales that Q6_KMatMul reads: whole super-blocks
    of K, a multiple of sixteen columns."""
    own = blocks.super_scales
    n, nb, block = blocks.q.shape
    return own is not None and own.kind == "Q6_K" and block == 16 and not nb % (2 * SUB) and not n % COLUMNS


def pack(blocks: Blocks) -> tuple[np.ndarray, np.ndarray]:
    """(q uint8 [N/16, K/32, 384], sc uint8 [N/16, K/256, 288]): see kernels/q6_k_matmul.c."""
    n = blocks.q.shape[0]
    u = (blocks.q.reshape(n, -1, BLOCK).astype(np.int16) + 32).astype(np.uint8)    # [N, nb, 32] in 0..63
    nb, groups = u.shape[1], n // COLUMNS
    by_run = lambda v: v.reshape(groups, COLUMNS, nb, 16 // CHUNK, CHUNK).transpose(0, 2, 3, 1, 4)  # noqa: E731
    low = u & 0x0F
    nibbles = by_run(low[..., :16] | (low[..., 16:] << 4))                            # [G, nb, run, c, 4]
    high = u >> 4
    pairs = by_run(high[..., :16] | (high[..., 16:] << 2))                            # [G, nb, run, c, 4]: bits 0-3
    bits = pairs[:, :, 0::2] | (pairs[:, :, 1::2] << 4)                              # [G, nb, 2, c, 4]
    q = np.concatenate([nibbles.reshape(groups, nb, -1), bits.reshape(groups, nb, -1)], axis=-1)
    own = blocks.super_scales
    supers = nb // SUB
    d = own.d.astype(np.float16).reshape(groups, COLUMNS, supers).transpose(0, 2, 1)  # [G, s, c]
    sc = own.sc.view(np.uint8).reshape(groups, COLUMNS, supers, 2 * SUB).transpose(0, 2, 3, 1)  # [G, s, 16, c]
    scales = np.concatenate([np.ascontiguousarray(d).view(np.uint8), sc.reshape(groups, supers, -1)], axis=-1)
    return np.ascontiguousarray(q), np.ascontiguousarray(scales)


def unpack(q: np.ndarray, scales: np.ndarray) -> Blocks:
    """Inverse of `pack`, as BlockIndex carries Q6_K: q − 32 in int8 blocks of 16, scale d·sc."""
    groups, nb, _ = q.shape
    supers = nb // SUB
    runs = lambda v: v.reshape(groups, nb, -1, COLUMNS, CHUNK).transpose(0, 3, 1, 2, 4).reshape(groups * COLUMNS, nb, -1)  # noqa: E731
    nibbles = runs(q[..., :256])                                                        # [N, nb, 16]
    bits = q[..., 256:].reshape(groups, nb, 2, 1, COLUMNS, CHUNK) >> np.array([0, 4], np.uint8).reshape(1, 1, 1, 2, 1, 1)
    pairs = runs((bits & 0x0F).reshape(groups, nb, 4 * COLUMNS * CHUNK))                  # [N, nb, 16]
    u = np.concatenate([(nibbles & 0x0F) | ((pairs & 3) << 4), (nibbles >> 4) | ((pairs >> 2) << 4)], axis=-1)
    d = np.ascontiguousarray(scales[..., :2 * COLUMNS]).view(np.float16)                 # [G, s, c]
    sc = scales[..., 2 * COLUMNS:].reshape(groups, supers, 2 * SUB, COLUMNS).view(np.int8)
    own = SuperScales("Q6_K", d.transpose(0, 2, 1).reshape(groups * COLUMNS, supers),
                      sc.transpose(0, 3, 1, 2).reshape(groups * COLUMNS, -1))
    step = np.repeat(own.d.astype(np.float32), 2 * SUB, axis=1) * own.sc.astype(np.float32)
    values = (u.astype(np.int16) - 32).astype(np.int8).reshape(groups * COLUMNS, -1, 16)
    return Blocks(np.ascontiguousarray(values), step, 8, None, own)


def matmul_node(model, node, weight_name: str, blocks: Blocks):
    """MatMul `node` (x @ initializer `weight_name`) as a Q6_KMatMul over `blocks` (`takes`)."""
    from onnx import helper, numpy_helper

    q, sc = pack(blocks)
    q_name, s_name = f"{weight_name}.q6_k", f"{weight_name}.q6_k_scales"
    model.graph.initializer.extend([numpy_helper.from_array(q, q_name), numpy_helper.from_array(sc, s_name)])
    n, nb, block = blocks.q.shape
    return helper.make_node(OP, [node.input[0], q_name, s_name], list(node.output), name=node.name + ".q6_k",
                            domain=DOMAIN, K=nb * block, N=n)
