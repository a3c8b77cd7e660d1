"""The tools in scripts/, the examples and Triton's model file import only names the package has
(the examples run in tests/test_examples.py; the lab's scripts are checked by its own tests)."""
import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted([*ROOT.glob("scripts/*.py"), *ROOT.glob("examples/*.py"), ROOT / "specdeploy" / "triton" / "model.py"])


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_imports_of_specdeploy_resolve(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "specdeploy":
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name) or importlib.util.find_spec(f"{node.module}.{alias.name}"), \
                    f"{path.name}: {node.module} has no {alias.name}"
