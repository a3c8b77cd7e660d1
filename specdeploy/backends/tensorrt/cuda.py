"""Thin checked wrappers over cuda-python's runtime API (every call returns (err, *values))."""
from __future__ import annotations

from ...errors import BackendError
from . import import_cudart


class Cuda:
    def __init__(self):
        self.rt = import_cudart()

    def check(self, result, what: str):
        err, *values = result if isinstance(result, tuple) else (result,)
        if int(err) != 0:
            raise BackendError(f"CUDA {what} failed ({err}); is an NVIDIA GPU with a working driver present?")
        return values[0] if len(values) == 1 else (values or None)

    def compute_capability(self, device: int = 0) -> tuple[int, int]:
        count = self.check(self.rt.cudaGetDeviceCount(), "device query")
        if not count:
            raise BackendError("no CUDA device found; the TensorRT backend needs an NVIDIA GPU")
        prop = self.check(self.rt.cudaGetDeviceProperties(device), "device properties")
        return int(prop.major), int(prop.minor)

    def malloc(self, size: int) -> int:
        return int(self.check(self.rt.cudaMalloc(max(size, 1)), "cudaMalloc"))

    def free(self, ptr: int) -> None:
        self.check(self.rt.cudaFree(ptr), "cudaFree")

    def stream(self) -> int:
        return int(self.check(self.rt.cudaStreamCreateWithFlags(self.rt.cudaStreamNonBlocking), "stream create"))

    def destroy_stream(self, stream: int) -> None:
        self.check(self.rt.cudaStreamDestroy(stream), "stream destroy")

    def memset(self, ptr: int, size: int, stream: int) -> None:
        self.check(self.rt.cudaMemsetAsync(ptr, 0, size, stream), "cudaMemsetAsync")

    def to_device(self, dst: int, array, stream: int) -> None:
        kind = self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        self.check(self.rt.cudaMemcpyAsync(dst, array.ctypes.data, array.nbytes, kind, stream), "copy to device")

    def to_host(self, array, src: int, stream: int) -> None:
        kind = self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self.check(self.rt.cudaMemcpyAsync(array.ctypes.data, src, array.nbytes, kind, stream), "copy to host")

    def synchronize(self, stream: int) -> None:
        self.check(self.rt.cudaStreamSynchronize(stream), "stream synchronize")
