"""`specdeploy bench`: plain vs speculative decoding per category, on the same graphs, one run.

Modes run interleaved on each prompt and are repeated (runtime.timing): tokens/s is the median
repeat's, a speedup the median of the ratios within each repeat. At greedy the
speculative outputs must equal the plain outputs token for token, or the run fails.
"""
from __future__ import annotations

import platform
from dataclasses import dataclass, field
from pathlib import Path

from .. import prompts as prompt_sets
from ..bundle import io_names
from ..config import UNWARPED, GenerationConfig, check_ngram
from ..constants import SOURCES, VERSION
from ..errors import SpecDeployError
from ..runtime.costs import CostModel, feature_head_costs, measure
from ..runtime.engine import Engine
from ..runtime.timing import ModeResult, run_modes
from . import roofline
from .priced import priced_speedups

PASS_ROWS = 8  # rows a pass is priced over in the report: a verify pass of up to 7 drafts


@dataclass(frozen=True)
class BenchConfig:
    bundle: Path
    prompts_file: Path | None = None
    max_new_tokens: int = 64
    repeats: int = 3
    prompts_per_category: int | None = None
    temperatures: tuple[float, ...] = (0.0, 1.0)
    compare_model: Path | None = None   # the source model, for --sweep-exits
    sweep: bool = False
    sweep_gammas: tuple[int, ...] = (1, 2, 3, 4, 6, 8)
    sweep_exits: tuple[int, ...] = ()
    output_dir: Path = Path("bench-results")
    plots: bool = True
    lookup_ngram: tuple[int, int] | None = None  # None: the bundle's

    def __post_init__(self):
        if self.lookup_ngram is not None:
            object.__setattr__(self, "lookup_ngram", check_ngram(self.lookup_ngram))

    @classmethod
    def quick(cls, **kw) -> "BenchConfig":
        """Under two minutes on a 2-core CPU with the example model."""
        return cls(**{"max_new_tokens": 32, "repeats": 1, "prompts_per_category": 1,
                      "sweep_gammas": (2, 4), **kw})


class GreedyMismatch(SpecDeployError):
    pass


@dataclass
class CategoryResult:
    temperature: float
    category: str
    modes: dict[str, ModeResult] = field(default_factory=dict)
    prompts: list[list[int]] = field(default_factory=list)

    def speedup(self, mode: str) -> float:
        return self.modes[mode].speedup_over(self.modes["plain"])


def _progress(total: int):
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="bench", leave=False)


def modes_for(temperature: float, default_source: str, max_new_tokens: int,
              lookup_ngram: tuple[int, int] | None = None, available=SOURCES) -> dict[str, GenerationConfig]:
    """`available`: the sources the bundle can run (a feature head's only where it has one)."""
    base = dict(max_new_tokens=max_new_tokens, temperature=temperature, seed=0 if temperature else None, **UNWARPED)
    modes = {"plain": GenerationConfig(speculative=False, **base)}
    sources = [s for s in SOURCES if s in available] if temperature == 0 else (default_source,)
    for source in sources:
        modes[source] = GenerationConfig(draft_source=source, lookup_ngram=lookup_ngram, **base)
    return modes


def run_categories(engine: Engine, config: BenchConfig, prompt_set: dict[str, list[str]]) -> list[CategoryResult]:
    chat = engine.tokenizer.chat_template is not None
    encoded = {c: [engine.encode_prompt([{"role": "user", "content": p}] if chat else p)
                   for p in ps[: config.prompts_per_category]] for c, ps in prompt_set.items()}
    plans = [(t, modes_for(t, engine.manifest.draft_source, config.max_new_tokens, config.lookup_ngram,
                           engine.decoder.drafters)) for t in config.temperatures]
    total = sum(len(m) * len(ids) * config.repeats for _, m in plans for ids in encoded.values())
    bar = _progress(total)
    results = []
    for temperature, modes in plans:
        for category, ids in encoded.items():
            res = CategoryResult(temperature, category, prompts=ids)
            res.modes = run_modes(engine, ids, modes, config.repeats, bar.update if bar else None)
            if temperature == 0:
                check_identical(res)
            results.append(res)
    if bar:
        bar.close()
    return results


