"""A readable summary of a bundle's manifest (`specdeploy inspect`)."""
from __future__ import annotations

from pathlib import Path

from . import files as files_io
from . import manifest as manifest_io


def describe(bundle: Path, verify: bool = False) -> str:
    """`verify`: also check every file's SHA-256 (reads every byte; a mismatch raises BundleError)."""
    m = manifest_io.read(bundle)
    checked = files_io.verify(bundle, m) if verify else None
    info = m.model
    lines = [
        f"bundle      {Path(bundle).resolve()} (schema {m.schema_version})",
        f"model       {info.name} ({info.architecture}, {info.num_layers} layers, hidden {info.hidden_size}, "
        f"vocab {info.vocab_size}, {info.num_kv_heads} KV heads × {info.head_dim})",
        f"split       exit layer {m.exit_layer}: draft = layers 0..{m.exit_layer - 1}, "
        f"verify = layers {m.exit_layer}..{info.num_layers - 1}",
        f"decoding    {m.num_draft_tokens} draft tokens, source {m.draft_source} "
        f"(lookup n-grams {m.lookup_ngram[0]}..{m.lookup_ngram[1]}), "
        f"{'speculative' if m.default_speculative else 'plain'} by default"
        + (f", confidence threshold {m.confidence_threshold}" if m.confidence_threshold else ""),
        f"sampling    {_sampling(m.sampling_defaults)}",
        f"KV buffers  {m.kv_dtype} {list(m.kv_shape)} per layer and K/V (max context {m.max_context})",
        f"precision   {m.precision}" + (f" (int4 blocks of {m.extra['int4_block_size']})"
                                         if "int4_block_size" in m.extra else ""),
    ]
    if m.operators:
        lines.append(f"operators   specdeploy's own: {', '.join(m.operators)} (built here by 'specdeploy build-kernels')")
    lines += _compute_lines({**m.extra, "fused_attention": m.fused_attention})
    for name, g in m.graphs.items():
        layers = f" layers {g.kv_layers[0]}..{g.kv_layers[1] - 1}" if g.kv_layers else ""
        lines.append(f"graph       {name:<12} {g.file:<17} {g.precision}{layers}")
    weights = Path(bundle) / m.weights
    if weights.is_file():
        lines.append(f"weights     {m.weights} {weights.stat().st_size / 2**20:.0f} MiB (shared, deduplicated)")
    if m.draft_vocab:
        lines.append(f"draft vocab {m.draft_vocab} ({(m.calibration or {}).get('draft_vocab_size', '?')} tokens)")
    if m.feature_vocab:
        lines.append(f"feature head reads layers {', '.join(map(str, m.feature_layers))} (draft source 'feature'); "
                     f"{m.feature_vocab} ({_rows(Path(bundle) / m.feature_vocab)} draft tokens)")
        measured = m.extra.get("feature_head_acceptance")
        if measured:
            rates = " ".join(f"{a:.2f}" for a in measured["per_position"])
            lines.append(f"head        held-out acceptance by draft position {rates}, tau {measured['tau']:.2f} "
                         f"at gamma {len(measured['per_position'])} (train-head, "
                         f"{measured.get('training_positions', 0):,} training positions)")
    if m.calibration:
        lines.append(f"calibration {_calibration(m.calibration)}")
    if m.exit_agreement is not None:
        lines.append(f"early exit  agrees with the full model on {m.exit_agreement:.1%} of held-out tokens"
                     + ("" if m.exit_can_pay else f" (under {m.exit_agreement_floor:.1%}: the hybrid never runs it)"))
    if m.quality:
        lines.append(f"quality     {_quality(m.quality)}")
    if m.tensorrt:
        lines.append(f"tensorrt    {m.tensorrt['version']} for compute capability {m.tensorrt['compute_capability']}")
    lines.append(f"files       {len(m.files)} recorded, sizes match"
                 + (f"; SHA-256 verified ({checked / 2**20:.0f} MiB read)" if verify else
                    " (inspect --verify checks their SHA-256)"))
    return "\n".join(lines)


def _sampling(defaults) -> str:
    """Where a request says nothing: the recorded defaults and their source, or greedy."""
    if defaults is None:
        return "greedy where a request says nothing (no sampling defaults recorded)"
    names = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")
    given = ", ".join(f"{n} {getattr(defaults, n)}" for n in names if getattr(defaults, n) is not None)
    return f"defaults {given} (from {defaults.source})"


