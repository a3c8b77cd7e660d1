"""int4 blocks of 32 as specdeploy's `Q4_0MatMul` (kernels/q4_0_matmul.c): GGUF's Q4_0 bytes,
sixteen output columns interleaved four bytes at a time, read in place from the weights file.

Against MatMulNBits (nbits.py) the same integers and the same per-row arithmetic kind (activations
to int8 per block of 32, integer dot products), but 4.5 bits a weight in memory, not 6, and no
packed copy beside the mapped file. It takes symmetric blocks of 32 only (a GGUF's Q4_0, or
round-to-nearest); blocks with float offsets (Q4_1, Q4_K, minmax, GPTQ's grid) stay MatMulNBits.
"""
from __future__ import annotations

import numpy as np

from ..kernels import DOMAIN
from .nbits import Blocks

OP = "Q4_0MatMul"
BLOCK = 32
COLUMNS = 16  # output columns interleaved per block: one int32 lane of a 512-bit register each
CHUNK = 4     # bytes of a column side by side


def takes(blocks: Blocks) -> bool:
    """Whether `blocks` are what Q4_0MatMul computes exactly: 4 bits, blocks of 32, no offsets,
    scales that float16 holds, a multiple of sixteen columns."""
    if blocks.bits != 4 or blocks.block != BLOCK or blocks.offsets is not None or blocks.q.shape[0] % COLUMNS:
        return False
    return bool(np.array_equal(blocks.scales.astype(np.float16).astype(np.float32), blocks.scales))


def half_scales(blocks: Blocks) -> Blocks:
    """`blocks` with their scales rounded to float16, as Q4_0 stores them: each weight moves by at
    most 2^-11 of itself, far inside the 4-bit step (the integers stay)."""
    return Blocks(blocks.q, blocks.scales.astype(np.float16).astype(np.float32), blocks.bits, blocks.offsets)


def pack(blocks: Blocks) -> tuple[np.ndarray, np.ndarray]:
    """(qs uint8 [N/16, nb, 256], d float16 [N/16, nb, 16]): byte j of a column's 16 holds q[j] + 8
    in its low nibble and q[j + 16] + 8 in its high one, as GGUF's Q4_0 does; a group's block is
    four runs of 64 bytes, run i holding bytes 4i .. 4i+3 of each of the sixteen columns."""
    n, nb, _ = blocks.q.shape
    d = blocks.scales.astype(np.float16).reshape(n // COLUMNS, COLUMNS, nb).transpose(0, 2, 1)
    return nibbles(blocks.q), np.ascontiguousarray(d)


def nibbles(q: np.ndarray) -> np.ndarray:
    """qs uint8 [N/16, nb, 256] of q int8 [N, nb, 32] in -8..7 (Q4_KMatMul's too)."""
    n, nb, _ = q.shape
    u = (q.astype(np.int16) + 8).astype(np.uint8)                           # [N, nb, 32]
    body = u[..., :16] | (u[..., 16:] << 4)                                  # [N, nb, 16]
    runs = body.reshape(n // COLUMNS, COLUMNS, nb, 16 // CHUNK, CHUNK)       # [G, c, nb, i, 4]
    qs = runs.transpose(0, 2, 3, 1, 4)                                       # [G, nb, i, c, 4]
    return np.ascontiguousarray(qs.reshape(n // COLUMNS, nb, 16 * COLUMNS))


def unpack(qs: np.ndarray, d: np.ndarray) -> Blocks:
    """Inverse of `pack`."""
    groups, nb, _ = qs.shape
    scales = d.transpose(0, 2, 1).reshape(groups * COLUMNS, nb).astype(np.float32)
    return Blocks(unpack_nibbles(qs), scales, 4)


def unpack_nibbles(qs: np.ndarray) -> np.ndarray:
    """Inverse of `nibbles`."""
    groups, nb, _ = qs.shape
    runs = qs.reshape(groups, nb, 16 // CHUNK, COLUMNS, CHUNK).transpose(0, 3, 1, 2, 4)  # [G, c, nb, i, 4]
    body = runs.reshape(groups * COLUMNS, nb, 16)
    return np.ascontiguousarray(np.concatenate([body & 0x0F, body >> 4], axis=-1).astype(np.int8) - np.int8(8))


def matmul_node(model, node, weight_name: str, blocks: Blocks, output: str | None = None, input: str | None = None):
    """MatMul `node` (x @ initializer `weight_name`) as a Q4_0MatMul over `blocks` (`takes`)."""
    from onnx import helper, numpy_helper

    qs, d = pack(blocks)
    q_name, d_name = f"{weight_name}.q4_0", f"{weight_name}.q4_0_scales"
    model.graph.initializer.extend([numpy_helper.from_array(qs, q_name), numpy_helper.from_array(d, d_name)])
    n, nb, _ = blocks.q.shape
    return helper.make_node(OP, [input or node.input[0], q_name, d_name], [output] if output else list(node.output),
                            name=node.name + ".q4_0", domain=DOMAIN, K=nb * BLOCK, N=n)
