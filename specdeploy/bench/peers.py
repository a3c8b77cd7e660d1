"""`bench --compare`: specdeploy beside the runtimes users would pick instead, in one run.

Every runtime decodes the same chat-templated prompt token ids, greedily, a fixed number of new
tokens (EOS ignored), interleaved prompt by prompt and repeated, so machine noise hits them alike.
Each row reports tokens/s (median of repeats), its ratio to the first bundle's plain decoding
(the median of the ratios within each repeat: runtime.timing says why), and
greedy agreement with that output (prompts whose tokens all equal it, mean leading tokens equal).

The peers (scripts/setup_peers.sh installs them): ONNX Runtime GenAI at fp32 / int8 / int4 built by
its own model builder from the same Hugging Face weights, llama.cpp on the same GGUF, Optimum's
ORTModelForCausalLM, and Hugging Face `generate`. One that cannot run says why in its row.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import prompts as prompt_sets
from ..bundle import manifest as manifest_io
from ..errors import ConfigError
from ..runtime.timing import repeat_speedups
from . import peer_runners as runners
from .report import speedup_range, spread
from .encoding import encode

ALL_PEERS = ("ortgenai-fp32", "ortgenai-int8", "ortgenai-int4", "llama.cpp", "optimum", "hf")


@dataclass(frozen=True)
class PeerConfig:
    bundles: tuple[Path, ...]          # the first one's plain output is the reference
    model: Path                        # the source: a .gguf file or a Hugging Face directory
    max_new_tokens: int = 64
    repeats: int = 3
    prompts_per_category: int = 2
    peers: tuple[str, ...] = ALL_PEERS
    cache: Path = Path(".cache/peers")  # HF directory, builder outputs, Optimum export
    threads: int | None = None
    output_dir: Path = Path("bench-results")

    def __post_init__(self):
        unknown = set(self.peers) - set(ALL_PEERS)
        if unknown:
            raise ConfigError(f"unknown peer(s) {', '.join(sorted(unknown))}; pick from {', '.join(ALL_PEERS)}")
        if not self.bundles:
            raise ConfigError("--compare needs at least one bundle")
        if self.max_new_tokens < 1 or self.repeats < 1 or self.prompts_per_category < 1:
            raise ConfigError("--max-tokens, --repeats and --prompts-per-category must be positive")


@dataclass
class Row:
    name: str
    note: str
    runner: object = None
    skipped: str | None = None
    seconds: list[float] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)

    def tokens_per_second(self) -> float:
        return sum(map(len, self.outputs)) / float(np.median(self.seconds)) if self.seconds else 0.0


def _rows(config: PeerConfig) -> list[Row]:
    """One row per bundle and mode, then per peer; bundles of one precision are told apart by name."""
    rows = []
    precisions = [manifest_io.read(b).precision for b in config.bundles]
    for bundle, precision in zip(config.bundles, precisions):
        label = precision if precisions.count(precision) == 1 else f"{precision} [{Path(bundle).name}]"
        for mode in ("plain", "default"):
            runner = runners.Specdeploy(bundle, speculative=False if mode == "plain" else None,
                                        threads=config.threads)
            rows.append(Row(f"specdeploy {label} {mode}", runner.note, runner))
    for peer in config.peers:
        try:
            runner = runners.make(peer, config.model, config.cache, config.threads)
            rows.append(Row(peer, runner.note, runner))
        except runners.PeerUnavailable as exc:
            rows.append(Row(peer, "", skipped=str(exc)))
    return rows


def _prompt_ids(bundle: Path, per_category: int) -> tuple[list[str], list[list[int]]]:
    from ..runtime.engine import Engine

    with Engine(bundle) as engine:
        chosen = [(c, p) for c, ps in prompt_sets.BENCH_PROMPTS.items() for p in ps[:per_category]]
        return [c for c, _ in chosen], [encode(engine, p) for _, p in chosen]


def _agreement(outputs: list[list[int]], reference: list[list[int]]) -> dict:
    leading = []
    for out, ref in zip(outputs, reference):
        n = next((i for i, (a, b) in enumerate(zip(out, ref)) if a != b), min(len(out), len(ref)))
        leading.append(n)
    equal = sum(o == r for o, r in zip(outputs, reference))
    return {"prompts_equal": equal, "prompts": len(reference), "mean_leading_equal": round(float(np.mean(leading)), 1)}


def run(config: PeerConfig, echo=print) -> dict:
    """Run every row interleaved; returns the results dict (also written as JSON and Markdown)."""
    categories, prompts = _prompt_ids(config.bundles[0], config.prompts_per_category)
    rows = _rows(config)
    live = [r for r in rows if r.runner is not None]
    for repeat in range(config.repeats):
        elapsed = [0.0] * len(live)
        order = list(enumerate(live))[:: -1 if repeat % 2 else 1]  # no row always first after a prompt change
        for ids in prompts:
            for i, row in order:
                began = time.perf_counter()
                out = row.runner.generate(ids, config.max_new_tokens)
                elapsed[i] += time.perf_counter() - began
                if repeat == 0:
                    row.outputs.append(out)
        for row, seconds in zip(live, elapsed):
            row.seconds.append(seconds)
        echo(f"repeat {repeat + 1}/{config.repeats} done")
    for row in live:
        row.runner.close()
    return _results(config, rows, categories)


def _results(config: PeerConfig, rows: list[Row], categories: list[str]) -> dict:
    from .runner import machine_info

    reference = rows[0]
    base = sum(map(len, reference.outputs)), reference.seconds
    table = []
    for row in rows:
        entry = {"runtime": row.name, "note": row.note}
        if row.skipped:
            entry["skipped"] = row.skipped
        else:
            tps = row.tokens_per_second()
            ratios = repeat_speedups(sum(map(len, row.outputs)), row.seconds, *base)  # by repeat, as bench's
            entry.update(tokens_per_second=round(tps, 2),
                         vs_reference=round(float(np.median(ratios)), 3) if ratios else 0.0,
                         vs_reference_range=speedup_range(ratios),
                         seconds_per_repeat=[round(s, 4) for s in row.seconds],
                         **_agreement(row.outputs, reference.outputs))
        table.append(entry)
    results = {"reference": reference.name, "categories": categories, "max_new_tokens": config.max_new_tokens,
               "repeats": config.repeats, "machine": machine_info(), "rows": table}
    if Path(config.model).suffix == ".gguf" and Path(config.model).is_file():
        from . import roofline

        weights, bandwidth = roofline.gguf_weight_bytes(config.model), roofline.read_bandwidth()
        results["roofline"] = {"file_gb": round(weights / 1e9, 3), "read_gb_s": round(bandwidth / 1e9, 1),
                               "roofline_tok_s": round(bandwidth / weights, 1)}
    return results


UNSTEADY = 1.25  # repeats this far apart: the 47 earlier peer runs kept in lab/runs stayed within 1.22


def unsteady(results: dict) -> str | None:
    """Why this run's ratios are no reading, or None: one repeat of the reference took a quarter
    longer than another, or a runtime's paired ratios moved that much between repeats — the machine
    was busy in some repeats and not others, and the median of three can be any of them."""
    rows = [r for r in results["rows"] if "skipped" not in r]
    seconds = rows[0].get("seconds_per_repeat") or [] if rows else []  # older results kept none
    if len(seconds) > 1 and max(seconds) > UNSTEADY * min(seconds):
        return (f"Unsteady run: {rows[0]['runtime']}'s repeats took {min(seconds):.1f}–{max(seconds):.1f} s; "
                "rerun on an otherwise idle machine before quoting these ratios.")
    for r in rows[1:]:
        low, high = r.get("vs_reference_range") or (1.0, 1.0)
        if high > UNSTEADY * low:
            return (f"Unsteady run: {r['runtime']}'s ratio moved from {low:.2f}× to {high:.2f}× between repeats; "
                    "rerun on an otherwise idle machine before quoting these ratios.")
    return None


def markdown(results: dict) -> str:
    lines = [f"| runtime | tok/s | vs {results['reference']} | prompts equal to it | mean leading tokens equal | note |",
             "|---|---|---|---|---|---|"]
    for r in results["rows"]:
        if "skipped" in r:
            lines.append(f"| {r['runtime']} | - | - | - | - | skipped: {r['skipped']} |")
        else:
            lines.append(f"| {r['runtime']} | {r['tokens_per_second']:.1f} | {r['vs_reference']:.2f}×"
                         f"{spread(r['vs_reference_range'])} | "
                         f"{r['prompts_equal']}/{r['prompts']} | {r['mean_leading_equal']} | {r['note']} |")
    r = results.get("roofline")
    if r:
        lines.append(f"\nMemory roofline: the file's {r['file_gb']:.3f} GB of weights a token at {r['read_gb_s']:.1f} "
                     f"GB/s read here allows {r['roofline_tok_s']:.1f} tok/s of decoding (the rows above include "
                     f"each prompt's prefill; `specdeploy bench` reports a step's fraction of its bundle's roofline).")
    warning = unsteady(results)
    return "\n".join(lines + ([f"\n**{warning}**"] if warning else []))


def plot(results: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results["rows"] if "skipped" not in r]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.2))
    names = [r["runtime"] for r in rows][::-1]
    values = [r["tokens_per_second"] for r in rows][::-1]
    colors = ["tab:blue" if n.startswith("specdeploy") else "tab:gray" for n in names]
    ax.barh(names, values, color=colors)
    ax.set_xlabel(f"tokens/s (greedy, {results['max_new_tokens']} new tokens, same prompts, one run)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def compare_command(bundle, also, model, peer_names, max_tokens, repeats, per_category, output_dir,
                    plots: bool, echo) -> dict:
    """`bench --compare`: run, print the table, write results.json / results.md / peers.png."""
    import json

    if model is None:
        raise ConfigError("--compare needs --model: the .gguf or Hugging Face directory the bundle was exported from")
    for b in (bundle, *also):
        manifest_io.read(b)
    options = {k: v for k, v in (("max_new_tokens", max_tokens), ("repeats", repeats),
                                 ("prompts_per_category", per_category)) if v is not None}
    peers = tuple(p.strip() for p in peer_names.split(",") if p.strip()) if peer_names else ALL_PEERS
    config = PeerConfig(bundles=(Path(bundle), *map(Path, also)), model=Path(model), peers=peers,
                        output_dir=Path(output_dir), **options)
    results = run(config, echo)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "peers.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "peers.md").write_text(markdown(results) + "\n")
    if plots:
        plot(results, out / "peers.png")
    echo(markdown(results))
    echo(f"wrote {out / 'peers.json'}, {out / 'peers.md'}" + (f", {out / 'peers.png'}" if plots else ""))
    return results
