"""Block-quantized weights in `MatMulNBits`' own layout, from float weights or from a GGUF's blocks.

Layout (symmetric, no zero-point input): for a weight W [K, N] of `x @ W`, blocks run along K per
output column n; B is uint8 [N, K/block, block*bits/8] holding q + 2^(bits-1) (4 bits: two per
byte, the even element in the low nibble), scales float32 [N * K/block]; W[k, n] = scale * q.
Blocks with a float minimum (GGUF Q4_1: W = d * q + m, q in 0..15) keep it as a float offset per
32 weights of K, W[k, n] = scale * q + offset[n, k // 32]: MatMulNBits computes the first term
and `offset_nodes` the second (sum of x over each 32 of K, times the offsets), which keeps the
kernel's fast integer path (float zero points run a ~70x slower one).
The same bytes serve `GatherBlockQuantized` (the tied embedding reads the LM head's weights).
4-bit scales may be negative (see `quantize`); tensorrt_form flips those blocks for TensorRT.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..optimize.graph import MS_DOMAIN

MSE_FACTORS = np.linspace(0.70, 1.0, 13, dtype=np.float32)  # shrunken ranges tried per block


OFFSET_BLOCK = 32  # weights of K sharing one float offset (GGUF's block)


@dataclass(frozen=True)
class SuperScales:
    """A GGUF weight's own scales, kept beside its Blocks so that specdeploy's operators read them as
    the file holds them. Q4_K: block b's (32 weights) scale is d·sc[b], its minimum −dmin·mn[b];
    Q6_K: sub-block b's (16 weights) scale is d·sc[b]; Q4_1: block b's scale is d[b], its minimum
    dmin[b] (the file's m). Q5_K and Q5_1 as Q4_K and Q4_1."""
    kind: str                       # "Q4_K", "Q5_K", "Q6_K", "Q4_1" or "Q5_1"
    d: np.ndarray                   # float16 [N, K/256] (Q4_1: [N, K/32])
    sc: np.ndarray | None = None    # Q4_K: uint8 [N, K/32], 6-bit; Q6_K: int8 [N, K/16]
    dmin: np.ndarray | None = None  # Q4_K: float16 [N, K/256]; Q4_1: float16 [N, K/32]
    mn: np.ndarray | None = None    # Q4_K: uint8 [N, K/32], 6-bit

    @staticmethod
    def joined(parts: list[SuperScales]) -> SuperScales | None:
        if len({p.kind for p in parts}) > 1:
            return None
        join = lambda f: None if getattr(parts[0], f) is None else np.concatenate([getattr(p, f) for p in parts])  # noqa: E731
        return SuperScales(parts[0].kind, join("d"), join("sc"), join("dmin"), join("mn"))


@dataclass(frozen=True)
class Blocks:
    q: np.ndarray       # int8 [N, K/block, block], in [-2^(bits-1), 2^(bits-1) - 1]
    scales: np.ndarray  # float32 [N, K/block]
    bits: int
    offsets: np.ndarray | None = None  # float32 [N, K/32], or None: symmetric
    super_scales: SuperScales | None = None  # a Q4_K source's own scales (blocks of 32), or None

    @property
    def block(self) -> int:
        return self.q.shape[2]

    @staticmethod
    def joined(parts: list[Blocks]) -> Blocks:
        """Blocks of consecutive column slices of one W, as one."""
        offsets = None if parts[0].offsets is None else np.concatenate([p.offsets for p in parts])
        own = None if any(p.super_scales is None for p in parts) else SuperScales.joined([p.super_scales for p in parts])
        return Blocks(np.concatenate([p.q for p in parts]), np.concatenate([p.scales for p in parts]), parts[0].bits,
                      offsets, own)

    def dequantize(self) -> np.ndarray:
        """W [K, N] as float32."""
        n, nb, block = self.q.shape
        w = (self.q.astype(np.float32) * self.scales[..., None]).reshape(n, nb * block)
        if self.offsets is not None:
            w = w + np.repeat(self.offsets, OFFSET_BLOCK, axis=1)
        return w.T


def _blocks_of(w: np.ndarray, block: int) -> np.ndarray:
    k, n = w.shape
    if k % block:
        raise ValueError(f"K={k} is not a multiple of the block size {block}")
    return np.ascontiguousarray(w.T).reshape(n, k // block, block)  # [N, nb, block]


COLUMNS = 4096  # output columns rounded at a time: a 150k-token LM head's temporaries stay ~100 MB


def quantize(w: np.ndarray, bits: int, block: int, method: str = "mse", half: bool = False) -> Blocks:
    """Block quantization of W [K, N]; "mse" picks each block's scale from a few shrunken ranges by
    squared error (clipping the largest value can cut the error of all the others), "absmax" maps
    each block's largest magnitude onto the grid (both symmetric), "minmax" is quantize_minmax
    (`half`: its scales and minima float16, as Q4_1 stores them). Columns are independent, so a wide
    W is rounded COLUMNS at a time."""
    if w.shape[1] > COLUMNS:
        return Blocks.joined([quantize(w[:, i : i + COLUMNS], bits, block, method, half)
                              for i in range(0, w.shape[1], COLUMNS)])
    if method == "minmax":
        return quantize_minmax(w, bits, block, half)
    x = _blocks_of(np.asarray(w, np.float32), block)                 # [N, nb, block]
    top = 2 ** (bits - 1)
    # 4 bits: the largest magnitude goes to -8 whatever its sign (a negative scale where it is
    # positive), so every block uses the grid's extra step, as ONNX Runtime's quantizer does;
    # 8 bits: positive scales over +-127, which TensorRT's DequantizeLinear (positive scales only)
    # can hold exactly
    pick = np.take_along_axis(x, np.abs(x).argmax(axis=-1)[..., None], axis=-1)  # [N, nb, 1]
    if bits == 4:
        extreme, steps = np.where(pick == 0, np.float32(1e-12), pick), -top
    else:
        extreme, steps = np.maximum(np.abs(pick), 1e-12), top - 1
    factors = MSE_FACTORS if method == "mse" else np.ones(1, np.float32)
    best_s = best_err = None
    for f in factors:
        s = extreme * f / steps
        q = np.clip(np.rint(x / s), -top, top - 1)
        err = ((q * s - x) ** 2).sum(axis=-1, keepdims=True)
        if best_err is None:
            best_s, best_err = s, err
        else:
            better = err < best_err
            best_s, best_err = np.where(better, s, best_s), np.minimum(err, best_err)
    q = np.clip(np.rint(x / best_s), -top, top - 1).astype(np.int8)
    return Blocks(q, best_s[..., 0].astype(np.float32), bits)


def quantize_minmax(w: np.ndarray, bits: int, block: int, half: bool = False) -> Blocks:
    """Asymmetric block quantization of W [K, N], GGUF Q4_1's form: each 32 of K spans its
    [min, max] in 2^bits - 1 steps, its minimum kept as a float offset (offset_nodes), the steps
    split into blocks of `block` (16 or 32) sharing the scale. Every level of the grid is used
    where a symmetric grid wastes part of it on a skewed block. `half`: scale and minimum float16
    (each moves by 2^-11 of itself, far inside a step), the blocks then Q4_1's own
    (`super_scales`), which specdeploy's Q4_1MatMul reads."""
    if OFFSET_BLOCK % block:
        raise ValueError(f"minmax blocks are {OFFSET_BLOCK} wide; {block} does not divide them")
    x = _blocks_of(np.asarray(w, np.float32), OFFSET_BLOCK)           # [N, nb, 32]
    top, levels = 2 ** (bits - 1), 2 ** bits - 1
    low, high = x.min(axis=-1), x.max(axis=-1)                        # [N, nb]
    scale = np.where(high > low, (high - low) / np.float32(levels), np.float32(1.0)).astype(np.float32)
    if half:
        scale = np.maximum(scale.astype(np.float16), np.float16(2 ** -24)).astype(np.float32)
        low = low.astype(np.float16).astype(np.float32)
    q = np.clip(np.rint((x - low[..., None]) / scale[..., None]), 0, levels) - top
    n, nb, _ = x.shape
    split = OFFSET_BLOCK // block
    own = SuperScales("Q4_1", scale.astype(np.float16), dmin=low.astype(np.float16)) \
        if half and bits == 4 and split == 1 else None
    return Blocks(q.astype(np.int8).reshape(n, nb * split, block), np.repeat(scale, split, axis=1), bits,
                  (low + np.float32(top) * scale).astype(np.float32), own)


def pack(blocks: Blocks) -> tuple[np.ndarray, np.ndarray]:
    """(B uint8 [N, nb, blob], scales float32 [N * nb]) as MatMulNBits reads them."""
    offset = (blocks.q.astype(np.int16) + 2 ** (blocks.bits - 1)).astype(np.uint8)  # [N, nb, block]
    if blocks.bits == 4:
        offset = offset[..., 0::2] | (offset[..., 1::2] << 4)
    return np.ascontiguousarray(offset), np.ascontiguousarray(blocks.scales.reshape(-1))


def unpack(b: np.ndarray, scales: np.ndarray, bits: int, block: int) -> Blocks:
    """Inverse of `pack` (for a MatMulNBits node's initializers, e.g. the LM head's)."""
    if bits == 4:
        low, high = (b & 0x0F).astype(np.int16), (b >> 4).astype(np.int16)
        values = np.stack([low, high], axis=-1).reshape(b.shape[0], b.shape[1], block)
    else:
        values = b.astype(np.int16)
    q = (values - 2 ** (bits - 1)).astype(np.int8)
    return Blocks(q, scales.reshape(b.shape[0], b.shape[1]).astype(np.float32), bits)


def matmul_node(model, node, weight_name: str, blocks: Blocks, accuracy_level: int, output: str | None = None,
                input: str | None = None):
    """Replace MatMul `node` (x @ initializer `weight_name`) by a MatMulNBits over `blocks`
    (reading `input` instead of x and writing `output` instead of the node's own output when given)."""
    from onnx import helper, numpy_helper

    b, scales = pack(blocks)
    n, nb, _ = blocks.q.shape
    b_name, s_name = f"{weight_name}.q{blocks.bits}", f"{weight_name}.scales"
    model.graph.initializer.extend([numpy_helper.from_array(b, b_name), numpy_helper.from_array(scales, s_name)])
    return helper.make_node(
        "MatMulNBits", [input or node.input[0], b_name, s_name], [output] if output else list(node.output),
        name=node.name + ".nbits",
        domain=MS_DOMAIN, K=nb * blocks.block, N=n, bits=blocks.bits, block_size=blocks.block,
        accuracy_level=accuracy_level,
    )


def block_sum_nodes(model, x: str, sums: dict) -> list:
    """Nodes summing x [B, S, K] over each 32 of K into `sums[x]` [B, S, K/32], once per activation
    (`sums`: activation -> its block sums, shared by every matmul reading it); [] when made already."""
    from onnx import helper, numpy_helper

    if x in sums:
        return []
    sums[x] = f"{x}.block_sums"
    shape, axes = f"{x}.block_shape", f"{x}.block_axis"
    model.graph.initializer.extend([
        numpy_helper.from_array(np.array([0, 0, -1, OFFSET_BLOCK], np.int64), shape),
        numpy_helper.from_array(np.array([-1], np.int64), axes)])
    return [helper.make_node("Reshape", [x, shape], [f"{x}.blocks"], name=f"{x}.blocks"),
            helper.make_node("ReduceSum", [f"{x}.blocks", axes], [sums[x]], name=sums[x], keepdims=0)]


def offset_nodes(model, x: str, product: str, out: str, offsets: np.ndarray, sums: dict) -> list:
    """Nodes adding `offsets` [N, K/32]'s term to MatMulNBits output `product`, as `out`.

    x [B, S, K] is summed over each 32 of K (block_sum_nodes); [B, S, K/32] @ offsets.T is a small
    float32 matmul (an 8-bit MatMulNBits for it measured slower, and lost 2.5 points of top-1
    agreement) whose rows, like the Reshape / ReduceSum / Add around it, do not depend on how many
    a call carries (row_check asserts it for every bundle). The quantizer's default folds the
    term into the MatMulNBits instead (folding.py); this exact form stays for --exact-offsets and
    for TensorRT.
    """
    from onnx import helper, numpy_helper

    nodes = block_sum_nodes(model, x, sums)
    table = f"{out}.offsets"
    model.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(offsets.T), table))  # [K/32, N]
    nodes += [helper.make_node("MatMul", [sums[x], table], [f"{out}.offset"], name=f"{out}.offset"),
              helper.make_node("Add", [product, f"{out}.offset"], [out], name=f"{out}.add_offset")]
    return nodes
