"""Each file of a bundle with its size and SHA-256, so a bundle copied onto a device proves it is whole.

Bundles travel by scp, containers and SD cards. The manifest records every file it names; loading
checks their sizes (a stat each: a truncated copy is caught before any graph is parsed), and
`inspect --verify`, quantize and build-engines also check their hashes (one read of every
byte: a flipped bit in the weights is caught before it is served, or sealed into a derived bundle).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from ..errors import BundleError

_CHUNK = 1 << 20


@dataclass(frozen=True)
class FileRecord:
    """One bundle file as it was written."""

    bytes: int
    sha256: str


def named(manifest) -> list[str]:
    """The files `manifest` binds, in a fixed order (the manifest itself excepted)."""
    names = [manifest.weights, manifest.tokenizer, manifest.chat_template, manifest.draft_vocab, manifest.feature_vocab]
    for graph in manifest.graphs.values():
        names += [graph.file, graph.tensorrt_file]
    engines = (manifest.tensorrt or {}).get("engines", {})
    names += [e.get("file") for e in engines.values() if isinstance(e, dict)]
    return list(dict.fromkeys(n for n in names if n))


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def record(bundle: Path, manifest) -> dict:
    """{file: FileRecord} for every file `manifest` binds, as they are now on disk."""
    out = {}
    for name in named(manifest):
        path = Path(bundle) / name
        if not path.is_file():
            raise BundleError(f"cannot seal {bundle}: {name} is missing")
        out[name] = FileRecord(bytes=path.stat().st_size, sha256=sha256(path))
    return out


def _damaged(bundle: Path, what: str) -> BundleError:
    return BundleError(f"bundle {bundle} is damaged: {what}; copy it again or re-export it")


def check_sizes(bundle: Path, manifest) -> None:
    """Every bound file present, at the size recorded: cheap enough for every load."""
    recorded = manifest.files
    for name in named(manifest):
        path = Path(bundle) / name
        if not path.is_file():
            raise BundleError(f"bundle {bundle} is incomplete: {name} is missing; copy it again or re-export it")
        if name not in recorded:
            raise _damaged(bundle, f"{name} has no size or hash in manifest.json")
        size, expected = path.stat().st_size, recorded[name].bytes
        if size != expected:
            raise _damaged(bundle, f"{name} is {size:,} bytes, manifest.json records {expected:,}")


def verify(bundle: Path, manifest) -> int:
    """Sizes, then every file's SHA-256 against the record; returns the bytes read."""
    check_sizes(bundle, manifest)
    total = 0
    for name in named(manifest):
        path = Path(bundle) / name
        if sha256(path) != manifest.files[name].sha256:
            raise _damaged(bundle, f"{name}'s content does not match its SHA-256 in manifest.json")
        total += path.stat().st_size
    return total
