"""Which of a graph's operators have no kernel on a GPU target, read from the targets' real tables.

The tables are data beside this module (tables/*.json), each naming its source and version:
ONNX Runtime's CUDA kernel registry for the pinned onnxruntime-gpu (what its docs/OperatorKernels.md
is generated from) and TensorRT's ONNX parser operator list (onnx-tensorrt's docs/operators.md).
A graph is checked node by node: its domain, operator and the version its opset gives it, and
the element types on its inputs and outputs.

ONNX Runtime matches a kernel registered from version N onwards ("N+") only to a node of version
N exactly, and a closed range [a, b] to versions inside it (kernel_registry.cc, VerifyVersion);
every type constraint's type must be one a registration lists. A Constant node is folded into an
initializer when a session loads, and an operator ONNX defines by a function (CastLike) is expanded
into that function's operators where no kernel takes it: neither needs a kernel of its own. TensorRT's parser imports the
default domain only and lists one set of types an operator, the types of its data: the node's first
typed input is checked against it (a comparison's boolean output, a dequantization's float output
are what those operators make). Node versions come from the installed ONNX Runtime's schemas
(it knows every opset up to its own release: the project's is newer than the tables').
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

TABLES = Path(__file__).parent / "tables"
DEFAULT_DOMAIN = "ai.onnx"
TENSORRT_TYPES = {"tensor(float)": "FP32", "tensor(float16)": "FP16", "tensor(bfloat16)": "BF16",
                  "tensor(int8)": "INT8", "tensor(int4)": "INT4", "tensor(int32)": "INT32",
                  "tensor(int64)": "INT64", "tensor(uint8)": "UINT8", "tensor(bool)": "BOOL",
                  "tensor(float8e4m3fn)": "FP8", "tensor(double)": "DOUBLE"}


@dataclass(frozen=True)
class Node:
    """One node as a kernel table sees it."""

    graph: str
    domain: str
    op: str
    version: int
    types: tuple[tuple[str, str], ...]       # (constraint name, element type) of each typed argument
    fixed: tuple[str, ...] = ()               # element types of arguments whose schema fixes them
    expandable: bool = False                  # ONNX defines it by a function of other operators
    opset: int = 0                            # the graph's opset for the node's domain


@dataclass(frozen=True)
class Missing:
    node: Node
    reason: str

    def __str__(self) -> str:
        n = self.node
        return f"{n.graph}: {n.domain}::{n.op} (version {n.version}): {self.reason}"


@lru_cache(maxsize=None)
def table(name: str) -> dict:
    return json.loads((TABLES / name).read_text())


def _schemas() -> dict:
    """(domain, op) -> [(since_version, schema)] from ONNX Runtime's own registry (ONNX's and its contrib ops)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

    out: dict = {}
    for schema in ort_state.get_all_operator_schema():
        out.setdefault((schema.domain or DEFAULT_DOMAIN, schema.name), []).append((schema.since_version, schema))
    return out


