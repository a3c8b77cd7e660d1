"""TensorRT stages: engines run with execute_async_v3 on one CUDA stream, KV buffers on the device.

Each KV buffer is allocated once and bound as both `past_*` input and `present_*` output (the
in-place TensorScatter of the graph, an aliased pair for TensorRT). Rollback is the host-side valid
length, as on the CPU: the cache never crosses to the host. Per call only the small tensors move:
token ids, positions, the h_k rows handed to the verify engine and the logits rows needed.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ...bundle import io_names
from ...errors import BackendError, BundleError, ConfigError, ContextLengthError
from ..base import OutputBuffers
from . import import_tensorrt
from .cuda import Cuda


def _max_shape(profiles: list[dict], name: str, static) -> tuple[int, ...]:
    shapes = [tuple(p[name][2]) for p in profiles if name in p]
    return max(shapes, key=lambda s: int(np.prod(s))) if shapes else tuple(static)


class SharedStream:
    """One CUDA stream for all of a bundle's stages (their work is ordered), destroyed by the last user."""

    def __init__(self, cuda: Cuda):
        self.cuda, self.handle, self.users = cuda, cuda.stream(), 0

    def acquire(self) -> int:
        self.users += 1
        return self.handle

    def release(self) -> None:
        self.users -= 1
        if self.users == 0 and self.handle is not None:
            self.cuda.destroy_stream(self.handle)
            self.handle = None


class TrtStage:
    """One engine with its device buffers; owns its KV buffers and frees everything on close."""

    def __init__(self, name: str, engine, graph, record: dict, kv: dict[str, int], cuda: Cuda,
                 stream: SharedStream, trt):
        self.name, self.engine, self.graph, self.cuda = name, engine, graph, cuda
        self.shared_stream, self.stream = stream, stream.acquire()
        self.kv, self.inputs, self.outputs = kv, {}, {}
        self.profiles = record["profiles"]
        self.profile_rows = [p[graph.inputs[0]][2][1] for p in self.profiles]  # rows of the first input
        self.max_rows = max(self.profile_rows)  # the most rows one call may carry (SplitModel checks)
        aliases = io_names.kv_aliases(graph.layers)
        self.contexts = [self._bound_context(engine, index, aliases) for index in range(len(self.profiles))]
        self._allocate_io(engine, trt, skip=set(aliases) | set(aliases.values()))
        dtype = next(iter(self.outputs.values()))[1]
        self.buffers = OutputBuffers({n: w for n, (_, _, w) in self.outputs.items()}, rows=8, dtype=dtype)

    def _bound_context(self, engine, profile: int, aliases: dict[str, str]):
        """An execution context for one profile with each KV buffer bound as past and present."""
        ctx = engine.create_execution_context()
        ctx.set_optimization_profile_async(profile, self.stream)
        for out_name, in_name in aliases.items():
            ctx.set_tensor_address(in_name, self.kv[in_name])
            ctx.set_tensor_address(out_name, self.kv[in_name])  # aliased: same device memory
        return ctx

    def _allocate_io(self, engine, trt, skip: set[str]) -> None:
        """Device buffers for the small tensors, sized for the largest profile."""
        for i in range(engine.num_io_tensors):
            tensor = engine.get_tensor_name(i)
            if tensor in skip:
                continue
            dtype = np.dtype(trt.nptype(engine.get_tensor_dtype(tensor)))
            if engine.get_tensor_mode(tensor) == trt.TensorIOMode.OUTPUT:
                width = int(engine.get_tensor_shape(tensor)[-1])
                size = self.max_rows * width * dtype.itemsize  # [1, rows, width]
                self.outputs[tensor] = (self.cuda.malloc(size), dtype, width)
            else:
                shape = _max_shape(self.profiles, tensor, engine.get_tensor_shape(tensor))
                self.inputs[tensor] = self.cuda.malloc(int(np.prod([max(d, 1) for d in shape])) * dtype.itemsize)

    def _context(self, rows: int):
        for ctx, limit in zip(self.contexts, self.profile_rows):
            if rows <= limit:
                return ctx
        raise ContextLengthError(
            f"{rows} rows in one call exceed the {self.name} engine's largest profile ({self.max_rows} rows); "
            f"rebuild the engines with 'specdeploy build-engines BUNDLE --max-prompt {rows}'"
        )

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = next(iter(feeds.values())).shape[1]
        ctx = self._context(rows)
        for name, array in feeds.items():
            array = np.ascontiguousarray(array)
            if not ctx.set_input_shape(name, array.shape):
                raise BackendError(f"{self.name} engine rejected shape {array.shape} for {name}; rebuild the engines")
            self.cuda.to_device(self.inputs[name], array, self.stream)
            ctx.set_tensor_address(name, self.inputs[name])
        for name, (ptr, _, _) in self.outputs.items():
            ctx.set_tensor_address(name, ptr)
        missing = ctx.infer_shapes()
        if missing:
            raise BackendError(f"{self.name} engine: shapes unresolved for {missing}; rebuild the engines")
        if not ctx.execute_async_v3(self.stream):
            raise BackendError(f"{self.name} engine failed to run; see the TensorRT log (-v)")
        views = self.buffers.views(rows)
        for name, view in views.items():
            self.cuda.to_host(view, self.outputs[name][0], self.stream)
        self.cuda.synchronize(self.stream)
        return views

    def kv_buffer(self, name: str):
        return None  # device memory: not readable from the host without a copy

    def close(self) -> None:
        """Free every device buffer this stage owns (inputs, outputs, KV) and release the stream."""
        pointers = [*self.inputs.values(), *(ptr for ptr, _, _ in self.outputs.values()), *self.kv.values()]
        self.inputs, self.outputs, self.kv = {}, {}, {}
        for ptr in pointers:
            self.cuda.free(ptr)
        if self.stream is not None:
            self.stream = None
            self.shared_stream.release()


