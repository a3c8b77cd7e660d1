"""The last step of every command that writes a bundle's graphs: prove them, then seal the manifest.

Export and quantize both end here, so a bundle is never installed without its row check (greedy
speculative == plain by construction), its measured exit agreement, and every file's size and hash.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..bundle import manifest as manifest_io
from ..bundle.manifest import Manifest
from . import exit_agreement, row_check


def seal(bundle: Path, manifest: Manifest, echo: Callable[[str], None]) -> Manifest:
    """Row-check the graphs in `bundle`, measure the exit's agreement, write the sealed manifest."""
    manifest = manifest.replace(row_check=None)
    manifest = manifest.replace(row_check=row_check.require(bundle, manifest, echo))
    manifest = manifest.replace(exit_agreement=exit_agreement.measure_bundle(bundle, manifest))
    echo(exit_agreement.describe(manifest))
    return manifest_io.write(bundle, manifest)
