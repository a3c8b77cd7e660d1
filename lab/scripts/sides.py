"""One side of a lab/scripts/*_ab.py comparison: one prompt per bench category, decoded plain and
speculative, tokens/s of each.

A side runs in a process of its own: huge pages, arenas and the heap belong to a process, and two
engines of one process are not equal (the later-loaded one's memory walked cheaper on 4 KB pages).
"""
from __future__ import annotations

import json
import subprocess
import sys
import time

from specdeploy.bench.encoding import encode
from specdeploy.config import GenerationConfig
from specdeploy.prompts import BENCH_PROMPTS


def category_prompts(engine, max_tokens: int) -> list[list[int]]:
    """The first prompt of every bench category, cut to leave room for `max_tokens`."""
    room = engine.manifest.max_context - max_tokens
    return [encode(engine, prompts[0])[:room] for prompts in BENCH_PROMPTS.values()]


def long_prompt(engine, tokens: int) -> list[int]:
    """A prompt of exactly `tokens` ids: every bench prompt's text, repeated until it is long enough."""
    text = " ".join(p for prompts in BENCH_PROMPTS.values() for p in prompts)
    return encode(engine, text * (1 + tokens // max(1, len(encode(engine, text)))))[:tokens]


def alternate(script: str, sides, repeats: int, args: list[str]) -> dict[str, list[dict]]:
    """Run `script --side SIDE *args` in a process of its own per side and repeat, the order rotating
    every repeat (no side always first, or always after the same one); each run's last stdout line
    is its JSON. Returns each side's runs in order."""
    sides, runs = list(sides), {side: [] for side in sides}
    for repeat in range(repeats):
        shift = repeat % len(sides)
        for side in sides[shift:] + sides[:shift]:
            out = subprocess.run([sys.executable, script, "--side", side, *args],
                                 capture_output=True, text=True, check=True)
            runs[side].append(json.loads(out.stdout.splitlines()[-1]))
    return runs


def mode_rates(engine, prompts: list[list[int]], max_tokens: int) -> dict[str, float]:
    """Tokens/s of plain and of speculative (the bundle's default) decoding, EOS ignored; each
    mode's first prompt is decoded once untimed first."""
    rates = {}
    for mode, speculative in (("plain", False), ("speculative", None)):
        config = GenerationConfig(max_new_tokens=max_tokens, speculative=speculative, ignore_eos=True)
        engine.generate_ids(prompts[0], config)  # warm
        began, tokens = time.perf_counter(), 0
        for ids in prompts:
            tokens += len(engine.generate_ids(ids, config))
        rates[mode] = tokens / (time.perf_counter() - began)
    return rates


def run_script(main) -> None:
    """Run a script's main(): a user error ends it with its one-line message and exit status 1."""
    from specdeploy.errors import SpecDeployError

    try:
        main()
    except SpecDeployError as exc:
        raise SystemExit(f"error: {exc}") from None


def use_arena(arena: str) -> None:
    """Make this process's sessions use `arena`: "shared" (the runtime's own: one CPU arena for every
    session), "session" (an arena each) or "none" (malloc), to measure the runtime's choice against."""
    from specdeploy.backends import onnxruntime as backend

    if arena == "shared":
        return
    original = backend.session_options

    def options(*args, **kwargs):
        so = original(*args, **kwargs)
        so.add_session_config_entry("session.use_env_allocators", "0")
        so.enable_cpu_mem_arena = arena != "none"
        return so

    backend.session_options = options
