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


@pytest.mark.parametrize("path", sorted(ROOT.glob("scripts/*.py")), ids=lambda p: p.name)
def test_each_python_script_answers_help(path):
    """A script that no longer starts against today's package fails here, not on a user's machine."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(path), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage:")


@pytest.mark.parametrize("path", sorted(ROOT.glob("scripts/*.sh")), ids=lambda p: p.name)
def test_each_shell_script_parses(path):
    """`bash -n`: the shell scripts' syntax (their specdeploy commands are checked against the CLI in
    test_docs.py, and test.sh / demo.sh / fetch_model.sh run in CI)."""
    import subprocess

    out = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr


def test_gpu_check_runs_its_cpu_rows_on_the_tiny_bundle(tiny_bundle):
    """Without a GPU the script says so and still prints the CPU row of each bundle; a missing bundle
    is one line and a non-zero exit."""
    import subprocess
    import sys

    script = str(ROOT / "scripts" / "gpu_check.py")
    out = subprocess.run([sys.executable, script, str(tiny_bundle), "--max-tokens", "16"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith(f"| {tiny_bundle.name} |")]
    assert rows and all(float(row.split("|")[3]) > 0 for row in rows)
    missing = subprocess.run([sys.executable, script, str(tiny_bundle.parent / "none.plan")], capture_output=True,
                             text=True, timeout=120)
    assert missing.returncode != 0 and missing.stderr.strip().startswith("error:")
    assert len(missing.stderr.strip().splitlines()) == 1