def nodes(path: Path, graph_name: str) -> list[Node]:
    """Every node of the ONNX file at `path`, with its version and argument types."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    opsets = {(o.domain or DEFAULT_DOMAIN): o.version for o in model.opset_import}
    types = element_types(model)
    schemas = _schemas()
    out = []
    for node in model.graph.node:
        domain = node.domain or DEFAULT_DOMAIN
        versions = [(v, s) for v, s in schemas.get((domain, node.op_type), []) if v <= opsets.get(domain, 1)]
        if not versions:
            out.append(Node(graph_name, domain, node.op_type, opsets.get(domain, 1), (), opset=opsets.get(domain, 1)))
            continue
        version, schema = max(versions, key=lambda pair: pair[0])
        typed, fixed = _argument_types(node, schema, types)
        expandable = _defined_by_function(onnx, domain, node.op_type, version)
        out.append(Node(graph_name, domain, node.op_type, version, typed, fixed, expandable, opsets.get(domain, 1)))
    return out


def _defined_by_function(onnx, domain: str, op: str, version: int) -> bool:
    if domain != DEFAULT_DOMAIN:
        return False
    try:
        schema = onnx.defs.get_schema(op, version, "")
    except onnx.defs.SchemaError:
        return False
    return bool(schema.has_function or schema.has_context_dependent_function)


def _argument_types(node, schema, types: dict) -> tuple[tuple, tuple]:
    """(constraint, type) of each argument bound to a type constraint, and the types of fixed-type ones."""
    constraints = {c.type_param_str for c in schema.type_constraints}
    typed, fixed = [], []
    formals = [(f, n) for f, n in zip(schema.inputs, node.input)] + [(f, n) for f, n in zip(schema.outputs, node.output)]
    for formal, name in formals:
        if not name or name not in types:
            continue
        (typed if formal.typeStr in constraints else fixed).append(
            (formal.typeStr, types[name]) if formal.typeStr in constraints else types[name])
    return tuple(typed), tuple(fixed)


def element_types(model) -> dict[str, str]:
    """'tensor(float)'-style element type of every value the graph's types can be inferred for.

    ONNX's inference covers the default domain; an output of another domain's operator takes the
    type its schema's constraint has among that node's inputs (MatMulNBits: its activation's)."""
    import onnx

    names = ELEMENT_CODES
    schemas = _schemas()
    known: dict[str, str] = {}
    for _ in range(4):  # contrib outputs typed, ONNX inference again over what follows them
        inferred = onnx.shape_inference.infer_shapes(_with_types(model, known))
        g = inferred.graph
        for value in [*g.input, *g.output, *g.value_info]:
            if value.type.tensor_type.elem_type:
                known[value.name] = names.get(value.type.tensor_type.elem_type, "unknown")
        for init in g.initializer:
            known[init.name] = names.get(init.data_type, "unknown")
        for node in g.node:
            if node.op_type == "Constant":
                value = next((a.t for a in node.attribute if a.name == "value"), None)
                if value is not None:
                    known[node.output[0]] = names.get(value.data_type, "unknown")
        if not _fill_contrib_outputs(g, known, schemas):
            break
    return known


def _fill_contrib_outputs(graph, known: dict, schemas: dict) -> bool:
    """Type the outputs of nodes ONNX's inference does not know; True if any was new."""
    added = False
    for node in graph.node:
        entries = schemas.get((node.domain or DEFAULT_DOMAIN, node.op_type))
        if not entries or not node.domain:
            continue
        schema = max(entries, key=lambda pair: pair[0])[1]
        bound = {f.typeStr: known[n] for f, n in zip(schema.inputs, node.input) if n in known}
        for formal, name in zip(schema.outputs, node.output):
            if name and name not in known and formal.typeStr in bound:
                known[name] = bound[formal.typeStr]
                added = True
    return added


def _with_types(model, known: dict):
    """`model` with `known` types as value_info, so ONNX's inference can go past foreign operators."""
    import onnx

    if not known:
        return model
    model = onnx.ModelProto.FromString(model.SerializeToString())
    have = {v.name for v in [*model.graph.input, *model.graph.output, *model.graph.value_info]}
    codes = {name: code for code, name in ELEMENT_CODES.items()}
    for name, kind in known.items():
        if name not in have and kind in codes:
            model.graph.value_info.append(onnx.helper.make_tensor_value_info(name, codes[kind], None))
    return model


ELEMENT_CODES = {1: "tensor(float)", 2: "tensor(uint8)", 3: "tensor(int8)", 4: "tensor(uint16)", 5: "tensor(int16)",
                 6: "tensor(int32)", 7: "tensor(int64)", 8: "tensor(string)", 9: "tensor(bool)", 10: "tensor(float16)",
                 11: "tensor(double)", 12: "tensor(uint32)", 13: "tensor(uint64)", 16: "tensor(bfloat16)",
                 17: "tensor(float8e4m3fn)", 18: "tensor(float8e4m3fnuz)", 19: "tensor(float8e5m2)",
                 20: "tensor(float8e5m2fnuz)", 21: "tensor(uint4)", 22: "tensor(int4)", 23: "tensor(float4e2m1)"}


def _version_matches(since: list, version: int) -> bool:
    start, end = since
    return version == start if end is None else start <= version <= end


def _types_match(node: Node, row: dict) -> bool:
    """Every constraint's type one the row registers (together, where it lists exact combinations)."""
    combos = row.get("registrations") or [row["types"]]
    return any(all(kind in combo.get(name, [kind]) for name, kind in node.types) for combo in combos)


def missing_onnxruntime(found: list[Node], kernels: dict) -> list[Missing]:
    """Nodes with no kernel in an ONNX Runtime table (a provider's registry)."""
    rows: dict = {}
    for row in kernels["kernels"]:
        rows.setdefault((row["domain"], row["op"]), []).append(row)
    out = []
    limit = kernels.get("max_supported_opset", {}).get(DEFAULT_DOMAIN)
    for node in found:
        candidates = rows.get((node.domain, node.op), [])
        if node.op == "Constant" and node.domain == DEFAULT_DOMAIN:
            continue  # an initializer once the session loads
        if node.domain == DEFAULT_DOMAIN and limit and max(node.version, node.opset) > limit:
            out.append(Missing(node, f"ONNX Runtime {kernels['version']} supports the default domain to opset {limit}"))
        elif not candidates and not node.expandable:
            out.append(Missing(node, f"no {kernels['provider']} kernel in ONNX Runtime {kernels['version']}"))
        elif not candidates:
            continue  # expanded into its function's operators, which the graph's other nodes are checked with
        elif not any(_version_matches(r["since"], node.version) for r in candidates):
            ranges = ", ".join(f"{r['since'][0]}+" if r["since"][1] is None else f"{r['since'][0]}-{r['since'][1]}"
                               for r in candidates)
            out.append(Missing(node, f"kernels registered for versions {ranges} only"))
        elif not any(_version_matches(r["since"], node.version) and _types_match(node, r) for r in candidates):
            out.append(Missing(node, f"no kernel for types {dict(node.types)}"))
    return out


def missing_tensorrt(found: list[Node], operators: dict) -> list[Missing]:
    """Nodes TensorRT's ONNX parser cannot import (a table of its supported operators and types)."""
    listed = {o["op"]: o for o in operators["operators"]}
    out = []
    for node in found:
        entry = listed.get(node.op)
        if node.domain != DEFAULT_DOMAIN:
            out.append(Missing(node, "TensorRT imports the default ONNX domain only (this needs a plugin)"))
        elif entry is None or not entry["supported"]:
            out.append(Missing(node, f"not supported by {operators['version'].split(' (')[0]}'s ONNX parser"))
        elif node.types and TENSORRT_TYPES.get(node.types[0][1], node.types[0][1]) not in entry["types"]:
            kind = TENSORRT_TYPES.get(node.types[0][1], node.types[0][1])
            out.append(Missing(node, f"its data is {kind}, not one of {', '.join(entry['types'])}"))
    return out


# the table each GPU target is checked against: (kind, file)
TARGET_TABLES = {
    "cuda": ("onnxruntime", "onnxruntime-gpu-1.31.1-cuda.json"),
    "tensorrt": ("tensorrt", "tensorrt-10.16-onnx-parser.json"),
    "jetson-orin": ("tensorrt", "tensorrt-10.1-onnx-parser.json"),  # JetPack 6's TensorRT 10.3 adds no operator to 10.1
}


def graph_files(bundle: Path, manifest, target: str) -> dict[str, Path]:
    """The file of each graph a target runs: TensorRT builds from a graph's DequantizeLinear form where it has one."""
    tensorrt = TARGET_TABLES[target][0] == "tensorrt"
    return {name: Path(bundle) / (g.tensorrt_file if tensorrt and g.tensorrt_file else g.file)
            for name, g in manifest.graphs.items()}


def check(bundle: Path, target: str) -> list[Missing]:
    """Every node of `bundle`'s graphs with no kernel on `target` (empty: all of them run there)."""
    from ..bundle import manifest as manifest_io
    from ..errors import ConfigError

    if target not in TARGET_TABLES:
        raise ConfigError(f"target '{target}' has no kernel table; pick one of {', '.join(TARGET_TABLES)}")
    kind, name = TARGET_TABLES[target]
    manifest = manifest_io.read(bundle)
    found = [n for graph, path in graph_files(bundle, manifest, target).items() for n in nodes(path, graph)]
    return missing_onnxruntime(found, table(name)) if kind == "onnxruntime" else missing_tensorrt(found, table(name))


def summary(missing: list[Missing]) -> list[str]:
    """One line per distinct (operator, reason), with the graphs and how many nodes."""
    groups: dict = {}
    for m in missing:
        key = (m.node.domain, m.node.op, m.node.version, m.reason)
        graphs, count = groups.get(key, (set(), 0))
        groups[key] = (graphs | {m.node.graph}, count + 1)
    return [f"{domain}::{op} (version {version}) ×{count} in {', '.join(sorted(graphs))}: {reason}"
            for (domain, op, version, reason), (graphs, count) in sorted(groups.items())]
