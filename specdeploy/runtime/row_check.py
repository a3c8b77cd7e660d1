"""Row independence: row i of an m-row pass must be bitwise the row a one-row pass computes.

That property is what makes greedy speculative output equal greedy plain output by construction:
a verify pass over m candidate rows then computes exactly the m one-row steps plain decoding
would. It depends on the graphs (attention formulation, quantized kernels) and on the machine
(which kernels ONNX Runtime picks for its CPU), so it is checked when a bundle is made and again
when it is loaded on a machine other than the one that checked it.

Every row count a pass can carry is compared (2 ..= MAX_DRAFT_TOKENS + 1, the longest verify
pass): a kernel may have its own code for each count (specdeploy's operators tile 1 to 8 rows, then
4 x 2), and a count left out is a count whose rows nobody has seen agree.
"""
from __future__ import annotations

import hashlib
import platform
from dataclasses import dataclass

import numpy as np

from ..constants import MAX_DRAFT_TOKENS

CHECK_ROWS = tuple(range(2, MAX_DRAFT_TOKENS + 2))  # every multi-row pass the runtime makes
FLAG_PREFIXES = ("avx", "amx", "fma", "f16c", "asimd", "sve", "i8mm", "dotprod", "bf16")


@dataclass(frozen=True)
class RowCheck:
    passed: bool
    max_diff: dict   # graph -> largest |difference| between m-row and one-row results (0.0 = bitwise)
    machine: str

    def to_dict(self) -> dict:
        return {"passed": self.passed, "max_diff": self.max_diff, "machine": self.machine}


def machine_fingerprint(provider: str = "cpu", operators: tuple[str, ...] = ()) -> str:
    """What decides which kernels run: ISA features, ONNX Runtime version, execution provider, and
    for a bundle using specdeploy's own `operators` the build of their library (a rebuilt library is
    other code: its rows are checked again)."""
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
    built = f" kernels-{_library_build()}" if operators else ""
    return f"{platform.machine()} ort-{ort.__version__} {provider} {' '.join(sorted(flags))}{built}".strip()


def _library_build() -> str:
    """The operator library's bytes as built here (its SHA-256, short), or "unbuilt"."""
    from .. import kernels

    path = kernels.library_path()
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.is_file() else "unbuilt"


def _diff(many: np.ndarray, ones: np.ndarray) -> float:
    if np.array_equal(many, ones):
        return 0.0
    return float(np.abs(many.astype(np.float64) - ones.astype(np.float64)).max()) or float("nan")


def _prefill(model, prompt: list[int]) -> None:
    model.verify_pass(model.draft_pass(prompt, 0).copy(), 0)


def _compare(model, prompt: list[int], tokens: list[int], counts=CHECK_ROWS) -> dict[str, float]:
    """Each graph fed the first m of `tokens` as one m-row call, for every m in `counts`, against the
    same rows as one-row calls. A call writes its own KV rows before reading them and leaves the
    prompt's alone, so one prefill serves every call."""
    start, most = len(prompt), max(counts)
    _prefill(model, prompt)
    singles = np.concatenate([model.draft_pass([t], start + i).copy() for i, t in enumerate(tokens[:most])])  # [M, H]
    # verify: both sides get the one-row draft outputs, so only the verify graph is compared
    final_ones = np.concatenate([model.verify_pass(singles[i : i + 1], start + i).copy() for i in range(most)])
    heads = {"head": (model.logits, final_ones)}
    if model.draft_head_stage is not model.head_stage:
        heads["draft_head"] = (model.draft_logits, singles)
    head_ones = {name: np.concatenate([head(rows[i : i + 1]).copy() for i in range(most)])
                 for name, (head, rows) in heads.items()}
    diffs: dict[str, float] = {}
    for m in counts:
        found = {"draft": _diff(model.draft_pass(tokens[:m], start).copy(), singles[:m]),
                 "verify": _diff(model.verify_pass(singles[:m], start).copy(), final_ones[:m])}
        for name, (head, rows) in heads.items():
            found[name] = _diff(head(rows[:m]).copy(), head_ones[name][:m])
        _keep_worst(diffs, found)
    return diffs


def _keep_worst(worst: dict[str, float], found: dict[str, float]) -> None:
    """worst[graph] := the larger difference (NaN, a difference not even finite, stays)."""
    for graph, d in found.items():
        before = worst.get(graph, 0.0)
        worst[graph] = before if np.isnan(before) else d if np.isnan(d) else max(before, d)


def check(model, prompt: list[int], vocab_size: int, provider: str = "cpu", seed: int = 0) -> RowCheck:
    """Run the comparison for every count in CHECK_ROWS at three prompt lengths (different key lengths)."""
    rng = np.random.default_rng(seed)
    worst: dict[str, float] = {}
    room = min(model.max_context - len(prompt), model.max_rows)
    counts = tuple(m for m in CHECK_ROWS if m <= room) or (min(2, room),)
    for cut in (len(prompt), max(1, len(prompt) // 2), max(1, len(prompt) - 3)):
        tokens = [int(t) for t in rng.integers(0, vocab_size, max(counts))]
        _keep_worst(worst, _compare(model, prompt[:cut], tokens, counts))
    passed = all(d == 0.0 for d in worst.values())
    return RowCheck(passed, worst, machine_fingerprint(provider, model.manifest.operators))


def describe(result: RowCheck) -> str:
    parts = ", ".join(f"{g} differs by up to {d:.1e}" for g, d in result.max_diff.items() if d != 0.0)
    return parts or "every graph bitwise row-independent"



def check_model(model, provider: str = "cpu", prompt_len: int = 24, seed: int = 0) -> RowCheck:
    """`check` over random token ids: row independence is a property of the kernels, not the text."""
    vocab = model.manifest.model.vocab_size
    length = max(4, min(prompt_len, model.max_context - max(CHECK_ROWS) - 1))
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
        fused = any(manifest.fused_attention.values())
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
    if recorded.get("passed") and recorded.get("machine") == machine_fingerprint(provider, model.manifest.operators):
        return None
    result = check_model(model, provider)
    if not result.passed:
        raise BundleError(
            f"this bundle's {model.manifest.precision} graphs are not row-independent on this machine "
            f"({describe(result)}), so speculative output would differ from plain output; re-export it "
            f"with this specdeploy (or re-quantize it) on this machine and ONNX Runtime"
        )
    return result
