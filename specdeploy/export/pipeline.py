"""The one export pipeline: model -> [calibration] -> graphs + validation -> [quantization] ->
[TensorRT engines] -> installed bundle.

Every step writes into one staging directory beside the output; the bundle is installed only once
whole, so an interrupted or failed export leaves an existing bundle untouched. Calibration and
quantization are steps this pipeline calls; neither calls back into it.
"""
from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..config import (TARGET_FORMS, target_form, check_int4_kernel, check_method, check_ngram, check_num_draft_tokens, check_precision,
                      check_source)
from ..constants import (DEFAULT_TARGET, BACKENDS, DEFAULT_BACKEND, DEFAULT_INT4_KERNEL, DEFAULT_BUNDLE, DEFAULT_DRAFT_SOURCE, DEFAULT_LOOKUP_NGRAM,
                         DEFAULT_MAX_CONTEXT, DEFAULT_NUM_DRAFT_TOKENS, DEFAULT_OPSET,
                         MAX_CONTEXT_RANGE, DEFAULT_QUANT_METHOD, OPSETS, QUARTER_EXIT)
from ..errors import ConfigError
from ..runtime.memory_log import mark, recording
from .sampling_defaults import check as check_sampling


@dataclass(frozen=True)
class ExportConfig:
    """Everything `specdeploy export` / `calibrate` can be asked; validated on construction."""

    source: Path                                   # Hugging Face directory, .gguf file, or a bundle to re-calibrate
    exit_layer: int | str | None                   # None: chosen by calibration ("auto"); QUARTER_EXIT: a quarter of the layers
    num_draft_tokens: int | None = DEFAULT_NUM_DRAFT_TOKENS  # None: chosen by calibration ("auto")
    max_context: int = DEFAULT_MAX_CONTEXT
    output: Path = Path(DEFAULT_BUNDLE)
    draft_source: str = DEFAULT_DRAFT_SOURCE
    lookup_ngram: tuple[int, int] = DEFAULT_LOOKUP_NGRAM
    calibrate: bool = False
    precision: str | None = None                   # None: the source's own (export/source_precision.py)
    draft_precision: str | None = None             # None: `precision`
    verify_precision: str | None = None            # None: `precision`
    method: str = DEFAULT_QUANT_METHOD             # how int4/int8 weights are rounded: QUANT_METHODS
    prompts_file: Path | None = None               # extra calibration prompts (JSONL)
    validate: bool = True
    backend: str = DEFAULT_BACKEND                 # "tensorrt": also build engines on this machine
    opset: int | None = None                       # None: the target's (24, or 23 for jetson-orin); 23: ScatterND KV writes
    feature_layers: tuple[int, ...] = ()           # layers whose input the graphs also output (a feature head's)
    head_features: bool = False                    # also output the layers a feature head reads by default (train-head --bundle)
    feature_head: Path | None = None               # an EAGLE-3 head to add (its layers become feature_layers)
    int4_kernel: str = DEFAULT_INT4_KERNEL         # what computes int4 weights (constants.INT4_KERNELS)
    sampling: dict = field(default_factory=dict)   # sampling defaults to record over the model's own (KEYS)
    target: str = DEFAULT_TARGET                   # the graph forms: constants.TARGETS (config.TARGET_FORMS)

    def __post_init__(self):
        object.__setattr__(self, "source", Path(self.source))
        object.__setattr__(self, "output", Path(self.output))
        if self.target in TARGET_FORMS and self.opset is None:
            object.__setattr__(self, "opset", TARGET_FORMS[self.target].opset or DEFAULT_OPSET)
        form = target_form(self.target, self.int4_kernel, self.opset,
                           (self.precision, self.draft_precision, self.verify_precision))
        if form.int4_kernel:
            object.__setattr__(self, "int4_kernel", form.int4_kernel)
        if self.opset not in OPSETS:
            raise ConfigError(f"opset={self.opset} is not supported; pick 24 (default) or 23 (ONNX Runtime 1.23)")
        if isinstance(self.exit_layer, str) and self.exit_layer != QUARTER_EXIT:
            raise ConfigError(f"exit_layer={self.exit_layer!r}: give a layer number, 'auto' or '{QUARTER_EXIT}'")
        if isinstance(self.exit_layer, int) and self.exit_layer < 1:
            raise ConfigError(f"exit_layer={self.exit_layer} must be >= 1")
        if self.num_draft_tokens is not None:
            check_num_draft_tokens(self.num_draft_tokens)
        low, high = MAX_CONTEXT_RANGE
        if not (low <= self.max_context <= high):
            raise ConfigError(f"max_context={self.max_context} must be in {low}..{high}")
        check_source(self.draft_source)
        object.__setattr__(self, "lookup_ngram", check_ngram(self.lookup_ngram))
        object.__setattr__(self, "feature_layers", tuple(sorted(set(self.feature_layers))))
        check_sampling(self.sampling)
        if self.feature_head is not None and not (Path(self.feature_head) / "config.json").is_file():
            raise ConfigError(f"--feature-head {self.feature_head} is not an EAGLE-3 head's directory (no config.json); "
                              f"train one with 'specdeploy train-head' or point at a downloaded head")
        for p in (self.precision, self.draft_precision, self.verify_precision):
            if p is not None:
                check_precision(p)
        check_method(self.method)
        object.__setattr__(self, "int4_kernel", check_int4_kernel(self.int4_kernel))
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend='{self.backend}' is unknown; pick one of {', '.join(BACKENDS)}")

    @property
    def quantized(self) -> bool:
        return {self.precision or "fp32", self.draft_precision or "fp32", self.verify_precision or "fp32"} != {"fp32"}

    def quantize_options(self):
        """What the quantization step is asked (`precision` decided: see `with_precision`)."""
        from ..quantization.compute import ComputeOptions
        from ..quantization.options import QuantizeOptions

        form = TARGET_FORMS[self.target]
        return QuantizeOptions(self.precision or "fp32", self.draft_precision, self.verify_precision, self.method,
                               tensorrt=self.backend == "tensorrt" or form.tensorrt_form, prompts_file=self.prompts_file,
                               compute=ComputeOptions(int4_kernel=self.int4_kernel,
                                                      fused_attention=form.fused_attention),
                               target=self.target)

    @property
    def needs_calibration(self) -> bool:
        return self.calibrate or self.exit_layer is None or self.num_draft_tokens is None

    def check_layers(self, num_layers: int) -> None:
        if isinstance(self.exit_layer, int) and self.exit_layer >= num_layers:
            raise ConfigError(
                f"exit_layer={self.exit_layer} must be < num_layers={num_layers}; pick 1..{num_layers - 1}"
            )
        wrong = [j for j in self.feature_layers if not 0 <= j <= num_layers]
        if wrong:
            raise ConfigError(f"feature layers {wrong} are not layer inputs of this model; pick 0..{num_layers} "
                              f"(j is the input of layer j; {num_layers} is the final hidden state)")


