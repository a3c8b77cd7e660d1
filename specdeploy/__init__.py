"""specdeploy: self-speculative decoding (early-exit drafts, exact verification) for edge LLMs.

    from specdeploy import Engine
    with Engine("engine.plan") as engine:
        print(engine.generate("Hello", max_new_tokens=32).text)
"""
from __future__ import annotations

from .config import GenerationConfig
from .errors import (BackendError, BundleError, ConfigError, ContextLengthError,
                     MissingDependencyError, SpecDeployError, UnsupportedModelError, ValidationError)
from .runtime.engine import Engine, Piece, Result
from .runtime.stats import GenerationStats

__version__ = "0.1.0"


def load(bundle, backend: str = "onnxruntime", provider: str = "cpu", threads: int | None = None) -> Engine:
    """Open a bundle for generation (same as `Engine(bundle, ...)`)."""
    return Engine(bundle, backend=backend, provider=provider, threads=threads)


def export(config):
    """Export a model to a bundle (needs the export extra); see `specdeploy.export.bundle.ExportConfig`."""
    from .export.bundle import export as _export

    return _export(config)


__all__ = [
    "Engine", "GenerationConfig", "GenerationStats", "Piece", "Result", "load", "export",
    "SpecDeployError", "ConfigError", "BundleError", "ContextLengthError", "UnsupportedModelError",
    "ValidationError", "MissingDependencyError", "BackendError",
]
