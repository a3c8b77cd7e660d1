"""Row independence: row i of an m-row pass must be bitwise the row a one-row pass computes.

That property is what makes greedy speculative output equal greedy plain output by construction:
a verify pass over m candidate rows then computes exactly the m one-row steps plain decoding
would. It depends on the graphs (attention formulation, quantized kernels) and on the machine
(which kernels ONNX Runtime picks for its CPU), so it is checked when a bundle is made and again
when it is loaded on a machine other than the one that checked it.
"""
from __future__ import annotations

import platform
from dataclasses import dataclass

import numpy as np

CHECK_ROWS = (2, 3, 5)  # rows per multi-row pass: the smallest verify, an odd one, a longer one
FLAG_PREFIXES = ("avx", "amx", "fma", "f16c", "asimd", "sve", "i8mm", "dotprod", "bf16")


@dataclass(frozen=True)
class RowCheck:
    passed: bool
    max_diff: dict   # graph -> largest |difference| between m-row and one-row results (0.0 = bitwise)
    machine: str

    def to_dict(self) -> dict:
        return {"passed": self.passed, "max_diff": self.max_diff, "machine": self.machine}


def machine_fingerprint(provider: str = "cpu") -> str:
    """What decides which kernels run: ISA features, ONNX Runtime version, execution provider."""
    import onnxruntime as ort

    flags = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    flags.update(w for w in line.split(":", 1)[1].split() if w.startswith(FLAG_PREFIXES))
                    break
    except OSError:
        pass
    return f"{platform.machine()} ort-{ort.__version__} {provider} {' '.join(sorted(flags))}".strip()


def _diff(many: np.ndarray, ones: np.ndarray) -> float:
    if np.array_equal(many, ones):
        return 0.0
    return float(np.abs(many.astype(np.float64) - ones.astype(np.float64)).max()) or float("nan")


def _prefill(model, prompt: list[int]) -> None:
    model.verify_pass(model.draft_pass(prompt, 0).copy(), 0)


def _compare(model, prompt: list[int], rows: list[int]) -> dict[str, float]:
    """Each graph fed the same inputs as one m-row call and as m one-row calls."""
    start, m = len(prompt), len(rows)
    _prefill(model, prompt)
    hidden_k = model.draft_pass(rows, start).copy()                                  # [m, H]
    _prefill(model, prompt)
    singles = np.concatenate([model.draft_pass([t], start + i).copy() for i, t in enumerate(rows)])
    # verify: both sides get the one-row draft outputs, so only the verify graph is compared
    _prefill(model, prompt)
    model.draft_pass(rows, start)
    final = model.verify_pass(singles, start).copy()                                  # [m, H]
    _prefill(model, prompt)
    model.draft_pass(rows, start)
    final_ones = np.concatenate([model.verify_pass(singles[i : i + 1], start + i).copy() for i in range(m)])
    diffs = {"draft": _diff(hidden_k, singles), "verify": _diff(final, final_ones)}
    heads = {"head": model.logits}
    if model.draft_head_stage is not model.head_stage:
        heads["draft_head"] = model.draft_logits
    for name, head in heads.items():
        source = final_ones if name == "head" else singles
        many = head(source).copy()
        ones = np.concatenate([head(source[i : i + 1]).copy() for i in range(m)])
        diffs[name] = _diff(many, ones)
    return diffs


def check(model, prompt: list[int], vocab_size: int, provider: str = "cpu", seed: int = 0) -> RowCheck:
    """Run the comparison for CHECK_ROWS rows at three prompt lengths (different key lengths)."""
    rng = np.random.default_rng(seed)
    worst: dict[str, float] = {}
    for cut, m in zip((len(prompt), max(1, len(prompt) // 2), max(1, len(prompt) - 3)), CHECK_ROWS):
        rows = [int(t) for t in rng.integers(0, vocab_size, m)]
        for graph, d in _compare(model, prompt[:cut], rows).items():
            worst[graph] = d if np.isnan(d) else max(worst.get(graph, 0.0), d)
    passed = all(d == 0.0 for d in worst.values())
    return RowCheck(passed, worst, machine_fingerprint(provider))


def describe(result: RowCheck) -> str:
    parts = ", ".join(f"{g} differs by up to {d:.1e}" for g, d in result.max_diff.items() if d != 0.0)
    return parts or "every graph bitwise row-independent"



def check_model(model, provider: str = "cpu", prompt_len: int = 24, seed: int = 0) -> RowCheck:
    """`check` over random token ids: row independence is a property of the kernels, not the text."""
    vocab = model.manifest.model.vocab_size
    length = max(4, min(prompt_len, model.max_context - 8))
    prompt = [int(t) for t in np.random.default_rng(seed).integers(0, vocab, length)]
    return check(model, prompt, vocab, provider, seed)


def check_bundle(bundle, manifest, provider: str = "cpu") -> RowCheck:
    """Load the bundle's graphs with ONNX Runtime and check them."""
    from ..backends import load_stages
    from .split_model import SplitModel

    model = SplitModel(manifest, load_stages(bundle, manifest, provider=provider))
    try:
        return check_model(model, provider)
    finally:
        model.close()


def require(bundle, manifest, echo=print) -> dict:
    """Check a bundle being made and refuse it if it fails: its speculative output would differ
    from plain output, which is never shipped. Returns the result for the manifest."""
    from ..errors import RowDependenceError

    result = check_bundle(bundle, manifest)
    if not result.passed:
        fused = any((manifest.extra.get("fused_attention") or {}).values())
        raise RowDependenceError(
            f"the {manifest.precision} graphs are not row-independent on this machine "
            f"({describe(result)}): speculative output would differ from plain output; "
            f"pick another --precision{', or quantize with --attention ops' if fused else ''}, "
            f"or report the model and machine"
        )
    echo(f"row independence: {describe(result)}")
    return result.to_dict()


def verify_at_load(model, provider: str = "cpu") -> RowCheck | None:
    """Re-check a bundle checked on another machine (or never): once, at load, before any output.

    Returns None when the manifest's own result applies here.
    """
    from ..errors import BundleError

    recorded = model.manifest.row_check or {}
    if recorded.get("passed") and recorded.get("machine") == machine_fingerprint(provider):
        return None
    result = check_model(model, provider)
    if not result.passed:
        raise BundleError(
            f"this bundle's {model.manifest.precision} graphs are not row-independent on this machine "
            f"({describe(result)}), so speculative output would differ from plain output; re-export it "
            f"with this specdeploy (or re-quantize it) on this machine and ONNX Runtime"
        )
    return result
