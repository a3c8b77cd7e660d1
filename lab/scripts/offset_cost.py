"""What an exact int4 bundle's offset term costs a plain step, and what folding it recovers, one run.

Usage: python lab/scripts/offset_cost.py BUNDLE [--repeats 3] [--max-tokens 64]
BUNDLE carries exact float offsets beside its MatMulNBits (`quantize --exact-offsets` of a GGUF's
Q4_1 / Q4_K blocks, or of --method minmax / gptq: nbits.offset_nodes). Three probe copies are
written to a temporary directory: "folded" is the bundle's graphs with each term folded into its
MatMulNBits, as `quantize` makes them by default (folding.py); "thin tables" keeps every op of the
term but cuts each offsets table [K/32, N] to its first column (the bytes gone, the ops kept); "no
term" removes the term (neither). The last two compute other logits than the bundle: they price
the term and are never bundles to ship. Each prompt (one per bench category, chat template or,
for a model without one, the plain text; EOS ignored; cut to fit the context) decodes plain on the
four engines, alternating the order; the last lines split the term's share of a step into the
two parts and say how much folding saves.
"""
from __future__ import annotations

import argparse
import dataclasses
import shutil
import tempfile
import time
from pathlib import Path

TABLE = ".offsets"  # nbits.offset_nodes names each table after the matmul output it corrects


def _offset_matmuls(model) -> list:
    tables = {t.name for t in model.graph.initializer if t.name.endswith(TABLE)}
    return [n for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in tables]


def thin_tables(model) -> int:
    """Each offsets table [K/32, N] as its first column [K/32, 1] (the Add broadcasts it)."""
    from onnx import numpy_helper

    tables = {n.input[1] for n in _offset_matmuls(model)}
    for tensor in model.graph.initializer:
        if tensor.name in tables:
            tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor)[:, :1].copy(), tensor.name))
    return len(tables)


def drop_terms(model) -> int:
    """The offset term removed: each Add's consumers read the MatMulNBits product instead."""
    terms = {n.output[0] for n in _offset_matmuls(model)}
    adds = [n for n in model.graph.node if n.op_type == "Add" and n.input[1] in terms]
    outputs = {o.name for o in model.graph.output}  # a graph output keeps its name and its Add
    rename = {n.output[0]: n.input[0] for n in adds if n.output[0] not in outputs}
    for node in model.graph.node:
        node.input[:] = [rename.get(name, name) for name in node.input]
    _prune(model, keep=outputs)
    return len(rename)


