"""Backends turn a bundle's graphs into stages: name-keyed arrays in, name-keyed arrays out."""
from __future__ import annotations

from ..errors import ConfigError

BACKENDS = ("onnxruntime", "tensorrt")


def load_stages(bundle, manifest, backend: str = "onnxruntime", provider: str = "cpu", **options):
    """Create every stage of the bundle on one backend, with its KV buffers bound in place."""
    if backend == "onnxruntime":
        from .onnxruntime import load_stages as load
    elif backend == "tensorrt":
        from .tensorrt.stage import load_stages as load
    else:
        raise ConfigError(f"unknown backend '{backend}'; pick one of {', '.join(BACKENDS)}")
    return load(bundle, manifest, provider=provider, **options)
