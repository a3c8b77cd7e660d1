"""INT4 / INT8 compute: every weight matmul as ONNX Runtime's `MatMulNBits`.

`MatMulNBits` with `accuracy_level=4` quantizes each activation row per block of K and accumulates
in integers. Whether its rows are bitwise independent of how many rows a call carries depends on
the CPU: 8 bits are at every block size measured; 4 bits at block 16 everywhere, at block 32 and
more on CPUs with AVX-512 VNNI; on AVX2 alone the one-row call is another kernel, and every call of
two rows or more agrees with the others, so there an int4 matmul in blocks of 32 is handed a padded
second row (two_rows.py). So the forms here are symmetric int8 in blocks of 32 and symmetric int4
in blocks of 32 where the bundle's row check passes, else 16 (integer zero points: float ones run
a ~70x slower path); every bundle is checked row by row (runtime.row_check) before it is installed. A GGUF's
own blocks are carried where they map (gguf_blocks.py): a Q4_1 / Q4_K float minimum as an offset,
folded into the MatMulNBits by default (folding.py: integer zero points plus the input's block sums
as extra rows of K) or, with exact_offsets, as an exact float32 term beside it (nbits.offset_nodes),
Q5_0 / Q6_K / Q8_0 tensors at 8 bits even in an
int4 graph. Activation outlier channels, which would set their neighbours' int8 step, are computed
in float beside the MatMulNBits (outliers.py; the int8 default).

Methods (all in MatMulNBits' layout, same kernels): "rtn" rounds to nearest with each block's
largest magnitude on the grid (nbits.py: at 4 bits on -8, ONNX Runtime's grid; at 8 bits over
+-127 with positive scales, so TensorRT can hold it exactly); "mse" picks each block's scale by
squared error; "minmax" spans each 32's [min, max] with a float offset (GGUF Q4_1's form, folded
or an offset term as above); "gptq" rounds onto minmax's grid at 4
bits (rtn's at 8) with each row's error folded into the rows after it against the calibration
text's activations (gptq.py), the most accurate where a GGUF's own blocks do not map; "ort" is ONNX Runtime's own quantizer (matmul_nbits_quantizer, RTN), whose 8-bit
blocks reach -128 with negative scales and so have no exact TensorRT form.
ONNX Runtime's HQQ was measured and is not offered: its float zero points run a ~9x slower path
whose rows are not independent. Nor is AWQ-style activation-aware scaling: over Gemma 3 270M's
126 layer weights (none on a 4-bit grid in its GGUF) it cut minmax's output error by 1.8x, still
13x GPTQ's, and raised GPTQ's by 1.15x (lab/scripts/requant_error.py, lab/notes/benchmarks-history.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config import check_int4_kernel
from ..constants import DEFAULT_INT4_KERNEL, QUANT_METHODS as METHODS
from ..errors import ConfigError
from ..optimize import attention, fusion, gqa_probe
from ..optimize.graph import MS_DOMAIN, array, attrs as node_attrs, lazy_weights, materialize, set_nodes, use_ms_domain
from . import two_rows
from .rewrites import fold_weight_transposes

ACCURACY_LEVEL = 4  # int8 activations, integer accumulation
TIED_TOLERANCE = 0.3  # relative error below which the head's blocks are taken as the embedding's
TIED_ROWS = 4096      # vocabulary rows that relative error is measured on


@dataclass(frozen=True)
class ComputeForm:
    bits: int
    block_size: int

    def __post_init__(self):
        if self.bits not in (4, 8) or self.block_size < 16 or self.block_size & (self.block_size - 1):
            raise ConfigError(f"MatMulNBits needs 4 or 8 bits and a power-of-two block of 16 or more, "
                              f"not {self.bits} bits in blocks of {self.block_size}")


FORMS = {"int4": ComputeForm(bits=4, block_size=16), "int8": ComputeForm(bits=8, block_size=32)}
# int4 blocks to try, fewest bytes first: 32 (5 bits a weight with its float scale, and ONNX
# Runtime's faster kernel; on AVX2 alone with a padded second row, two_rows.py), then 16; the
# bundle's row check decides (quantize.quantize_into)
INT4_BLOCKS = (32, 16)


@dataclass(frozen=True)
class ComputeOptions:
    """How int4 / int8 graphs are made: int4's block (None: the largest of INT4_BLOCKS whose bundle
    passes the row check here), whether int4 matmuls in blocks of 32 read a padded second row
    (two_rows.py; None: where this CPU's one-row kernel differs; True: a bundle made on a VNNI
    machine for AVX2 devices),
    whether the graphs are fused for ONNX Runtime (fusion.py; off only to measure what it gains),
    and whether activation outlier channels are computed in float (outliers.py; None: for int8,
    where it buys top-1 agreement at 8-10% of the speed, not for int4, bought for speed), and
    whether float offsets (a GGUF's Q4_1 / Q4_K minima, minmax / gptq) stay an exact float32 term
    beside each MatMulNBits or are folded into it (folding.py; the default, faster), and whether each
    layer's attention becomes one GroupQueryAttention kernel (attention.py; the default where it
    applies) or stays op by op (what ONNX Runtime's CUDA provider needs), and the bits of an int4
    bundle's LM head where it is re-quantized (8: as llama.cpp's 4-bit files keep it, Q6_K / Q8_0;
    a 4-bit head cost ~10 points of top-1 on the example and on Gemma 3, and the speed an 8-bit
    head costs is the head's share of a step: lab/notes/benchmarks-history.md), and which kernel
    computes int4 weights (INT4_KERNELS)."""

    int4_block: int | None = None
    fuse: bool = True
    float_outliers: bool | None = None
    exact_offsets: bool = False
    fused_attention: bool = True
    head_bits: int = 8
    two_rows: bool | None = None
    int4_kernel: str = DEFAULT_INT4_KERNEL  # "auto" is decided when a bundle is quantized (operators.choose_kernel)

    def outliers_for(self, precision: str) -> bool:
        return self.float_outliers if self.float_outliers is not None else precision == "int8"

    def __post_init__(self):
        if self.int4_block not in (None, *INT4_BLOCKS):
            raise ConfigError(f"int4 block size {self.int4_block} is not offered; pick one of "
                              f"{', '.join(map(str, INT4_BLOCKS))} (or leave it to the row check)")
        object.__setattr__(self, "int4_kernel", check_int4_kernel(self.int4_kernel))
        if self.int4_kernel == "specdeploy" and self.int4_block not in (None, 32):
            raise ConfigError(f"specdeploy's int4 kernels read blocks of 32, not {self.int4_block}; drop --int4-block "
                              f"(or add --int4-kernel matmulnbits)")
        if self.head_bits not in (4, 8):
            raise ConfigError(f"an int4 bundle's LM head is 4 or 8 bits, not {self.head_bits}")

    def blocks(self) -> tuple:
        if self.int4_kernel == "specdeploy":
            return (32,)
        return (self.int4_block,) if self.int4_block else INT4_BLOCKS


def compute_form(precision: str, options: ComputeOptions = ComputeOptions()) -> ComputeForm:
    """The compute form of `precision` (int4 in the options' block when it names one)."""
    if precision == "int4" and options.int4_block:
        return ComputeForm(bits=4, block_size=options.int4_block)
    return FORMS[precision]


def wider_head(precision: str, method: str, options: ComputeOptions) -> bool:
    """Whether an LM head re-quantized at `precision` takes 8 bits (int8's form, row-independent at
    every block size) rather than the graph's 4; `ort` keeps ONNX Runtime's own form."""
    return precision == "int4" and options.head_bits == 8 and method != "ort"


def _algo_config(form: ComputeForm, method: str):
    from onnxruntime.quantization import matmul_nbits_quantizer as mnb

    if method == "ort":
        return mnb.DefaultWeightOnlyQuantConfig(block_size=form.block_size, is_symmetric=True,
                                                accuracy_level=ACCURACY_LEVEL, bits=form.bits)
    raise ConfigError(f"quantization method '{method}' is unknown; pick one of {', '.join(METHODS)}")


def quantize_graph(src: Path, dst: Path, precision: str, method: str = "rtn", index=None,
                   options: ComputeOptions = ComputeOptions(), outliers: dict | None = None,
                   grams=None, max_context: int | None = None, lm_head: bool = False) -> int:
    """Write `src` (fp32) to `dst` with every initializer-weight MatMul as MatMulNBits; returns how
    many weights came losslessly from `index` (a gguf_blocks.BlockIndex of the source file).
    `outliers` (activation -> channels, outliers.outlier_channels) are computed in float beside
    them (not with ONNX Runtime's own quantizer, `ort`, which writes its graph whole); `grams`
    (activation -> Xᵀ X over the calibration text) are what `gptq` rounds against; `max_context`:
    fuse each layer's attention into one kernel for KV buffers of that many rows plus one
    (attention.py; None: op by op); `lm_head`: this is the LM head's graph, whose weights an int4
    bundle holds at `options.head_bits` (`ort` keeps ONNX Runtime's own form: 4 bits).

    MatMuls whose weight is computed in the graph (a draft head's gathered vocabulary subset) stay
    float: the quantizer only sees initializers. Rotary, residual-norm and sibling-matmul nodes are
    fused on the way (fusion.py).
    """
    import logging

    import onnx
    from onnxruntime.quantization import matmul_nbits_quantizer as mnb

    logging.getLogger("onnxruntime.quantization").setLevel(logging.WARNING)
    if method not in METHODS:
        raise ConfigError(f"quantization method '{method}' is unknown; pick one of {', '.join(METHODS)}")
    with lazy_weights(src.parent):  # each weight read when it is rounded (optimize/graph.py)
        model = onnx.load(str(src), load_external_data=False)
        fold_weight_transposes(model)
        if options.fuse:
            fusion.fuse_all(model, index.form if index is not None else None)
            if max_context:
                attention.fuse_attention(model, max_context, gqa_probe.form_row_independent)
        chosen, carried = compute_form(precision, options), 0
        if lm_head and wider_head(precision, method, options):
            chosen = FORMS["int8"]  # a GGUF's own head blocks still carry as they are
        if method != "ort":
            carried = _own_blocks(model, chosen, "absmax" if method == "rtn" else method, index, outliers, grams,
                                  fold=not options.exact_offsets,
                                  q4_0=options.int4_kernel == "specdeploy" and (precision == "int4" or index is not None))
        materialize(model)
    if method == "ort":
        quantizer = mnb.MatMulNBitsQuantizer(model, algo_config=_algo_config(chosen, method),
                                             accuracy_level=ACCURACY_LEVEL)
        quantizer.process()
        model = quantizer.model.model
    two_rows.pad_rows(model, two_rows.policy(options.two_rows))
    onnx.save(model, str(dst), save_as_external_data=True, location=dst.name + ".data")
    return carried


def _blocks(w, form: ComputeForm, method: str, index, gram=lambda: None, q4_0: bool = False):
    """(blocks, carried): the source file's own blocks where they map exactly, else quantized
    (by GPTQ over the input's Gram matrix `gram()` where the method asks for it: asked for only
    here, so a graph whose weights all carry never runs the calibration text). `q4_0`: int4 goes to
    specdeploy's operators, so the symmetric methods (rtn, mse) round with float16 scales
    (q4_0.half_scales, Q4_0MatMul's) and GPTQ and minmax keep their grid with float16 scales and
    minima (Q4_1MatMul's; on the symmetric grid GPTQ lost most of what it gains)."""
    from . import gptq, nbits
    from .q4_0 import half_scales

    carried = index.blocks(w, form.block_size) if index is not None else None
    if carried is not None:
        return carried, True
    if method == "gptq":  # 4 bits on minmax's grid, where GPTQ gains both measures; 8 on rtn's
        gram = gram()
        grid = "minmax" if form.bits == 4 and not w.shape[0] % nbits.OFFSET_BLOCK else "absmax"
        half = q4_0 and grid == "minmax"
        return (gptq.quantize(w, gram, form.bits, form.block_size, grid, half) if gram is not None
                else nbits.quantize(w, form.bits, form.block_size, grid, half)), False
    if method == "minmax" and w.shape[0] % nbits.OFFSET_BLOCK:
        method = "absmax"  # offsets come per 32 of K
    blocks = nbits.quantize(w, form.bits, form.block_size, method, q4_0 and method == "minmax")
    return (half_scales(blocks) if q4_0 and form.bits == 4 and blocks.offsets is None else blocks), False


def _own_blocks(model, form: ComputeForm, method: str, index=None, outliers: dict | None = None,
                grams=None, fold: bool = True, q4_0: bool = False) -> int:
    """Every MatMul with an initializer weight [K, N] as MatMulNBits; returns how many were carried.

    `outliers`: activation -> channels computed in float beside the MatMulNBits (outliers.py);
    `grams`: activation -> Xᵀ X over the calibration text, for GPTQ (gptq.py), or a function
    returning them (called only for a weight that does not carry); `fold`: float
    offsets folded into the MatMulNBits (folding.py) rather than an exact term beside it; `q4_0`:
    blocks that Q4_0MatMul or Q8MatMul computes exactly (q4_0.takes, q8.takes) go to them."""
    inits = {t.name: t for t in model.graph.initializer}
    nodes, carried, shared = [], 0, {"sums": {}, "outliers": {}, "joined": {}, "fold": fold, "q4_0": q4_0}
    for node in model.graph.node:
        weight = inits.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        if weight is None or len(weight.dims) != 2 or weight.dims[0] % form.block_size:
            nodes.append(node)
            continue
        gram = lambda name=node.input[0]: (grams() if callable(grams) else grams or {}).get(name)  # noqa: E731
        blocks, exact = _blocks(array(weight), form, method, index, gram, q4_0)
        carried += exact
        channels = (outliers or {}).get(node.input[0])
        nodes += _compute_nodes(model, node, weight.name, blocks, channels, shared)
    set_nodes(model, nodes)
    use_ms_domain(model)
    if q4_0:
        from . import operators

        if operators.uses(model):
            operators.use_domain(model)
            operators.fuse_biases(model)
    return carried


def _compute_nodes(model, node, weight: str, blocks, channels, shared: dict) -> list:
    """MatMul `node` as a MatMulNBits over `blocks`, then its outlier term, then its offset term
    (folded into the MatMulNBits where no outlier channels are: their float rows are the symmetric
    values', which the folded zero points would change)."""
    from . import folding, nbits, outliers, q4_0, q4_1, q4_k, q5, q6_k, q8

    x, out = node.input[0], node.output[0]
    with_offsets = blocks.offsets is not None
    for own in (q4_1, q4_k, q5.Q5_K, q5.Q5_1, q6_k):  # a GGUF's own blocks, as the file holds them
        if channels is None and shared["q4_0"] and own.takes(blocks):
            return [own.matmul_node(model, node, weight, blocks)]
    if channels is None and shared["q4_0"] and q4_0.takes(blocks):
        return [q4_0.matmul_node(model, node, weight, blocks)]
    if channels is None and shared["q4_0"] and q8.takes(blocks):
        return [q8.matmul_node(model, node, weight, blocks)]
    if channels is None and not with_offsets:
        return [nbits.matmul_node(model, node, weight, blocks, ACCURACY_LEVEL)]
    if channels is None and shared["fold"]:
        return folding.folded_nodes(model, x, out, weight, blocks, ACCURACY_LEVEL, node.name + ".nbits", shared)
    product = last = f"{out}.product"
    prelude, reads, terms = [], x, []
    if channels is not None:
        last = f"{out}.with_outliers" if with_offsets else out
        reads, prelude, terms = outliers.outlier_nodes(
            model, x, blocks.q.shape[1] * blocks.q.shape[2], product, last,
            outliers.symmetric_rows(blocks, channels), channels, shared["outliers"])
    if with_offsets:  # the offset term sums the whole activation, its outlier channels included
        terms += nbits.offset_nodes(model, x, last, out, blocks.offsets, shared["sums"])
    return [*prelude, nbits.matmul_node(model, node, weight, blocks, ACCURACY_LEVEL, output=product, input=reads),
            *terms]


def quantize_embedding(draft: Path, head: Path, precision: str, index=None,
                       options: ComputeOptions = ComputeOptions()) -> int:
    """The draft graph's embedding Gather as GatherBlockQuantized, in place; the table's bits (0: not
    rewritten).

    A tied embedding reads the LM head's MatMulNBits bytes (the shared weights file stores them
    once); an untied one is block-quantized the same way. Either way it no longer costs fp32.
    """
    import onnx
    from onnx import helper, numpy_helper

    from . import nbits

    chosen = compute_form(precision, options)
    data = draft.with_name(draft.name + ".data")
    with lazy_weights(draft.parent):  # the fp32 table is read memory-mapped, never whole
        model = onnx.load(str(draft), load_external_data=False)
        inits = {t.name: t for t in model.graph.initializer}
        gather = next((n for n in model.graph.node if n.op_type == "Gather" and n.input[0] in inits
                       and len(inits[n.input[0]].dims) == 2), None)
        if gather is None:
            return 0
        table = array(inits[gather.input[0]])                                         # [V, H] float32
        if table.shape[1] % chosen.block_size:
            return 0
        blocks = _tied_head_blocks(head, table) or _blocks(table.T, chosen, "absmax", index)[0]
        if blocks.offsets is not None:  # GatherBlockQuantized has no float offsets
            blocks = nbits.quantize(table.T, chosen.bits, chosen.block_size, "absmax")
        b, scales = nbits.pack(blocks)
        vocab, n_blocks = blocks.q.shape[:2]
        name = gather.input[0]
        model.graph.initializer.extend([numpy_helper.from_array(b.reshape(vocab, -1), name + ".q"),
                                        numpy_helper.from_array(scales.reshape(vocab, n_blocks), name + ".qscales")])
        replacement = helper.make_node(
            "GatherBlockQuantized", [name + ".q", gather.input[1], name + ".qscales"], list(gather.output),
            name=gather.name + ".quantized", domain=MS_DOMAIN, gather_axis=0, quantize_axis=1,
            block_size=blocks.block, bits=blocks.bits)
        set_nodes(model, [replacement if n is gather else n for n in model.graph.node])  # the fp32 table dropped
        del table
        materialize(model)  # the graph's other weights, read before their file is rewritten
    use_ms_domain(model)
    data.unlink(missing_ok=True)
    onnx.save(model, str(draft), save_as_external_data=True, location=data.name)
    return blocks.bits


def _tied_head_blocks(head: Path, table):
    """The LM head's blocks (whatever their width: an int4 bundle may carry an 8-bit head from the
    GGUF) when they quantize `table` (a tied embedding), else None."""
    import onnx
    from onnx import numpy_helper

    from . import nbits, q8

    model = onnx.load(str(head))
    inits = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        attrs = node_attrs(node)
        if node.op_type not in ("MatMulNBits", q8.OP) or attrs.get("N") != table.shape[0] or len(node.input) > 3:
            continue
        bits, block = (attrs["bits"], attrs["block_size"]) if node.op_type == "MatMulNBits" else (8, q8.BLOCK)
        blocks = nbits.unpack(numpy_helper.to_array(inits[node.input[1]]),
                              numpy_helper.to_array(inits[node.input[2]]), bits, block)
        # tied: the head's blocks quantize this very table (4-bit relative error ~0.1; an untied
        # head's weights are unrelated, error ~1.4), told apart on the first TIED_ROWS tokens' rows
        rows = slice(0, min(TIED_ROWS, table.shape[0]))
        sample = nbits.Blocks(blocks.q[rows], blocks.scales[rows], blocks.bits,
                              None if blocks.offsets is None else blocks.offsets[rows])
        part = np.asarray(table[rows])                                                # [R, H]
        error = np.linalg.norm(sample.dequantize() - part.T) / max(np.linalg.norm(part), 1e-12)
        if error < TIED_TOLERANCE:
            return blocks
    return None
