"""Activation outlier channels of an fp32 bundle's weight matmuls, as int8 quantization finds them.

Usage: python lab/scripts/outlier_channels.py BUNDLE [--top 10]
Runs the fp32 graphs on the calibration text (as `quantize` does) and prints, per matmul input,
its width, the largest |x| of its largest channel against the median channel's, and how many
channels `quantize --float-outliers` computes in float; the inputs with the largest ratios first.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def main() -> None:
    from specdeploy.bundle import manifest as manifest_io
    from specdeploy.quantization import feeds, outliers

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args()
    manifest = manifest_io.read(args.bundle)
    samples = feeds.calibration_feeds(args.bundle, manifest, feeds.calibration_texts(None))
    rows = []
    for name, graph in manifest.graphs.items():
        maxima = outliers.channel_maxima(args.bundle / graph.file, samples[name])
        chosen = outliers.outlier_channels(maxima)
        for activation, top in maxima.items():
            ratio = float(top.max() / max(np.median(top), 1e-30))
            rows.append((ratio, name, activation, top.size, len(chosen.get(activation, ()))))
    rows.sort(reverse=True)
    print(f"{len(rows)} matmul inputs, {sum(r[4] > 0 for r in rows)} with channels in float, "
          f"{sum(r[4] for r in rows)} channels")
    for ratio, name, activation, k, count in rows[: args.top]:
        print(f"{name:8s} {activation:32s} K={k:5d} largest / median channel {ratio:8.1f}x  in float: {count}")


if __name__ == "__main__":
    from sides import run_script

    run_script(main)
