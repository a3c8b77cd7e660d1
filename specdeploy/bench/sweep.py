"""Sweep exit layer × draft length: measured α, c and speedup next to the DESIGN.md formula.

The gap between `predicted` (τ / (γ c + 1) from the measured α and c) and `measured` is runtime
overhead the formula does not see.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from ..config import UNWARPED, GenerationConfig
from ..runtime.engine import Engine
from ..runtime.timing import run_modes


def expected_tokens_per_round(alpha: float, gamma: int) -> float:
    if alpha >= 1.0:
        return gamma + 1.0
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def _grid_for(engine: Engine, ids, gammas, config, calibrated: bool) -> list[dict]:
    from ..runtime.costs import measure

    costs = measure(engine.model, max_rows=2, repeats=7)
    k = engine.manifest.exit_layer
    c = costs.draft_step_s(k) / costs.full_step_s
    base = dict(max_new_tokens=config.max_new_tokens, temperature=0.0, **UNWARPED)
    modes = {"plain": GenerationConfig(speculative=False, **base)}
    modes.update({f"g{g}": GenerationConfig(num_draft_tokens=g, draft_source="early_exit", **base) for g in gammas})
    res = run_modes(engine, ids, modes, config.repeats)
    plain = res["plain"]
    rows = []
    for g in gammas:
        r = res[f"g{g}"]
        tau = expected_tokens_per_round(r.acceptance_rate, g)
        rows.append({"exit_layer": k, "num_draft_tokens": g, "calibrated": calibrated,
                     "acceptance_rate": round(r.acceptance_rate, 4), "tokens_per_round": round(r.tokens_per_round, 3),
                     "cost_ratio": round(c, 4), "predicted_speedup": round(tau / (g * c + 1), 3),
                     "measured_speedup": round(r.speedup_over(plain), 3)})
    return rows


def sweep(engine: Engine, config, prompt_set: dict[str, list[str]]) -> dict:
    chat = engine.tokenizer.chat_template is not None
    texts = [ps[0] for ps in prompt_set.values()]
    ids = [engine.encode_prompt([{"role": "user", "content": t}] if chat else t) for t in texts]
    grid = _grid_for(engine, ids, config.sweep_gammas, config, engine.manifest.calibration is not None)
    skipped = None
    extra_exits = [k for k in config.sweep_exits if k != engine.manifest.exit_layer]
    if extra_exits and config.compare_model is None:
        skipped = "other exit layers need --model (the source model) to export them"
    elif extra_exits:
        grid += _other_exits(config, extra_exits, ids, engine.manifest.max_context)
    return {"grid": grid, "skipped": skipped,
            "note": "other exit layers are exported without calibration (plain exit)"}


def _other_exits(config, exits, ids, max_context) -> list[dict]:
    from ..export import ExportConfig
    from ..export.arch import load
    from ..export.writer import write_bundle

    model, tokenizer = load(config.compare_model)
    rows = []
    for k in exits:
        with tempfile.TemporaryDirectory() as tmp:
            write_bundle(model, tokenizer, ExportConfig(source=config.compare_model, exit_layer=k,
                                                        max_context=max_context, validate=False), Path(tmp))
            with Engine(tmp) as engine:
                rows += _grid_for(engine, ids, config.sweep_gammas, config, calibrated=False)
    return rows
