"""Build TensorRT engines from a bundle's ONNX graphs, on the machine that will run them.

Profiles come from the I/O names and dynamic axes in `io_names`: every graph gets a decode/verify
profile (1 … γmax+1 rows) and a prefill profile (up to the longest prompt) — the heads too, so
teacher-forced logits over a prompt and any num_draft_tokens up to the prompt limit run. Engines are
written as `<graph>.trt` inside the bundle. The
graphs carry their own precision (FP16 types, INT8 / FP8 Q/DQ), so networks are strongly typed:
TensorRT 11 always, TensorRT 10 through the STRONGLY_TYPED creation flag.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from ...bundle import io_names
from ...bundle import manifest as manifest_io
from ...constants import COMPUTE_PRECISIONS, MAX_DRAFT_TOKENS
from ...errors import BackendError, ConfigError
from . import import_tensorrt
from .cuda import Cuda

log = logging.getLogger("specdeploy")
TIMING_CACHE = "tensorrt.timing-cache"
FP8_MIN_CAPABILITY = (8, 9)  # Ada, Hopper and later; Jetson Orin (8.7) has none


@dataclass(frozen=True)
class BuildConfig:
    max_draft_tokens: int = 8
    max_prompt: int = 512
    workspace_mb: int = 2048

    def __post_init__(self):
        if not (1 <= self.max_draft_tokens <= MAX_DRAFT_TOKENS):
            raise ConfigError(f"max_draft_tokens={self.max_draft_tokens} must be in 1..{MAX_DRAFT_TOKENS}")
        if self.max_prompt < 1:
            raise ConfigError(f"max_prompt={self.max_prompt} must be >= 1")


def profiles(graph, manifest, config: BuildConfig) -> list[dict[str, tuple]]:
    """Per optimization profile: input name -> (min, opt, max) shape, for every dynamic input."""
    hidden, ctx = manifest.model.hidden_size, manifest.max_context
    decode_rows = (1, min(manifest.num_draft_tokens + 1, config.max_draft_tokens + 1), config.max_draft_tokens + 1)
    prefill_rows = (1, min(128, config.max_prompt), min(config.max_prompt, ctx))
    out = []
    for rows in (decode_rows, prefill_rows):
        shapes = {}
        for name in graph.inputs:
            axes = io_names.dynamic_axes(name)
            if name == io_names.ATTENTION_MASK:
                shapes[name] = ((1, 1), (1, min(256, ctx)), (1, ctx))
            elif name == io_names.HIDDEN_IN:
                shapes[name] = tuple((1, r, hidden) for r in rows)
            elif name == io_names.FEATURES:  # a feature head's projection
                shapes[name] = tuple((1, r, len(manifest.feature_layers) * hidden) for r in rows)
            elif axes:
                shapes[name] = tuple((1, r) for r in rows)
        out.append(shapes)
    return out


def _network(trt, builder, logger, path: Path):
    major = int(trt.__version__.split(".")[0])
    flags = 0
    if major < 11:  # TensorRT 11 networks are always strongly typed
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(path)):
        errors = "; ".join(str(parser.get_error(i).desc()) for i in range(parser.num_errors))
        raise BackendError(f"TensorRT cannot parse {path.name}: {errors}")
    return network, parser


def _check_precision(manifest, capability: tuple[int, int]) -> None:
    fp8 = [n for n, g in manifest.graphs.items() if g.precision == "fp8"]
    if fp8 and capability < FP8_MIN_CAPABILITY:
        raise ConfigError(
            f"this GPU (compute capability {capability[0]}.{capability[1]}) has no FP8, which the "
            f"{', '.join(fp8)} graph(s) use; FP8 needs 8.9+ (Ada, Hopper). Re-quantize with "
            f"--precision int8 or fp16 (Jetson Orin: int8 or fp16)"
        )


def tensorrt_source(name: str, graph) -> str:
    """The file TensorRT parses: an int4/int8 graph's DequantizeLinear form (TensorRT does not run
    ONNX Runtime's MatMulNBits), any other graph itself."""
    if graph.precision in COMPUTE_PRECISIONS and not graph.tensorrt_file:
        raise ConfigError(
            f"the {name} graph is {graph.precision} for ONNX Runtime (MatMulNBits) and the bundle has no "
            f"TensorRT form of it; re-quantize the fp32 bundle with 'specdeploy quantize --precision "
            f"{graph.precision} --tensorrt'"
        )
    return graph.tensorrt_file or graph.file


def build_engines(bundle: Path, config: BuildConfig = BuildConfig(), echo=print) -> Path:
    """Build one engine per graph into the bundle and record them in the manifest."""
    bundle = Path(bundle)
    manifest = manifest_io.read_verified(bundle)  # a bad bundle is named before a missing TensorRT
    trt = import_tensorrt()
    capability = Cuda().compute_capability()
    _check_precision(manifest, capability)
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    cache_path = bundle / TIMING_CACHE
    engines = {}
    for name, graph in manifest.graphs.items():
        network, _parser = _network(trt, builder, logger, bundle / tensorrt_source(name, graph))
        build = builder.create_builder_config()
        build.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, config.workspace_mb << 20)
        cache = build.create_timing_cache(cache_path.read_bytes() if cache_path.is_file() else b"")
        build.set_timing_cache(cache, False)
        shapes = profiles(graph, manifest, config)
        for profile_shapes in shapes:
            profile = builder.create_optimization_profile()
            for tensor, (lo, opt, hi) in profile_shapes.items():
                profile.set_shape(tensor, lo, opt, hi)
            build.add_optimization_profile(profile)
        plan = builder.build_serialized_network(network, build)
        if plan is None:
            raise BackendError(f"TensorRT could not build the {name} engine; rerun with -v for its log")
        file = f"{name}.trt"
        (bundle / file).write_bytes(bytes(plan))
        cache_path.write_bytes(bytes(build.get_timing_cache().serialize()))
        engines[name] = {"file": file, "profiles": [{k: [list(s) for s in v] for k, v in p.items()} for p in shapes]}
        echo(f"built {file} ({len(shapes)} profile{'s' if len(shapes) > 1 else ''})")
    record = {"version": trt.__version__, "compute_capability": f"{capability[0]}.{capability[1]}",
              "max_draft_tokens": config.max_draft_tokens, "max_prompt": config.max_prompt, "engines": engines}
    manifest_io.write(bundle, manifest.replace(tensorrt=record))
    return bundle
