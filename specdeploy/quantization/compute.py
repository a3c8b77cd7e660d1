"""INT4 / INT8 compute: every weight matmul as ONNX Runtime's `MatMulNBits`.

`MatMulNBits` with `accuracy_level=4` quantizes each activation row per block of K and accumulates
in integers; on the CPUs measured its rows are bitwise independent of how many rows a call carries
for 8 bits at every block size and for 4 bits at block 16, but not for 4 bits at 32 / 64 / 128
(the one-row path is another kernel). So the forms here are symmetric int8 in blocks of 32 and
symmetric int4 in blocks of 16 (integer zero points: float ones run a ~70x slower path), and every
bundle made with them is checked row by row (runtime.row_check) before it is installed.

The weights come from ONNX Runtime's own quantizer (round-to-nearest by default; HQQ optional).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from .rewrites import fold_weight_transposes

METHODS = ("rtn", "hqq")
ACCURACY_LEVEL = 4  # int8 activations, integer accumulation


@dataclass(frozen=True)
class ComputeForm:
    bits: int
    block_size: int


FORMS = {"int4": ComputeForm(bits=4, block_size=16), "int8": ComputeForm(bits=8, block_size=32)}


def _algo_config(form: ComputeForm, method: str):
    from onnxruntime.quantization import matmul_nbits_quantizer as mnb

    if method == "rtn":
        return mnb.DefaultWeightOnlyQuantConfig(block_size=form.block_size, is_symmetric=True,
                                                accuracy_level=ACCURACY_LEVEL, bits=form.bits)
    if method == "hqq":
        if form.bits != 4:
            raise ConfigError("--method hqq quantizes to 4 bits only; use it with --precision int4")
        return mnb.HQQWeightOnlyQuantConfig(block_size=form.block_size, bits=form.bits)
    raise ConfigError(f"quantization method '{method}' is unknown; pick one of {', '.join(METHODS)}")


def quantize_graph(src: Path, dst: Path, precision: str, method: str = "rtn") -> None:
    """Write `src` (fp32) to `dst` with every initializer-weight MatMul as MatMulNBits.

    MatMuls whose weight is computed in the graph (a draft head's gathered vocabulary subset) stay
    float: the quantizer only sees initializers.
    """
    import logging

    import onnx
    from onnxruntime.quantization import matmul_nbits_quantizer as mnb

    logging.getLogger("onnxruntime.quantization").setLevel(logging.WARNING)
    model = onnx.load(str(src))
    fold_weight_transposes(model)
    quantizer = mnb.MatMulNBitsQuantizer(model, algo_config=_algo_config(FORMS[precision], method),
                                         accuracy_level=ACCURACY_LEVEL)
    quantizer.process()
    set_accuracy_level(quantizer.model.model)
    quantizer.model.save_model_to_file(str(dst), use_external_data_format=True)


def set_accuracy_level(model) -> None:
    """Every MatMulNBits at ACCURACY_LEVEL (HQQ's quantizer leaves it unset, i.e. float compute)."""
    from onnx import helper

    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            kept = [a for a in node.attribute if a.name != "accuracy_level"]
            del node.attribute[:]
            node.attribute.extend(kept + [helper.make_attribute("accuracy_level", ACCURACY_LEVEL)])
