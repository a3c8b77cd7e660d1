"""Where a bundle's resident memory goes: RSS (anonymous / file-backed) after each loading step.

Usage: python lab/scripts/memory_breakdown.py BUNDLE [--arena shared|session|none] [--keep]
Prints MB after the imports, the tokenizer, each ONNX Runtime session and its KV buffers, the
weight-file pages handed back (as the runtime does once its sessions are built), and the memory
bench's two prompts (64 tokens, speculative). The steps are the runtime's own (load_stages); --arena
picks ONNX Runtime's CPU memory (default: one arena the sessions share, as the runtime does),
--keep skips the heap trim and the page-out, to measure what each saves.
Linux only (reads /proc/self/status).
"""
from __future__ import annotations

import argparse
from pathlib import Path


def rss() -> str:
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return "  ".join(f"{key} {int(fields[key].split()[0]) / 1024:7.1f}" for key in
                     ("VmRSS", "RssAnon", "RssFile", "VmHWM"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--arena", choices=("shared", "session", "none"), default="shared")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    print(f"{'start':24s} {rss()}")
    import numpy  # noqa: F401
    import onnxruntime

    from sides import use_arena
    from specdeploy.backends import onnxruntime as backend
    from specdeploy.backends.residency import page_out, trim_heap

    use_arena(args.arena)
    from specdeploy.bundle import manifest as manifest_io
    from specdeploy.config import GenerationConfig
    from specdeploy.prompts import BENCH_PROMPTS
    from specdeploy.runtime.decoder import Decoder
    from specdeploy.runtime.split_model import SplitModel
    from specdeploy.runtime.tokenizer import Tokenizer

    print(f"{'imports':24s} {rss()}")
    m = manifest_io.read(args.bundle)
    template = (args.bundle / m.chat_template).read_text() if m.chat_template else None
    tokenizer = Tokenizer(args.bundle / m.tokenizer, template, m.model.bos_token_id)
    print(f"{'tokenizer':24s} {rss()}")
    stages = {}
    for name, graph in m.graphs.items():
        options = backend.session_options()  # as --arena asks (use_arena above)
        session = onnxruntime.InferenceSession(str(args.bundle / graph.file), options,
                                               providers=["CPUExecutionProvider"])
        if not args.keep:
            trim_heap()
        print(f"{'session ' + name:24s} {rss()}")
        stages[name] = backend.OrtStage(name, session, graph, backend.allocate_kv(m, graph.layers))
        print(f"{'  + KV buffers':24s} {rss()}")
    released = 0 if args.keep else page_out(args.bundle)
    print(f"{'weight-file pages out':24s} {rss()}  ({released / 2**20:.0f} MB of mappings advised)")
    decoder = Decoder(SplitModel(m, stages))
    for category in ("chat", "summarisation"):
        text = BENCH_PROMPTS[category][0]
        ids = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": text}])
                               if template else text)
        config = GenerationConfig(max_new_tokens=64, speculative=True, draft_source="hybrid")
        for _ in decoder.generate(ids, config):
            pass
        print(f"{'generated (' + category + ')':24s} {rss()}")


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:
        from specdeploy.errors import SpecDeployError  # imported late: "start" measures a bare interpreter

        if not isinstance(exc, SpecDeployError):
            raise
        raise SystemExit(f"error: {exc}") from None
