"""A faithful fake of the parts of `tensorrt` and `cuda.bindings.runtime` the backend uses.

"Device" memory is host memory at real addresses, copies are memmove, and an engine executes by
running its ONNX graph in ONNX Runtime on the tensors at the bound addresses. Like TensorRT it
checks shapes against the active profile, that every tensor has an address, and that a KV output
is bound to the same address as its aliased input.
"""
from __future__ import annotations

import ctypes
import enum
import json
import types
from pathlib import Path

import numpy as np
import onnx

NP_OF_ONNX = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.FLOAT16: np.float16,
              onnx.TensorProto.INT64: np.int64, onnx.TensorProto.INT32: np.int32}


# --------------------------------------------------------------------------- cuda.bindings.runtime
class FakeCudart(types.ModuleType):
    class cudaError_t(enum.IntEnum):
        cudaSuccess = 0

    class cudaMemcpyKind(enum.IntEnum):
        cudaMemcpyHostToDevice = 1
        cudaMemcpyDeviceToHost = 2

    cudaStreamNonBlocking = 1

    def __init__(self, capability=(8, 7)):
        super().__init__("cuda.bindings.runtime")
        self.capability, self.memory, self.freed = capability, {}, []
        self.streams, self.destroyed_streams = [], []

    def cudaGetDeviceCount(self):
        return self.cudaError_t.cudaSuccess, 1

    def cudaGetDeviceProperties(self, device):
        return self.cudaError_t.cudaSuccess, types.SimpleNamespace(major=self.capability[0], minor=self.capability[1])

    def cudaMalloc(self, size):
        buf = np.zeros(size, np.uint8)
        self.memory[buf.ctypes.data] = buf
        return self.cudaError_t.cudaSuccess, buf.ctypes.data

    def cudaFree(self, ptr):
        self.freed.append(ptr)
        return (self.cudaError_t.cudaSuccess,)

    def cudaStreamCreateWithFlags(self, flags):
        self.streams.append(7 + len(self.streams))
        return self.cudaError_t.cudaSuccess, self.streams[-1]

    def cudaStreamDestroy(self, stream):
        self.destroyed_streams.append(stream)
        return (self.cudaError_t.cudaSuccess,)

    def cudaMemsetAsync(self, ptr, value, size, stream):
        ctypes.memset(ptr, value, size)
        return (self.cudaError_t.cudaSuccess,)

    def cudaMemcpyAsync(self, dst, src, size, kind, stream):
        ctypes.memmove(dst, src, size)
        return (self.cudaError_t.cudaSuccess,)

    def cudaStreamSynchronize(self, stream):
        return (self.cudaError_t.cudaSuccess,)


# --------------------------------------------------------------------------------------- tensorrt
class DataType(enum.IntEnum):
    FLOAT = 0
    HALF = 1
    INT32 = 3
    INT64 = 8


class TensorIOMode(enum.IntEnum):
    INPUT = 1
    OUTPUT = 2


class NetworkDefinitionCreationFlag(enum.IntEnum):
    STRONGLY_TYPED = 1


class MemoryPoolType(enum.IntEnum):
    WORKSPACE = 0


class Logger:
    WARNING = 2

    def __init__(self, severity=2):
        self.severity = severity


def nptype(dtype):
    return {DataType.FLOAT: np.float32, DataType.HALF: np.float16, DataType.INT32: np.int32,
            DataType.INT64: np.int64}[dtype]


class Network:
    def __init__(self, flags):
        self.flags, self.path = flags, None


class _ParserError:
    def __init__(self, text):
        self.text = text

    def desc(self):
        return self.text


class OnnxParser:
    def __init__(self, network, logger):
        self.network, self.num_errors = network, 0

    def parse_from_file(self, path):
        """As TensorRT's parser: ONNX Runtime's contrib ops (MatMulNBits, GatherBlockQuantized) fail."""
        self.network.path = path
        if not Path(path).is_file():
            return False
        import onnx

        model = onnx.load(str(path), load_external_data=False)
        contrib = sorted({n.op_type for n in model.graph.node if n.domain == "com.microsoft"})
        if contrib:
            self.num_errors = 1
            self.errors = [f"No importer registered for op: {contrib[0]}"]
            return False
        self.network.ops = [n.op_type for n in model.graph.node]
        self.network.dq_blocks = [
            {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
            for n in model.graph.node if n.op_type == "DequantizeLinear"]
        return True

    def get_error(self, i):
        return _ParserError(self.errors[i])


class Profile:
    def __init__(self):
        self.shapes = {}

    def set_shape(self, name, lo, opt, hi):
        assert all(a <= b <= c for a, b, c in zip(lo, opt, hi)), f"bad profile for {name}"
        self.shapes[name] = [list(lo), list(opt), list(hi)]


class TimingCache:
    def serialize(self):
        return b"timing-cache"


class BuilderConfig:
    def __init__(self):
        self.profiles, self.pool = [], {}

    def set_memory_pool_limit(self, pool, size):
        self.pool[pool] = size

    def create_timing_cache(self, data):
        return TimingCache()

    def set_timing_cache(self, cache, ignore_mismatch):
        return True

    def get_timing_cache(self):
        return TimingCache()

    def add_optimization_profile(self, profile):
        self.profiles.append(profile.shapes)
        return len(self.profiles) - 1


class Builder:
    created_flags: list = []

    def __init__(self, logger):
        pass

    def create_network(self, flags=0):
        Builder.created_flags.append(flags)
        return Network(flags)

    def create_builder_config(self):
        return BuilderConfig()

    def create_optimization_profile(self):
        return Profile()

    def build_serialized_network(self, network, config):
        return json.dumps({"onnx": str(network.path), "profiles": config.profiles}).encode()


class Engine:
    def __init__(self, blob: bytes):
        spec = json.loads(blob)
        self.path, self.profiles = spec["onnx"], spec["profiles"]
        model = onnx.load(self.path, load_external_data=False)
        self.io = {}
        for mode, values in ((TensorIOMode.INPUT, model.graph.input), (TensorIOMode.OUTPUT, model.graph.output)):
            for v in values:
                t = v.type.tensor_type
                shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim)
                self.io[v.name] = (mode, NP_OF_ONNX[t.elem_type], shape)
        self.names = list(self.io)
        self.num_io_tensors = len(self.names)
        self.num_optimization_profiles = len(self.profiles)
        self._session = None

    def get_tensor_name(self, i):
        return self.names[i]

    def get_tensor_mode(self, name):
        return self.io[name][0]

    def get_tensor_dtype(self, name):
        return {np.float32: DataType.FLOAT, np.float16: DataType.HALF, np.int64: DataType.INT64,
                np.int32: DataType.INT32}[self.io[name][1]]

    def get_tensor_shape(self, name):
        return self.io[name][2]

    def get_aliased_input_tensor(self, name):
        return name.replace("present_", "past_") if name.startswith("present_") else None

    def create_execution_context(self):
        return Context(self)

    def session(self):
        if self._session is None:
            import onnxruntime as ort

            self._session = ort.InferenceSession(self.path)
        return self._session