def _rows(path: Path) -> str:
    """Entries of a saved 1-D .npy (read from its header), or '?'."""
    try:
        import numpy as np

        return f"{np.load(path, mmap_mode='r').shape[0]:,}"
    except (OSError, ValueError):
        return "?"


def _compute_lines(extra: dict) -> list[str]:
    """How an integer bundle computes: what its GGUF carried, folded offsets, float outlier channels,
    fused attention, matmuls handed two rows (each only where the bundle has it)."""
    lines = []
    carried, folded = extra.get("gguf_carried_weights") or {}, extra.get("folded_offsets") or {}
    if any(carried.values()):
        by_graph = ", ".join(f"{k} {v}" for k, v in carried.items() if v)
        line = f"from GGUF   {sum(carried.values())} weights carried losslessly from the source file's blocks ({by_graph})"
        if any(folded.values()):
            line = (f"from GGUF   {sum(carried.values())} weights carried from the source file's blocks ({by_graph}): "
                    f"values and scales losslessly, the float minima folded into {sum(folded.values())} matmuls")
        lines.append(line)
    elif any(folded.values()):
        lines.append(f"offsets     float offsets folded into {sum(folded.values())} matmuls")
    outliers = extra.get("float_outlier_channels") or {}
    if any(outliers.values()):
        lines.append(f"outliers    {sum(outliers.values())} activation channels computed in float beside the "
                     "integer matmuls (" + ", ".join(f"{k} {v}" for k, v in outliers.items() if v) + ")")
    fused = extra.get("fused_attention") or {}
    if any(fused.values()):
        lines.append(f"attention   one GroupQueryAttention kernel a layer ({', '.join(f'{k} {v}' for k, v in fused.items() if v)}"
                     f" layers; ONNX Runtime's CPU provider; KV buffers one row past max context)")
    padded = extra.get("two_row_matmuls") or {}
    if any(padded.values()):
        by_graph = ", ".join(f"{k} {v}" for k, v in padded.items() if v)
        lines.append(f"two rows    {sum(padded.values())} int4 matmuls read a padded second row, never one row alone "
                     f"({by_graph}; where the one-row kernel is another, as on AVX2 without VNNI)")
    return lines


def _calibration(cal: dict) -> str:
    """What autotune chose and what the end-to-end measurement recorded, in words."""
    chosen, parts = cal.get("chosen") or {}, []
    if "exit_layer" in chosen:
        choice = f"chose exit layer {chosen['exit_layer']}, {chosen['num_draft_tokens']} draft tokens"
        if chosen.get("threshold") is not None:
            choice += f", threshold {chosen['threshold']}"
        if "predicted_speedup" in chosen:
            choice += f", predicted {chosen['predicted_speedup']:.2f}× plain"
        parts.append(choice)
    measured = sorted((cal.get("measured_speedup") or {}).items(), key=lambda item: -item[1])  # best first
    if measured:
        parts.append("measured " + ", ".join(f"{mode} {speedup:.2f}×" for mode, speedup in measured))
    return "; ".join(parts) or "recorded (no choice)"


QUALITY_WORDS = {  # quality-report key -> how inspect shows it, given the whole report
    "top1_agreement": lambda q: f"top-1 agreement with fp32 {q['top1_agreement']:.1%}",
    "perplexity": lambda q: f"perplexity {q['perplexity']:.2f}"
                            + (f" (fp32 {q['perplexity_fp32']:.2f})" if "perplexity_fp32" in q else ""),
    "greedy_identical": lambda q: "greedy speculative " + ("== plain" if q["greedy_identical"] else "DIFFERS from plain"),
    "acceptance_rate": lambda q: f"acceptance {q['acceptance_rate']:.1%}",
    "plain_tokens_per_second": lambda q: f"plain {q['plain_tokens_per_second']:.1f} tok/s",
    "speculative_tokens_per_second": lambda q: f"speculative {q['speculative_tokens_per_second']:.1f} tok/s",
}
SHOWN_WITH = {"perplexity_fp32"}  # keys another key's words include


def _quality(quality: dict) -> str:
    """The quality report of `quantize` in words; keys this version does not know as key=value."""
    known = [words(quality) for key, words in QUALITY_WORDS.items() if key in quality]
    other = [f"{k}={v}" for k, v in quality.items() if k not in QUALITY_WORDS and k not in SHOWN_WITH]
    return ", ".join(known + other)
