"""INT8 / FP8 / FP16 versions of a bundle's graphs.

All three are weight-only explicit quantization: per-channel int8 (or E4M3) weights behind
DequantizeLinear, or float16 weights behind Cast, with float32 activations and KV; the MLP down
projections stay float. That is the form TensorRT's explicit-quantization path builds from, and on
the CPU ONNX Runtime dequantizes the weights once at load.

Why weight-only: quantizing activations (static, calibrated Q/DQ pairs; measured 1.5× faster on
the CPU) rounds every intermediate result, which turns the last-bit differences between a one-row
and a many-row matmul into different tokens: greedy speculative output stopped matching plain
output on the example model. Exactness is the product's promise, so activations stay float.

The calibration run still feeds every graph real inputs (prompt tokens to the draft graph, the exit
hidden states the draft graph produces to the verify graph, the hidden states that reach the heads):
the quantizer needs them to trace the graphs, and they validate that each graph runs.
"""
from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np

from .. import prompts
from ..bundle import io_names
from ..bundle import manifest as manifest_io
from ..constants import PRECISIONS
from ..errors import ConfigError, require

log = logging.getLogger("specdeploy")
KEEP_FLOAT = ("down_proj",)  # MatMuls whose weights' names contain these stay in float


def _float_matmuls(model, keep=KEEP_FLOAT) -> list[str]:
    """Names of MatMul nodes whose weight (directly or through a Transpose) is one to keep in float."""
    inits = {t.name for t in model.graph.initializer if any(k in t.name for k in keep)}
    transposed = {n.output[0] for n in model.graph.node if n.op_type == "Transpose" and n.input[0] in inits}
    return [n.name for n in model.graph.node
            if n.op_type == "MatMul" and any(i in inits or i in transposed for i in n.input)]


def _fold_weight_transposes(model) -> None:
    """Replace Transpose(initializer) with the transposed initializer, so quantizers see weights.

    The export keeps weights untransposed (so a tied LM head is stored once); a quantized weight is
    a new tensor anyway, and a quantizer only recognises a MatMul weight that is an initializer.
    """
    from onnx import numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    keep = []
    for node in model.graph.node:
        if node.op_type == "Transpose" and node.input[0] in inits:
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
            data = numpy_helper.to_array(inits[node.input[0]])
            model.graph.initializer.append(numpy_helper.from_array(np.transpose(data, perm), node.output[0]))
        else:
            keep.append(node)
    del model.graph.node[:]
    model.graph.node.extend(keep)
    used = {i for n in model.graph.node for i in n.input}
    unused = [t for t in model.graph.initializer if t.name not in used]
    for t in unused:
        model.graph.initializer.remove(t)


class _Reader:
    """ONNX Runtime calibration data reader over a list of feed dicts, built lazily."""

    def __init__(self, feeds: list[Callable[[], dict]]):
        self.feeds = iter(feeds)

    def get_next(self):
        make = next(self.feeds, None)
        return None if make is None else make()


def _calibration_feeds(bundle: Path, manifest, texts: list[str],
                       window: int = 32) -> dict[str, list[Callable[[], dict]]]:
    """Per graph, feeds from running the fp32 bundle on fixed-size windows of the calibration texts.

    Equal shapes let every calibrator (histograms too) merge its statistics across samples.
    """
    from ..runtime.engine import Engine

    feeds = {name: [] for name in manifest.graphs}
    with Engine(bundle) as engine:
        stream = [t for text in texts for t in engine.encode_prompt(text)]
        for start in range(0, len(stream) - window + 1, window):
            ids = stream[start : start + window]
            hidden_k = engine.model.draft_pass(ids, 0).copy()                      # [S, H]
            final = engine.model.verify_pass(hidden_k, 0).copy()                       # [S, H]
            feeds[io_names.DRAFT].append(_decoder_feed(manifest, io_names.DRAFT, io_names.INPUT_IDS,
                                                       np.array([ids], np.int64)))
            feeds[io_names.VERIFY].append(_decoder_feed(manifest, io_names.VERIFY, io_names.HIDDEN_IN, hidden_k[None]))
            feeds[io_names.HEAD].append(lambda f=final: {io_names.HIDDEN_IN: f[None]})
            if io_names.DRAFT_HEAD in manifest.graphs:
                feeds[io_names.DRAFT_HEAD].append(lambda h=hidden_k: {io_names.HIDDEN_IN: h[None]})
    return feeds


def _decoder_feed(manifest, graph: str, first: str, value: np.ndarray) -> Callable[[], dict]:
    def make():
        rows = value.shape[1]
        feed = {first: value, io_names.POSITION_IDS: np.arange(rows, dtype=np.int64)[None],
                io_names.WRITE_INDEX: np.zeros(1, np.int64),
                io_names.ATTENTION_MASK: np.ones((1, rows), np.int64)}
        for name in io_names.kv_inputs(manifest.graph(graph).layers):
            feed[name] = np.zeros(manifest.kv_shape, np.float32)
        return feed
    return make


