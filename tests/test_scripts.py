"""The scripts and examples import only names the package has (they are not run by every test)."""
import ast
import importlib
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


def test_copy_length_ab_runs_and_checks_identity(tiny_bundle):
    """The A/B prints a line per category and overall (and exits non-zero if greedy output differs)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "copy_length_ab.py"), str(tiny_bundle),
                          "--prompts-per-category", "1", "--repeats", "1", "--max-tokens", "8"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if not line.startswith("round ms by verify rows")]
    assert len(lines) == 8 and lines[-1].startswith("overall") and "priced" in lines[0]


def test_memory_breakdown_reports_every_loading_step(tiny_bundle):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "memory_breakdown.py"), str(tiny_bundle)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    steps = [line.split("VmRSS")[0].strip() for line in out.stdout.splitlines()]
    assert steps[:3] == ["start", "imports", "tokenizer"] and steps.count("+ KV buffers") == 3
    assert steps[-1].startswith("generated") and all("VmHWM" in line for line in out.stdout.splitlines())


def test_quality_compare_measures_each_bundle_over_each_text_length(tiny_bundle, tmp_path):
    """The reference against itself agrees fully; a bad bundle path is one line and a non-zero exit."""
    import subprocess
    import sys

    script = str(ROOT / "scripts" / "quality_compare.py")
    out = subprocess.run([sys.executable, script, str(tiny_bundle), str(tiny_bundle), "--passages", "1", "2"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    line, = out.stdout.splitlines()
    assert "1 passages: top-1 100.0%" in line and "2 passages: top-1 100.0%" in line
    bad = subprocess.run([sys.executable, script, str(tiny_bundle), str(tmp_path / "none")],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


def test_outlier_channels_lists_the_inputs_quantize_would_split(tiny_bundle):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "outlier_channels.py"), str(tiny_bundle), "--top", "3"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    head, *rows = out.stdout.splitlines()
    assert head.endswith("channels") and " matmul inputs, " in head and len(rows) == 3
    ratios = [float(row.split("median channel")[1].split("x")[0]) for row in rows]
    assert ratios == sorted(ratios, reverse=True) and ratios[-1] >= 1.0


def test_arena_ab_times_both_modes_on_both_engines(tiny_bundle):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "arena_ab.py"), str(tiny_bundle), "--repeats", "1",
                          "--max-tokens", "8"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["plain", "speculative"]
    assert all("no arena (default)" in line and "(1.000x)" in line and "arena:" in line for line in lines)


def test_round_overhead_times_the_drafters_choices_while_decoding(tiny_bundle):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "round_overhead.py"), str(tiny_bundle),
                          "--prompts", "2", "--max-tokens", "8", "--category", "summarisation"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    labels = {line[:24].strip() for line in out.stdout.splitlines()}
    assert {"lookup search", "draft() -> plain step", "round (all kinds)"} <= labels
    assert "100.00% of a round" in out.stdout


@pytest.mark.parametrize("script, bundles", [("arena_ab", 1), ("copy_length_ab", 1), ("outlier_channels", 1),
                                             ("quality_compare", 2), ("round_overhead", 1)])
def test_a_script_given_no_bundle_says_so_in_one_line(script, bundles, tmp_path):
    import subprocess
    import sys

    missing = [str(tmp_path / "no-such.plan")] * bundles
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / f"{script}.py"), *missing],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert out.stderr.startswith("error: ") and len(out.stderr.strip().splitlines()) == 1, out.stderr
