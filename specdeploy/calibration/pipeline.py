"""`specdeploy calibrate` / `export --calibrate`: data -> adapters -> costs -> choice -> bundle.

1. the model's own generations on the built-in prompts (and the user's), cached;
2. per candidate exit layer, a distilled exit adapter over the draft vocabulary;
3. draft / verify costs timed on real graphs of this machine and backend;
4. (k, γ, threshold) chosen by replaying greedy rounds on held-out task kinds;
5. the final bundle, then plain vs speculative measured end to end on held-out prompts; the
   draft source and γ with the best measured speed become the bundle's defaults.
"""
from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable


from ..config import GenerationConfig
from ..export.bundle import DraftHead, ExportConfig, export
from . import adapter as adapters
from . import autotune, prompts, vocab
from .data import DataConfig, collect

log = logging.getLogger("specdeploy")


@dataclass(frozen=True)
class CalibrationConfig:
    exits: tuple[int, ...] | None = None   # None: candidates spread over the lower half
    gammas: tuple[int, ...] = tuple(range(1, 9))
    draft_vocab_size: int = 8192
    max_new_tokens: int = 96
    train_steps: int = 300
    measure_prompts: int = 4
    measure_tokens: int = 64


def candidate_exits(num_layers: int) -> tuple[int, ...]:
    picks = {max(1, round(num_layers * f)) for f in (1 / 6, 1 / 4, 1 / 3, 1 / 2)}
    return tuple(sorted(k for k in picks if k < num_layers))


def _adapters(model, train, held, exits, vocab_ids, steps, echo):
    results = {}
    for k in exits:
        raw, _ = adapters.draft_predictions(model, held, k, vocab_ids, None)
        fitted = adapters.train(model, train, k, vocab_ids, adapters.TrainConfig(steps=steps))
        pred, conf = adapters.draft_predictions(model, held, k, vocab_ids, fitted)
        match = pred == held.greedy
        train_pred, _ = adapters.draft_predictions(model, train, k, vocab_ids, fitted)
        agreement = {"plain_exit": float((raw == held.greedy).mean()), "adapter": float(match.mean()),
                     "adapter_on_training_data": float((train_pred == train.greedy).mean())}
        echo(f"exit layer {k}: held-out greedy agreement {agreement['plain_exit']:.2f} plain exit "
             f"-> {agreement['adapter']:.2f} with adapter ({agreement['adapter_on_training_data']:.2f} on training data)")
        results[k] = (fitted, match, conf, agreement)
    return results


def _costs(model_tok, request, k, fitted, vocab_ids, max_rows):
    from ..backends import load_stages
    from ..manifest import read
    from ..runtime.split_model import SplitModel
    from .costs import measure

    with tempfile.TemporaryDirectory() as tmp:
        cfg = ExportConfig(source=request.source, exit_layer=k, max_context=256,
                           output=Path(tmp) / "timing", validate=False)
        path = export(cfg, DraftHead(fitted, vocab_ids), loaded=model_tok)
        manifest = read(path)
        return measure(SplitModel(manifest, load_stages(path, manifest)), max_rows)


def _measure_end_to_end(bundle: Path, held_convs, gammas, cal: CalibrationConfig, echo) -> dict:
    from ..bench.timing import run_modes
    from ..runtime.engine import Engine

    with Engine(bundle) as engine:
        chat = engine.tokenizer.chat_template is not None
        ids = [engine.encode_prompt(c if chat else c[-1]["content"]) for c in held_convs[: cal.measure_prompts]]
        base = dict(max_new_tokens=cal.measure_tokens)
        modes = {"plain": GenerationConfig(speculative=False, **base)}
        for gamma in gammas:
            for source in ("early_exit", "hybrid"):
                modes[f"{source}/{gamma}"] = GenerationConfig(num_draft_tokens=gamma, draft_source=source, **base)
        results = run_modes(engine, ids, modes, repeats=2)
    plain = results.pop("plain").tokens_per_second
    speedups = {name: r.tokens_per_second / plain for name, r in results.items()}
    for name, s in speedups.items():
        echo(f"measured {name}: {s:.2f}× plain")
    return speedups