def export(config: ExportConfig, echo: Callable[[str], None] = print, calibration=None) -> Path:
    """Export (and optionally calibrate, quantize, build engines for) one bundle; returns its path.

    `calibration` is a `calibration.steps.CalibrationConfig` (defaults when None).
    """
    with recording() as memory:
        output = _export(config, echo, calibration)
    echo(memory.summary())
    return output


def _export(config: ExportConfig, echo, calibration) -> Path:
    """The steps of `export`, each marked in its memory log."""
    from ..bundle.install import check_output, install, staging_dir
    from .arch import check_context

    config = resolve_source(config)
    output = check_output(config.output)  # bad inputs fail before the (slow) model load
    if config.prompts_file:
        from ..prompts import load_calibration_prompts

        load_calibration_prompts(config.prompts_file)
    with _one_parse(config.source):
        model, tokenizer, streamed = _load(config)
        config.check_layers(model.config.num_hidden_layers)
        config = with_exit_layer(config, model.config.num_hidden_layers, echo)
        check_context(model.config, config.max_context)
        how = "its weights read a tensor at a time" if streamed else "in fp32"
        echo(f"loaded {config.source.name}: {model.config.model_type}, {model.config.num_hidden_layers} layers, {how}")
        config = with_precision(config, echo)
    mark("loading the model")
    with staging_dir(output, ".export-") as staging:
        if config.needs_calibration:
            from ..calibration.steps import CalibrationConfig
            from .calibrate import calibrated_export

            calibrated_export(model, tokenizer, config, staging, echo, calibration or CalibrationConfig())
        else:
            from .writer import write_bundle

            write_bundle(model, tokenizer, config, staging, echo=echo, streamed=streamed, sealed=not config.quantized)
        del model, streamed  # quantizing reads the graphs, never the model
        final = _quantized(staging, config, echo, calibration) if config.quantized else staging
        mark("quantizing" if config.quantized else "writing the bundle")
        if config.target != DEFAULT_TARGET and not config.quantized:  # a quantized copy reported its own
            from ..quantization.quantize import kernel_report

            echo(kernel_report(final, config.target))
        if config.backend == "tensorrt":
            from ..backends.tensorrt.build import build_engines

            build_engines(final, echo=echo)
        install(final, output)
    return output