class Context:
    fail_runs = False   # tests set this to make execute_async_v3 report a failure, as TensorRT can
    executed = 0        # calls of execute_async_v3, over all contexts

    def __init__(self, engine):
        self.engine, self.profile, self.shapes, self.addresses = engine, 0, {}, {}

    def set_optimization_profile_async(self, index, stream):
        assert 0 <= index < self.engine.num_optimization_profiles
        self.profile = index
        return True

    def set_input_shape(self, name, shape):
        if name not in self.engine.profiles[self.profile]:  # static input: only its own shape
            ok = tuple(shape) == self.engine.io[name][2]
            if ok:
                self.shapes[name] = tuple(shape)
            return ok
        lo, _, hi = self.engine.profiles[self.profile][name]
        if not all(a <= s <= b for a, s, b in zip(lo, shape, hi)):
            raise ValueError(f"shape {tuple(shape)} of {name} is outside profile {self.profile} [{lo}, {hi}]")
        self.shapes[name] = tuple(shape)
        return True

    def set_tensor_address(self, name, ptr):
        self.addresses[name] = int(ptr)
        return True

    def infer_shapes(self):
        return [n for n, (mode, _, shape) in self.engine.io.items()
                if mode == TensorIOMode.INPUT and -1 in shape and n not in self.shapes]

    def _array(self, name, shape):
        dtype = np.dtype(self.engine.io[name][1])
        size = int(np.prod(shape)) * dtype.itemsize
        raw = (ctypes.c_uint8 * size).from_address(self.addresses[name])
        return np.frombuffer(raw, dtype).reshape(shape)

    def execute_async_v3(self, stream):
        Context.executed += 1
        if Context.fail_runs:
            return False
        feeds = {}
        for name, (mode, _, shape) in self.engine.io.items():
            if name not in self.addresses:
                raise RuntimeError(f"no address set for {name}")
            alias = self.engine.get_aliased_input_tensor(name)
            if mode == TensorIOMode.OUTPUT and alias and self.addresses[name] != self.addresses[alias]:
                raise RuntimeError(f"API error: {name} must share its address with {alias}")
            if mode == TensorIOMode.INPUT:
                feeds[name] = self._array(name, self.shapes.get(name, shape)).copy()
        outputs = self.engine.session().run(None, feeds)
        for (name, _), value in zip([(n, m) for n, m in self.engine.io.items() if m[0] == TensorIOMode.OUTPUT], outputs):
            self._array(name, value.shape)[...] = value
        return True


def make_tensorrt(version="10.3.0"):
    mod = types.ModuleType("tensorrt")
    for name, obj in dict(DataType=DataType, TensorIOMode=TensorIOMode, Logger=Logger, Builder=Builder,
                          NetworkDefinitionCreationFlag=NetworkDefinitionCreationFlag, OnnxParser=OnnxParser,
                          MemoryPoolType=MemoryPoolType, nptype=nptype,
                          Runtime=lambda logger: types.SimpleNamespace(deserialize_cuda_engine=Engine)).items():
        setattr(mod, name, obj)
    mod.__version__ = version
    return mod


def install(monkeypatch, version="10.3.0", capability=(8, 7)):
    """Put the fakes in sys.modules as `tensorrt` and `cuda.bindings.runtime`."""
    import sys

    trt = make_tensorrt(version)
    cudart = FakeCudart(capability)
    cuda_pkg, bindings = types.ModuleType("cuda"), types.ModuleType("cuda.bindings")
    cuda_pkg.bindings, bindings.runtime = bindings, cudart
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    monkeypatch.setitem(sys.modules, "cuda", cuda_pkg)
    monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
    monkeypatch.setitem(sys.modules, "cuda.bindings.runtime", cudart)
    return trt, cudart
