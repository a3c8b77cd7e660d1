"""int8 blocks of 32 as specdeploy's `Q8MatMul` (kernels/q8_matmul.c), in an int4 bundle made for
specdeploy's kernels (`--int4-kernel q4_0`): its LM head, and 5- to 8-bit GGUF blocks carried.

The bytes are MatMulNBits' own 8-bit layout (nbits.pack), read as they lie in the weights file,
where MatMulNBits packs a copy at load: the tied embedding's GatherBlockQuantized reads the same
bytes, so the runtime holds the table once (backends/onnxruntime.in_place_weights).
"""
from __future__ import annotations

from ..kernels import DOMAIN
from .nbits import Blocks

OP = "Q8MatMul"
BLOCK = 32


def takes(blocks: Blocks) -> bool:
    """Whether Q8MatMul computes `blocks` exactly: 8 bits in blocks of 32, no float offsets."""
    return blocks.bits == 8 and blocks.block == BLOCK and blocks.offsets is None


def matmul_node(model, node, weight_name: str, blocks: Blocks):
    """MatMul `node` (x @ initializer `weight_name`) as a Q8MatMul over `blocks` (`takes`), its
    initializers named as MatMulNBits' would be."""
    from onnx import helper, numpy_helper

    from . import nbits

    b, scales = nbits.pack(blocks)
    n, nb, _ = blocks.q.shape
    b_name, s_name = f"{weight_name}.q8", f"{weight_name}.scales"
    model.graph.initializer.extend([numpy_helper.from_array(b, b_name), numpy_helper.from_array(scales, s_name)])
    return helper.make_node(OP, [node.input[0], b_name, s_name], list(node.output), name=node.name + ".q8",
                            domain=DOMAIN, K=nb * BLOCK, N=n)
