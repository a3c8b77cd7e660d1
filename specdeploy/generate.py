"""`specdeploy generate`: stream one completion to a text sink and report its statistics."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from .config import GenerationConfig
from .runtime.engine import Engine
from .runtime.stats import GenerationStats


def generate_to(bundle: Path, prompt: str, config: GenerationConfig, write: Callable[[str], None],
                chat: bool = True, provider: str = "cpu", backend: str = "onnxruntime") -> GenerationStats:
    """Stream the completion through `write`, then one summary line; returns the statistics."""
    stats = GenerationStats()
    with Engine(bundle, backend=backend, provider=provider) as engine:
        use_chat = chat and engine.tokenizer.chat_template is not None
        request = [{"role": "user", "content": prompt}] if use_chat else prompt
        for piece in engine.stream(request, config, stats):
            write(piece.text)
    speculative = engine.manifest.default_speculative if config.speculative is None else config.speculative
    mode = f"speculative ({config.draft_source or engine.manifest.draft_source})" if speculative else "plain"
    write(f"\n[{mode}] {stats.summary()}\n")
    return stats
