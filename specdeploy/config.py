"""Frozen, validated configuration of one generation call and of its sampling."""
from __future__ import annotations

from dataclasses import dataclass

from .constants import (TARGETS, DEFAULT_PREFILL_CHUNK, INT4_KERNEL_ALIASES, INT4_KERNELS, MAX_DRAFT_TOKENS, MAX_NGRAM, PRECISIONS, QUANT_METHODS,
                        SOURCES)
from .errors import ConfigError

RESPONSE_FORMATS = ("text", "json_object", "json_schema", "lark")
# the model's own distribution, whatever sampling defaults a bundle records: what measurements decode with
UNWARPED = dict(top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0)
MAX_LOGPROBS = 20  # top alternatives a token's logprobs may list (OpenAI's limit)


def check_ngram(ngram) -> tuple[int, int]:
    """A valid (min, max) lookup n-gram range, or ConfigError saying what is wrong."""
    pair = tuple(ngram) if isinstance(ngram, (tuple, list)) else ()
    if len(pair) != 2 or not all(isinstance(n, int) and not isinstance(n, bool) for n in pair):
        raise ConfigError(f"lookup_ngram={ngram!r} must be two integers (min, max), e.g. (2, 4)")
    low, high = pair
    if not (1 <= low <= high <= MAX_NGRAM):
        raise ConfigError(f"lookup_ngram=({low}, {high}) needs 1 <= min <= max <= {MAX_NGRAM}, e.g. (2, 4)")
    return low, high


