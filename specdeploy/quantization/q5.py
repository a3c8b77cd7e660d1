"""5-bit weights as GGUF's Q5_K super-blocks and Q5_1 blocks, computed by specdeploy's `Q5_KMatMul`
and `Q5_1MatMul` (kernels/q4_k_matmul.c, beside Q4_KMatMul and Q4_1MatMul): the file's values, its
scales and minima, read in place from the weights file.

Q5_K is most of a Q5_K_M file (the quantization people download when Q4_K_M is not good enough),
Q5_1 some older files' layers. Each is its 4-bit sibling with a fifth bit a weight (q in 0..31), so
the operator is that sibling's: the low four bits in Q4_0MatMul's interleave, then per run of 64
nibble bytes two 64-bit masks of the fifth bits (kernels/q4_k_matmul.c), and the sibling's own
scales. Where these operators are not used the same blocks go to MatMulNBits at 8 bits with their
offsets folded, exactly too.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels import DOMAIN
from . import q4_1, q4_k
from .nbits import Blocks
from .q4_0 import CHUNK, COLUMNS, nibbles, unpack_nibbles

BLOCK = 32
TOP = 16        # q in 0..31 is carried as q − 16
NIBBLES = 256   # a group's block of low four bits, as Q4_0MatMul's
RUNS = 4        # runs of 64 nibble bytes a block


@dataclass(frozen=True)
class FiveBit:
    kind: str    # the GGUF type, "Q5_K" or "Q5_1"
    op: str      # the operator computing it

    def takes(self, blocks: Blocks) -> bool:
        """Whether `blocks` carry this type's own scales as the operator reads them: blocks of 32 (Q5_K:
        whole super-blocks of K), a multiple of sixteen columns."""
        own = blocks.super_scales
        n, nb, block = blocks.q.shape
        whole = self.kind != "Q5_K" or not nb % q4_k.SUB
        return own is not None and own.kind == self.kind and blocks.bits == 8 and block == BLOCK and whole \
            and not n % COLUMNS

    def pack(self, blocks: Blocks) -> tuple[np.ndarray, np.ndarray]:
        """(qs uint8 [N/16, K/32, 320]: the low four bits as Q4_0MatMul's, then the fifth bits' masks;
        the scales as the 4-bit sibling's: Q5_K sc uint8 [N/16, K/256, 320], Q5_1 dm float16 [N/16, K/32, 32])."""
        u = (blocks.q.astype(np.int16) + TOP).astype(np.uint8)                         # [N, nb, 32] in 0..31
        qs = np.concatenate([nibbles((u & 0x0F).astype(np.int8) - np.int8(8)), fifth_masks(u >> 4)], axis=-1)
        own = blocks.super_scales
        scales = q4_k.scale_bytes(own) if self.kind == "Q5_K" else q4_1.scale_halves(own)
        return np.ascontiguousarray(qs), scales

    def unpack(self, qs: np.ndarray, scales: np.ndarray) -> Blocks:
        """Inverse of `pack`, in BlockIndex's symmetric form (q − 16, offset 16·scale + minimum)."""
        sibling = q4_k if self.kind == "Q5_K" else q4_1
        own = sibling.own_scales(scales, self.kind)
        d, offsets = sibling.symmetric(own, TOP)
        low = unpack_nibbles(np.ascontiguousarray(qs[..., :NIBBLES])) + np.int8(8)      # [N, nb, 32] in 0..15
        q = (low | (unpack_fifth(qs[..., NIBBLES:]) << 4)).astype(np.int8) - np.int8(TOP)
        return Blocks(q, d, 8, offsets, own)

    def matmul_node(self, model, node, weight_name: str, blocks: Blocks):
        """MatMul `node` (x @ initializer `weight_name`) as this operator over `blocks` (`takes`)."""
        from onnx import helper, numpy_helper

        qs, scales = self.pack(blocks)
        stem = self.kind.lower()
        q_name, s_name = f"{weight_name}.{stem}", f"{weight_name}.{stem}_scales"
        model.graph.initializer.extend([numpy_helper.from_array(qs, q_name), numpy_helper.from_array(scales, s_name)])
        n, nb, _ = blocks.q.shape
        return helper.make_node(self.op, [node.input[0], q_name, s_name], list(node.output),
                                name=f"{node.name}.{stem}", domain=DOMAIN, K=nb * BLOCK, N=n)


Q5_K = FiveBit("Q5_K", "Q5_KMatMul")
Q5_1 = FiveBit("Q5_1", "Q5_1MatMul")
OPS = (Q5_K.op, Q5_1.op)


def fifth_masks(fifth: np.ndarray) -> np.ndarray:
    """uint8 [N/16, nb, 64] of the fifth bits [N, nb, 32] (0 or 1): per run i of nibble bytes (byte
    t = 4c + j holds column c's weights 4i + j and 16 + 4i + j) a little-endian 64-bit mask of the
    low nibbles' weights (bit t), then one of the high nibbles'."""
    n, nb, _ = fifth.shape
    bits = fifth.reshape(n // COLUMNS, COLUMNS, nb, 2, RUNS, CHUNK)                    # [G, c, nb, half, i, j]
    bits = bits.transpose(0, 2, 4, 3, 1, 5).reshape(n // COLUMNS, nb, RUNS, 2, COLUMNS * CHUNK)
    return np.packbits(bits.astype(np.uint8), axis=-1, bitorder="little").reshape(n // COLUMNS, nb, -1)


def unpack_fifth(masks: np.ndarray) -> np.ndarray:
    """Inverse of `fifth_masks`."""
    groups, nb, _ = masks.shape
    bits = np.unpackbits(masks.reshape(groups, nb, RUNS, 2, -1), axis=-1, bitorder="little")
    bits = bits.reshape(groups, nb, RUNS, 2, COLUMNS, CHUNK).transpose(0, 4, 1, 3, 2, 5)  # [G, c, nb, half, i, j]
    return np.ascontiguousarray(bits.reshape(groups * COLUMNS, nb, BLOCK))
