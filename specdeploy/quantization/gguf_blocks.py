"""Carry a GGUF's own quantized blocks into MatMulNBits, losslessly, where they map exactly.

Q8_0 (32 int8 values and one fp16 scale per block) is int8 in blocks of 32; Q4_0 (32 values
stored as q + 8, one fp16 scale) is int4 in two blocks of 16 sharing the scale. The float weights
the exporter saw are these blocks dequantized (fp16 scale to fp32, times q: exact), so a graph
weight's column is matched to its GGUF row by its bytes — no name mapping, and the row order a
loader may permute (Llama's q/k projections) does not matter. Other types (Q4_1's float minimum,
K-quants) do not map and are re-quantized by the chosen method.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from .nbits import Blocks

GGUF_BLOCK = 32
CARRIES = {"int8": "Q8_0", "int4": "Q4_0"}  # compute precision -> the GGUF type it takes exactly


def _decode(raw: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(q int8 [rows, nb, 32], scales float32 [rows, nb]) of one tensor's raw blocks [rows, bytes]."""
    rows = raw.shape[0]
    blocks = raw.reshape(rows, -1, 2 + (GGUF_BLOCK if kind == "Q8_0" else GGUF_BLOCK // 2))
    scales = np.ascontiguousarray(blocks[..., :2]).view(np.float16)[..., 0].astype(np.float32)
    body = blocks[..., 2:]
    if kind == "Q8_0":
        q = body.view(np.int8)
    else:  # byte j: element j in the low nibble, element j + 16 in the high one
        q = np.concatenate([body & 0x0F, body >> 4], axis=-1).astype(np.int8) - 8
    return np.ascontiguousarray(q), scales


def _row_key(values: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(values, np.float32).tobytes(), digest_size=16).digest()


class BlockIndex:
    """The GGUF rows of one type, keyed by their dequantized float32 bytes."""

    def __init__(self, tensors, kind: str):
        self.kind, self.rows = kind, {}
        for raw in tensors:
            q, scales = _decode(raw, kind)
            values = (q.astype(np.float32) * scales[..., None]).reshape(q.shape[0], -1)
            for r in range(q.shape[0]):
                self.rows[_row_key(values[r])] = (q[r], scales[r])

    @classmethod
    def from_file(cls, path: Path, precision: str) -> "BlockIndex | None":
        import gguf

        kind = CARRIES[precision]
        wanted = getattr(gguf.GGMLQuantizationType, kind)
        tensors = [t.data for t in gguf.GGUFReader(str(path)).tensors if t.tensor_type == wanted]
        return cls(tensors, kind) if tensors else None

    def blocks(self, w: np.ndarray, bits: int, block: int) -> Blocks | None:
        """W [K, N] as the file's own blocks (re-split to `block`), or None unless every column matches."""
        found = [self.rows.get(_row_key(w[:, n])) for n in range(w.shape[1])]
        if not found or any(f is None for f in found):
            return None
        q = np.stack([f[0] for f in found])                       # [N, K/32, 32]
        scales = np.stack([f[1] for f in found])                  # [N, K/32]
        split = GGUF_BLOCK // block
        n, nb = scales.shape
        return Blocks(q.reshape(n, nb * split, block), np.repeat(scales, split, axis=1), bits)
