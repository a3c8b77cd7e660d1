"""Carry a GGUF's own quantized blocks into MatMulNBits, losslessly, where they map exactly.

Q8_0 (32 int8 values and one fp16 scale per block) is int8 in blocks of 32; Q4_0 (32 values
stored as q + 8, one fp16 scale) is int4 in two blocks of 16 sharing the scale; Q4_1 (32 values
in 0..15, an fp16 scale d and minimum m) is int4 the same way plus a float offset per block
(nbits.offset_nodes), and so is Q4_K, whose 32-wide sub-blocks each have a scale and a minimum;
Q5_0 (5-bit values, one scale per 32) and Q6_K (6-bit values, a scale per 16) are int8 blocks of
32 and 16 holding the same integers; Q5_1 and Q5_K (Q4_1 and Q4_K with a fifth bit, q in 0..31) are
int8 blocks of 32 plus a float offset.
The float weights the exporter saw are these blocks dequantized (as gguf's own dequantize
computes them), so a graph weight's column is matched to its GGUF row by its
bytes — no name mapping, and the row order a loader may permute (Llama's q/k projections) does
not matter. Other types (Q2_K / Q3_K, the IQ types, ...) are re-quantized by the chosen method.
"""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Callable

import numpy as np

from .nbits import Blocks, SuperScales

GGUF_BLOCK = 32
# compute precision -> the GGUF types it takes exactly, each at the narrowest MatMulNBits width
# that holds its values: 4-bit types at 4 bits, 5- to 8-bit ones (Q5_0, Q6_K, Q8_0) at 8 bits even
# in an int4 bundle — re-rounding them to 4 would discard what the file holds (the example's Q8_0
# tied embedding / LM head above all), and llama.cpp runs them at their width too.
CARRIES = {"int8": ("Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0"),
           "int4": ("Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0")}
