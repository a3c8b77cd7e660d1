"""specdeploy: self-speculative decoding (early-exit drafts, exact verification) for edge LLMs.

    from specdeploy import Engine
    with Engine("engine.plan") as engine:        # a bundle directory
        print(engine.generate("Hello", max_new_tokens=32).text)

Exporting needs the export extra: `from specdeploy.export import ExportConfig, export`.
"""
from __future__ import annotations

from .config import GenerationConfig, ResponseFormat
from .constants import DEFAULT_PREFILL_CHUNK
from .constants import VERSION as __version__
from .errors import (BackendError, BundleError, ConfigError, ContextLengthError,
                     MissingDependencyError, ModelSourceError, RowDependenceError, SpecDeployError, UnsupportedModelError,
                     ValidationError)
from .runtime.conversation import Conversation
from .runtime.engine import Engine, Piece, Result
from .runtime.stats import GenerationStats


def load(bundle, backend: str = "onnxruntime", provider: str | None = None, threads: int | None = None,
         prefill_chunk: int = DEFAULT_PREFILL_CHUNK) -> Engine:
    """Open a bundle for generation (same as `Engine(bundle, ...)`)."""
    return Engine(bundle, backend=backend, provider=provider, threads=threads, prefill_chunk=prefill_chunk)


__all__ = [
    "Engine", "Conversation", "GenerationConfig", "GenerationStats", "Piece", "ResponseFormat", "Result", "load",
    "SpecDeployError", "ConfigError", "BundleError", "ContextLengthError", "UnsupportedModelError",
    "ValidationError", "RowDependenceError", "MissingDependencyError", "BackendError", "ModelSourceError", "__version__",
]