def calibrate_export(request, echo: Callable[[str], None] = print,
                     cal: CalibrationConfig = CalibrationConfig()) -> Path:
    from ..export.arch import load

    request = resolve_source(request)
    model, tokenizer = load(request.source)
    num_layers, vocab_size = model.config.num_hidden_layers, model.config.vocab_size
    exits = (request.exit_layer,) if request.exit_layer else (cal.exits or candidate_exits(num_layers))
    gammas = (request.num_draft_tokens,) if request.num_draft_tokens else cal.gammas
    train_convs = prompts.builtin(held_out=False)
    if request.prompts_file:
        train_convs = train_convs + prompts.load_user_prompts(request.prompts_file)
    held_convs = prompts.builtin(held_out=True)
    data_cfg = DataConfig(exits=tuple(sorted(set(exits))), max_new_tokens=cal.max_new_tokens)
    echo(f"calibrating exit layers {list(exits)} on {len(train_convs)} prompts "
         f"({len(held_convs)} held out)")
    train = collect(model, tokenizer, request.source, train_convs, data_cfg, "train")
    held = collect(model, tokenizer, request.source, held_convs, data_cfg, "heldout")
    vocab_ids = vocab.choose(train, vocab_size, cal.draft_vocab_size)
    echo(f"draft vocabulary: {len(vocab_ids)} tokens cover {vocab.coverage(held, vocab_ids):.1%} "
         f"of held-out greedy tokens")
    fitted = _adapters(model, train, held, exits, vocab_ids, cal.train_steps, echo)
    k0 = exits[len(exits) // 2]
    costs = _costs((model, tokenizer), request, k0, fitted[k0][0], vocab_ids, max(gammas) + 1)
    candidates = []
    for k, (_, match, conf, _) in fitted.items():
        candidates += autotune.evaluate(k, match, conf, held.segment, costs, gammas=gammas)
    choice = autotune.best(candidates)
    echo(autotune.table(candidates))
    echo(f"chosen: exit layer {choice.exit_layer}, {choice.num_draft_tokens} draft tokens, "
         f"threshold {choice.threshold}, predicted {choice.predicted_speedup:.2f}× plain")
    calibration = {
        "exit_layers": {str(k): v[3] for k, v in fitted.items()},
        "draft_vocab_size": int(len(vocab_ids)),
        "draft_vocab_coverage": vocab.coverage(held, vocab_ids),
        "costs": costs.to_dict(),
        "table": autotune.table(candidates),
        "chosen": {"exit_layer": choice.exit_layer, "num_draft_tokens": choice.num_draft_tokens,
                   "threshold": choice.threshold, "predicted_speedup": round(choice.predicted_speedup, 3)},
    }
    adapter = fitted[choice.exit_layer][0]
    draft = DraftHead(adapter, vocab_ids, choice.threshold)
    config = ExportConfig(source=request.source, exit_layer=choice.exit_layer,
                          num_draft_tokens=choice.num_draft_tokens, max_context=request.max_context,
                          output=request.output, draft_source=request.draft_source,
                          lookup_ngram=request.lookup_ngram, validate=request.validate, opset=request.opset)
    path = export(config, draft, calibration, loaded=(model, tokenizer))
    return _choose_defaults(path, held_convs, [choice.num_draft_tokens], cal, echo)


def decide_defaults(speedups: dict[str, float]) -> tuple[str, int, bool]:
    """(draft source, γ, speculate by default) from measured speedups keyed "source/γ".

    If no speculative configuration beat plain decoding, the bundle defaults to plain decoding.
    """
    best = max(speedups, key=speedups.get)
    source, gamma = best.split("/")
    return source, int(gamma), speedups[best] >= 1.0


def _choose_defaults(path: Path, held_convs, gammas, cal, echo) -> Path:
    """Measure plain vs speculative end to end and record the best measured defaults."""
    from .. import manifest as manifest_io

    speedups = _measure_end_to_end(path, held_convs, gammas, cal, echo)
    source, gamma, speculate = decide_defaults(speedups)
    m = manifest_io.read(path)
    calibration = {**(m.calibration or {}), "measured_speedup": {k: round(v, 3) for k, v in speedups.items()}}
    manifest_io.write(path, m.replace(draft_source=source, num_draft_tokens=gamma, calibration=calibration,
                                      default_speculative=speculate))
    best = speedups[f"{source}/{gamma}"]
    if speculate:
        echo(f"default: speculative, {source}, {gamma} draft tokens (measured {best:.2f}× plain)")
    else:
        echo(f"speculation measured slower than plain here (best {best:.2f}× with {source}/{gamma}): the bundle "
             f"defaults to plain decoding; request speculation per call to use it anyway")
    return path


def resolve_source(request):
    """`specdeploy calibrate BUNDLE`: re-calibrate from the model the bundle was exported from."""
    import dataclasses

    from .. import manifest as manifest_io
    from ..errors import ConfigError

    path = Path(request.source)
    if not (path / manifest_io.MANIFEST_FILE).is_file():
        return request
    source = manifest_io.read(path).extra.get("source")
    if not source or not Path(source).exists():
        raise ConfigError(f"{path} does not record an existing source model ({source}); "
                          f"calibrate the model itself: specdeploy calibrate MODEL --output {path}")
    return dataclasses.replace(request, source=Path(source))