def _quantize_static(src: Path, dst: Path, reader, precision: str) -> None:
    """Weight-only INT8 (per-channel symmetric) Q/DQ; FP8 re-quantizes the same weights to E4M3.

    ONNX Runtime's quantizer inserts activation pairs too; they are removed (see module docstring).
    """
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    model = onnx.load(str(src))
    keep_float = _float_matmuls(model)
    _fold_weight_transposes(model)
    quantize_static(
        model, str(dst), reader, quant_format=QuantFormat.QDQ, op_types_to_quantize=["MatMul"],
        per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
        nodes_to_exclude=keep_float, use_external_data_format=True,
        calibrate_method=CalibrationMethod.MinMax, extra_options={"WeightSymmetric": True},
    )
    model = onnx.load(str(dst))
    _drop_activation_qdq(model)  # weight-only: see _drop_activation_qdq
    if precision == "fp8":
        _int8_weights_to_fp8(model)
    dst.unlink()
    for data in dst.parent.glob(dst.name + "*.data"):
        data.unlink()
    onnx.save(model, str(dst), save_as_external_data=True, location=dst.name + ".data")


E4M3_MAX = 448.0


def _drop_activation_qdq(model) -> None:
    """Remove activation Quantize/Dequantize pairs, keeping weight-only dequantization.

    Quantizing activations on a coarse FP8 grid turns the last-bit differences between a one-row
    and a many-row matmul into whole quantization steps; weight-only FP8 keeps the verify pass
    batch-invariant, so greedy speculative output stays identical to plain output.
    """
    from onnx import helper

    producers = {n.output[0]: n for n in model.graph.node if n.op_type == "QuantizeLinear"}
    nodes, dropped = [], set()
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and node.input[0] in producers:
            q = producers[node.input[0]]
            dropped.add(id(q))
            nodes.append(helper.make_node("Identity", [q.input[0]], [node.output[0]], name=node.name + "_fp"))
        else:
            nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(n for n in nodes if id(n) not in dropped)
    used = {i for n in model.graph.node for i in n.input}
    for t in [t for t in model.graph.initializer if t.name not in used]:
        model.graph.initializer.remove(t)


def _int8_weights_to_fp8(model):
    """Turn the INT8 weight dequantization into FLOAT8E4M3FN with per-channel scales."""
    import ml_dtypes
    from onnx import numpy_helper

    inits = {t.name: t for t in model.graph.initializer}

    def replace(name, array):
        new = numpy_helper.from_array(array, name)
        inits[name].CopyFrom(new)

    done = set()
    for node in model.graph.node:
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear") or node.input[1] in done:
            continue
        x, scale, zero = node.input[0], node.input[1], node.input[2]
        s = numpy_helper.to_array(inits[scale]).astype(np.float32)
        if node.op_type == "DequantizeLinear" and x in inits:  # a weight: re-quantize per channel
            axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
            w = numpy_helper.to_array(inits[x]).astype(np.float32) * np.expand_dims(s, 1 - axis if s.ndim else 0)
            amax = np.abs(w).max(axis=1 - axis, keepdims=True)
            new_s = np.maximum(amax, 1e-12) / E4M3_MAX
            replace(x, (w / new_s).astype(ml_dtypes.float8_e4m3fn))
            replace(scale, new_s.reshape(s.shape).astype(np.float32))
        else:
            continue
        replace(zero, np.zeros(numpy_helper.to_array(inits[zero]).shape, ml_dtypes.float8_e4m3fn))
        done.add(scale)
    return model


def _to_fp16(src: Path, dst: Path) -> None:
    """FP16 weights with FP32 activations and KV: each weight is stored in float16 behind a Cast.

    Float16 activations round every intermediate result, which turns the last-bit differences
    between a one-row and a many-row matmul into different tokens (measured on the example model:
    an exact float16 tie between the top two logits, broken differently by plain and speculative
    decoding). Weight-only float16 halves the weights and keeps greedy identity; ONNX Runtime folds
    the casts when it loads the graph.
    """
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(src))
    casts = []
    for tensor in model.graph.initializer:
        if tensor.data_type != onnx.TensorProto.FLOAT or np.prod(tensor.dims) < 1024:
            continue
        name = tensor.name
        half = numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float16), name + ".fp16")
        tensor.CopyFrom(half)
        casts.append(helper.make_node("Cast", [name + ".fp16"], [name], to=onnx.TensorProto.FLOAT,
                                      name=name + ".cast"))
    nodes = casts + list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.save(model, str(dst), save_as_external_data=True, location=dst.name + ".data")


def graph_precisions(manifest, precision: str, draft: str | None, verify: str | None) -> dict[str, str]:
    """Precision per graph: the draft head follows the draft graph, the head follows verify."""
    draft, verify = draft or precision, verify or precision
    for p in (precision, draft, verify):
        if p not in PRECISIONS:
            raise ConfigError(f"precision '{p}' is unknown; pick one of {', '.join(PRECISIONS)}")
    by_graph = {io_names.DRAFT: draft, io_names.DRAFT_HEAD: draft, io_names.VERIFY: verify, io_names.HEAD: verify}
    return {name: by_graph[name] for name in manifest.graphs}


