"""Top-1 agreement and perplexity of bundles against their fp32 reference, over more or less text.

Usage: python lab/scripts/quality_compare.py REFERENCE BUNDLE [BUNDLE ...] [--passages 4 8]
The quality report (`quantize`) measures the first 4 held-out passages; the same measure over more
of them shows how much of a difference between two bundles is the sample.
"""
from __future__ import annotations

import argparse
from pathlib import Path


def main() -> None:
    from specdeploy.prompts import PASSAGES
    from specdeploy.quantization.quality import compare_text

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reference")
    parser.add_argument("bundles", nargs="+")
    parser.add_argument("--passages", type=int, nargs="+", default=[4, len(PASSAGES)])
    args = parser.parse_args()
    for bundle in args.bundles:
        cells = []
        for n in args.passages:
            q = compare_text(Path(args.reference), Path(bundle), PASSAGES[:n])
            cells.append(f"{n} passages: top-1 {q['top1_agreement']:.1%}, perplexity {q['perplexity']:.2f} "
                         f"(reference {q['perplexity_fp32']:.2f})")
        print(f"{bundle}: " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    from sides import run_script

    run_script(main)
