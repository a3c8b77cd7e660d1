"""A calibrated export: the pipeline runs the calibration steps around its own bundle writes.

1. the model's own generations on the built-in prompts (and the user's), cached;
2. per candidate exit layer, a distilled exit adapter over the draft vocabulary;
3. draft / verify costs timed on a bundle written at the middle candidate, on this machine;
4. (k, γ, threshold) chosen by replaying greedy rounds on held-out task kinds;
5. the final bundle, then plain vs speculative measured end to end on held-out prompts; the
   draft source and γ with the best measured speed become the bundle's defaults.
"""
from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Callable

from .. import prompts
from ..bundle import manifest as manifest_io
from ..calibration import autotune, vocab
from ..calibration.data import DataConfig, collect
from ..calibration.steps import CalibrationConfig, FittedExit, candidate_exits, decide_defaults, fit_exits
from ..calibration.steps import measure_end_to_end
from .writer import DraftHead, write_bundle


def _costs(model, tokenizer, config, k: int, fitted: FittedExit, vocab_ids, max_rows: int):
    """Pass costs timed on real graphs exported at exit `k` (a throwaway bundle), at the precision
    being exported: integer kernels price extra verify rows very differently from fp32 ones."""
    from ..backends import load_stages
    from ..runtime.costs import measure
    from ..runtime.split_model import SplitModel

    timing = dataclasses.replace(config, exit_layer=k, num_draft_tokens=1, max_context=256, validate=False)
    with tempfile.TemporaryDirectory() as tmp:
        bundle = Path(tmp) / "fp32"
        bundle.mkdir()
        manifest = write_bundle(model, tokenizer, timing, bundle, DraftHead(fitted.adapter, vocab_ids))
        if config.quantized:
            from ..quantization.quantize import quantize_into

            bundle = quantize_into(bundle, Path(tmp) / "quantized", config.quantize_options(), echo=lambda line: None)
            manifest = manifest_io.read(bundle)
        split = SplitModel(manifest, load_stages(bundle, manifest))
        try:
            return measure(split, max_rows)
        finally:
            split.close()


def _conversations(config):
    train = prompts.calibration_conversations(held_out=False)
    if config.prompts_file:
        train = train + prompts.load_calibration_prompts(config.prompts_file)
    return train, prompts.calibration_conversations(held_out=True)


def calibrated_export(model, tokenizer, config, staging: Path, echo: Callable[[str], None],
                      cal: CalibrationConfig) -> None:
    """Calibrate and write the chosen bundle into `staging` with measured defaults."""
    num_layers, vocab_size = model.config.num_hidden_layers, model.config.vocab_size
    exits = (config.exit_layer,) if config.exit_layer else (cal.exits or candidate_exits(num_layers))
    gammas = (config.num_draft_tokens,) if config.num_draft_tokens else cal.gammas
    train_convs, held_convs = _conversations(config)
    data_cfg = DataConfig(exits=tuple(sorted(set(exits))), max_new_tokens=cal.max_new_tokens)
    echo(f"calibrating exit layers {list(exits)} on {len(train_convs)} prompts ({len(held_convs)} held out)")
    train = collect(model, tokenizer, config.source, train_convs, data_cfg, "train")
    held = collect(model, tokenizer, config.source, held_convs, data_cfg, "heldout")
    vocab_ids = vocab.choose(train, vocab_size, cal.draft_vocab_size)
    echo(f"draft vocabulary: {len(vocab_ids)} tokens cover {vocab.coverage(held, vocab_ids):.1%} "
         f"of held-out greedy tokens")
    fitted = fit_exits(model, train, held, exits, vocab_ids, cal.train_steps, echo)
    k0 = exits[len(exits) // 2]
    costs = _costs(model, tokenizer, config, k0, fitted[k0], vocab_ids, max(gammas) + 1)
    candidates = []
    for k, f in fitted.items():
        candidates += autotune.evaluate(k, f.match, f.confidence, held.segment, costs, gammas=gammas)
    choice = autotune.best(candidates)
    echo(autotune.table(candidates))
    echo(f"chosen: exit layer {choice.exit_layer}, {choice.num_draft_tokens} draft tokens, "
         f"threshold {choice.threshold}, predicted {choice.predicted_speedup:.2f}× plain")
    calibration = {
        "exit_layers": {str(k): f.agreement for k, f in fitted.items()},
        "draft_vocab_size": int(len(vocab_ids)), "draft_vocab_coverage": vocab.coverage(held, vocab_ids),
        "costs": costs.to_dict(), "table": autotune.table(candidates),
        "chosen": {"exit_layer": choice.exit_layer, "num_draft_tokens": choice.num_draft_tokens,
                   "threshold": choice.threshold, "predicted_speedup": round(choice.predicted_speedup, 3)},
    }
    chosen = dataclasses.replace(config, exit_layer=choice.exit_layer, num_draft_tokens=choice.num_draft_tokens)
    draft = DraftHead(fitted[choice.exit_layer].adapter, vocab_ids, choice.threshold)
    write_bundle(model, tokenizer, chosen, staging, draft, calibration)
    _record_defaults(staging, held_convs, [choice.num_draft_tokens], cal, echo)


def remeasure_defaults(bundle: Path, config, cal: CalibrationConfig, echo: Callable[[str], None]) -> None:
    """The measured defaults again, on the quantized bundle that ships (its kernels, its speed)."""
    held_convs = _conversations(config)[1]
    _record_defaults(bundle, held_convs, [manifest_io.read(bundle).num_draft_tokens], cal, echo)


def _record_defaults(bundle: Path, held_convs, gammas, cal: CalibrationConfig, echo) -> None:
    """Measure plain vs speculative end to end and record the best measured defaults."""
    speedups = measure_end_to_end(bundle, held_convs, gammas, cal, echo)
    source, gamma, speculate = decide_defaults(speedups)
    m = manifest_io.read(bundle)
    calibration = {**(m.calibration or {}), "measured_speedup": {k: round(v, 3) for k, v in speedups.items()}}
    manifest_io.write(bundle, m.replace(draft_source=source, num_draft_tokens=gamma, calibration=calibration,
                                        default_speculative=speculate))
    best = speedups[f"{source}/{gamma}"]
    if speculate:
        echo(f"default: speculative, {source}, {gamma} draft tokens (measured {best:.2f}× plain)")
    else:
        echo(f"speculation measured slower than plain here (best {best:.2f}× with {source}/{gamma}): the bundle "
             f"defaults to plain decoding; request speculation per call to use it anyway")
