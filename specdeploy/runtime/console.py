"""Streaming one completion to a terminal: text on one stream, statistics on the other.

Text goes to `write_text` (stdout in the CLI) and the summary line to `write_stats` (stderr), so
`specdeploy generate ... > out.txt` captures the text alone, as llama.cpp and most CLIs do.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..config import GenerationConfig
from ..constants import DEFAULT_BACKEND
from .engine import Engine
from .stats import GenerationStats


def generate_to(bundle: Path, prompt: str, config: GenerationConfig, write_text: Callable[[str], None],
                write_stats: Callable[[str], None], chat: bool = True, provider: str | None = None,
                backend: str = DEFAULT_BACKEND) -> GenerationStats:
    """Stream the completion through `write_text`, then one summary line through `write_stats`."""
    stats = GenerationStats()
    with Engine(bundle, backend=backend, provider=provider) as engine:
        use_chat = chat and engine.tokenizer.chat_template is not None
        request = [{"role": "user", "content": prompt}] if use_chat else prompt
        settings = engine.settings(config)
        for piece in engine.stream(request, config, stats):
            write_text(piece.text)
    write_text("\n")
    mode = f"speculative ({settings.draft_source})" if settings.speculative else "plain"
    write_stats(f"[{mode}] {stats.summary()}\n")
    return stats
