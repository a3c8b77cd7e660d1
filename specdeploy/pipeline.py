"""`specdeploy export` end to end: export, then optionally calibrate, tune and quantize."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .errors import ConfigError

PRECISIONS = ("fp32", "fp16", "int8", "fp8")


@dataclass(frozen=True)
class ExportRequest:
    source: Path
    exit_layer: int | None          # None: choose by calibration ("auto")
    num_draft_tokens: int | None    # None: choose by calibration ("auto")
    max_context: int = 2048
    output: Path = Path("engine.plan")
    draft_source: str = "early_exit"
    calibrate: bool = False
    precision: str = "fp32"
    validate: bool = True
    prompts_file: Path | None = None

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision='{self.precision}' is unknown; pick one of {', '.join(PRECISIONS)}")

    @property
    def needs_calibration(self) -> bool:
        return self.calibrate or self.exit_layer is None or self.num_draft_tokens is None


def run_export(request: ExportRequest, echo: Callable[[str], None] = print) -> Path:
    from .export.bundle import ExportConfig, export

    if request.needs_calibration:
        from .calibration.pipeline import calibrate_export

        return calibrate_export(request, echo)
    config = ExportConfig(
        source=request.source, exit_layer=request.exit_layer,
        num_draft_tokens=request.num_draft_tokens, max_context=request.max_context,
        output=request.output, draft_source=request.draft_source, validate=request.validate,
    )
    path = export(config)
    if request.precision != "fp32":
        from .quantize import quantize_bundle

        quantize_bundle(path, request.precision, echo=echo, source=request.source)
    return path
