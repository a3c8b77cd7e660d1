"""Quantized versions of a bundle's graphs: INT4 / INT8 compute, FP8 / FP16 weight-only.

* int4, int8 (compute.py): every weight matmul as `MatMulNBits`, whose integer kernels quantize
  activations per row, so a row's result does not depend on the other rows of a call. What ONNX
  Runtime runs on the CPU (and its CUDA provider); TensorRT gets a DequantizeLinear form of the
  same weights (tensorrt_form.py).
* fp8, fp16: weight-only, E4M3 weights behind DequantizeLinear (per channel; the MLP down
  projections stay float) or float16 weights behind Cast, float32 activations and KV: the forms
  TensorRT's explicit-quantization path builds from; ONNX Runtime dequantizes them once at load.

Every quantized bundle passes the row-independence check (runtime.row_check) before it is
installed: its greedy speculative output then equals its greedy plain output by construction.

Calibration data (fp8's calibrator, int4 / int8's activation outliers, GPTQ's Gram matrices) comes
from feeds.py.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from .. import prompts
from ..backends import attention_window, residency
from ..bundle import io_names
from ..bundle import manifest as manifest_io
from ..config import TARGET_FORMS
from ..errors import ConfigError, RowDependenceError, require
from ..optimize import gqa_probe
from ..runtime.memory_log import mark, recording
from ..runtime.split_model import too_large
from ..optimize.attention import fused_count
from . import feeds as feeds_io
from .compute import (FORMS as COMPUTE_FORMS, INT4_BLOCKS, ComputeOptions, quantize_embedding, quantize_graph,
                      wider_head)
from .options import QuantizeOptions
from .two_rows import padded_count
from .rewrites import drop_activation_qdq, float_matmuls, fold_weight_transposes, int8_weights_to_fp8, to_fp16

log = logging.getLogger("specdeploy")


def _quantize_fp8(src: Path, dst: Path, reader) -> None:
    """Weight-only FP8: per-channel symmetric INT8 Q/DQ from ONNX Runtime's quantizer, re-quantized to E4M3.

    ONNX Runtime's quantizer inserts activation pairs too; they are removed (see module docstring).
    """
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    model = onnx.load(str(src))
    keep_float = float_matmuls(model)
    fold_weight_transposes(model)
    quantize_static(
        model, str(dst), reader, quant_format=QuantFormat.QDQ, op_types_to_quantize=["MatMul"],
        per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
        nodes_to_exclude=keep_float, use_external_data_format=True,
        calibrate_method=CalibrationMethod.MinMax, extra_options={"WeightSymmetric": True},
    )
    model = onnx.load(str(dst))
    drop_activation_qdq(model)  # weight-only: see rewrites.drop_activation_qdq
    int8_weights_to_fp8(model)
    dst.unlink()
    for data in dst.parent.glob(dst.name + "*.data"):
        data.unlink()
    onnx.save(model, str(dst), save_as_external_data=True, location=dst.name + ".data")


def _quantize_graph(src: Path, dst: Path, precision: str, method: str, feeds: Callable[[], list], indexes,
                    options: ComputeOptions, found: dict | None = None, grams=None,
                    max_context: int | None = None, lm_head: bool = False) -> int:
    """Quantize one graph; returns how many weights came losslessly from the source GGUF."""
    if precision in COMPUTE_FORMS:
        return quantize_graph(src, dst, precision, method, indexes.get(precision), options, found, grams,
                              max_context, lm_head)
    if precision == "fp8":
        _quantize_fp8(src, dst, feeds_io.Reader(feeds()))
    elif precision == "fp16":
        to_fp16(src, dst)
    return 0


def _gguf_indexes(manifest, plan: dict, method: str) -> dict:
    """Per compute precision, the source GGUF's exactly-mapping blocks (Q8_0 / Q4_0), if any."""
    from .gguf_blocks import CARRIES, BlockIndex

    source = Path(manifest.extra.get("source") or "")
    wanted = {p for p in plan.values() if p in CARRIES}
    if method == "ort" or source.suffix != ".gguf" or not source.is_file() or not wanted:
        return {}
    indexes = {p: BlockIndex.from_file(source, p) for p in wanted}
    return {p: i for p, i in indexes.items() if i is not None}


