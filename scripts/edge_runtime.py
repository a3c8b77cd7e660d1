"""The runtime at edge size: load time, resident memory against the bundle's weight bytes, plain and
default decoding interleaved, and a long prompt's peak with chunked prefill, in one process.

    python scripts/edge_runtime.py BUNDLE [--prompt-tokens 2000] [--new-tokens 64] [--repeats 2]

Resident memory is the process's (VmRSS / VmHWM, the peak reset after each phase where Linux allows
it, so each phase's peak is its own), the weight bytes the bundle's shared weights file. The long
prompt is the bench's prose repeated to the length asked (token ids, so the figure does not depend
on the tokenizer), run last.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def _status(key: str) -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith(key + ":"))


def _reset_peak() -> None:
    """VmHWM starts again from the current VmRSS (Linux >= 4.0); elsewhere the peak stays cumulative."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _resident() -> str:
    return f"anonymous {_status('RssAnon'):,.0f} MB, file-backed {_status('RssFile'):,.0f} MB"


def _decode(engine, ids: list[int], config, repeats: int) -> float:
    """Tokens per second over `repeats` generations of `ids`."""
    tokens = seconds = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        out = engine.generate_ids(ids, config)
        seconds += time.perf_counter() - start
        tokens += len(out)
    return tokens / seconds


def main() -> int:
    from specdeploy import Engine, GenerationConfig
    from specdeploy.bench.encoding import encode
    from specdeploy.prompts import BENCH_PROMPTS, PASSAGES

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    manifest = json.loads((args.bundle / "manifest.json").read_text())
    weights = (args.bundle / manifest["weights"]).stat().st_size / 2**20
    start = time.perf_counter()
    with Engine(args.bundle) as engine:
        load_s, loaded = time.perf_counter() - start, _status("VmRSS")
        print(f"load: {load_s:.1f} s, resident {loaded:,.0f} MB = {loaded / weights:.2f}x the weights "
              f"({weights:,.0f} MB; {_resident()}), peak while loading {_status('VmHWM'):,.0f} MB")
        _reset_peak()
        ids = encode(engine, BENCH_PROMPTS["chat"][0])
        modes = {"plain": GenerationConfig(max_new_tokens=args.new_tokens, speculative=False, ignore_eos=True),
                 "default": GenerationConfig(max_new_tokens=args.new_tokens, ignore_eos=True)}
        speed = {name: 0.0 for name in modes}
        for _ in range(args.repeats):  # interleaved, so both modes see the same machine
            for name, config in modes.items():
                speed[name] += _decode(engine, ids, config, 1) / args.repeats
        decoding = _status("VmHWM")
        print(f"decoding: plain {speed['plain']:.1f} tok/s, default {speed['default']:.1f} tok/s "
              f"({speed['default'] / speed['plain']:.2f}x); peak resident {decoding:,.0f} MB = "
              f"{decoding / weights:.2f}x the weights ({_resident()} after)")
        _reset_peak()
        prose = [t for text in PASSAGES for t in encode(engine, text)]
        length = min(args.prompt_tokens, engine.manifest.max_context - 8)
        long_ids = (prose * (length // len(prose) + 1))[:length]
        start = time.perf_counter()
        engine.generate_ids(long_ids, GenerationConfig(max_new_tokens=1, speculative=False))
        print(f"a {length}-token prompt: prefill {time.perf_counter() - start:.1f} s, peak resident "
              f"{_status('VmHWM'):,.0f} MB = {_status('VmHWM') / weights:.2f}x the weights")
    return 0


if __name__ == "__main__":
    sys.exit(main())
