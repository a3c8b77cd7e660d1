"""What a bundle's graphs hold of specdeploy's own operators (kernels/): whether and how many, the
domain declared, and the weights they read in place, for the manifest."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..bundle.manifest import InPlaceWeight
from ..kernels import DOMAIN, Q4_0, Q4_K, Q5, Q6_K


def decided(compute, tensorrt: bool, echo):
    """`compute` (ComputeOptions) with int4_kernel "auto" decided: specdeploy's operators where
    their library is built or can be built here, else ONNX Runtime's MatMulNBits (said in one line);
    MatMulNBits for a TensorRT bundle, which cannot build ours, and for blocks of 16 asked for."""
    import dataclasses

    from .. import kernels

    if compute.int4_kernel != "auto":
        return compute
    quiet = tensorrt or compute.int4_block not in (None, 32)
    why = "asked for MatMulNBits' form" if quiet else kernels.unavailable()
    if why and not quiet:
        echo(f"int4 kernel: ONNX Runtime's MatMulNBits, since specdeploy's cannot be built here ({why}); "
             f"`specdeploy build-kernels` builds them")
    return dataclasses.replace(compute, int4_kernel="matmulnbits" if why else "specdeploy")


def uses(model) -> bool:
    """Whether an ONNX model holds any of specdeploy's operators."""
    return any(n.domain == DOMAIN for n in model.graph.node)


def count(graph: Path) -> int:
    """How many of specdeploy's operators the ONNX file `graph` holds."""
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    return sum(n.domain == DOMAIN for n in model.graph.node)


def use_domain(model) -> None:
    """Declare the operators' domain, once."""
    from onnx import helper

    if not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))


def fuse_biases(model) -> int:
    """An operator whose product is read only by an Add of a constant float bias [N] (Qwen2's q / k /
    v biases) takes that bias as its optional fourth input, as MatMulNBits takes its own: the same
    sums, one kernel fewer a layer. Returns how many Adds went."""
    from ..optimize.fusion import _Graph, bias_add
    from ..optimize.graph import set_nodes

    g, inits = _Graph(model), {t.name: t for t in model.graph.initializer}
    outputs = {o.name for o in model.graph.output}
    gone = set()
    for node in [n for n in model.graph.node if n.domain == DOMAIN and len(n.input) == 3]:
        found = bias_add(g, inits, node.output[0]) if node.output[0] not in outputs else None
        n = next((a.i for a in node.attribute if a.name == "N"), None)
        if found is None or found[1].shape != (n,):
            continue
        add, _ = found
        node.input.append(next(i for i in add.input if i != node.output[0]))
        node.output[0] = add.output[0]
        gone.add(id(add))
    set_nodes(model, [n for n in model.graph.node if id(n) not in gone])
    return len(gone)


def names(bundle: Path, graphs: dict) -> tuple[str, ...]:
    """The manifest's `operators`: the library's operators and layouts the graphs need, or none
    (Q4_0MatMul and Q8MatMul are "q4_0.v2", Q4_KMatMul and Q4_1MatMul "q4_k.v1", Q5_KMatMul and Q5_1MatMul
    "q5.v1", Q6_KMatMul "q6_k.v1")."""
    import onnx

    from . import q4_1, q4_k, q5, q6_k

    ops = {n.op_type for g in graphs.values()
           for n in onnx.load(str(bundle / g.file), load_external_data=False).graph.node if n.domain == DOMAIN}
    minima, five = {q4_k.OP, q4_1.OP}, set(q5.OPS)
    layouts = ((Q4_0, bool(ops - minima - five - {q6_k.OP})), (Q4_K, bool(ops & minima)), (Q5, bool(ops & five)),
               (Q6_K, q6_k.OP in ops))
    return tuple(name for name, used in layouts if used)


def in_place_table(bundle: Path, graphs: dict) -> dict[str, tuple[InPlaceWeight, ...]]:
    """graph -> the InPlaceWeight (name, offset, length, dtype, shape) of each initializer holding bytes that one of
    specdeploy's operators reads (in any graph: the draft graph's tied embedding shares the LM head's),
    in the shared weights file: what the runtime reads once into huge-page memory and hands ONNX
    Runtime (backends/onnxruntime.in_place_weights)."""
    import onnx
    from onnx import helper

    models = {name: onnx.load(str(bundle / g.file), load_external_data=False) for name, g in graphs.items()}
    places = {name: {t.name: {e.key: e.value for e in t.external_data} for t in m.graph.initializer}
              for name, m in models.items()}
    read = {(int(places[name][i]["offset"]), int(places[name][i]["length"]))
            for name, m in models.items() for n in m.graph.node if n.domain == DOMAIN
            for i in n.input[1:] if "offset" in places[name].get(i, {})}
    table = {}
    for name, model in models.items():
        rows = []
        for tensor in model.graph.initializer:
            place = places[name][tensor.name]
            if "offset" in place and (int(place["offset"]), int(place["length"])) in read:
                dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).name
                rows.append(InPlaceWeight(tensor.name, int(place["offset"]), int(place["length"]), dtype,
                                          tuple(tensor.dims)))
        if rows:
            table[name] = tuple(rows)
    return table
