"""TensorRT stages: engines run with execute_async_v3 on one CUDA stream, KV buffers on the device.

Each KV buffer is allocated once and bound as both `past_*` input and `present_*` output (the
in-place TensorScatter of the graph, an aliased pair for TensorRT). Rollback is the host-side valid
length, as on the CPU: the cache never crosses to the host. Per call only the small tensors move:
token ids, positions, the h_k rows handed to the verify engine and the logits rows needed.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ... import io_names
from ...errors import BundleError
from ..base import OutputBuffers
from . import import_tensorrt
from .cuda import Cuda


def _max_shape(profiles: list[dict], name: str, static) -> tuple[int, ...]:
    shapes = [tuple(p[name][2]) for p in profiles if name in p]
    return max(shapes, key=lambda s: int(np.prod(s))) if shapes else tuple(static)


class TrtStage:
    def __init__(self, name: str, engine, graph, record: dict, kv: dict[str, int], cuda: Cuda, stream: int, trt):
        self.name, self.engine, self.graph, self.cuda, self.stream = name, engine, graph, cuda, stream
        self.profiles = record["profiles"]
        self.max_rows = [p[graph.inputs[0]][2][1] for p in self.profiles]  # rows of the first input
        self.contexts = []
        aliases = io_names.kv_aliases(graph.layers)
        for index in range(len(self.profiles)):
            ctx = engine.create_execution_context()
            ctx.set_optimization_profile_async(index, stream)
            for out_name, in_name in aliases.items():
                ctx.set_tensor_address(in_name, kv[in_name])
                ctx.set_tensor_address(out_name, kv[in_name])  # aliased: same device memory
            self.contexts.append(ctx)
        self.kv = kv
        self.inputs, self.outputs = {}, {}
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        for tensor in names:
            if tensor in aliases or tensor in aliases.values():
                continue
            dtype = np.dtype(trt.nptype(engine.get_tensor_dtype(tensor)))
            shape = _max_shape(self.profiles, tensor, engine.get_tensor_shape(tensor))
            if engine.get_tensor_mode(tensor) == trt.TensorIOMode.OUTPUT:
                width = int(engine.get_tensor_shape(tensor)[-1])
                shape = (1, max(self.max_rows), width)
                self.outputs[tensor] = (cuda.malloc(int(np.prod(shape)) * dtype.itemsize), dtype, width)
            else:
                self.inputs[tensor] = cuda.malloc(int(np.prod([max(d, 1) for d in shape])) * dtype.itemsize)
        dtype = next(iter(self.outputs.values()))[1]
        self.buffers = OutputBuffers({n: w for n, (_, _, w) in self.outputs.items()}, rows=8, dtype=dtype)

    def _context(self, rows: int):
        for ctx, limit in zip(self.contexts, self.max_rows):
            if rows <= limit:
                return ctx
        raise BundleError(
            f"{rows} rows exceed the {self.name} engine's largest profile ({max(self.max_rows)}); rebuild "
            f"engines with a larger --max-prompt"
        )

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = next(iter(feeds.values())).shape[1]
        ctx = self._context(rows)
        for name, array in feeds.items():
            array = np.ascontiguousarray(array)
            if not ctx.set_input_shape(name, array.shape):
                raise BundleError(f"{self.name} engine rejected shape {array.shape} for {name}; rebuild the engines")
            self.cuda.to_device(self.inputs[name], array, self.stream)
            ctx.set_tensor_address(name, self.inputs[name])
        for name, (ptr, _, _) in self.outputs.items():
            ctx.set_tensor_address(name, ptr)
        missing = ctx.infer_shapes()
        if missing:
            raise BundleError(f"{self.name} engine: shapes unresolved for {missing}; rebuild the engines")
        if not ctx.execute_async_v3(self.stream):
            raise BundleError(f"{self.name} engine failed to run; see the TensorRT log (-v)")
        views = self.buffers.views(rows)
        for name, view in views.items():
            self.cuda.to_host(view, self.outputs[name][0], self.stream)
        self.cuda.synchronize(self.stream)
        return views

    def kv_buffer(self, name: str):
        return None  # device memory: not readable from the host without a copy

    def close(self) -> None:
        for ptr in self.inputs.values():
            self.cuda.free(ptr)
        for ptr, _, _ in self.outputs.values():
            self.cuda.free(ptr)
        self.inputs, self.outputs = {}, {}


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


def load_stages(bundle: Path, manifest, provider: str = "cuda", **_) -> dict[str, TrtStage]:
    trt = import_tensorrt()
    cuda = Cuda()
    record = check_engines(manifest, trt.__version__, cuda.compute_capability())
    logger = trt.Logger(trt.Logger.WARNING)
    runtime = trt.Runtime(logger)
    stream = cuda.stream()
    kv_bytes = int(np.prod(manifest.kv_shape)) * np.dtype(manifest.kv_dtype).itemsize
    stages = {}
    for name, graph in manifest.graphs.items():
        engine = runtime.deserialize_cuda_engine((Path(bundle) / record["engines"][name]["file"]).read_bytes())
        if engine is None:
            raise BundleError(f"TensorRT could not load the {name} engine; rebuild with 'specdeploy build-engines'")
        kv = {n: cuda.malloc(kv_bytes) for n in io_names.kv_inputs(graph.layers)}
        for ptr in kv.values():
            cuda.memset(ptr, kv_bytes, stream)
        stages[name] = TrtStage(name, engine, graph, record["engines"][name], kv, cuda, stream, trt)
    return stages