_WIDE = {"Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0"}  # carried at 8 bits
_TOP = {"Q4_1": 8, "Q4_K": 8, "Q5_1": 16, "Q5_K": 16}  # q in 0..2·top−1 with a minimum: q − top is symmetric
_BODY = {"Q8_0": GGUF_BLOCK, "Q4_0": GGUF_BLOCK // 2, "Q4_1": GGUF_BLOCK // 2}  # bytes of values
_HEADER = {"Q8_0": 2, "Q4_0": 2, "Q4_1": 4}                                      # fp16 d (and m)
_Q4_K_BYTES = 2 + 2 + 12 + 128  # fp16 d, dmin; 8 packed 6-bit scales and minima; 256 nibbles
_Q5_K_BYTES = 2 + 2 + 12 + 32 + 128  # the same with 256 fifth bits before the nibbles
_Q5_1_BYTES = 2 + 2 + 4 + 16         # fp16 d, m; 32 fifth bits; 32 nibbles


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


def _decode_q4_k(raw: np.ndarray):
    """As `_decode`, for Q4_K: super-blocks of 256, each 8 sub-blocks of 32 with a 6-bit scale and
    minimum times the super-block's fp16 d and dmin; the file's values are (d·sc)·q − dmin·m, a
    Q4_1 block per 32 (scale d·sc, minimum −dmin·m), computed as gguf's dequantize does."""
    from gguf.quants import Q4_K

    rows = raw.shape[0]
    blocks = raw.reshape(-1, _Q4_K_BYTES)                                        # [R, 144]
    d = np.ascontiguousarray(blocks[:, 0:2]).view(np.float16).astype(np.float32)     # [R, 1]
    dmin = np.ascontiguousarray(blocks[:, 2:4]).view(np.float16).astype(np.float32)  # [R, 1]
    sc, mn = Q4_K.get_scale_min(np.ascontiguousarray(blocks[:, 4:16]))           # [R, 8] each
    scale, minimum = d * sc.astype(np.float32), dmin * mn.astype(np.float32)      # [R, 8]
    # each 32 bytes hold two sub-blocks: the even one in the low nibbles, the odd one in the high
    qs = blocks[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    q = (qs & 0x0F).reshape(rows, -1, GGUF_BLOCK).astype(np.int8)                # [rows, nb, 32]
    return np.ascontiguousarray(q), scale.reshape(rows, -1), -minimum.reshape(rows, -1)


def _decode_q5_k(raw: np.ndarray):
    """As `_decode_q4_k`, for Q5_K: the same super-blocks with a fifth bit a weight (bit j of byte i
    of the 32 after the scales: sub-block j's weight i), q in 0..31."""
    rows = raw.shape[0]
    blocks = raw.reshape(-1, _Q5_K_BYTES)                                        # [R, 176]
    q4, scale, least = _decode_q4_k(np.concatenate([blocks[:, :16], blocks[:, 48:]], axis=1).reshape(rows, -1))
    fifth = (blocks[:, 16:48].reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1  # [R, 8, 32]
    q = q4 | (fifth.reshape(rows, -1, GGUF_BLOCK) << 4).astype(np.int8)
    return np.ascontiguousarray(q), scale, least


def _decode_q5_1(raw: np.ndarray):
    """As `_decode`, for Q5_1: 32 values of 5 bits (a 32-bit word of fifth bits, then the low
    nibbles) with an fp16 d and m; the file's values are d·q + m."""
    rows = raw.shape[0]
    blocks = raw.reshape(-1, _Q5_1_BYTES)                                        # [R, 24]
    d, m = (np.ascontiguousarray(blocks[:, at:at + 2]).view(np.float16).astype(np.float32)[:, 0] for at in (0, 2))
    high = np.ascontiguousarray(blocks[:, 4:8]).view(np.uint32)                  # [R, 1]
    high = ((high >> np.arange(32, dtype=np.uint32)[None]) & 1).astype(np.uint8)  # [R, 32]
    low = blocks[:, 8:].reshape(-1, 1, 16) >> np.array([0, 4], np.uint8).reshape(1, 2, 1)
    q = ((low & 0x0F).reshape(-1, 32) | (high << 4)).astype(np.int8)
    return q.reshape(rows, -1, GGUF_BLOCK), d.reshape(rows, -1), m.reshape(rows, -1)


def _q4_k_scales(raw: np.ndarray, kind: str = "Q4_K") -> SuperScales:
    """A Q4_K (or Q5_K) tensor's own scales, as the file holds them (Q4_KMatMul / Q5_KMatMul read these)."""
    from gguf.quants import Q4_K

    rows = raw.shape[0]
    blocks = raw.reshape(-1, _Q4_K_BYTES if kind == "Q4_K" else _Q5_K_BYTES)     # [R, 144 or 176]
    sc, mn = Q4_K.get_scale_min(np.ascontiguousarray(blocks[:, 4:16]))           # [R, 8] each
    half = lambda at: np.ascontiguousarray(blocks[:, at:at + 2]).view(np.float16).reshape(rows, -1)  # noqa: E731
    return SuperScales(kind, half(0), sc.astype(np.uint8).reshape(rows, -1), half(2), mn.astype(np.uint8).reshape(rows, -1))


def _q6_k_scales(raw: np.ndarray) -> SuperScales:
    """A Q6_K tensor's own scales, as the file holds them (Q6_KMatMul reads these)."""
    rows = raw.shape[0]
    blocks = raw.reshape(-1, 210)                                                # [R, 210]
    d = np.ascontiguousarray(blocks[:, 208:210]).view(np.float16).reshape(rows, -1)
    return SuperScales("Q6_K", d, np.ascontiguousarray(blocks[:, 192:208]).view(np.int8).reshape(rows, -1))


def _q4_1_scales(raw: np.ndarray, kind: str = "Q4_1") -> SuperScales:
    """A Q4_1 (or Q5_1) tensor's own d and m, float16 per 32 (Q4_1MatMul / Q5_1MatMul read these)."""
    rows = raw.shape[0]
    width = 20 if kind == "Q4_1" else _Q5_1_BYTES
    halves = np.ascontiguousarray(raw.reshape(rows, -1, width)[..., :4]).view(np.float16)   # [rows, nb, 2]
    return SuperScales(kind, np.ascontiguousarray(halves[..., 0]), dmin=np.ascontiguousarray(halves[..., 1]))


_OWN_SCALES = {"Q4_K": _q4_k_scales, "Q6_K": _q6_k_scales, "Q4_1": _q4_1_scales,
               "Q5_K": lambda raw: _q4_k_scales(raw, "Q5_K"), "Q5_1": lambda raw: _q4_1_scales(raw, "Q5_1")}


def _decode_q5_0(raw: np.ndarray):
    """As `_decode`, for Q5_0: 32 values of 5 bits (low nibbles, then a 32-bit word of high bits)
    and an fp16 scale; the file's values are d·(q − 16), held exactly by int8 blocks of 32."""
    rows = raw.shape[0]
    blocks = raw.reshape(-1, 22)                                                 # [R, 22]
    d = np.ascontiguousarray(blocks[:, 0:2]).view(np.float16).astype(np.float32)[:, 0]
    high = np.ascontiguousarray(blocks[:, 2:6]).view(np.uint32)                  # [R, 1]
    high = ((high >> np.arange(32, dtype=np.uint32)[None]) & 1).astype(np.uint8)  # [R, 32]
    low = blocks[:, 6:].reshape(-1, 1, 16) >> np.array([0, 4], np.uint8).reshape(1, 2, 1)
    q = ((low & 0x0F).reshape(-1, 32) | (high << 4)).astype(np.int8) - np.int8(16)
    return q.reshape(rows, -1, GGUF_BLOCK), d.reshape(rows, -1), None


def _decode_q6_k(raw: np.ndarray):
    """As `_decode`, for Q6_K: super-blocks of 256 in 16 sub-blocks of 16 six-bit values, each with
    an int8 scale times the fp16 d; the file's values are (d·sc)·(q − 32), held exactly by int8
    blocks of 16. The bit layout is gguf's own dequantize's."""
    rows = raw.shape[0]
    blocks = raw.reshape(-1, 210)                                                # [R, 210]
    ql, qh, sc = blocks[:, :128], blocks[:, 128:192], blocks[:, 192:208]
    d = np.ascontiguousarray(blocks[:, 208:210]).view(np.float16).astype(np.float32)   # [R, 1]
    scale = d * np.ascontiguousarray(sc).view(np.int8).astype(np.float32)          # [R, 16]
    low = (ql.reshape(-1, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & 0x0F
    high = (qh.reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 0x03
    q = (low.reshape(-1, 8, 32) | (high.reshape(-1, 8, 32) << 4)).astype(np.int8) - np.int8(32)
    return q.reshape(rows, -1, 16), scale.reshape(rows, -1), None


_DECODERS = {"Q4_0": lambda raw: _decode(raw, "Q4_0"), "Q4_1": lambda raw: _decode(raw, "Q4_1"),
             "Q8_0": lambda raw: _decode(raw, "Q8_0"), "Q4_K": _decode_q4_k, "Q5_0": _decode_q5_0,
             "Q6_K": _decode_q6_k, "Q5_K": _decode_q5_k, "Q5_1": _decode_q5_1}


def _values(q, d, m) -> np.ndarray:
    """The file's float32 values [rows, K], computed as gguf's dequantize computes them."""
    values = q.astype(np.float32) * d[..., None]
    if m is not None:
        values = values + m[..., None]
    return values.reshape(q.shape[0], -1)


def _row_key(values: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(values, np.float32).tobytes(), digest_size=16).digest()


INDEX_ROWS = 4096  # rows decoded at a time while indexing
# what rows of different types may be carried together in one weight (sibling weights are fused):
# (bits carried, a float offset, the file's block)
_FORMS = {"Q4_0": (4, False, 32), "Q4_1": (4, True, 32), "Q4_K": (4, True, 32), "Q5_0": (8, False, 32),
          "Q5_1": (8, True, 32), "Q5_K": (8, True, 32), "Q8_0": (8, False, 32), "Q6_K": (8, False, 16)}


class BlockIndex:
    """The GGUF rows of the types a precision carries, keyed by their dequantized float32 bytes.

    A row is kept as (q int8 [nb, b], scales [nb], offsets [nb] or None, bits), b the file's block
    (32; 16 for Q6_K), in MatMulNBits' symmetric form: Q4_1's and Q4_K's d * q + m (q in 0..15)
    becomes d * (q - 8) + (m + 8d), the offset rounded once to float32 (nbits.offset_nodes adds it);
    Q5_1's and Q5_K's (q in 0..31) d * (q - 16) + (m + 16d).
    """

    def __init__(self, tensors, kind: str):
        self.rows: dict[bytes, tuple[int, int]] = {}   # row key -> (tensor, row)
        self._tensors: list[tuple[Callable[[], np.ndarray], str]] = []  # (its raw rows when called; type)
        self.add(tensors, kind)

    def add(self, tensors, kind: str) -> None:
        """Index every row of `tensors` (raw GGUF rows of type `kind`, or functions returning them:
        a file's, mapped only while read); only the keys are kept, the rows are decoded again when
        carried (an 8B model's decoded blocks are 8 GB)."""
        for tensor in tensors:
            self._tensors.append((tensor if callable(tensor) else (lambda t=tensor: t), kind))
            raw = self._tensors[-1][0]()
            for start in range(0, raw.shape[0], INDEX_ROWS):
                values = _values(*_DECODERS[kind](raw[start : start + INDEX_ROWS]))      # [rows, K]
                for r in range(values.shape[0]):
                    self.rows[_row_key(values[r])] = (len(self._tensors) - 1, start + r)

    def _decoded(self, found: list[tuple[int, int]]):
        """(q, scales, offsets or None, bits, Q4_K's own scales or None) of the rows `found`, in order,
        in the symmetric form."""
        parts, own = [], []
        for tensor in dict.fromkeys(t for t, _ in found):
            raw, kind = self._tensors[tensor]
            rows = raw()[np.array([r for t, r in found if t == tensor])]
            q, d, m = _DECODERS[kind](rows)
            if m is not None:
                q, m = q - _TOP[kind], m + np.float32(_TOP[kind]) * d
            parts.append((q, d, m))
            own.append(_OWN_SCALES[kind](rows) if kind in _OWN_SCALES else None)
        order = [t for t, _ in found]
        if order != sorted(order, key=list(dict.fromkeys(order)).index):  # rows from tensors interleaved
            return None
        q, d = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        m = None if parts[0][2] is None else np.concatenate([p[2] for p in parts])
        own = None if any(o is None for o in own) else SuperScales.joined(own)
        return q, d, m, 8 if self._tensors[found[0][0]][1] in _WIDE else 4, own

    @classmethod
    def from_file(cls, path: Path, precision: str) -> "BlockIndex | None":
        import gguf

        by_kind = {}
        for t in gguf.GGUFReader(str(path)).tensors:
            if t.tensor_type.name in CARRIES[precision]:  # mapped only while read: its pages do not stay resident
                mapped = functools.partial(np.memmap, path, dtype=t.data.dtype, mode="r", offset=t.data_offset,
                                           shape=t.data.shape)
                by_kind.setdefault(t.tensor_type.name, []).append(mapped)
        index = None
        for kind, tensors in by_kind.items():
            if index is None:
                index = cls(tensors, kind)
            else:
                index.add(tensors, kind)
        return index

    def form(self, w: np.ndarray):
        """The form (bits, offsets, block) W [K, N]'s first column carries in, or None: what sibling
        weights must share to be fused (fusion.fuse_sibling_matmuls)."""
        found = self.rows.get(_row_key(w[:, 0]))
        return None if found is None else _FORMS[self._tensors[found[0]][1]]

    def blocks(self, w: np.ndarray, block: int) -> Blocks | None:
        """W [K, N] as the file's own blocks, or None unless every column matches one type's rows.

        4-bit blocks are re-split to `block` (16 or 32, sharing the file's scale); 8-bit ones keep
        the file's (32; 16 for Q6_K).
        """
        found = [self.rows.get(_row_key(w[:, n])) for n in range(w.shape[1])]
        if not found or any(f is None for f in found) or len({_FORMS[self._tensors[t][1]] for t, _ in found}) > 1:
            return None
        decoded = self._decoded(found)
        if decoded is None:
            return None
        q, scales, offsets, bits, own = decoded  # [N, K/b, b] (b the file's block), [N, K/b], [N, K/32] or None
        split = GGUF_BLOCK // block if bits == 4 else 1
        n, nb = scales.shape
        return Blocks(q.reshape(n, nb * split, -1), np.repeat(scales, split, axis=1), bits, offsets,
                      own if split == 1 else None)