def fold_terms(model) -> int:
    """Each offset term folded into its MatMulNBits (folding.folded_nodes, the quantizer's default),
    reading the block sums the term already computes; terms behind outlier rows are left as they are."""
    from onnx import numpy_helper

    from specdeploy.quantization import folding, nbits
    from specdeploy.optimize.graph import attrs, set_nodes

    array = {t.name: t for t in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    adds = {n.input[1]: n for n in model.graph.node if n.op_type == "Add"}
    placed, gone, shared = {}, set(), {"sums": {}, "joined": {}}
    for term in _offset_matmuls(model):
        add = adds[term.output[0]]
        product = producers[add.input[0]]
        if product.op_type != "MatMulNBits" or len(product.input) != 3:
            continue
        a, (x, b, scales) = attrs(product), product.input
        blocks = nbits.unpack(numpy_helper.to_array(array[b]), numpy_helper.to_array(array[scales]), a["bits"],
                              a["block_size"])
        blocks = dataclasses.replace(blocks, offsets=numpy_helper.to_array(array[term.input[1]]).T.copy())
        shared["sums"][x] = term.input[0]
        placed[add.output[0]] = folding.folded_nodes(model, x, add.output[0], f"{b}.folded", blocks,
                                                     a["accuracy_level"], f"{product.name}.folded", shared)
        gone |= {product.output[0], term.output[0]}
    nodes = []
    for node in model.graph.node:
        nodes += placed.get(node.output[0], [] if node.output[0] in gone else [node])
    set_nodes(model, nodes)
    return len(placed)


def _prune(model, keep: set) -> None:
    """Drop nodes none of whose outputs is read, until none is left (the block sums go too)."""
    while True:
        read = keep | {name for n in model.graph.node for name in n.input}
        live = [n for n in model.graph.node if any(o in read for o in n.output)]
        if len(live) == len(model.graph.node):
            return
        del model.graph.node[:]
        model.graph.node.extend(live)


def probe_copy(bundle: Path, out: Path, rewrite) -> int:
    """A copy of `bundle` in `out` with `rewrite` applied to every graph; returns terms rewritten."""
    import onnx

    from specdeploy.bundle import manifest as manifest_io, weights

    manifest = manifest_io.read(bundle)
    shutil.copytree(bundle, out, ignore=shutil.ignore_patterns("*.onnx", manifest.weights))
    staged, count = {}, 0
    for name, graph in manifest.graphs.items():
        model = onnx.load(str(bundle / graph.file))
        count += rewrite(model)
        staged[name] = out / f"{name}.staged.onnx"
        onnx.save(model, str(staged[name]), save_as_external_data=True, location=f"{name}.staged.data")
    weights.share(staged, out, manifest.weights)
    for path in [*out.glob("*.staged.onnx"), *out.glob("*.staged.data")]:
        path.unlink()
    manifest_io.write(out, manifest)  # sealed again: its files' sizes and hashes are the copy's
    return count


def _seconds_per_token(engines: dict, repeats: int, max_tokens: int) -> dict:
    """Plain decoding on every engine, prompt by prompt, the order alternating each repeat."""
    from specdeploy.config import GenerationConfig
    from specdeploy.prompts import BENCH_PROMPTS

    config = GenerationConfig(max_new_tokens=max_tokens, speculative=False, ignore_eos=True)
    totals = {label: [0, 0.0] for label in engines}
    for repeat in range(repeats):
        for prompts in BENCH_PROMPTS.values():
            for label, engine in list(engines.items())[:: 1 if repeat % 2 == 0 else -1]:
                chat = [{"role": "user", "content": prompts[0]}]  # a model without a template: the text
                ids = engine.encode_prompt(chat if engine.manifest.chat_template else prompts[0])
                began = time.perf_counter()
                tokens = engine.generate_ids(ids[: engine.manifest.max_context - max_tokens], config)
                totals[label][0] += len(tokens)
                totals[label][1] += time.perf_counter() - began
    return {label: seconds / tokens for label, (tokens, seconds) in totals.items()}


def main() -> None:
    from specdeploy.errors import ConfigError
    from specdeploy.runtime.engine import Engine

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    engines = {"bundle": Engine(args.bundle)}
    with tempfile.TemporaryDirectory() as tmp:
        for label, rewrite in (("folded", fold_terms), ("thin tables", thin_tables), ("no term", drop_terms)):
            path = Path(tmp) / label.replace(" ", "-")
            if probe_copy(args.bundle, path, rewrite) == 0:
                raise ConfigError(f"{args.bundle} has no exact offset term to price; give an int4 bundle made "
                                  f"with 'quantize --exact-offsets' from a GGUF's Q4_1 / Q4_K blocks or with "
                                  f"--method minmax or gptq")
            engines[label] = Engine(path)
        step = _seconds_per_token(engines, args.repeats, args.max_tokens)
    for label, seconds in step.items():
        print(f"{label:12s} {1 / seconds:7.1f} tok/s  ({step['bundle'] / seconds:.3f}x the bundle)")
    base, term = step["bundle"], step["bundle"] - step["no term"]
    print(f"offset term: {100 * term / base:.1f}% of a plain step "
          f"(tables' bytes {100 * (base - step['thin tables']) / base:.1f}%, "
          f"its ops {100 * (step['thin tables'] - step['no term']) / base:.1f}%)")
    print(f"folded: {100 * (step['folded'] - step['no term']) / base:.1f}% of a plain step "
          f"({100 * (base - step['folded']) / term:.0f}% of the term's time saved)")


if __name__ == "__main__":
    from sides import run_script

    run_script(main)
