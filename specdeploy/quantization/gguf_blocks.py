"""Carry a GGUF's own quantized blocks into MatMulNBits, losslessly, where they map exactly.

Q8_0 (32 int8 values and one fp16 scale per block) is int8 in blocks of 32; Q4_0 (32 values
stored as q + 8, one fp16 scale) is int4 in two blocks of 16 sharing the scale; Q4_1 (32 values
in 0..15, an fp16 scale d and minimum m) is int4 the same way plus a float offset per block
(nbits.offset_nodes). The float weights the exporter saw are these blocks dequantized (as gguf's
own dequantize computes them), so a graph weight's column is matched to its GGUF row by its
bytes — no name mapping, and the row order a loader may permute (Llama's q/k projections) does
not matter. Other types (Q5_0 / Q5_1, the K-quants) are re-quantized by the chosen method; Q4_K's
32-wide sub-blocks (a scale and a minimum each) would map onto the Q4_1 form, and are not carried yet.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from .nbits import Blocks

GGUF_BLOCK = 32
# compute precision -> the GGUF types it takes exactly. An int4 bundle keeps a tensor the file
# stores at 8 bits (Q8_0: the example's tied embedding / LM head) at 8 bits: re-rounding it to 4
# would discard what the file holds, and llama.cpp runs it at 8 bits too.
CARRIES = {"int8": ("Q8_0",), "int4": ("Q4_0", "Q4_1", "Q8_0")}
_BODY = {"Q8_0": GGUF_BLOCK, "Q4_0": GGUF_BLOCK // 2, "Q4_1": GGUF_BLOCK // 2}  # bytes of values
_HEADER = {"Q8_0": 2, "Q4_0": 2, "Q4_1": 4}                                      # fp16 d (and m)


def _decode(raw: np.ndarray, kind: str):
    """(q int8 [rows, nb, 32], d float32 [rows, nb], m float32 [rows, nb] or None) of one
    tensor's raw blocks [rows, bytes]; the file's values are d * q (+ m)."""
    rows = raw.shape[0]
    blocks = raw.reshape(rows, -1, _HEADER[kind] + _BODY[kind])
    header = np.ascontiguousarray(blocks[..., :_HEADER[kind]]).view(np.float16).astype(np.float32)
    body = blocks[..., _HEADER[kind]:]
    if kind == "Q8_0":
        q = body.view(np.int8)
    else:  # byte j: element j in the low nibble, element j + 16 in the high one
        q = np.concatenate([body & 0x0F, body >> 4], axis=-1).astype(np.int8)
    if kind == "Q4_0":
        q = q - 8
    minimum = header[..., 1] if kind == "Q4_1" else None
    return np.ascontiguousarray(q), header[..., 0], minimum


def _values(q, d, m) -> np.ndarray:
    """The file's float32 values [rows, K], computed as gguf's dequantize computes them."""
    values = q.astype(np.float32) * d[..., None]
    if m is not None:
        values = values + m[..., None]
    return values.reshape(q.shape[0], -1)


def _row_key(values: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(values, np.float32).tobytes(), digest_size=16).digest()


class BlockIndex:
    """The GGUF rows of the types a precision carries, keyed by their dequantized float32 bytes.

    A row is kept as (q int8 [nb, 32], scales [nb], offsets [nb] or None, bits) in MatMulNBits'
    symmetric form: Q4_1's d * q + m (q in 0..15) becomes d * (q - 8) + (m + 8d), the offset
    rounded once to float32 (nbits.offset_nodes adds it).
    """

    def __init__(self, tensors, kind: str):
        self.rows = {}
        self.add(tensors, kind)

    def add(self, tensors, kind: str) -> None:
        bits = 8 if kind == "Q8_0" else 4
        for raw in tensors:
            q, d, m = _decode(raw, kind)
            values = _values(q, d, m)
            if m is not None:
                q, m = q - 8, m + np.float32(8) * d
            for r in range(q.shape[0]):
                self.rows[_row_key(values[r])] = (q[r], d[r], None if m is None else m[r], bits)

    @classmethod
    def from_file(cls, path: Path, precision: str) -> "BlockIndex | None":
        import gguf

        index = None
        for kind in CARRIES[precision]:
            wanted = getattr(gguf.GGMLQuantizationType, kind)
            tensors = [t.data for t in gguf.GGUFReader(str(path)).tensors if t.tensor_type == wanted]
            if not tensors:
                continue
            if index is None:
                index = cls(tensors, kind)
            else:
                index.add(tensors, kind)
        return index

    def blocks(self, w: np.ndarray, block: int) -> Blocks | None:
        """W [K, N] as the file's own blocks, or None unless every column matches one type's rows.

        4-bit blocks are re-split to `block` (16 or 32, sharing the file's scale); 8-bit ones keep
        the file's 32.
        """
        found = [self.rows.get(_row_key(w[:, n])) for n in range(w.shape[1])]
        if not found or any(f is None for f in found) or len({(f[3], f[2] is None) for f in found}) > 1:
            return None
        q = np.stack([f[0] for f in found])                       # [N, K/32, 32]
        scales = np.stack([f[1] for f in found])                  # [N, K/32]
        offsets = None if found[0][2] is None else np.stack([f[2] for f in found])  # [N, K/32]
        bits = found[0][3]
        split = GGUF_BLOCK // block if bits == 4 else 1
        n, nb = scales.shape
        return Blocks(q.reshape(n, nb * split, -1), np.repeat(scales, split, axis=1), bits, offsets)
