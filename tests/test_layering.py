"""The package's layering is one-way: a module imports only from layers below its own.

The layers, bottom to top (docs/DESIGN.md has the map):

    core (constants, errors, config, jsonl, prompts) < bundle, kernels < backends < runtime < optimize, checks
        < calibration, quantization < export < bench, serve, triton < cli

Every import is checked, also those inside functions (lazy imports still create the dependency),
and no modules import each other in a cycle, inside a layer or across.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "specdeploy"
CORE = ("constants", "errors", "config", "jsonl", "prompts")
RANK = {"core": 0, "bundle": 1, "kernels": 1, "backends": 2, "runtime": 3, "optimize": 4, "checks": 4,
        "calibration": 5, "quantization": 5,
        "feature_head": 6, "export": 7, "bench": 8, "serve": 8, "triton": 8, "cli": 9}
HEAVY = {"torch", "transformers", "onnx", "onnxscript", "gguf", "accelerate", "matplotlib"}
SERVING = {"starlette", "uvicorn", "tritonclient"}
# third-party packages a layer may never import (click: only the CLI, checked separately)
BANNED = {
    "core": HEAVY | SERVING,
    "bundle": (HEAVY - {"onnx"}) | SERVING,   # the weights writer reads graphs with onnx, lazily
    "backends": HEAVY | SERVING,
    "runtime": HEAVY | SERVING,
    "optimize": (HEAVY - {"onnx"}) | SERVING,
    "checks": (HEAVY - {"onnx"}) | SERVING,   # reads graphs with onnx, lazily
}
IMPORT_NOTHING_OF_OURS = ("constants", "errors")


def unit_of(module: str) -> str | None:
    """The layer of a module name inside the package ('specdeploy.runtime.engine' -> 'runtime')."""
    parts = module.split(".")
    if parts[0] != "specdeploy":
        return None
    if len(parts) == 1:
        return "api"
    return "core" if parts[1] in CORE else parts[1]


def imports(module: str, source: str, is_package: bool) -> list[str]:
    """Absolute names of everything `source` imports (relative imports resolved)."""
    package = module if is_package else module.rpartition(".")[0]
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(base)
                if node.module:
                    names.append(f"{base}.{node.module}")
                else:
                    names += [f"{base}.{a.name}" for a in node.names]
            else:
                names.append(node.module)
    return names


def violations(module: str, source: str, is_package: bool = False) -> list[str]:
    me = unit_of(module)
    out = []
    for target in imports(module, source, is_package):
        top, unit = target.split(".")[0], unit_of(target)
        if unit is None:
            if top == "click" and me != "cli":
                out.append(f"{module} imports click (only the CLI may)")
            if top in BANNED.get(me, ()):
                out.append(f"{module} ({me}) imports {top}")
            continue
        name = module.split(".")[1] if "." in module else ""
        if me == "core" and name in IMPORT_NOTHING_OF_OURS:
            out.append(f"{module} must import nothing of ours, imports {target}")
        if unit == "api" and me != "api":
            out.append(f"{module} imports the public API package ({target}); import the module itself")
        elif unit == "cli":
            out.append(f"{module} imports the CLI ({target})")
        elif me != "api" and unit != me and RANK[unit] >= RANK[me]:
            out.append(f"{module} ({me}) imports {target} ({unit}): against the layer direction")
    return out


def package_modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        yield ".".join(parts), path.read_text(), is_package


def test_every_unit_has_a_layer():
    units = {unit_of(m) for m, _, _ in package_modules()} - {"api"}
    assert units <= set(RANK), f"add {units - set(RANK)} to RANK and to docs/DESIGN.md's map"


def test_imports_follow_the_layer_direction():
    found = [v for m, src, pkg in package_modules() for v in violations(m, src, pkg)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("module, source, fragment", [
    ("specdeploy.runtime.decoder", "import torch", "imports torch"),
    ("specdeploy.runtime.decoder", "from ..export import writer", "against the layer direction"),
    ("specdeploy.bundle.manifest", "from ..runtime import engine", "against the layer direction"),
    ("specdeploy.calibration.steps", "def f():\n    from ..quantization import quality", "against"),
    ("specdeploy.serve.app", "import click", "only the CLI"),
    ("specdeploy.bench.runner", "from ..cli import main", "imports the CLI"),
    ("specdeploy.bench.runner", "import specdeploy", "public API"),
    ("specdeploy.constants", "from .errors import ConfigError", "import nothing of ours"),
])
def test_the_check_catches_each_kind_of_violation(module, source, fragment):
    """Control: a violation of each rule is reported (so the test above can fail)."""
    found = violations(module, source)
    assert any(fragment in v for v in found), found


def test_allowed_imports_pass_the_check():
    assert violations("specdeploy.export.pipeline", "from ..quantization.quantize import quantized_copy") == []
    assert violations("specdeploy.runtime.engine", "from ..bundle import manifest\nimport numpy") == []


def import_graph(modules) -> dict[str, set[str]]:
    """Module -> the package modules it imports (a name that is a package's attribute, e.g.
    `from . import io_names`, resolves to the module of that name)."""
    known = {m for m, _, _ in modules}
    graph = {}
    for module, source, is_package in modules:
        targets = set()
        for target in imports(module, source, is_package):
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != module and not is_package_of(target, module):
                targets.add(target)
        graph[module] = targets
    return graph


def is_package_of(package: str, module: str) -> bool:
    return module.startswith(package + ".")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected group of modules (depth-first search)."""
    found, done, stack = [], set(), []

    def visit(node):
        if node in stack:
            found.append(stack[stack.index(node):] + [node])
            return
        if node in done:
            return
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            visit(nxt)
        stack.pop()
        done.add(node)

    for node in sorted(graph):
        visit(node)
    return found


def test_no_modules_import_each_other_in_a_cycle():
    found = cycles(import_graph(list(package_modules())))
    assert not found, "\n".join(" -> ".join(c) for c in found)


def test_the_cycle_check_finds_a_cycle_inside_a_package():
    """Control: two modules of one package importing each other (as triton's repository and
    manifests once did) are reported."""
    modules = [("specdeploy.triton.a", "from .b import x", False), ("specdeploy.triton.b", "def f():\n    from .a import y", False),
               ("specdeploy.triton.c", "from .a import z", False)]
    assert cycles(import_graph(modules)) == [["specdeploy.triton.a", "specdeploy.triton.b", "specdeploy.triton.a"]]
