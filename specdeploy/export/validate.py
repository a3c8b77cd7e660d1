"""Run the exported graphs and the PyTorch reference through one decoding schedule and compare.

The schedule covers prefill, single-token drafting, a batched verify pass, and a rollback (a
second verify from an earlier valid length over rows the first one wrote), so a broken cache
write, mask or slice shows up as a mismatch. Tolerance: max |ONNX - torch| on logits must stay
under `LOGITS_ATOL` times the logits' scale (max(1, max |logits|)); fp32 graphs land near 1e-5.
"""
from __future__ import annotations

import numpy as np

from ..bundle import io_names
from ..errors import ValidationError
from ..runtime.split_model import SplitModel, graph_at_a_time

LOGITS_ATOL = {"fp32": 1e-3, "fp16": 5e-2, "int8": None, "int4": None, "fp8": None}


def _schedule(model: SplitModel, prompt: list[int], drafts: list[int],
              verify: bool = True) -> list[tuple[str, np.ndarray]]:
    """Each graph's calls in the order a decode makes them, one graph after another (the draft
    graph's, then the verify graph's, then the heads'), each graph's stage closed when done: a large
    model's fp32 graphs are then never resident together, and each graph sees what it would.
    `verify=False`: the draft graph's and heads' outputs only (a verify graph too large to load)."""
    p = len(prompt)
    hidden = model.draft_pass(prompt, 0).copy()
    features, outputs = _features(model, io_names.DRAFT), {io_names.DRAFT: _copied(model, io_names.DRAFT)}
    rows = [model.draft_pass([token], p + i).copy()[0] for i, token in enumerate(drafts)]
    # rollback: keep one draft, redo the rest with other tokens over the stale rows
    redo = model.draft_pass(drafts[::-1][:2], p + 1).copy()
    model.draft_stage.close()
    out = [("prefill.draft_hidden", hidden), *features]
    out += [(f"draft{i}.logits", model.draft_logits(row[None]).copy()) for i, row in enumerate(rows)]
    out += [("rollback.draft_hidden", redo)]
    if not verify:
        return out
    finals = [model.verify_pass(hidden, 0)[-1:].copy()]
    features, outputs[io_names.VERIFY] = _features(model, io_names.VERIFY), _copied(model, io_names.VERIFY)
    finals += [model.verify_pass(np.stack(rows), p).copy(), model.verify_pass(redo, p + 1).copy()]
    model.verify_stage.close()
    if io_names.FEATURE_HEAD in model.stages:
        out += _feature_head(model, outputs, prompt, drafts)
    return out + features + [("prefill.logits", model.logits(finals[0]).copy()), ("verify.logits", model.logits(finals[1]).copy()),
                  ("rollback.logits", model.logits(finals[2]).copy())]


def _features(model: SplitModel, graph: str) -> list[tuple[str, np.ndarray]]:
    """The feature outputs (for a feature head) of `graph`'s last pass, copied."""
    return [(f"prefill.{name}", value.copy()) for name, value in sorted(model.outputs[graph].items())
            if name.startswith("feature.")]


def _copied(model: SplitModel, graph: str) -> dict:
    return {name: value.copy() for name, value in model.outputs[graph].items()}


def _feature_head(model: SplitModel, outputs: dict, prompt: list[int], drafts: list[int]) -> list:
    """The feature head's graphs as drafting calls them: the prompt's features projected, a pass
    over the prompt's rows, then one chained row from its own output."""
    model.outputs = outputs  # the prefill passes' outputs: every feature for the prompt's rows
    projected = model.project_features(model.features()).copy()                # [p, H]
    logits, hidden = (x.copy() for x in model.feature_head_pass(projected[:-1], prompt[1:], 0))
    chained, _ = model.feature_head_pass(hidden[-1:], drafts[:1], len(prompt) - 1)
    return [("feature_fc.hidden", projected), ("feature_head.logits", logits), ("feature_head.hidden", hidden),
            ("feature_head.chained_logits", chained.copy())]


def compare(exported: SplitModel, reference: SplitModel, precision: str = "fp32",
            seed: int = 0, prompt_len: int = 7, verify: bool = True) -> dict[str, float]:
    """Max abs differences per checked output; raises ValidationError listing every mismatch."""
    rng = np.random.default_rng(seed)
    vocab = exported.manifest.model.vocab_size
    prompt = [int(t) for t in rng.integers(0, vocab, prompt_len)]
    drafts = [int(t) for t in rng.integers(0, vocab, 3)]
    diffs, failures = {}, []
    atol = LOGITS_ATOL.get(precision)
    for (name, got), (_, want) in zip(_schedule(exported, prompt, drafts, verify),
                                      _schedule(reference, prompt, drafts, verify)):
        diff = float(np.abs(got - want).max())
        diffs[name] = diff
        if atol is not None and diff > atol * max(1.0, float(np.abs(want).max())):
            failures.append(f"{name}: max |diff| {diff:.3g}")
    if failures:
        raise ValidationError(
            "exported graphs disagree with the PyTorch reference (" + "; ".join(failures)
            + "); this is a bug in the exporter for this model, please report it with the model config"
        )
    return diffs


def validation_prompt_len(model, manifest) -> int:
    """7 tokens, or past the sliding window where a family has one (so windowed rows are checked),
    within the bundle's context (the schedule adds 4 rows)."""
    window = getattr(model.config, "sliding_window", None) if "sliding_attention" in \
        (getattr(model.config, "layer_types", None) or ()) else None
    return max(7, min((window or 0) + 7, manifest.max_context - 8))


def validate_bundle(model, bundle, manifest, adapter=None, vocab_ids=None, streamed=None,
                    skip: frozenset = frozenset(), feature_head=None) -> dict[str, float]:
    """The bundle's graphs in ONNX Runtime, one at a time, against the PyTorch reference over one
    schedule (with `streamed`, a skeleton whose layers load their weights as they run:
    export/streamed.py); `skip` may hold the verify graph (too large to load here: the draft graph
    and heads are still compared)."""
    import contextlib

    from .reference import reference_stages

    exported = SplitModel(manifest, graph_at_a_time(bundle, manifest))
    try:
        with streamed.materialized() if streamed else contextlib.nullcontext(model) as runnable:
            stages = reference_stages(runnable, manifest, adapter, vocab_ids)
            if feature_head is not None:
                from .feature_graphs import reference_stages as head_stages

                stages.update(head_stages(feature_head, runnable, manifest.kv_shape))
            reference = SplitModel(manifest, stages)
            return compare(exported, reference, manifest.precision, verify=io_names.VERIFY not in skip,
                           prompt_len=validation_prompt_len(runnable, manifest))
    finally:
        exported.close()
