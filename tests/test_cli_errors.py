"""Bad input to every command: one `Error:` line, exit 1, no traceback, nothing lost."""
import json
import shutil
import socket

import pytest
from click.testing import CliRunner

from specdeploy.cli import main


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def assert_one_line_error(result, fragment):
    out = result.output
    assert result.exit_code == 1, out
    assert out.startswith("Error: ") and out.count("\n") == 1, out
    assert "Traceback" not in out and fragment in out, out


def _truncate(path, keep):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)] if isinstance(keep, float) else data[:keep])


def _model_copy(tiny_model_dir, tmp_path, name):
    target = tmp_path / name
    shutil.copytree(tiny_model_dir, target)
    return target


def _bad_sources(tiny_model_dir, tmp_path):
    """(name, path, fragment of the expected message) for each kind of bad model input."""
    cases = [("missing", tmp_path / "nothing", "does not exist")]
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"not a gguf file at all" * 10)
    cases.append(("corrupt gguf", corrupt, "GGUF magic bytes"))
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + b"\x05\x00")
    cases.append(("truncated gguf", truncated, "cannot load"))
    malformed = _model_copy(tiny_model_dir, tmp_path, "malformed")
    (malformed / "config.json").write_text("{ not json")
    cases.append(("malformed config", malformed, "config.json is not valid JSON"))
    partial = _model_copy(tiny_model_dir, tmp_path, "partial")
    (partial / "config.json").write_text(json.dumps({"hidden_size": 64}))
    cases.append(("partial config", partial, "no 'model_type'"))
    no_tok = _model_copy(tiny_model_dir, tmp_path, "no-tokenizer")
    (no_tok / "tokenizer.json").unlink()
    cases.append(("missing tokenizer", no_tok, "has no tokenizer"))
    cut = _model_copy(tiny_model_dir, tmp_path, "truncated-weights")
    _truncate(cut / "model.safetensors", 0.5)
    cases.append(("truncated safetensors", cut, "is truncated"))
    ints = _model_copy(tiny_model_dir, tmp_path, "int8-weights")
    _retype_safetensors(ints / "model.safetensors", "I8")
    cases.append(("unsupported dtype", ints, "stores weights as I8"))
    return cases


def _retype_safetensors(path, dtype):
    """Rewrite the header so every tensor claims `dtype` (sizes no longer matter to the check)."""
    raw = path.read_bytes()
    length = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + length])
    for name, t in header.items():
        if name != "__metadata__":
            t["dtype"] = dtype
    blob = json.dumps(header).encode()
    blob += b" " * (length - len(blob)) if len(blob) <= length else b""
    path.write_bytes(len(blob).to_bytes(8, "little") + blob + raw[8 + length :])


@pytest.fixture(scope="module")
def bad_sources(tiny_model_dir, tmp_path_factory):
    return _bad_sources(tiny_model_dir, tmp_path_factory.mktemp("bad"))


def test_export_bad_model_inputs(bad_sources, tmp_path):
    for name, source, fragment in bad_sources:
        result = run("export", source, "--exit-layer", 1, "--output", tmp_path / "out")
        assert_one_line_error(result, fragment)
        assert not (tmp_path / "out").exists(), name


