"""Native TensorRT engines built from the bundle's ONNX graphs (optional; imported lazily).

`tensorrt` and `cuda.bindings` (cuda-python) are needed only here; without them every command
that needs this backend says so in one line.
"""
from __future__ import annotations

from ...errors import MissingDependencyError


def import_tensorrt():
    try:
        import tensorrt as trt
    except ImportError:
        raise MissingDependencyError(
            "the TensorRT backend needs the 'tensorrt' Python package: on Jetson it comes with JetPack "
            "(apt install python3-libnvinfer), on a desktop GPU pip install tensorrt from NVIDIA's index"
        ) from None
    return trt


def import_cudart():
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        raise MissingDependencyError(
            "the TensorRT backend needs CUDA bindings: pip install 'specdeploy[tensorrt]' (cuda-python)"
        ) from None
    return cudart