def check_engines(manifest, trt_version: str, capability: tuple[int, int]) -> dict:
    record = manifest.tensorrt
    if not record:
        raise BundleError("this bundle has no TensorRT engines; build them on this machine with "
                          "'specdeploy build-engines BUNDLE'")
    built_cc = record["compute_capability"]
    here_cc = f"{capability[0]}.{capability[1]}"
    if record["version"] != trt_version or built_cc != here_cc:
        raise BundleError(
            f"engines were built for TensorRT {record['version']} on compute capability {built_cc}, but this "
            f"machine has TensorRT {trt_version} and {here_cc}; rebuild them with 'specdeploy build-engines BUNDLE'"
        )
    return record


def _check_options(provider: str | None, threads: int | None) -> None:
    if provider not in (None, "cuda"):
        raise ConfigError(f"--provider {provider} is an ONNX Runtime setting; the TensorRT backend always runs "
                          f"on the GPU: drop --provider, or use --backend onnxruntime --provider {provider}")
    if threads is not None:
        raise ConfigError("threads is an ONNX Runtime setting; the TensorRT backend runs on the GPU: drop it")


def load_stages(bundle: Path, manifest, provider: str | None = None, threads: int | None = None) -> dict[str, TrtStage]:
    _check_options(provider, threads)
    trt = import_tensorrt()
    cuda = Cuda()
    record = check_engines(manifest, trt.__version__, cuda.compute_capability())
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    stream = SharedStream(cuda)
    kv_bytes = int(np.prod(manifest.kv_shape)) * np.dtype(manifest.kv_dtype).itemsize
    stages: dict[str, TrtStage] = {}
    try:
        for name, graph in manifest.graphs.items():
            engine = runtime.deserialize_cuda_engine((Path(bundle) / record["engines"][name]["file"]).read_bytes())
            if engine is None:
                raise BundleError(f"TensorRT could not load the {name} engine; rebuild with 'specdeploy build-engines'")
            kv = {n: cuda.malloc(kv_bytes) for n in io_names.kv_inputs(graph.layers)}
            for ptr in kv.values():
                cuda.memset(ptr, kv_bytes, stream.handle)
            stages[name] = TrtStage(name, engine, graph, record["engines"][name], kv, cuda, stream, trt)
    except BaseException:
        for stage in stages.values():
            stage.close()
        raise
    return stages
