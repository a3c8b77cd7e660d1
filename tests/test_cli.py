"""The command line: one-line errors, non-zero exits, no tracebacks."""
import pytest
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
    result = run("generate", tiny_bundle, "w3", "--lookup-ngram", 3, 2)
    assert result.exit_code == 1 and "lookup_ngram=(3, 2)" in result.output and result.output.count("\n") == 1


def test_export_error_is_one_line(tmp_path):
    result = run("export", tmp_path / "missing", "--exit-layer", 3, "--output", tmp_path / "o")
    assert result.exit_code == 1 and result.output.startswith("Error: ") and "does not exist" in result.output


def test_corrupt_and_foreign_bundles_are_one_line_errors(tiny_bundle, tmp_path):
    import json
    import shutil

    corrupt = tmp_path / "corrupt"
    shutil.copytree(tiny_bundle, corrupt)
    (corrupt / "manifest.json").write_text("{ nope")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "manifest.json").write_text('{"format": "something-else"}')
    bad_ngram = tmp_path / "bad_ngram"
    shutil.copytree(tiny_bundle, bad_ngram)
    data = json.loads((bad_ngram / "manifest.json").read_text())
    (bad_ngram / "manifest.json").write_text(json.dumps({**data, "lookup_ngram": [0, "4"]}))
    partial = tmp_path / "partial"
    shutil.copytree(tiny_bundle, partial)
    (partial / "verify.onnx").unlink()
    for bundle, fragment in ((corrupt, "not valid JSON"), (foreign, "not a specdeploy bundle"),
                             (partial, "verify.onnx is missing"), (bad_ngram, "lookup_ngram")):
        result = run("generate", bundle, "w3")
        assert result.exit_code == 1 and fragment in result.output, result.output
        assert "Traceback" not in result.output and result.output.count("\n") == 1


def test_inspect_and_plain_flags(tiny_bundle):
    result = run("inspect", tiny_bundle)
    assert result.exit_code == 0 and "exit layer 2" in result.output and "verify.onnx" in result.output
    assert "early exit  agrees with the full model on" in result.output  # measured at export
    result = run("generate", tiny_bundle, "w3 w4", "--no-speculation", "--greedy", "--max-new-tokens", 5, "--raw")
    assert result.exit_code == 0 and "[plain]" in result.output


@pytest.mark.integration  # a whole export (or Hugging Face generate): not the fast tier
def test_export_and_generate_through_the_cli(tiny_model_dir, tmp_path):
    out = tmp_path / "cli.plan"
    result = run("export", tiny_model_dir, "--exit-layer", 1, "--max-context", 64, "--output", out)
    assert result.exit_code == 0, result.output
    assert "precision fp32: a Hugging Face directory's float weights as they are" in result.output
    assert "peak resident memory" in result.output  # and the step that reached it
    result = run("generate", out, "w3 w4", "--max-tokens", 6, "--raw", "--draft-source", "hybrid")
    assert result.exit_code == 0 and "speculative (hybrid)" in result.output
    result = run("generate", out, "w3 w4", "--max-tokens", 6, "--raw", "--draft-source", "lookup",
                 "--lookup-ngram", 1, 3)
    assert result.exit_code == 0, result.output


def test_generate_writes_text_to_stdout_and_the_summary_to_stderr(tiny_bundle):
    result = CliRunner().invoke(main, ["generate", str(tiny_bundle), "w3 w4", "--max-tokens", "8", "--raw"])
    assert result.exit_code == 0, result.output
    assert "tok/s" not in result.stdout and "[speculative" not in result.stdout  # `> out.txt` keeps text only
    assert "tok/s" in result.stderr and result.stderr.count("\n") == 1
    assert result.stdout.strip()  # the generated text
