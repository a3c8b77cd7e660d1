"""Benchmark results as JSON, a Markdown table, and PNG plots (matplotlib, optional)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..runtime.stats import add_positions
from ..runtime.timing import ModeResult, paired_speedup, repeat_speedups


def _mode_dict(mode: ModeResult, plain: ModeResult) -> dict:
    return {
        "tokens": mode.tokens, "tokens_per_second": round(mode.tokens_per_second, 2),
        "speedup": round(mode.speedup_over(plain), 3) if plain.tokens_per_second else None,
        "speedup_range": speedup_range(repeat_speedups(mode.tokens, mode.seconds, plain.tokens, plain.seconds)),
        "seconds_per_repeat": [round(s, 4) for s in mode.seconds],
        "acceptance_rate": round(mode.acceptance_rate, 4), "tokens_per_round": round(mode.tokens_per_round, 3),
        "time_to_first_token_ms": round(1000 * float(np.median(mode.first_token_s)), 1),
        "by_source": {s: {"rounds": r, "draft_tokens": d, "accepted_tokens": a,
                          "acceptance_rate": round(a / d, 4) if d else 0.0}
                      for s, (r, d, a) in mode.by_source.items()},
        "positions": {s: counts for s, counts in mode.totals.positions.items()},  # [[reached, accepted] per j]
    }


def speedup_range(ratios: list[float]) -> list[float] | None:
    """Lowest and highest per-repeat speedup: how far the machine moved the ratio within this run."""
    return [round(min(ratios), 3), round(max(ratios), 3)] if len(ratios) > 1 else None


def _overall(categories, temperature) -> dict:
    rows = [c for c in categories if c.temperature == temperature]
    out, per_repeat = {}, {}
    for name in rows[0].modes:
        tokens = sum(c.modes[name].tokens for c in rows)
        per_repeat[name] = (tokens, [sum(r) for r in zip(*(c.modes[name].seconds for c in rows))])
        seconds = sum(float(np.median(c.modes[name].seconds)) for c in rows)
        drafted = sum(c.modes[name].drafted for c in rows)
        accepted = sum(c.modes[name].accepted for c in rows)
        rounds = sum(c.modes[name].rounds for c in rows)
        out[name] = {"tokens_per_second": round(tokens / seconds, 2) if seconds else 0.0,
                     "acceptance_rate": round(accepted / drafted, 4) if drafted else 0.0,
                     "tokens_per_round": round((accepted + rounds) / rounds, 3) if rounds else 0.0}
    plain = per_repeat["plain"]
    for name, v in out.items():
        v["speedup"] = round(paired_speedup(*per_repeat[name], *plain), 3) if plain[0] else None
        v["speedup_range"] = speedup_range(repeat_speedups(*per_repeat[name], *plain))
    return out


def summarise(manifest, categories, config) -> dict:
    temps = sorted({c.temperature for c in categories})
    return {
        "bundle": {"model": manifest.model.name, "exit_layer": manifest.exit_layer,
                   "num_layers": manifest.model.num_layers, "num_draft_tokens": manifest.num_draft_tokens,
                   "draft_source": manifest.draft_source, "precision": manifest.precision,
                   "lookup_ngram": list(config.lookup_ngram or manifest.lookup_ngram),
                   "calibrated": manifest.calibration is not None},
        "settings": {"max_new_tokens": config.max_new_tokens, "repeats": config.repeats,
                     "prompts_per_category": config.prompts_per_category,
                     "timing": "wall time per generation incl. prefill; tok/s from the median repeat, "
                               "speedups the median of per-repeat ratios"},
        "greedy_identical_to_plain": 0.0 in temps,
        "results": {str(t): {c.category: {m: _mode_dict(r, c.modes["plain"]) for m, r in c.modes.items()}
                             for c in categories if c.temperature == t} for t in temps},
        "overall": {str(t): _overall(categories, t) for t in temps},
    }


def _x(ratio) -> str:
    return "-" if ratio is None else f"{ratio:.2f}×"


def markdown(results: dict) -> str:
    b = results["bundle"]
    lines = [f"# specdeploy bench: {b['model']} (exit layer {b['exit_layer']}/{b['num_layers']}, "
             f"γ={b['num_draft_tokens']}, {b['precision']}, calibrated: {b['calibrated']})", "",
             f"Machine: {results.get('machine', {}).get('processor', '?')}, "
             f"{results.get('machine', {}).get('cpu_count', '?')} cores. "
             f"{results['settings']['max_new_tokens']} new tokens, {results['settings']['repeats']} repeats "
             f"(tok/s: the median repeat; speedups: the median of per-repeat ratios, their range in parentheses).", ""]
    for temp, cats in results["results"].items():
        modes = list(next(iter(cats.values())))
        lines += [f"## temperature {temp}", "",
                  "| category | plain tok/s | " + " | ".join(f"{m} α / τ / speedup" for m in modes if m != "plain") + " |",
                  "|---|---|" + "---|" * (len(modes) - 1)]
        rows = list(cats.items()) + [("**overall**", results["overall"][temp])]
        for cat, r in rows:
            cells = [f"{r[m]['acceptance_rate']:.2f} / {r[m]['tokens_per_round']:.2f} / **{_x(r[m]['speedup'])}**"
                     + spread(r[m].get("speedup_range")) for m in modes if m != "plain"]
            lines.append(f"| {cat} | {r['plain']['tokens_per_second']:.1f} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += _position_lines(results)
    lines += _roofline_lines(results)
    if "lookup_bound" in results:
        lines += _bound_lines(results)
    if "sweep" in results:
        lines += ["## sweep: exit layer × draft length (greedy, early exit)", "",
                  "| k | γ | α | τ | c | predicted | measured |", "|---|---|---|---|---|---|---|"]
        for r in results["sweep"]["grid"]:
            lines.append(f"| {r['exit_layer']} | {r['num_draft_tokens']} | {r['acceptance_rate']:.2f} | "
                         f"{r['tokens_per_round']:.2f} | {r['cost_ratio']:.2f} | {r['predicted_speedup']:.2f}× | "
                         f"{r['measured_speedup']:.2f}× |")
        lines.append("")
    mem = results.get("memory")
    if mem:
        lines.append(f"Peak memory (RSS, each mode in a fresh process): plain {mem['plain']['peak_mb']:.0f} MB, "
                     f"speculative {mem['speculative']['peak_mb']:.0f} MB "
                     f"({100 * mem['speculative_overhead']:+.1f}%).")
    return "\n".join(lines) + "\n"


def _position_lines(results: dict) -> list[str]:
    """Greedy acceptance by draft position for each drafting source, over every category, and what
    a feature head's calls cost beside a plain step."""
    totals: dict[tuple[str, str], list[list[int]]] = {}
    for category in results["results"].get("0.0", {}).values():
        for mode, r in category.items():
            for source, counts in r.get("positions", {}).items():
                add_positions(totals.setdefault((mode, source), []), counts)
    if not totals:
        return []
    lines = ["## acceptance by draft position (greedy, all categories)", "",
             "P(the j-th draft accepted | the ones before it were), with the rounds that reached it.", "",
             "| mode | source | j = 1, 2, … |", "|---|---|---|"]
    for (mode, source), counts in totals.items():
        if not counts:
            continue  # plain steps draft nothing
        cells = ", ".join(f"{a / r:.2f} ({r})" if r else "-" for r, a in counts)
        lines.append(f"| {mode} | {source} | {cells} |")
    head = results.get("feature_head_ms")
    if head:
        lines += ["", f"Feature head: one call {head['head_call']:.2f} ms, the features' projection "
                      f"{head['projection']:.2f} ms, against a plain one-row step of {head['step']:.2f} ms "
                      f"({head['head_call'] / head['step']:.1%} and {head['projection'] / head['step']:.1%} of it)."]
    return lines + [""]


