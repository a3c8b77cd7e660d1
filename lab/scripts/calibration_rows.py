"""How many calibration tokens (GPTQ's rows of H) each bundle's tokenizer makes of the built-in text.

    python lab/scripts/calibration_rows.py BUNDLE [BUNDLE ...]

GPTQ's passes and Gram matrices scale with these rows: a byte-level tokenizer (the random
checkpoints' default) makes several times what a real model's BPE makes of the same text.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from specdeploy.bundle import manifest as manifest_io
from specdeploy.quantization import feeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundles", nargs="+", type=Path)
    args = parser.parse_args()
    texts = feeds.calibration_texts(None, every=True)
    print(f"built-in calibration text: {len(texts)} replies, {sum(map(len, texts)):,} characters")
    for bundle in args.bundles:
        windows = feeds.calibration_windows(bundle, manifest_io.read(bundle), texts)
        print(f"{bundle}: {sum(map(len, windows)):,} rows ({len(windows)} windows of 32 tokens)")


if __name__ == "__main__":
    main()
