"""A float offset per 32 of K folded into its own MatMulNBits: integer zero points, and the input's
block sums as extra rows of K.

The exact offset term (nbits.offset_nodes) reads a float32 table [K/32, N] beside each weight and
runs a matmul and an add; on the example it was 15% of a plain int4 step, in those tables' bytes
and its small ops (lab/scripts/offset_cost.py). Folded, each block with values q (stored as u = q + 2^(b-1)),
scale d and offset o computes

    W = d*q + o = d*(u - z) + r,   z = clip(round(2^(b-1) - o/d), 0, 2^b - 1),   r = o - d*(2^(b-1) - z)

z is an integer zero point, which keeps the kernel's fast integer path (ONNX Runtime packs it into
its own per-block term when the session loads), and r, at most half a step where z is not
clipped, multiplies the sum of the block's inputs. So the K/32 block sums are appended to the
input (one Concat per activation, shared by every matmul reading it) and r becomes K/32 more rows
of the same MatMulNBits, on a grid of their own per block of those rows. The values and scales
stay what they were (a GGUF's own); each offset moves by at most half a step of its rows' grid
(`offset_error`). Why not exact: no integer zero point holds a float minimum, and a float zero
point runs a ~70x slower path. What it buys and costs on the example: lab/notes/benchmarks-history.md.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .nbits import OFFSET_BLOCK, Blocks, block_sum_nodes, unpack
from ..optimize.graph import MS_DOMAIN


@dataclass(frozen=True)
class Folded:
    b: np.ndarray            # uint8 [N, nb + na, block*bits/8]: the values, then r's rows in na blocks
    scales: np.ndarray       # float32 [N * (nb + na)]
    zero_points: np.ndarray  # uint8 [N * ceil((nb + na) * bits / 8)], low nibble first at 4 bits
    k: int                   # K + K/32: the input's width with its block sums appended
    bits: int
    block: int


def _grid(r: np.ndarray, bits: int, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """r [N, s] on an asymmetric grid per `block` of its columns: (u [N, na, block], scales [N, na],
    zero points [N, na]); padding past s holds the zero point (the value 0)."""
    n, s = r.shape
    na, levels = -(-s // block), 2 ** bits - 1
    padded = np.zeros((n, na * block))
    padded[:, :s] = r
    padded = padded.reshape(n, na, block)                                       # [N, na, block]
    low, high = np.minimum(padded.min(axis=-1), 0), np.maximum(padded.max(axis=-1), 0)  # [N, na]
    scale = np.where(high > low, (high - low) / levels, 1.0)
    zero = np.clip(np.rint(-low / scale), 0, levels)
    u = np.clip(np.rint(padded / scale[..., None]) + zero[..., None], 0, levels)
    u = np.where((np.arange(na * block) < s).reshape(1, na, block), u, zero[..., None])
    return u.astype(np.uint8), scale.astype(np.float32), zero.astype(np.uint8)


def _pack(values: np.ndarray, bits: int) -> np.ndarray:
    """uint8 values [..., m] as MatMulNBits stores them: two a byte at 4 bits (even one low)."""
    if bits == 8:
        return np.ascontiguousarray(values)
    if values.shape[-1] % 2:
        values = np.concatenate([values, np.zeros((*values.shape[:-1], 1), np.uint8)], axis=-1)
    return np.ascontiguousarray(values[..., 0::2] | (values[..., 1::2] << 4))


def fold(blocks: Blocks) -> Folded:
    """`blocks` (with offsets) as one MatMulNBits over [x, block sums of x]."""
    if blocks.offsets is None:
        raise ValueError("only blocks with float offsets are folded")
    n, nb, block = blocks.q.shape
    split, top, levels = OFFSET_BLOCK // block, 2 ** (blocks.bits - 1), 2 ** blocks.bits - 1
    d = blocks.scales.astype(np.float64)                                         # [N, nb]
    o = np.repeat(blocks.offsets.astype(np.float64), split, axis=1)              # [N, nb]
    ratio = np.divide(o, d, out=np.zeros_like(o), where=d != 0)
    z = np.clip(np.rint(top - ratio), 0, levels)                                 # [N, nb]
    r = (o - d * (top - z))[:, ::split]                                          # [N, K/32]
    ru, rs, rz = _grid(r, blocks.bits, block)
    u = (blocks.q.astype(np.int16) + top).astype(np.uint8)                       # [N, nb, block]
    values = _pack(np.concatenate([u, ru], axis=1), blocks.bits)
    zeros = _pack(np.concatenate([z.astype(np.uint8), rz], axis=1), blocks.bits)
    scales = np.concatenate([blocks.scales.astype(np.float32), rs], axis=1)
    return Folded(values, scales.reshape(-1), zeros.reshape(-1), nb * block + r.shape[1], blocks.bits, block)


def unfold(b: np.ndarray, scales: np.ndarray, zero_points: np.ndarray, k: int, bits: int, block: int) -> Blocks:
    """The Blocks a folded MatMulNBits computes with: its values and scales, and the offsets its zero
    points and block-sum rows add (float32 [N, K/32]); K = k * 32/33."""
    n, total = b.shape[0], b.shape[1]
    width = k * OFFSET_BLOCK // (OFFSET_BLOCK + 1)
    nb, top = width // block, 2 ** (bits - 1)
    values = unpack(b, scales, bits, block)                                      # q = u - top, per block
    zeros = zero_points.reshape(n, -1)
    if bits == 4:
        zeros = np.stack([zeros & 0x0F, zeros >> 4], axis=-1).reshape(n, -1)
    zeros = zeros[:, :total].astype(np.float64)                                  # [N, nb + na]
    d = values.scales.astype(np.float64)                                         # [N, nb + na]
    rows = (values.q[:, nb:].astype(np.float64) + top - zeros[:, nb:, None]) * d[:, nb:, None]
    r = rows.reshape(n, -1)[:, : width // OFFSET_BLOCK]                          # [N, K/32]
    main = (d[:, :nb] * (top - zeros[:, :nb]))[:, :: OFFSET_BLOCK // block]      # [N, K/32]
    return Blocks(values.q[:, :nb], values.scales[:, :nb], bits, (main + r).astype(np.float32))


def offset_error(blocks: Blocks, folded: Folded) -> np.ndarray:
    """|offset folded - offset| [N, K/32]: what folding moved each offset by."""
    f = folded
    held = unfold(f.b, f.scales, f.zero_points, f.k, f.bits, f.block).offsets
    return np.abs(held.astype(np.float64) - blocks.offsets.astype(np.float64))


def folded_nodes(model, x: str, out: str, weight: str, blocks: Blocks, accuracy_level: int, name: str,
                 shared: dict) -> list:
    """Nodes computing x @ W of `blocks` (with offsets) as `out`: the block sums of x and [x, sums]
    once per activation (`shared`: "sums" and "joined", activation -> name), then the MatMulNBits."""
    from onnx import helper, numpy_helper

    nodes = block_sum_nodes(model, x, shared["sums"])
    if x not in shared["joined"]:
        shared["joined"][x] = joined = f"{x}.with_block_sums"
        nodes.append(helper.make_node("Concat", [x, shared["sums"][x]], [joined], name=joined, axis=-1))
    f = fold(blocks)
    names = [f"{weight}.q{f.bits}", f"{weight}.scales", f"{weight}.zero_points"]
    model.graph.initializer.extend(numpy_helper.from_array(a, n) for a, n in zip((f.b, f.scales, f.zero_points), names))
    return [*nodes, helper.make_node(
        "MatMulNBits", [shared["joined"][x], *names], [out], name=name, domain=MS_DOMAIN, K=f.k,
        N=blocks.q.shape[0], bits=f.bits, block_size=f.block, accuracy_level=accuracy_level)]


def folded_count(graph) -> int:
    """How many MatMulNBits in the ONNX file `graph` are folded (read a zero-point input)."""
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    return sum(n.op_type == "MatMulNBits" and len(n.input) == 4 for n in model.graph.node)