def check_num_draft_tokens(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not (1 <= n <= MAX_DRAFT_TOKENS):
        raise ConfigError(f"num_draft_tokens={n!r} must be an integer in 1..{MAX_DRAFT_TOKENS}")
    return n


def check_prefill_chunk(rows: int) -> int:
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ConfigError(f"prefill_chunk={rows!r} must be a whole number of rows >= 1 (default {DEFAULT_PREFILL_CHUNK})")
    return rows


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ConfigError(f"precision '{precision}' is unknown; pick one of {', '.join(PRECISIONS)}")
    return precision


def check_method(method: str) -> str:
    if method not in QUANT_METHODS:
        raise ConfigError(f"method '{method}' is unknown; pick one of {', '.join(QUANT_METHODS)}")
    return method


def check_int4_kernel(kernel: str) -> str:
    """The kernel's name (an earlier name as today's), or an error naming the choices."""
    kernel = INT4_KERNEL_ALIASES.get(kernel, kernel)
    if kernel not in INT4_KERNELS:
        raise ConfigError(f"int4 kernel '{kernel}' is unknown; pick one of {', '.join(INT4_KERNELS)}")
    return kernel


@dataclass(frozen=True)
class TargetForm:
    """What a target asks of a bundle's graphs. cpu: specdeploy's int4 operators and one fused
    attention kernel a layer (ONNX Runtime's CPU GroupQueryAttention). cuda: int4 / int8 weights in
    MatMulNBits and attention op by op (GroupQueryAttention has no float32 CUDA kernel). tensorrt:
    also each integer graph's DequantizeLinear form, which TensorRT builds from. jetson-orin: that
    form within JetPack 6's limits: opset 23 (its TensorRT 10.3 and onnxruntime 1.23 read no
    opset 24), RMSNormalization as standard operators (TensorRT 10.3 has no importer for it) and no
    fp8 (Orin has none)."""

    name: str
    int4_kernel: str | None      # the kernel the target needs (None: any)
    fused_attention: bool
    tensorrt_form: bool
    opset: int | None = None     # the opset the target needs (None: any)
    refused_precisions: tuple[str, ...] = ()
    standard_norms: bool = False  # RMSNormalization as standard operators (TensorRT < 10.14 has no importer)


TARGET_FORMS = {
    "cpu": TargetForm("cpu", None, True, False),
    "cuda": TargetForm("cuda", "matmulnbits", False, False),
    "tensorrt": TargetForm("tensorrt", "matmulnbits", False, True),
    "jetson-orin": TargetForm("jetson-orin", "matmulnbits", False, True, 23, ("fp8",), True),
}


def target_form(target: str, int4_kernel: str, opset: int | None, precisions=()) -> TargetForm:
    """The form `target` asks for, checked against the options given with it (opset None: not asked)."""
    if target not in TARGETS:
        raise ConfigError(f"target '{target}' is unknown; pick one of {', '.join(TARGETS)}")
    form = TARGET_FORMS[target]
    if form.int4_kernel and int4_kernel not in ("auto", form.int4_kernel):
        raise ConfigError(f"--int4-kernel {int4_kernel} is specdeploy's CPU operators, which --target {target} "
                          f"cannot run; drop --int4-kernel (the target uses {form.int4_kernel})")
    if form.opset and opset is not None and opset != form.opset:
        raise ConfigError(f"--target {target} needs --opset {form.opset} (JetPack 6's TensorRT and ONNX Runtime)")
    refused = [p for p in precisions if p in form.refused_precisions]
    if refused:
        raise ConfigError(f"--target {target} has no {refused[0]} (Orin has no FP8 units); use int8 or fp16")
    return form


def check_source(source: str) -> str:
    if source not in SOURCES:
        raise ConfigError(f"draft_source='{source}' is unknown; pick one of {', '.join(SOURCES)}")
    return source


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0   # 0 means greedy
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None  # drop tokens below min_p times the most likely one's probability

    def __post_init__(self):
        if not (0.0 <= self.temperature <= 100.0):
            raise ConfigError(f"temperature={self.temperature} must be in [0, 100]; use 0 for greedy")
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError(f"top_k={self.top_k} must be >= 1 (or unset)")
        if self.top_p is not None and not (0.0 < self.top_p <= 1.0):
            raise ConfigError(f"top_p={self.top_p} must be in (0, 1] (or unset)")
        if self.min_p is not None and not (0.0 <= self.min_p <= 1.0):
            raise ConfigError(f"min_p={self.min_p} must be in [0, 1] (or unset)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class Penalties:
    """Penalties on tokens already seen, applied to each row's logits from that row's own prefix.

    repetition: Hugging Face's (CTRL's) multiplicative penalty over the prompt and the output
    (1 is off; > 1 discourages repeats); presence / frequency: OpenAI's, subtracted once per token
    seen in the output and once per occurrence (0 is off; -2..2)."""

    repetition: float = 1.0
    presence: float = 0.0
    frequency: float = 0.0

    def __post_init__(self):
        if not (0.0 < self.repetition <= 10.0):
            raise ConfigError(f"repetition_penalty={self.repetition} must be in (0, 10]; 1 is off")
        for name, value in (("presence_penalty", self.presence), ("frequency_penalty", self.frequency)):
            if not (-2.0 <= value <= 2.0):
                raise ConfigError(f"{name}={value} must be in [-2, 2]; 0 is off")

    @property
    def active(self) -> bool:
        return self.repetition != 1.0 or self.presence != 0.0 or self.frequency != 0.0


@dataclass(frozen=True)
class ResponseFormat:
    """Output constrained to a grammar: "json_object" (any JSON object), "json_schema" (`schema`, a
    JSON Schema as a dict) or "lark" (`grammar`, llguidance's Lark syntax)."""

    type: str
    schema: dict | None = None
    grammar: str | None = None

    def __post_init__(self):
        if self.type not in RESPONSE_FORMATS:
            raise ConfigError(f"response format '{self.type}' is unknown; pick one of {', '.join(RESPONSE_FORMATS)}")
        if self.type == "json_schema" and not isinstance(self.schema, dict):
            raise ConfigError("a json_schema response format needs 'schema': a JSON Schema object")
        if self.type == "lark" and not (isinstance(self.grammar, str) and self.grammar.strip()):
            raise ConfigError("a lark response format needs 'grammar': the grammar's text")


@dataclass(frozen=True)
class GenerationConfig:
    """One generation's options. Sampling fields left None take the bundle's defaults (the model's
    generation_config, recorded at export), else greedy decoding; temperature 0 is always greedy."""

    max_new_tokens: int = 128
    temperature: float | None = None
    top_k: int | None = None              # 0: off, even where the bundle's defaults set one
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    speculative: bool | None = None       # None: the bundle's default
    num_draft_tokens: int | None = None   # None: the bundle's default
    draft_source: str | None = None       # None: the bundle's default
    lookup_ngram: tuple[int, int] | None = None  # (min, max) suffix lengths lookup matches; None: bundle's
    ignore_eos: bool = False
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None           # None: none; 0: each token's own; k: and its k most likely
    response_format: ResponseFormat | None = None

    def __post_init__(self):
        if not (1 <= self.max_new_tokens <= 1_000_000):
            raise ConfigError(f"max_new_tokens={self.max_new_tokens} must be a positive integer")
        if self.num_draft_tokens is not None:
            check_num_draft_tokens(self.num_draft_tokens)
        if self.draft_source is not None:
            check_source(self.draft_source)
        if self.lookup_ngram is not None:
            object.__setattr__(self, "lookup_ngram", check_ngram(self.lookup_ngram))
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ConfigError("stop must be a list of non-empty strings")
        if self.logprobs is not None and not (0 <= self.logprobs <= MAX_LOGPROBS):
            raise ConfigError(f"logprobs={self.logprobs} must be in 0..{MAX_LOGPROBS} (or unset)")
        SamplingParams(0.0 if self.temperature is None else self.temperature, self.top_k or None, self.top_p, self.min_p)
        Penalties(1.0 if self.repetition_penalty is None else self.repetition_penalty,
                  self.presence_penalty, self.frequency_penalty)
