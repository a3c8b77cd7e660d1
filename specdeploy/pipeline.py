"""`specdeploy export` end to end: export, then optionally calibrate, tune and quantize."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .errors import ConfigError
from .manifest import DEFAULT_LOOKUP_NGRAM

PRECISIONS = ("fp32", "fp16", "int8", "fp8")


@dataclass(frozen=True)
class ExportRequest:
    source: Path
    exit_layer: int | None          # None: choose by calibration ("auto")
    num_draft_tokens: int | None    # None: choose by calibration ("auto")
    max_context: int = 2048
    output: Path = Path("engine.plan")
    draft_source: str = "hybrid"
    lookup_ngram: tuple[int, int] = DEFAULT_LOOKUP_NGRAM
    calibrate: bool = False
    precision: str = "fp32"
    validate: bool = True
    prompts_file: Path | None = None
    draft_precision: str | None = None
    verify_precision: str | None = None
    backend: str = "onnxruntime"   # "tensorrt": also build engines on this machine
    opset: int = 24

    def __post_init__(self):
        for p in (self.precision, self.draft_precision, self.verify_precision):
            if p is not None and p not in PRECISIONS:
                raise ConfigError(f"precision='{p}' is unknown; pick one of {', '.join(PRECISIONS)}")

    @property
    def quantized(self) -> bool:
        return {self.precision, self.draft_precision or "fp32", self.verify_precision or "fp32"} != {"fp32"}

    @property
    def needs_calibration(self) -> bool:
        return self.calibrate or self.exit_layer is None or self.num_draft_tokens is None


def run_export(request: ExportRequest, echo: Callable[[str], None] = print) -> Path:
    from .export.bundle import export

    if request.needs_calibration:
        from .calibration.pipeline import calibrate_export

        path = calibrate_export(request, echo)
    else:
        path = export(_export_config(request))
    if request.quantized:
        from .quantize import quantize

        quantize(path, path, request.precision, request.draft_precision, request.verify_precision,
                 request.prompts_file, echo)
    if request.backend == "tensorrt":
        from .backends.tensorrt.build import build_engines

        build_engines(path, echo=echo)
    return path


def _export_config(request: ExportRequest):
    from .export.bundle import ExportConfig

    return ExportConfig(
        source=request.source, exit_layer=request.exit_layer,
        num_draft_tokens=request.num_draft_tokens, max_context=request.max_context,
        output=request.output, draft_source=request.draft_source, lookup_ngram=request.lookup_ngram,
        validate=request.validate, opset=request.opset,
    )