def _load(config: ExportConfig):
    """(model, tokenizer, streamed): a skeleton whose weights are read a tensor at a time
    (streamed.py) unless calibration runs the model, or the source is not a GGUF or safetensors."""
    from .arch import check_supported
    from .inputs import check_source
    from .streamed import load_skeleton, streamable

    check_source(config.source, check_supported)  # a bad file is named before either path reads it
    if not config.needs_calibration and streamable(config.source):
        return load_skeleton(config.source)
    from .arch import load

    return (*load(config.source), None)


def _quantized(fp32: Path, config: ExportConfig, echo, calibration=None) -> Path:
    """A quantized copy of the staged fp32 bundle beside it (the fp32 one is its quality reference);
    a calibrated bundle's measured defaults are measured again on it."""
    from ..quantization.quantize import quantized_copy

    target = fp32.with_name("quantized")
    quantized_copy(fp32, target, config.quantize_options(), echo)
    shutil.rmtree(fp32)
    if config.needs_calibration:
        from ..calibration.steps import CalibrationConfig
        from .calibrate import remeasure_defaults

        remeasure_defaults(target, config, calibration or CalibrationConfig(), echo)
    return target


def _one_parse(source: Path):
    """A GGUF is parsed once for loading and for its precision (export/gguf_reads.py)."""
    import contextlib

    if source.suffix != ".gguf":
        return contextlib.nullcontext()
    from .gguf_reads import parsed_once

    return parsed_once()


def default_exit_layer(num_layers: int) -> int:
    """A quarter of the layers, rounded (8 of 30, 7 of 28, 9 of 36), at least one: deep enough that
    the draft layers' KV rows every drafter writes are a small share of a step, shallow enough for
    an early-exit draft to cost little. Every drafter works whatever the exit; only the early exit's
    own drafts depend on it (docs/draft-sources.md)."""
    return max(1, min(num_layers - 1, (num_layers + 2) // 4))


def with_exit_layer(config: ExportConfig, num_layers: int, echo) -> ExportConfig:
    """`config` with the default exit layer decided (said in the log), else as it was."""
    if config.exit_layer != QUARTER_EXIT:
        return config
    k = default_exit_layer(num_layers)
    echo(f"exit layer {k} of {num_layers} (the default: a quarter of the layers; --exit-layer K or auto chooses another)")
    return dataclasses.replace(config, exit_layer=k)


def with_precision(config: ExportConfig, echo) -> ExportConfig:
    """`config` with its precision decided: as asked, else the source's own (said in the log)."""
    if config.precision is not None:
        return config
    from .source_precision import choose

    precision, line = choose(config.source)
    echo(line)
    return dataclasses.replace(config, precision=precision)


def resolve_source(config: ExportConfig) -> ExportConfig:
    """`specdeploy calibrate BUNDLE`: re-calibrate from the model the bundle was exported from."""
    from ..bundle import manifest as manifest_io

    if not (config.source / manifest_io.MANIFEST_FILE).exists():
        return config
    source = manifest_io.read(config.source).extra.get("source")
    if not source or not Path(source).exists():
        raise ConfigError(f"{config.source} does not record an existing source model ({source}); "
                          f"calibrate the model itself: specdeploy calibrate MODEL --output {config.output}")
    return dataclasses.replace(config, source=Path(source))
