"""ONNX Runtime stages: KV buffers bound in place with IOBinding, session options for decode.

Binding the same OrtValue as `past_*` input and `present_*` output lets the TensorScatter kernel
update the cache in place; outputs are written straight into preallocated numpy buffers.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ..bundle import io_names
from ..bundle.manifest import GraphInfo, Manifest
from ..constants import PROVIDERS
from ..errors import BackendError, ConfigError
from . import attention_window
from .base import OutputBuffers, usable_cpus
from .residency import anonymous_regions, collapse_new, drop_cached, page_out, read_anonymous, trim_heap, zeroed

EXECUTION_PROVIDERS = dict(zip(PROVIDERS, ("CPUExecutionProvider", "CUDAExecutionProvider",
                                           "TensorrtExecutionProvider")))
SHRINK_AFTER_ROWS = 64  # more rows than any verify pass (MAX_DRAFT_TOKENS + 1): a prompt's prefill


@functools.lru_cache(maxsize=1)
def register_shared_arena() -> None:
    """One CPU arena for every session of this process that asks for it (`session.use_env_allocators`).

    Without an arena, glibc serves ONNX Runtime's per-run buffers, and where they land (heap or
    a fresh mapping) varies run to run: the example's int4 peak was 237 or 245 MB between
    identical runs and a 1,900-token prompt peaked at 724-728 MB. One arena shared by the draft,
    verify and head sessions reuses one set of chunks: 236 MB every run, 463-467 MB for that
    prompt, and decoding as fast (lab/scripts/arena_ab.py, lab/notes/benchmarks-history.md).
    """
    info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
    try:
        ort.create_and_register_allocator(info, ort.OrtArenaCfg(0, 0, -1, -1))  # unbounded, next-power-of-two growth
    except Exception:  # the host application registered one first: its arena serves our sessions
        pass


@functools.lru_cache(maxsize=1)
def shrink_run() -> ort.RunOptions:
    """Run options that hand the arena's free chunks back after the run: a long prompt's prefill
    needs buffers (attention scores over every row) that decoding never reuses."""
    options = ort.RunOptions()
    options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    return options


def session_options(threads: int | None = None, log_severity: int = 3,
                    fold_dequantize: bool = False, operators: tuple[str, ...] = ()) -> ort.SessionOptions:
    """Small-batch decode: one pool per session sized to the CPUs the process may use (`usable_cpus`),
    spinning only inside a run.

    A decode pass is hundreds of small ops; a pool that sleeps between them pays a thread wake-up
    per op (lab/notes/benchmarks-history.md: plain decoding 52 → 65 tok/s on 2 cores once pools spin). Draft,
    verify and head sessions alternate, so a pool still spinning after its run would fight the next
    session for the same cores: each pool spins while its session runs and stops when the run ends.
    `fold_dequantize` (weight-only fp8 graphs): dequantize the weights once at load instead of
    letting ONNX Runtime fuse them into kernels that quantize activations per call, whose results
    depend on how many rows a call carries and so break greedy identity with plain decoding.
    Every session uses the one CPU arena of `register_shared_arena`. `operators`: specdeploy's own
    operators the graph uses (the manifest's `operators`), registered from the library built here.
    """
    so = ort.SessionOptions()
    so.enable_cpu_mem_arena = True
    register_shared_arena()
    so.add_session_config_entry("session.use_env_allocators", "1")
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.intra_op_num_threads = threads or usable_cpus()
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "1")
    so.add_session_config_entry("session.force_spinning_stop", "1")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    so.log_severity_level = log_severity
    if fold_dequantize:
        so.add_session_config_entry("session.disable_quant_qdq", "1")
    if operators:
        so.register_custom_ops_library(str(operator_library(operators)))
    return so


def operator_library(operators: tuple[str, ...]) -> Path:
    """The library holding `operators` (kernels/), built here on first use."""
    from .. import kernels

    unknown = [name for name in operators if name not in kernels.NAMES]
    if unknown:
        raise BackendError(f"this bundle needs operator(s) {', '.join(unknown)}, which this specdeploy does not "
                           f"have (another version's weight layout): re-export the bundle with this specdeploy, "
                           f"or run it with the version that made it")
    return kernels.library("this bundle")


def providers_for(provider: str) -> list[str]:
    if provider not in EXECUTION_PROVIDERS:
        raise ConfigError(f"unknown provider '{provider}'; pick one of {', '.join(PROVIDERS)}")
    wanted = EXECUTION_PROVIDERS[provider]
    if wanted not in ort.get_available_providers():
        raise BackendError(
            f"ONNX Runtime here has no {wanted}; install onnxruntime-gpu (in place of onnxruntime) "
            f"on a machine with CUDA, or use --provider cpu"
        )
    return [wanted] if provider == "cpu" else [wanted, "CPUExecutionProvider"]


class OrtStage:
    def __init__(self, name: str, session: ort.InferenceSession, graph: GraphInfo, kv: dict):
        self.name, self.session, self.graph = name, session, graph
        self.binding = session.io_binding()
        self.kv = kv
        self.held = None  # memory ONNX Runtime reads as initializers (in_place_weights): kept alive with the stage
        for out_name, in_name in io_names.kv_aliases(graph.layers).items():
            self.binding.bind_ortvalue_input(in_name, kv[in_name])
            self.binding.bind_ortvalue_output(out_name, kv[in_name])
        outs = [o for o in session.get_outputs() if o.name not in io_names.kv_aliases(graph.layers)]
        dtype = np.float16 if outs and outs[0].type == "tensor(float16)" else np.float32
        self.buffers = OutputBuffers({o.name: int(o.shape[-1]) for o in outs}, rows=8, dtype=dtype)
        self.shrink = shrink_run() if session.get_session_options().enable_cpu_mem_arena else None

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = 0
        for name, array in feeds.items():
            self.binding.bind_cpu_input(name, array)
            rows = rows or array.shape[1]
        views = self.buffers.views(rows)
        for name, view in views.items():
            self.binding.bind_output(name, "cpu", 0, view.dtype, view.shape, view.ctypes.data)
        try:
            self.session.run_with_iobinding(self.binding, self.shrink if rows > SHRINK_AFTER_ROWS else None)
        except Exception as exc:  # ORT raises its own exception types
            raise BackendError(f"{self.name} graph failed in ONNX Runtime: {exc}") from exc
        return views

    def kv_buffer(self, name: str) -> np.ndarray | None:
        """A host view (CPU) or host copy (GPU) of one KV buffer, for inspection and tests."""
        value = self.kv.get(name)
        return None if value is None else value.numpy()

    def close(self) -> None:
        self.binding.clear_binding_inputs()
        self.binding.clear_binding_outputs()


def allocate_kv(manifest: Manifest, layers: range, device: str = "cpu") -> dict:
    """Zeroed KV buffers `[1, Hkv, max_context, D]`, allocated once on the provider's device.

    On the CPU the numpy arrays back the OrtValues directly (resident only where rows are written);
    on a GPU the zeros are copied once.
    """
    dtype = np.dtype(manifest.kv_dtype)
    return {
        name: ort.OrtValue.ortvalue_from_numpy(zeroed(manifest.kv_shape, dtype), device, 0)
        for name in io_names.kv_inputs(layers)
    }


def in_place_weights(bundle: Path, manifest: Manifest) -> tuple[dict[str, tuple[list, list]], object]:
    """({graph: (initializer names, OrtValues)}, the memory holding them) for the weights
    specdeploy's operators read every step, as quantizing recorded them in the manifest: each span
    of the weights file read once into huge-page anonymous memory (residency.read_anonymous), even
    where two graphs name it (the tied embedding and the LM head), and handed to ONNX Runtime as it
    is instead of the file mapping ONNX Runtime would make: the same bytes, held once, streamed
    without a TLB miss every 4 KB."""
    table = manifest.read_in_place
    spans = sorted({(e.offset, e.length) for entries in table.values() for e in entries})
    if not spans:
        return {}, None
    region, views = read_anonymous(Path(bundle) / manifest.weights, spans)
    view_of = dict(zip(spans, views))
    weights = {}
    for graph, entries in table.items():
        values = [ort.OrtValue.ortvalue_from_numpy(np.frombuffer(view_of[(e.offset, e.length)], np.dtype(e.dtype))
                                                   .reshape(e.shape)) for e in entries]
        weights[graph] = ([e.name for e in entries], values)
    return weights, region


def provider_options(provider: str, bundle: Path) -> list:
    """The TensorRT execution provider caches its engines and timing data beside the graphs."""
    if provider != "tensorrt":
        return []
    cache = str(Path(bundle) / "ort-trt-cache")
    return [{"trt_engine_cache_enable": "1", "trt_engine_cache_path": cache,
             "trt_timing_cache_enable": "1", "trt_timing_cache_path": cache}, {}]


def check_opset(manifest: Manifest, version: str = ort.__version__) -> None:
    major, minor = (int(x) for x in version.split(".")[:2])
    if manifest.opset >= 24 and (major, minor) < (1, 25):
        raise BackendError(
            f"this bundle uses ONNX opset 24 (TensorScatter), which needs onnxruntime>=1.25, but this "
            f"environment has {version} (the newest for Python 3.10); re-export with --opset 23"
        )


def check_provider(manifest: Manifest, provider: str) -> None:
    """A bundle made for the CPU runs on the CPU only where it uses specdeploy's operators (CPU code)
    or fused float32 attention (ONNX Runtime's GroupQueryAttention has no float32 kernel on its GPU
    providers): refused in one line naming the target to export for."""
    if provider == "cpu":
        return
    what = [w for w, used in (("specdeploy's int4 operators (CPU code)", manifest.operators),
                              ("fused float32 attention (CPU GroupQueryAttention)", any(manifest.fused_attention.values())))
            if used]
    if what:
        raise BackendError(
            f"this bundle is made for --target {manifest.target}: its {' and '.join(what)} cannot run on --provider "
            f"{provider}; export it with --target cuda (or quantize its fp32 bundle with --target cuda)"
        )


def load_stages(bundle: Path, manifest: Manifest, provider: str | None = None, threads: int | None = None,
                log_severity: int = 3) -> dict[str, OrtStage]:
    check_opset(manifest)
    provider = provider or "cpu"
    check_provider(manifest, provider)
    attention_window.check(manifest, provider)
    providers = providers_for(provider)
    options = provider_options(provider, bundle) or None
    device = "cpu" if provider == "cpu" else "cuda"
    before = anonymous_regions() if device == "cpu" else None
    in_place, held = in_place_weights(bundle, manifest)
    stages = {}
    for name, graph in manifest.graphs.items():
        path = Path(bundle) / graph.file
        options_here = session_options(threads, log_severity, graph.precision == "fp8", manifest.operators)
        names, values = in_place.get(name, ([], []))
        for weight, value in zip(names, values):  # used as they are, not copied: they live with the stage
            options_here.add_initializer(weight, value)
        try:
            session = ort.InferenceSession(
                str(path), options_here,
                providers=providers,
                provider_options=options,
            )
        except Exception as exc:
            raise BackendError(
                f"ONNX Runtime {ort.__version__} cannot load {path.name}: {(str(exc).splitlines() or [repr(exc)])[0]}; "
                f"re-export the bundle with this version of specdeploy"
            ) from exc
        # before the next session's load peaks on top of what this one freed or packed: the heap's
        # free pages, and the weights file's pages this session read (its kernels hold packed copies)
        trim_heap()
        page_out(bundle)
        stages[name] = OrtStage(name, session, graph, allocate_kv(manifest, graph.layers, device))
        stages[name].held = (values, held)
    collapse_new(before)  # what the sessions packed, on 2 MB pages (residency.py)
    if device == "cpu":
        drop_cached(Path(bundle) / manifest.weights)  # a row read later maps one page, not a folio
    return stages
