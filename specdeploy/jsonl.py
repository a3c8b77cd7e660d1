"""Reading users' JSONL files with errors that name the file and line."""
from __future__ import annotations

import json
from pathlib import Path

from .errors import ConfigError


def read_objects(path: Path, example: str) -> list[tuple[int, object]]:
    """(line number, parsed value) for each non-blank line; a clear error for bad or empty files."""
    items = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            items.append((number, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{number} is not valid JSON ({exc.msg}); one object per line") from None
    if not items:
        raise ConfigError(f"{path} holds no prompts; add lines like {example}")
    return items