def _quantize_graphs(bundle: Path, manifest, plan: dict, tmp: Path, method: str, calibration, indexes,
                     echo, options: ComputeOptions, fuse_attention: bool) -> tuple[dict, dict]:
    """Each graph quantized into `tmp` (the tied embedding too); (files by stem, counts per graph: weights
    carried from the GGUF, offsets folded, layers with fused attention, float outlier channels)."""
    from .folding import folded_count
    from .operators import count as own_count

    files, carried, folded, fused, padded, found = {}, {}, {}, {}, {}, calibration.outliers
    context = manifest.max_context if fuse_attention else None
    for name in feeds_io.feeding_order(manifest.graphs):
        graph = manifest.graphs[name]
        src, dst = bundle / graph.file, tmp / graph.file
        feeds = lambda name=name: calibration.feeds.get(name)  # noqa: E731  (made only where fp8 asks)
        drafter = name in io_names.FEATURE_GRAPHS  # see _feature_method
        rounding = "rtn" if name in calibration.unrounded else _feature_method(method) if drafter else method
        carried[name] = _quantize_graph(src, dst, plan[name], rounding,
                                        feeds, indexes, options, found.get(name), calibration.grams(name),
                                        context, lm_head=name == io_names.HEAD)
        folded[name] = folded_count(dst) if plan[name] in COMPUTE_FORMS else 0
        fused[name] = fused_count(dst) if plan[name] in COMPUTE_FORMS else 0
        padded[name] = padded_count(dst) if plan[name] in COMPUTE_FORMS else 0
        files[Path(graph.file).stem] = dst if plan[name] != "fp32" else src
        blocks = f" in blocks of {options.int4_block}" if plan[name] == "int4" and options.int4_block else ""
        if name == io_names.HEAD and wider_head(plan[name], method, options):
            blocks += " (the LM head at 8 bits)"
        channels = found.get(name) or {}
        kept = (f"; {sum(map(len, channels.values()))} activation outlier channels of {len(channels)} matmul "
                f"inputs in float" if channels else "")
        two = (f"; {padded[name]} matmuls handed a padded second row (a one-row int4 call is another "
               f"kernel without VNNI)" if padded[name] else "")
        own = own_count(dst) if plan[name] in ("int4", "int8") and options.int4_kernel == "specdeploy" else 0
        own_line = f"; {own} matmul{'s' if own > 1 else ''} by specdeploy's operators (read in place)" if own else ""
        nearest = (f"; rounded to nearest, not by GPTQ: {calibration.unrounded[name]} (more memory, or the "
                   f"model's GGUF with its blocks carried, avoids this)" if name in calibration.unrounded else "")
        echo(f"{name}: {plan[name]}{blocks}{_carried(carried[name], folded[name])}{kept}{two}{own_line}{nearest}")
        residency.trim_heap()  # what a graph's rounding freed, before the next one's peak
        mark(f"quantizing the {name} graph")
    draft, head = plan[io_names.DRAFT], plan[io_names.HEAD]
    readers = [n for n in (io_names.DRAFT, io_names.FEATURE_HEAD) if n in manifest.graphs]
    bits = [draft in COMPUTE_FORMS and head == draft and quantize_embedding(
        tmp / manifest.graph(name).file, tmp / manifest.graph(io_names.HEAD).file, draft, indexes.get(draft), options)
        for name in readers]  # the same blocks: the shared weights file stores them once
    if bits[0]:
        echo(f"embedding: {bits[0]}-bit blocks (GatherBlockQuantized{', the feature head reads them too' * (len(bits) > 1)})")
    counts = {"gguf_carried_weights": carried, "folded_offsets": folded, "fused_attention": fused,
              "two_row_matmuls": padded,
              "float_outlier_channels": {n: int(sum(map(len, c.values()))) for n, c in found.items()}}
    # the manifest's order again (the shared weights file's layout, the counts' order)
    files = {Path(g.file).stem: files[Path(g.file).stem] for g in manifest.graphs.values()}
    return files, {key: {n: by[n] for n in manifest.graphs if n in by} for key, by in counts.items()}


