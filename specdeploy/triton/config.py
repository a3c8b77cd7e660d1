"""What `specdeploy triton` is asked: validated once, read by the repository and manifest writers."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..constants import BACKENDS, DEFAULT_BACKEND
from ..errors import ConfigError


@dataclass(frozen=True)
class TritonConfig:
    bundle: Path
    output: Path
    name: str = "specdeploy"
    instances: int = 1            # engines per node, each with its own KV buffers
    max_queue: int = 8            # requests waiting per instance; more get an error response
    threads: int | None = None    # ONNX Runtime intra-op threads per instance (None: every CPU the process may use)
    copy: bool = False            # copy the bundle into the repository instead of referencing it
    site_packages: str | None = None  # extra paths for Triton's Python stub (specdeploy, numpy<2, onnxruntime)
    backend: str = DEFAULT_BACKEND    # tensorrt: engines built on the device (Jetson, RTX); instances on the GPU

    def __post_init__(self):
        if not self.name or any(c in self.name for c in "/\\ "):
            raise ConfigError(f"--name {self.name!r} must be a non-empty name without spaces or slashes")
        if self.instances < 1 or self.max_queue < 1:
            raise ConfigError("--instances and --max-queue must be >= 1")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"--threads {self.threads} must be >= 1")
        if self.backend not in BACKENDS:
            raise ConfigError(f"--backend {self.backend} is unknown; pick one of {', '.join(BACKENDS)}")
        if self.backend == "tensorrt" and self.threads is not None:
            raise ConfigError("--threads is an ONNX Runtime setting; drop it with --backend tensorrt")