def check_identical(res: CategoryResult) -> None:
    plain = res.modes["plain"].outputs
    for name, mode in res.modes.items():
        for i, (a, b) in enumerate(zip(plain, mode.outputs)):
            if a != b:
                raise GreedyMismatch(
                    f"greedy {name} output differs from plain on {res.category} prompt {i}; "
                    f"this breaks exactness, please report it with the bundle's manifest"
                )


def lookup_bound(engine: Engine, categories: list[CategoryResult], ngram: tuple[int, int] | None,
                 costs: CostModel) -> dict:
    """The clairvoyant lookup bound on this run's greedy outputs, priced with passes timed here."""
    from .bound import copy_bounds, pass_cost

    m = engine.manifest
    ngram = ngram or m.lookup_ngram
    cases = {c.category: list(zip(c.prompts, c.modes["plain"].outputs)) for c in categories if c.temperature == 0}
    passes = {str(r): round(1000 * pass_cost(costs, r), 2) for r in range(1, m.num_draft_tokens + 2)}
    return {"ngram": list(ngram), "num_draft_tokens": m.num_draft_tokens, "costs": costs.to_dict(), "pass_ms": passes,
            "categories": copy_bounds(cases, costs, ngram, m.num_draft_tokens)}


def machine_info() -> dict:
    import numpy
    import onnxruntime

    info = {"machine": platform.machine(), "processor": platform.processor() or platform.machine(),
            "system": platform.platform(), "python": platform.python_version(),
            "cpu_count": __import__("os").cpu_count(),
            "packages": {"specdeploy": VERSION, "onnxruntime": onnxruntime.__version__,
                         "numpy": numpy.__version__}}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["processor"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return info


def run(config: BenchConfig) -> dict:
    """Run everything the config asks for; returns the JSON-ready results."""
    from .report import summarise

    prompt_set = prompt_sets.load_bench_prompts(config.prompts_file) if config.prompts_file else prompt_sets.bench_prompts()
    from ..bundle import manifest as manifest_io
    from . import memory

    manifest_io.read(config.bundle)  # a damaged bundle is named before anything is measured
    # first, while this process maps nothing: pages two processes share are never paged out
    peak_memory = memory.compare(config.bundle, config.max_new_tokens)
    with Engine(config.bundle) as engine:
        categories = run_categories(engine, config, prompt_set)
        results = summarise(engine.manifest, categories, config)
        if 0.0 in config.temperatures:
            costs = measure(engine.model, max(PASS_ROWS, engine.manifest.num_draft_tokens + 1))
            results["passes"] = roofline.pass_costs(costs, PASS_ROWS)
            results["roofline"] = roofline.roofline(roofline.bundle_weight_bytes(config.bundle, engine.manifest),
                                                    roofline.read_bandwidth(), costs.full_step_s)
            results["lookup_bound"] = lookup_bound(engine, categories, config.lookup_ngram, costs)
            results["priced"] = priced_speedups(categories, costs, engine.manifest.exit_layer)
        if io_names.FEATURE_HEAD in engine.manifest.graphs:
            results["feature_head_ms"] = feature_head_costs(engine.model)
        results["memory"] = peak_memory
        if config.sweep:
            from .sweep import sweep

            results["sweep"] = sweep(engine, config, prompt_set)
    results["machine"] = machine_info()
    return results


def bench(config: BenchConfig) -> tuple[dict, list[Path]]:
    """Run the benchmark and write JSON, Markdown and plots into `config.output_dir`."""
    from .report import write

    results = run(config)
    return results, write(results, Path(config.output_dir), config.plots)