def _feature_method(method: str) -> str:
    """How a feature head's weights are rounded: as asked, except GPTQ, whose Gram matrices would
    need the head run over the calibration text; to nearest instead (a drafter's rounding costs
    acceptance, never exactness: the verify pass decides every token)."""
    return "rtn" if method == "gptq" else method


def _attention_line(fused: dict, reason: str | None) -> str:
    if any(fused.values()):
        layers = ", ".join(f"{n} {c}" for n, c in fused.items() if c)
        return f"attention: one GroupQueryAttention kernel a layer ({layers} layers)"
    return f"attention: op by op ({reason or 'no layer in a form that kernel computes row-independently here'})"


def _carried(carried: int, folded: int) -> str:
    if not folded:
        return f" ({carried} weights carried losslessly from the GGUF's own blocks)" if carried else ""
    if not carried:
        return f" ({folded} weights' float offsets folded into their matmuls)"
    return (f" ({carried} weights carried from the GGUF's own blocks: values and scales losslessly, the float "
            f"minima of {folded} folded into their matmuls; --exact-offsets keeps them exact)")


def quantize_bundle(bundle: Path, options: QuantizeOptions, texts: list[str] | None = None,
                    echo: Callable[[str], None] = print) -> Path:
    """Rewrite the fp32 bundle at `bundle` in place as `options` asks, then seal it (runtime/seal.py).

    Raises RowDependenceError (the bundle left half-written) when the graphs fail the row check.
    """
    require("onnx", "export", "quantizing a bundle")
    from ..bundle import weights
    from ..runtime.seal import seal

    bundle, compute = Path(bundle), options.compute
    manifest = manifest_io.read(bundle)
    if manifest.precision != "fp32":
        raise ConfigError(f"{bundle} is already {manifest.precision}; quantize an fp32 bundle")
    plan = options.plan(manifest)
    calibration = feeds_io.calibrate(bundle, manifest, plan, options.method, compute, texts or options.texts())
    mark("calibrating (activation outliers where int8 keeps them)")
    indexes = _gguf_indexes(manifest, plan, options.method)
    unfused = gqa_probe.unfused_reason(manifest, plan, COMPUTE_FORMS, compute, options.tensorrt)
    with tempfile.TemporaryDirectory(dir=bundle.parent, prefix=".quantize-") as tmp:
        tmp = Path(tmp)
        try:
            files, counts = _quantize_graphs(bundle, manifest, plan, tmp, options.method, calibration, indexes,
                                             echo, compute, unfused is None)
        finally:
            calibration.close()
        if calibration.rows:
            echo(f"gptq: Gram matrices over {calibration.rows:,} tokens of calibration text")
        if any(p in COMPUTE_FORMS for p in plan.values()):
            echo(_attention_line(counts["fused_attention"], unfused))
        out = tmp / "bundle"
        out.mkdir()
        weights.share(files, out, manifest.weights)
        mark("writing the shared weights file")
        for name in [*(g.file for g in manifest.graphs.values()), manifest.weights]:
            shutil.move(str(out / name), str(bundle / name))
    graphs = {n: dataclasses.replace(g, precision=plan[n]) for n, g in manifest.graphs.items()}
    if options.tensorrt:
        graphs = _tensorrt_forms(bundle, graphs, echo, TARGET_FORMS[options.target].standard_norms)
    extra = _extra(manifest.extra, counts, plan, compute)
    from .operators import in_place_table, names

    operators = names(bundle, graphs)
    seal(bundle, manifest.replace(graphs=graphs, precision=options.label(plan), extra=extra,
                                  kv_spare_rows=int(unfused is None), operators=operators, target=options.target,
                                  **_attention(counts["fused_attention"], bundle, graphs),
                                  read_in_place=in_place_table(bundle, graphs) if operators else {}), echo)
    mark("checking row independence")
    return bundle


