"""Backends turn a bundle's graphs into stages: name-keyed arrays in, name-keyed arrays out."""
from __future__ import annotations

from ..constants import BACKENDS, DEFAULT_BACKEND
from ..errors import ConfigError


def load_stages(bundle, manifest, backend: str = DEFAULT_BACKEND, provider: str | None = None,
                threads: int | None = None):
    """Create every stage of the bundle on one backend, with its KV buffers bound in place.

    `provider` and `threads` are ONNX Runtime settings; the TensorRT backend refuses them rather
    than ignoring them.
    """
    if backend == "onnxruntime":
        from .onnxruntime import load_stages as load
    elif backend == "tensorrt":
        from .tensorrt.stage import load_stages as load
    else:
        raise ConfigError(f"unknown backend '{backend}'; pick one of {', '.join(BACKENDS)}")
    return load(bundle, manifest, provider=provider, threads=threads)
