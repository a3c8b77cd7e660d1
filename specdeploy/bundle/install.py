"""Putting a finished bundle in place without ever leaving a half-written or missing one.

Exporting and quantizing build into a staging directory beside the output; only a whole bundle
replaces an existing one, and an interrupted or failed run leaves the old bundle as it was.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from ..errors import ConfigError
from .manifest import MANIFEST_FILE


def check_output(output: Path) -> Path:
    """The resolved output path, or a one-line error when it cannot become a bundle directory."""
    output = Path(output).resolve()
    if output.exists() and not output.is_dir():
        raise ConfigError(f"--output {output} is a file; choose a directory path for the bundle")
    if output.exists() and any(output.iterdir()) and not (output / MANIFEST_FILE).is_file():
        raise ConfigError(f"{output} exists and is not a bundle; choose another --output")
    parent = output.parent
    for ancestor in (parent, *parent.parents):
        if ancestor.exists():
            if not ancestor.is_dir():
                raise ConfigError(f"cannot create {output}: {ancestor} is a file; choose another --output")
            if not os.access(ancestor, os.W_OK | os.X_OK):
                raise ConfigError(f"cannot write to {ancestor} (permission denied); choose another --output")
            break
    return output


@contextlib.contextmanager
def staging_dir(output: Path, prefix: str) -> Iterator[Path]:
    """An empty directory on the output's file system, removed afterwards whatever happens."""
    output = check_output(output)
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=output.parent, prefix=prefix)
    except OSError as exc:
        raise ConfigError(f"cannot write to {output.parent} ({exc.strerror}); choose another --output") from None
    try:
        staging = Path(tmp) / "bundle"
        staging.mkdir()
        yield staging
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def install(staging: Path, output: Path) -> None:
    """Move a finished bundle into place, replacing an older bundle only once the new one is whole."""
    output = check_output(output)
    old = output.with_name(output.name + ".old")
    if output.exists():
        shutil.rmtree(old, ignore_errors=True)
        output.rename(old)
    try:
        shutil.move(str(staging), str(output))
    except BaseException:
        if old.exists() and not output.exists():
            old.rename(output)  # put the previous bundle back
        raise
    shutil.rmtree(old, ignore_errors=True)