def _extra(extra: dict, counts: dict[str, dict[str, int]], plan: dict, options: ComputeOptions) -> dict:
    """The manifest's record of what quantizing did: each count per graph where any is non-zero
    (fused attention has fields of its own: `_attention`), and int4's block size."""
    extra = {**extra, **{key: c for key, c in counts.items() if any(c.values()) and key != "fused_attention"}}
    if "int4" in plan.values():
        extra["int4_block_size"] = options.int4_block or COMPUTE_FORMS["int4"].block_size
    return extra


def _attention(fused: dict[str, int], bundle: Path, graphs: dict) -> dict:
    """The manifest's fused-attention fields: the layers fused a graph (those that have any), and the
    attention window's shift where a fused layer is windowed."""
    fused = {n: c for n, c in fused.items() if c}
    windowed = any(fused_count(bundle / g.file, windowed=True) for n, g in graphs.items() if fused.get(n))
    return {"fused_attention": fused, "attention_window_shift": attention_window.shift() if windowed else None}


def _tensorrt_forms(bundle: Path, graphs: dict, echo, standard_norms: bool = False) -> dict:
    from . import tensorrt_form

    out = dict(graphs)
    for name, graph in graphs.items():
        if graph.precision in COMPUTE_FORMS:
            file = Path(graph.file).stem + tensorrt_form.SUFFIX
            try:
                count = tensorrt_form.write(bundle / graph.file, bundle / file, standard_norms)
            except ValueError as exc:
                raise ConfigError(f"the {name} graph has no exact TensorRT form: {exc}") from None
            out[name] = graph.__class__(**{**graph.__dict__, "tensorrt_file": file})
            echo(f"{name}: TensorRT form {file} ({count} DequantizeLinear weights)")
    return out


def quantize_into(source: Path, target: Path, options: QuantizeOptions, texts: list[str] | None = None,
                  echo: Callable[[str], None] = print) -> Path:
    """Copy the fp32 bundle `source` to the new directory `target` and quantize it there, int4 in
    the largest block of `options.compute.blocks()` whose graphs pass the row check on this machine;
    float offsets folded where a block size passes so, else kept exact (its kernel's rows differ on
    fewer CPUs: no zero points)."""
    from .operators import decided

    manifest = manifest_io.read(source)
    plan = set(options.plan(manifest).values())
    ours = "int4" in plan or ("int8" in plan and Path(manifest.extra.get("source") or "").suffix == ".gguf")
    compute = decided(options.compute, options.tensorrt, echo) if ours else options.compute
    graphs = manifest.graphs
    blocks = compute.blocks() if "int4" in options.plan(manifest).values() else (None,)
    attempts, folded = [(block, compute.exact_offsets) for block in blocks], False
    while True:
        block, exact = attempts.pop(0)
        _copy(source, target, manifest.weights, link=all(p in COMPUTE_FORMS for p in options.plan(manifest).values()))
        try:
            tried = dataclasses.replace(compute, int4_block=block, exact_offsets=exact)
            return quantize_bundle(target, dataclasses.replace(options, compute=tried), texts, echo)
        except RowDependenceError as exc:
            folded = folded or _folded(target, graphs)
            if not attempts and folded and not exact:
                attempts = [(b, True) for b in blocks]
            if not attempts:
                smallest = min(INT4_BLOCKS)
                hint = f" (int4 in blocks of {smallest} is row-independent on more CPUs: --int4-block {smallest})"
                raise RowDependenceError(f"{exc}{hint if block not in (None, smallest) else ''}") from None
            shutil.rmtree(target)
            echo(f"{_form(block, exact, folded)} is not row-independent on this machine; trying "
                 f"{_form(*attempts[0], folded)}")


