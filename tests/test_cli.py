"""The command line: one-line errors, non-zero exits, no tracebacks."""
from click.testing import CliRunner

from specdeploy.cli import main


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_generate_streams_and_summarises(tiny_bundle):
    result = run("generate", tiny_bundle, "w3 w4", "--max-tokens", 12, "--raw")
    assert result.exit_code == 0, result.output
    assert "tok/s" in result.output and "acceptance" in result.output and "tokens/round" in result.output


def test_generate_on_missing_bundle_is_one_line_error(tmp_path):
    result = run("generate", tmp_path / "nothing", "hi")
    assert result.exit_code == 1
    assert result.output.startswith("Error: ") and "specdeploy export" in result.output
    assert "Traceback" not in result.output and result.output.count("\n") == 1


def test_generate_context_overflow_is_one_line_error(tiny_bundle):
    result = run("generate", tiny_bundle, " ".join(["w3"] * 120), "--max-tokens", 50, "--raw")
    assert result.exit_code == 1 and "max context 128" in result.output
    assert "Traceback" not in result.output


def test_bad_option_values_exit_non_zero(tiny_bundle):
    assert run("generate", tiny_bundle, "w3", "--temperature", "-2").exit_code == 1
    assert run("generate", tiny_bundle, "w3", "--num-draft-tokens", "0").exit_code == 1
    assert run("export", "model", "--exit-layer", "x").exit_code == 2


def test_export_error_is_one_line(tmp_path):
    result = run("export", tmp_path / "missing", "--exit-layer", 3, "--output", tmp_path / "o")
    assert result.exit_code == 1 and result.output.startswith("Error: ") and "does not exist" in result.output