def quantize_bundle(bundle: Path, precision: str, draft_precision: str | None = None,
                    verify_precision: str | None = None, texts: list[str] | None = None,
                    echo: Callable[[str], None] = print, **_) -> Path:
    """Rewrite the fp32 bundle at `bundle` in place at the requested precision(s)."""
    require("onnx", "export", "quantizing a bundle")
    from ..bundle import weights

    bundle = Path(bundle)
    manifest = manifest_io.read(bundle)
    if manifest.precision != "fp32":
        raise ConfigError(f"{bundle} is already {manifest.precision}; quantize an fp32 bundle")
    plan = graph_precisions(manifest, precision, draft_precision, verify_precision)
    texts = texts or _calibration_texts(None)
    feeds = _calibration_feeds(bundle, manifest, texts) if {"int8", "fp8"} & set(plan.values()) else {}
    with tempfile.TemporaryDirectory(dir=bundle.parent, prefix=".quantize-") as tmp:
        tmp = Path(tmp)
        files = {}
        for name, graph in manifest.graphs.items():
            src, dst = bundle / graph.file, tmp / graph.file
            if plan[name] in ("int8", "fp8"):
                _quantize_static(src, dst, _Reader(feeds[name]), plan[name])
            elif plan[name] == "fp16":
                _to_fp16(src, dst)
            files[Path(graph.file).stem] = dst if plan[name] != "fp32" else src
            echo(f"{name}: {plan[name]}")
        out = tmp / "bundle"
        out.mkdir()
        weights.share(files, out, manifest.weights)
        graphs = {n: g.__class__(**{**g.__dict__, "precision": plan[n]}) for n, g in manifest.graphs.items()}
        label = precision if len(set(plan.values())) == 1 else "+".join(f"{k}:{v}" for k, v in plan.items())
        for name in manifest.graphs:
            shutil.move(str(out / manifest.graphs[name].file), str(bundle / manifest.graphs[name].file))
        shutil.move(str(out / manifest.weights), str(bundle / manifest.weights))
    manifest = manifest.replace(graphs=graphs, precision=label)
    manifest_io.write(bundle, manifest)
    return bundle


def _calibration_texts(prompts_file: Path | None) -> list[str]:
    texts = [c[-1]["content"] for c in prompts.calibration_conversations(held_out=False)[::6]]
    if prompts_file:
        texts += [c[-1]["content"] for c in prompts.load_calibration_prompts(prompts_file)]
    return texts


def quantized_copy(source: Path, target: Path, precision: str, draft_precision: str | None = None,
                   verify_precision: str | None = None, prompts_file: Path | None = None,
                   echo: Callable[[str], None] = print, report: bool = True) -> Path:
    """Copy the fp32 bundle `source` to the new directory `target`, quantize it, measure its quality.

    The quality report (top-1 agreement with fp32 and perplexity on held-out text, acceptance,
    CPU tokens/s of plain and speculative decoding) is printed and stored in the manifest.
    """
    manifest_io.read(source)
    texts = _calibration_texts(prompts_file)
    shutil.copytree(source, target)
    quantize_bundle(target, precision, draft_precision, verify_precision, texts, echo)
    if report:
        from . import quality

        held_out = [c[-1]["content"] for c in prompts.calibration_conversations(held_out=True)[:3]]
        result = quality.report(source, target, prompts.PASSAGES[:4], held_out)
        quantized = manifest_io.read(target)
        manifest_io.write(target, quantized.replace(quality=result))
        echo(format_quality(quantized.precision, result))
    return target


def quantize(source: Path, output: Path, precision: str, draft_precision: str | None = None,
             verify_precision: str | None = None, prompts_file: Path | None = None,
             echo: Callable[[str], None] = print, report: bool = True) -> Path:
    """Write a quantized copy of the fp32 bundle `source` to `output` (which may be `source`).

    Built in a staging directory and installed only once whole: a failure leaves `output` as it was.
    """
    from ..bundle.install import install, staging_dir

    source = Path(source).resolve()
    manifest_io.read(source)
    with staging_dir(output, ".quantize-") as staging:
        target = staging.with_name("quantized")
        quantized_copy(source, target, precision, draft_precision, verify_precision, prompts_file, echo, report)
        install(target, output)
    return Path(output).resolve()


def format_quality(precision: str, q: dict) -> str:
    return (f"{precision}: top-1 agreement with fp32 {q['top1_agreement']:.1%}, perplexity "
            f"{q['perplexity']:.2f} (fp32 {q['perplexity_fp32']:.2f}), acceptance {q['acceptance_rate']:.1%}, "
            f"CPU plain {q['plain_tokens_per_second']:.1f} tok/s, speculative "
            f"{q['speculative_tokens_per_second']:.1f} tok/s, greedy identical: {q['greedy_identical']}")
