"""Values shared by every layer, defined once: the CLI builds its choices from these.

This module imports nothing of ours, so any module may import it.
"""
from __future__ import annotations

VERSION = "0.1.0"

# draft sources (runtime/drafting.py); "plain" labels a round or request without drafts
SOURCES = ("early_exit", "lookup", "hybrid", "feature")  # feature: a bundle's feature head (export --feature-head)
PLAIN = "plain"
DEFAULT_DRAFT_SOURCE = "hybrid"

# num_draft_tokens (γ): the largest any drafter, request or engine profile accepts
MAX_DRAFT_TOKENS = 16
DEFAULT_NUM_DRAFT_TOKENS = 4
QUARTER_EXIT = "quarter"  # export's default exit layer: a quarter of the layers (export/pipeline.default_exit_layer)

# lookup drafting: suffix lengths (min, max) matched against the context, longest first
DEFAULT_LOOKUP_NGRAM = (1, 4)
MAX_NGRAM = 16

# graph precisions; "fp32" is the exported form, the others come from quantization
PRECISIONS = ("fp32", "fp16", "int8", "int4", "fp8")
QUANTIZED_PRECISIONS = ("fp16", "int8", "int4", "fp8")
COMPUTE_PRECISIONS = ("int8", "int4")   # MatMulNBits: integer kernels; the others are weight-only
QUANT_METHODS = ("rtn", "mse", "minmax", "gptq", "ort")   # how int4/int8 blocks are rounded (quantization.compute)
# what computes int4 weights (and a GGUF's Q4_1 / Q4_K / Q6_K / Q8_0 blocks): specdeploy's own
# operators (the file's blocks read in place from the weights file, 4.5-6.6 bits a weight; a
# library built on this machine: kernels/), or ONNX Runtime's MatMulNBits (packed at load, 6 bits a
# weight at 4; needs nothing built, and the form CUDA and TensorRT take). "auto": ours wherever the
# library is built or can be (a C compiler here), else MatMulNBits. "q4_0" is ours' earlier name.
INT4_KERNELS = ("auto", "specdeploy", "matmulnbits")
INT4_KERNEL_ALIASES = {"q4_0": "specdeploy"}
DEFAULT_INT4_KERNEL = "auto"
# the lowest output error of those (docs/precision.md); rtn is the fast, lossy option
DEFAULT_QUANT_METHOD = "gptq"

BACKENDS = ("onnxruntime", "tensorrt")
DEFAULT_BACKEND = "onnxruntime"
PROVIDERS = ("cpu", "cuda", "tensorrt")   # ONNX Runtime execution providers

# ONNX opsets a bundle can be exported at: 24 writes KV rows with TensorScatter (ONNX Runtime
# >= 1.25), 23 with ScatterND (ONNX Runtime 1.23, the newest for Python 3.10)
OPSETS = (24, 23)
DEFAULT_OPSET = 24
TARGETS = ("cpu", "cuda", "tensorrt", "jetson-orin")  # what a bundle's graph forms are made for
DEFAULT_TARGET = "cpu"

DEFAULT_MAX_CONTEXT = 2048
MAX_CONTEXT_RANGE = (16, 32768)

# rows one prefill pass carries: a longer prompt is prefilled in passes of this many rows, which
# bounds its activations (lab/notes/benchmarks-history.md, "Chunked prefill")
DEFAULT_PREFILL_CHUNK = 256

# a bundle is a directory; this is its default name (it is not a TensorRT plan file)
DEFAULT_BUNDLE = "engine.plan"