def _copy(source: Path, target: Path, weights_file: str, link: bool) -> None:
    """`source` copied to `target`; with `link`, its weights file hard-linked where the filesystem
    allows (an 8B model's fp32 weights are 32 GB): int4 / int8 read the fp32 weights memory-mapped
    (optimize/graph.py) and replace the file whole, never writing it. `onnx` refuses to load a
    hard-linked file's data, which fp16 / fp8 and graphs kept fp32 do, so they get a copy."""
    import os

    def copy(src, dst):
        if link and Path(src).name == weights_file:
            with contextlib.suppress(OSError):
                return os.link(src, dst)
        return shutil.copy2(src, dst)

    shutil.copytree(source, target, copy_function=copy)


def _folded(bundle: Path, graphs: dict) -> bool:
    """Whether a half-written quantized bundle (its manifest not yet sealed) folded any offsets."""
    from .folding import folded_count

    return any(folded_count(bundle / g.file) for g in graphs.values())


def _form(block: int | None, exact: bool, folded: bool) -> str:
    offsets = ("exact offsets" if exact else "offsets folded") if folded else ""
    return ", ".join(part for part in (f"int4 in blocks of {block}" if block else "", offsets) if part)


def quantized_copy(source: Path, target: Path, options: QuantizeOptions,
                   echo: Callable[[str], None] = print) -> Path:
    """Copy the fp32 bundle `source` to the new directory `target`, quantize it, measure its quality.

    The quality report (top-1 agreement with fp32 and perplexity on held-out text, acceptance,
    CPU tokens/s of plain and speculative decoding) is printed and stored in the manifest.
    """
    quantize_into(source, target, options, options.texts(), echo)
    large = too_large(source, manifest_io.read(source)) if options.report else {}
    if large:
        echo(f"no quality report: the fp32 reference's {', '.join(f'{n} graph ({r})' for n, r in large.items())}; "
             f"the row check and exit agreement above are the quantized graphs' own")
    elif options.report:
        from . import quality

        held_out = [c[-1]["content"] for c in prompts.calibration_conversations(held_out=True)[:3]]
        result = quality.report(source, target, prompts.PASSAGES[:4], held_out)
        quantized = manifest_io.write(target, manifest_io.read(target).replace(quality=result))
        echo(format_quality(quantized.precision, result))
        mark("measuring the quality report")
    if options.target != "cpu":
        echo(kernel_report(target, options.target))
    return target


def kernel_report(bundle: Path, target: str) -> str:
    """One line (more where operators lack one) on whether every graph operator has a kernel on `target`."""
    from ..checks.kernel_coverage import TARGET_TABLES, check, summary, table

    source = table(TARGET_TABLES[target][1])
    missing = summary(check(bundle, target))
    where = f"{source.get('provider', 'the ONNX parser')} of {source['version'].split(' (')[0]}"
    if not missing:
        return f"kernels: every operator of the graphs has one on --target {target} ({where})"
    return "\n".join([f"kernels: {len(missing)} operator(s) have none on --target {target} ({where}):",
                      *(f"  {line}" for line in missing)])


def quantize(source: Path, output: Path, options: QuantizeOptions, echo: Callable[[str], None] = print) -> Path:
    """Write a quantized copy of the fp32 bundle `source` to `output` (which may be `source`).

    Built in a staging directory and installed only once whole: a failure leaves `output` as it was.
    """
    from ..bundle.install import install, staging_dir

    source = Path(source).resolve()
    manifest_io.read_verified(source)  # a damaged byte is named, not sealed into the copy
    with recording() as memory, staging_dir(output, ".quantize-") as staging:
        target = staging.with_name("quantized")
        quantized_copy(source, target, options, echo)
        install(target, output)
    echo(memory.summary())
    return Path(output).resolve()


def format_quality(precision: str, q: dict) -> str:
    return (f"{precision}: top-1 agreement with fp32 {q['top1_agreement']:.1%}, perplexity "
            f"{q['perplexity']:.2f} (fp32 {q['perplexity_fp32']:.2f}), acceptance {q['acceptance_rate']:.1%}, "
            f"CPU plain {q['plain_tokens_per_second']:.1f} tok/s, speculative "
            f"{q['speculative_tokens_per_second']:.1f} tok/s, greedy identical: {q['greedy_identical']}")
