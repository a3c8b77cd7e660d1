"""The calibration steps the export pipeline runs, in order, between loading and writing a bundle."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..config import UNWARPED, GenerationConfig
from . import adapter as adapters
from .data import Activations


@dataclass(frozen=True)
class CalibrationConfig:
    exits: tuple[int, ...] | None = None   # None: candidates spread over the lower half
    gammas: tuple[int, ...] = tuple(range(1, 9))  # num_draft_tokens candidates
    draft_vocab_size: int = 8192
    max_new_tokens: int = 96
    train_steps: int = 300
    measure_prompts: int = 4
    measure_tokens: int = 64


@dataclass(frozen=True)
class FittedExit:
    """One candidate exit layer after training: its adapter and how it did on held-out positions."""

    adapter: object              # calibration.adapter.ExitAdapter
    match: object                # [N] bool: the adapted exit's greedy token equals the model's
    confidence: object           # [N] the exit's top probability
    agreement: dict


def candidate_exits(num_layers: int) -> tuple[int, ...]:
    picks = {max(1, round(num_layers * f)) for f in (1 / 6, 1 / 4, 1 / 3, 1 / 2)}
    return tuple(sorted(k for k in picks if k < num_layers))


def fit_exits(model, train: Activations, held: Activations, exits, vocab_ids, steps: int,
              echo: Callable[[str], None]) -> dict[int, FittedExit]:
    """Train one exit adapter per candidate exit layer and measure it on held-out positions."""
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
        results[k] = FittedExit(fitted, match, conf, agreement)
    return results


def measure_end_to_end(bundle: Path, held_convs, gammas, cal: CalibrationConfig,
                       echo: Callable[[str], None]) -> dict[str, float]:
    """Speedup over plain decoding of early exit and hybrid at each γ, measured on held-out prompts."""
    from ..runtime.engine import Engine
    from ..runtime.timing import run_modes

    with Engine(bundle) as engine:
        chat = engine.tokenizer.chat_template is not None
        ids = [engine.encode_prompt(c if chat else c[-1]["content"]) for c in held_convs[: cal.measure_prompts]]
        base = dict(max_new_tokens=cal.measure_tokens, temperature=0.0, **UNWARPED)
        modes = {"plain": GenerationConfig(speculative=False, **base)}
        for gamma in gammas:
            for source in ("early_exit", "hybrid"):
                modes[f"{source}/{gamma}"] = GenerationConfig(num_draft_tokens=gamma, draft_source=source, **base)
        results = run_modes(engine, ids, modes, repeats=2)
    plain = results.pop("plain")
    speedups = {name: r.speedup_over(plain) for name, r in results.items()}
    for name, s in speedups.items():
        echo(f"measured {name}: {s:.2f}× plain")
    return speedups


MARGIN = 0.03  # a measured gain must exceed this before a riskier choice replaces a safer one


def decide_defaults(speedups: dict[str, float], margin: float = MARGIN) -> tuple[str, int, bool]:
    """(draft source, num_draft_tokens, speculate by default) from measured speedups keyed "source/γ".

    Measurements on a busy machine are noisy, so each step away from the safer choice needs a
    margin: early exit replaces the hybrid (which prices its own fallback to plain steps) only when
    it measured more than `margin` faster, and speculation is the default only when the pick beat
    plain decoding by more than `margin` (so a default is never measurably slower than plain).
    """
    def best_of(source):
        named = {k: v for k, v in speedups.items() if k.startswith(source + "/")}
        return max(named, key=named.get) if named else None

    best = best_of("hybrid") or max(speedups, key=speedups.get)
    early = best_of("early_exit")
    if early and speedups[early] > speedups[best] * (1 + margin):
        best = early
    source, gamma = best.split("/")
    return source, int(gamma), speedups[best] > 1 + margin