def test_failed_export_leaves_the_existing_bundle_untouched(bad_sources, tiny_bundle, tmp_path):
    existing = tmp_path / "existing"
    shutil.copytree(tiny_bundle, existing)
    before = {p.name: p.read_bytes() for p in existing.iterdir() if p.is_file()}
    for _name, source, fragment in bad_sources:
        assert_one_line_error(run("export", source, "--exit-layer", 1, "--output", existing), fragment)
    assert {p.name: p.read_bytes() for p in existing.iterdir() if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing"]  # no staging left behind


def test_export_to_an_unwritable_output(tiny_model_dir, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    assert_one_line_error(run("export", tiny_model_dir, "--exit-layer", 1, "--output", blocker / "bundle"),
                          "is a file")
    assert_one_line_error(run("export", tiny_model_dir, "--exit-layer", 1, "--output", blocker), "is a file")
    stranger = tmp_path / "not-a-bundle"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("mine")
    assert_one_line_error(run("export", tiny_model_dir, "--exit-layer", 1, "--output", stranger), "not a bundle")
    assert (stranger / "notes.txt").read_text() == "mine"


def test_calibrate_bad_inputs(bad_sources, tiny_model_dir, tmp_path):
    for _name, source, fragment in bad_sources[:3]:
        assert_one_line_error(run("calibrate", source, "--output", tmp_path / "out"), fragment)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("{nope\n")
    result = run("calibrate", tiny_model_dir, "--prompts", prompts, "--output", tmp_path / "out")
    assert_one_line_error(result, "p.jsonl:1 is not valid JSON")


@pytest.fixture
def corrupt_bundle(tiny_bundle, tmp_path):
    bundle = tmp_path / "corrupt.plan"
    shutil.copytree(tiny_bundle, bundle)
    (bundle / "manifest.json").write_text("{ nope")
    return bundle


def test_quantize_bad_inputs(tiny_bundle, corrupt_bundle, tmp_path):
    assert_one_line_error(run("quantize", tmp_path / "none", "--precision", "int8", "-o", tmp_path / "q"),
                          "is not a bundle")
    assert_one_line_error(run("quantize", corrupt_bundle, "--precision", "int8", "-o", tmp_path / "q"),
                          "not valid JSON")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert_one_line_error(run("quantize", tiny_bundle, "--precision", "int8", "-o", blocker), "is a file")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("[1, 2]\n")
    result = run("quantize", tiny_bundle, "--precision", "int8", "--prompts", prompts, "-o", tmp_path / "q")
    assert_one_line_error(result, "needs a 'prompt' string")
    assert run("quantize", tiny_bundle, "--precision", "int3", "-o", tmp_path / "q").exit_code == 2  # usage
    assert run("quantize", tiny_bundle, "--precision", "int4", "--int4-block", "64", "-o", tmp_path / "q").exit_code == 2


def test_build_engines_bad_inputs(tiny_bundle, corrupt_bundle, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "tensorrt", None)  # as on a machine without TensorRT
    assert_one_line_error(run("build-engines", tiny_bundle), "needs the 'tensorrt' Python package")
    assert_one_line_error(run("build-engines", tmp_path / "none"), "is not a bundle")
    assert_one_line_error(run("build-engines", tiny_bundle, "--max-draft-tokens", 0), "max_draft_tokens=0")


def test_inspect_bad_inputs(corrupt_bundle, tmp_path):
    assert_one_line_error(run("inspect", tmp_path / "none"), "is not a bundle")
    assert_one_line_error(run("inspect", corrupt_bundle), "not valid JSON")


def test_serve_bad_inputs(tiny_bundle, corrupt_bundle, tmp_path):
    assert_one_line_error(run("serve", tmp_path / "none"), "is not a bundle")
    assert_one_line_error(run("serve", corrupt_bundle), "not valid JSON")
    assert_one_line_error(run("serve", tiny_bundle, "--max-queue", 0), "max_queue=0")
    assert_one_line_error(run("serve", tiny_bundle, "--prefill-chunk", 0), "prefill_chunk=0 must be a whole number of rows >= 1")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert_one_line_error(run("serve", tiny_bundle, "--port", port), f"could not listen on 127.0.0.1:{port}")


def test_serve_bad_access_options(tiny_bundle):
    assert_one_line_error(run("serve", tiny_bundle, "--api-key", " "), "--api-key must be a non-empty key")


@pytest.mark.parametrize("option, value, fragment", [("--min-p", 2, "min_p=2.0 must be in [0, 1]"),
                                                     ("--repetition-penalty", 0, "repetition_penalty=0.0"),
                                                     ("--temperature", -1, "temperature=-1.0")])
def test_generate_bad_sampling_options(tiny_bundle, option, value, fragment):
    assert_one_line_error(run("generate", tiny_bundle, "w3", option, value), fragment)


@pytest.mark.parametrize("pair, fragment", [("heat=1", "KEY one of temperature"), ("top_p=high", "not a number"),
                                            ("top_p=1.5", "top_p=1.5 must be in (0, 1]")])
def test_export_bad_sampling_defaults(tiny_model_dir, tmp_path, pair, fragment):
    assert_one_line_error(run("export", tiny_model_dir, "-o", tmp_path / "b", "--sampling", pair), fragment)


def test_generate_bad_provider_for_tensorrt(tiny_bundle):
    result = run("generate", tiny_bundle, "w3", "--backend", "tensorrt", "--provider", "cpu")
    assert_one_line_error(result, "ONNX Runtime setting")


def test_a_terminated_export_removes_its_staging_directory(tiny_model_dir, tmp_path):
    """SIGTERM is handled as Ctrl-C: one line, exit 130, and nothing left in the output's folder
    (an interrupted 1.5B export once left 23 GB there)."""
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-m", "specdeploy.cli", "export", str(tiny_model_dir), "--exit-layer",
                             "1", "--output", str(tmp_path / "out")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 120
    while not any(p.name.startswith(".export-") for p in tmp_path.iterdir()):
        assert proc.poll() is None and time.monotonic() < deadline, "the export never staged anything"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and err.strip().splitlines()[-1] == "Interrupted." and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_a_signal_inside_an_import_is_taken_again_after_it(tmp_path, monkeypatch):
    """Raised through an extension module's initialisation a KeyboardInterrupt aborts the
    interpreter (seen: a SIGTERM landing in torch.onnx's first import); the handler sends the
    signal again a moment later instead, and raises anywhere else."""
    import signal
    import sys
    import threading

    from specdeploy import cli

    sent = threading.Event()
    monkeypatch.setattr(cli, "INTERRUPT_RETRY_S", 0.0)
    monkeypatch.setattr(cli.os, "kill", lambda pid, signum: sent.set() if signum == signal.SIGTERM else None)
    (tmp_path / "interrupted_module.py").write_text(
        "import signal, sys\nfrom specdeploy import cli\ncli._interrupt(signal.SIGTERM, sys._getframe())\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import interrupted_module  # noqa: F401  (the handler ran inside this import and did not raise)

    assert sent.wait(5)
    with pytest.raises(KeyboardInterrupt):
        cli._interrupt(signal.SIGTERM, sys._getframe())
