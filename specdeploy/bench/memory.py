"""Peak memory of plain vs speculative decoding, each in a fresh process (ru_maxrss).

    python -m specdeploy.bench.memory BUNDLE plain|speculative [MAX_NEW_TOKENS]
"""
from __future__ import annotations

import json
import resource
import subprocess
import sys

from ..config import UNWARPED, GenerationConfig
from ..errors import SpecDeployError
from ..runtime.engine import Engine
from ..prompts import BENCH_PROMPTS
from .encoding import encode


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure_here(bundle: str, mode: str, max_new_tokens: int) -> dict:
    with Engine(bundle) as engine:
        loaded = _peak_mb()
        for category in ("chat", "summarisation"):
            ids = encode(engine, BENCH_PROMPTS[category][0])[: engine.manifest.max_context - max_new_tokens]
            engine.generate_ids(ids, GenerationConfig(max_new_tokens=max_new_tokens, temperature=0.0, **UNWARPED,
                                                      speculative=mode == "speculative",
                                                      draft_source="hybrid"))
    return {"after_load_mb": round(loaded, 1), "peak_mb": round(_peak_mb(), 1)}


def compare(bundle, max_new_tokens: int = 64) -> dict:
    out = {}
    for mode in ("plain", "speculative"):
        proc = subprocess.run([sys.executable, "-m", "specdeploy.bench.memory", str(bundle), mode,
                               str(max_new_tokens)], capture_output=True, text=True)
        if proc.returncode:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise SpecDeployError(f"the {mode} memory measurement failed ({last}); rerun it with "
                             f"'python -m specdeploy.bench.memory {bundle} {mode}' to see why")
        out[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    plain, spec = out["plain"]["peak_mb"], out["speculative"]["peak_mb"]
    out["speculative_overhead"] = round(spec / plain - 1.0, 4)
    out["note"] = "each mode in a fresh process; peak resident set size (ru_maxrss)"
    return out


if __name__ == "__main__":
    print(json.dumps(measure_here(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 64)))