def spread(bounds) -> str:
    """A speedup's per-repeat range as " (low–high)"; nothing where the repeats agree or were one."""
    return f" ({bounds[0]:.2f}–{bounds[1]:.2f})" if bounds and bounds[0] != bounds[1] else ""


def _roofline_lines(results: dict) -> list[str]:
    """What a pass over more rows costs, and plain decoding against the memory roofline."""
    lines = []
    if "passes" in results:
        costs = " / ".join(f"{v:.2f}" for v in results["passes"].values())
        lines.append(f"A full-depth pass over 1…{len(results['passes'])} rows costs {costs} one-row steps "
                     f"(each row count timed in turn at a valid length of 32).")
    r = results.get("roofline")
    if r:
        lines.append(f"Plain decoding's one-row step runs at {r['step_tok_s']:.1f} tok/s, {100 * r['fraction']:.0f}% "
                     f"of the memory roofline: {r['weight_gb']:.3f} GB of weights a token (as the bundle stores them) "
                     f"at {r['read_gb_s']:.1f} GB/s read here allows {r['roofline_tok_s']:.1f}.")
    return lines + [""] if lines else []


def _bound_lines(results: dict) -> list[str]:
    """Measured lookup/hybrid speedups beside the clairvoyant bound on the same greedy outputs."""
    b, greedy = results["lookup_bound"], results["results"].get("0.0", {})
    measured, priced = {**greedy, "overall": results["overall"].get("0.0", {})}, results.get("priced", {})
    lines = ["## lookup bound (greedy): the most any copy drafter could reach on these outputs", "",
             f"Every round drafts exactly the longest continuation any earlier {b['ngram'][0]}..{b['ngram'][1]}-gram "
             f"match offers (at most {b['num_draft_tokens']} tokens); rounds priced with passes timed on this machine "
             f"(ms over 1, 2, … rows: {' / '.join(f'{v:.1f}' for v in b['pass_ms'].values())}). "
             "Priced: the rounds each mode ran (first repeat), at those pass costs — its speedup without the run's "
             "timing noise or the drafter's own work.", "",
             "| category | clairvoyant τ | bound | lookup priced / measured | hybrid priced / measured |",
             "|---|---|---|---|---|"]
    for category, r in b["categories"].items():
        got, cost = measured.get(category, {}), priced.get(category, {})
        cells = [f"{_x(cost.get(m))} / {_x(got[m]['speedup']) if m in got else '-'}" for m in ("lookup", "hybrid")]
        lines.append(f"| {category} | {r['tokens_per_round']:.2f} | {_x(r['speedup_bound'])} | " + " | ".join(cells) + " |")
    return lines + [""]


