"""The precision a model source already has: a quantized GGUF keeps its own, unless asked otherwise.

A user who hands over a Q4 file has chosen 4-bit weights; exporting it at fp32 would write a bundle
five times the file's size that decodes at fp32 speed. Its blocks carry into integer compute
losslessly (quantization/gguf_blocks.py), so the file's own precision is also its most faithful form.
A Hugging Face directory holds float weights: it exports at fp32 unless `--precision` asks otherwise.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

# GGUF tensor types by the compute precision that holds them (gguf_blocks.CARRIES says which carry exactly)
FOUR_BIT = {"Q4_0", "Q4_1", "Q4_K", "Q3_K", "Q2_K", "IQ4_NL", "IQ4_XS", "IQ3_S", "IQ3_XXS", "IQ2_XXS",
            "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0"}
EIGHT_BIT = {"Q8_0", "Q8_1", "Q8_K", "Q6_K", "Q5_0", "Q5_1", "Q5_K"}


def layer_weight_types(path: Path) -> Counter:
    """Parameters per GGUF tensor type over the file's 2-D layer weights (the bulk of a model)."""
    from gguf import GGUFReader

    counts: Counter = Counter()
    for tensor in GGUFReader(path).tensors:
        if tensor.name.startswith("blk.") and len(tensor.shape) == 2:
            counts[tensor.tensor_type.name] += int(tensor.n_elements)
    return counts


def of_gguf(counts: Counter) -> str:
    """int4 where most layer parameters are 4-bit or narrower, int8 where they are 5- to 8-bit, else fp32."""
    total = sum(counts.values()) or 1
    four = sum(n for t, n in counts.items() if t in FOUR_BIT)
    eight = sum(n for t, n in counts.items() if t in EIGHT_BIT)
    if four / total >= 0.5:
        return "int4"
    if (four + eight) / total >= 0.5:
        return "int8"
    return "fp32"


def describe(counts: Counter, precision: str) -> str:
    """One line for the export log: what the file holds, what was kept, and how to choose another."""
    total = sum(counts.values()) or 1
    held = ", ".join(f"{t} {n / total:.0%}" for t, n in counts.most_common(3))
    others = "|".join(p for p in ("fp32", "int8", "int4") if p != precision)
    kept = "" if precision == "fp32" else ", its blocks carried"
    return f"precision {precision}: the file's own (layer weights {held}){kept}; --precision {others} chooses another"


def choose(source: Path) -> tuple[str, str]:
    """(precision, log line) for a source exported without --precision."""
    if Path(source).suffix != ".gguf":
        return "fp32", ("precision fp32: a Hugging Face directory's float weights as they are; --precision int4 "
                        "(or int8) makes a smaller, faster bundle with a quality report")
    counts = layer_weight_types(Path(source))
    precision = of_gguf(counts)
    return precision, describe(counts, precision)