def plots(results: dict, out: Path) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    for temp, cats in results["results"].items():
        modes = [m for m in next(iter(cats.values())) if m != "plain"]
        fig, ax = plt.subplots(figsize=(9, 4))
        x = np.arange(len(cats))
        for i, m in enumerate(modes):
            ax.bar(x + i * 0.8 / len(modes), [cats[c][m]["speedup"] or 0.0 for c in cats], 0.8 / len(modes), label=m)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(x + 0.4 - 0.4 / len(modes), list(cats), rotation=20)
        ax.set_ylabel("speedup vs plain")
        ax.set_title(f"{results['bundle']['model']}: speedup by category (T={temp})")
        ax.legend()
        fig.tight_layout()
        path = out / f"speedup_by_category_t{temp}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    if "sweep" in results:
        written.append(_sweep_plot(results["sweep"]["grid"], out, plt))
    return written


def heat_scale(key: str, data: np.ndarray) -> tuple[str, float, float]:
    """(colormap, vmin, vmax) on a scale that means something, not the data's own min..max.

    Acceptance spans its whole range 0..1; speedup is centred on 1.0 (plain decoding) with at
    least ±0.25 either side, so 0.34 vs 0.36 or 0.98× vs 1.02× look alike, as they are.
    """
    if key == "acceptance_rate":
        return "viridis", 0.0, 1.0
    values = data[np.isfinite(data)]
    spread = max(0.25, float(np.abs(values - 1.0).max()) if values.size else 0.0)
    return "RdBu", 1.0 - spread, 1.0 + spread


def _sweep_plot(grid, out: Path, plt) -> Path:
    exits = sorted({r["exit_layer"] for r in grid})
    gammas = sorted({r["num_draft_tokens"] for r in grid})
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    panels = ((axes[0], "acceptance_rate", "acceptance α (0..1)", "{:.2f}"),
              (axes[1], "measured_speedup", "speedup vs plain (1.0 = same)", "{:.2f}×"))
    for ax, key, title, label in panels:
        data = np.full((len(exits), len(gammas)), np.nan)
        for r in grid:
            data[exits.index(r["exit_layer"]), gammas.index(r["num_draft_tokens"])] = r[key]
        cmap, vmin, vmax = heat_scale(key, data)
        im = ax.imshow(data, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
        ax.set_xticks(range(len(gammas)), gammas)
        ax.set_yticks(range(len(exits)), exits)
        ax.set_xlabel("draft length γ")
        ax.set_ylabel("exit layer k")
        ax.set_title(title)
        for (i, j), v in np.ndenumerate(data):
            if np.isfinite(v):
                shade = (v - vmin) / (vmax - vmin)
                dark = shade < 0.6 if key == "acceptance_rate" else abs(shade - 0.5) > 0.3
                ax.text(j, i, label.format(v), ha="center", va="center", fontsize=8, color="w" if dark else "k")
        fig.colorbar(im, ax=ax)
    fig.tight_layout()
    path = out / "sweep.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(results: dict, out: Path, with_plots: bool = True) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "results.md").write_text(markdown(results))
    files = [out / "results.json", out / "results.md"]
    return files + (plots(results, out) if with_plots else [])
