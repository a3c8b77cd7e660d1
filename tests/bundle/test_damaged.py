"""Damaged bundles, as copies onto devices break them: every command answers in one `Error:` line,
and leaves the bundle (and any output path) as it was."""
import hashlib
import json
import shutil
import sys

import pytest
from click.testing import CliRunner

from specdeploy.bundle import files as files_io
from specdeploy.bundle import manifest as manifest_io
from specdeploy.cli import main
from specdeploy.errors import BundleError


def _edit_manifest(change):
    def damage(bundle):
        path = bundle / "manifest.json"
        data = json.loads(path.read_text())
        change(data)
        path.write_text(json.dumps(data))
    return damage


def _truncate(name, keep=0.5):
    def damage(bundle):
        data = (bundle / name).read_bytes()
        (bundle / name).write_bytes(data[: int(len(data) * keep)])
    return damage


def _remove(name):
    return lambda bundle: (bundle / name).unlink()


def _flip(name, at=0.5):
    def damage(bundle):
        data = bytearray((bundle / name).read_bytes())
        data[int(len(data) * at)] ^= 0x01
        (bundle / name).write_bytes(bytes(data))
    return damage


def _manifest_dir(bundle):
    (bundle / "manifest.json").unlink()
    (bundle / "manifest.json").mkdir()


# (name, damage, fragment of the one-line error every command gives)
EVERY_COMMAND = [
    # without a manifest, calibrate takes the directory for a model directory and names what it lacks
    ("no manifest", _remove("manifest.json"), {"calibrate": "has no config.json", None: "is not a bundle"}),
    ("manifest is a directory", _manifest_dir, "is not a bundle"),
    ("manifest truncated", _truncate("manifest.json", 0.6), "not valid JSON"),
    ("manifest is binary", lambda b: (b / "manifest.json").write_bytes(b"\xff\xfe\x00garbage"), "not valid JSON"),
    ("manifest is a list", lambda b: (b / "manifest.json").write_text("[1, 2]"), "not a specdeploy bundle"),
    ("older schema", _edit_manifest(lambda d: d.update(schema_version=1)), "schema version 1"),
    ("field missing", _edit_manifest(lambda d: d["model"].pop("num_layers")), "'model.num_layers' is missing"),
    ("field mistyped", _edit_manifest(lambda d: d.update(exit_layer="eight")), "'exit_layer' must be an integer"),
    ("field misspelt", _edit_manifest(lambda d: d.update(exit_layr=d.pop("exit_layer"))), "'exit_layr' is not one"),
    ("exit layer out of range", _edit_manifest(lambda d: d.update(exit_layer=9)), "'exit_layer' must be in 1..3"),
    ("graph entry missing", _edit_manifest(lambda d: d["graphs"].pop("verify")), "'graphs.verify' is missing"),
    ("graph file name mistyped", _edit_manifest(lambda d: d["graphs"]["draft"].update(file=7)),
     "'graphs.draft.file' must be a string"),
    ("kv layers wrong", _edit_manifest(lambda d: d["graphs"]["verify"].update(kv_layers=[1, 4])),
     "'graphs.verify.kv_layers' must be [2, 4]"),
    ("file record missing", _edit_manifest(lambda d: d.pop("files")), "'files' is missing"),
    ("one file unrecorded", _edit_manifest(lambda d: d["files"].pop("weights.bin")), "has no size or hash"),
    ("file size mistyped", _edit_manifest(lambda d: d["files"]["weights.bin"].update(bytes="big")),
     "'files.weights.bin.bytes' must be an integer"),
    ("quality mistyped", _edit_manifest(lambda d: d.update(quality={"top1_agreement": "high"})),
     "'quality.top1_agreement' must be a number"),
    ("tensorrt record incomplete", _edit_manifest(lambda d: d.update(tensorrt={"version": "10.9"})),
     "'tensorrt.compute_capability' is missing"),
    ("lookup n-grams wrong", _edit_manifest(lambda d: d.update(lookup_ngram=[4, 1])), "lookup_ngram=(4, 1)"),
    ("graph file missing", _remove("verify.onnx"), "verify.onnx is missing"),
    ("graph file truncated", _truncate("verify.onnx"), "verify.onnx is"),
    ("weights truncated", _truncate("weights.bin", 0.9), "weights.bin is"),
    ("weights grown", lambda b: open(b / "weights.bin", "ab").write(b"\0"), "weights.bin is"),
    ("tokenizer missing", _remove("tokenizer.json"), "tokenizer.json is missing"),
    ("chat template missing", _remove("chat_template.jinja"), "chat_template.jinja is missing"),
]
# same sizes, other bytes: found by the commands that read every byte
FLIPPED = [
    ("weights byte flipped", _flip("weights.bin"), "weights.bin's content does not match"),
    ("graph byte flipped", _flip("draft.onnx", 0.9), "draft.onnx's content does not match"),
    ("tokenizer byte flipped", _flip("tokenizer.json", 0.3), "tokenizer.json's content does not match"),
]


def commands(bundle, out):
    return {
        "inspect": ["inspect", bundle],
        "inspect --verify": ["inspect", bundle, "--verify"],
        "generate": ["generate", bundle, "w3 w4", "--max-tokens", "2"],
        "serve": ["serve", bundle, "--port", "0"],
        "bench": ["bench", bundle, "--quick", "--no-plots", "-o", out],
        "quantize": ["quantize", bundle, "--precision", "int8", "-o", out],
        "quantize in place": ["quantize", bundle, "--precision", "int8", "-o", bundle],
        "build-engines": ["build-engines", bundle],
        "triton": ["triton", bundle, "-o", out],
        "calibrate": ["calibrate", bundle, "--output", out],
    }


VERIFYING = ("inspect --verify", "quantize", "quantize in place", "build-engines")


def snapshot(path):
    if not path.exists():
        return None
    if path.is_file():
        return hashlib.sha256(path.read_bytes()).hexdigest()
    return {p.name: snapshot(p) for p in sorted(path.iterdir())}


def check(bundle, tmp_path, fragment, which):
    out = tmp_path / "out"
    before = snapshot(bundle)
    for name, args in commands(bundle, out).items():
        if name not in which:
            continue
        result = CliRunner().invoke(main, [str(a) for a in args])
        text = result.output
        assert result.exit_code == 1, (name, text)
        assert text.startswith("Error: ") and text.count("\n") == 1, (name, text)
        expected = fragment.get(name, fragment[None]) if isinstance(fragment, dict) else fragment
        assert expected in text and "Traceback" not in text, (name, text)
        assert snapshot(bundle) == before, f"{name} changed the damaged bundle"
        assert not out.exists(), f"{name} left {out}"
        assert sorted(p.name for p in tmp_path.iterdir()) == [bundle.name], f"{name} left staging behind"


@pytest.fixture(autouse=True)
def no_tensorrt(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # as on a machine without TensorRT


def damaged(tiny_bundle, tmp_path, damage):
    bundle = tmp_path / "damaged.plan"
    shutil.copytree(tiny_bundle, bundle)
    damage(bundle)
    return bundle


@pytest.mark.parametrize("name, damage, fragment", EVERY_COMMAND, ids=[c[0] for c in EVERY_COMMAND])
def test_every_command_refuses_a_damaged_bundle_in_one_line(tiny_bundle, tmp_path, name, damage, fragment):
    check(damaged(tiny_bundle, tmp_path, damage), tmp_path, fragment, commands(None, None))


@pytest.mark.parametrize("name, damage, fragment", FLIPPED, ids=[c[0] for c in FLIPPED])
def test_a_flipped_byte_is_found_by_the_commands_that_read_every_byte(tiny_bundle, tmp_path, name, damage,
                                                                       fragment):
    bundle = damaged(tiny_bundle, tmp_path, damage)
    check(bundle, tmp_path, fragment, VERIFYING)
    plain = CliRunner().invoke(main, ["inspect", str(bundle)])
    assert plain.exit_code == 0 and "sizes match" in plain.output  # sizes alone cannot see it


def test_a_whole_bundle_verifies(tiny_bundle):
    result = CliRunner().invoke(main, ["inspect", str(tiny_bundle), "--verify"])
    assert result.exit_code == 0, result.output
    assert "SHA-256 verified" in result.output
    manifest = manifest_io.read(tiny_bundle)
    assert files_io.verify(tiny_bundle, manifest) == sum(r.bytes for r in manifest.files.values())


def test_sealing_records_what_is_on_disk_now(tiny_bundle, tmp_path):
    bundle = tmp_path / "b"
    shutil.copytree(tiny_bundle, bundle)
    manifest = manifest_io.read(bundle)
    (bundle / "chat_template.jinja").write_text("{{ messages }}")
    with pytest.raises(BundleError, match="chat_template.jinja is"):
        manifest_io.read(bundle)
    sealed = manifest_io.write(bundle, manifest)
    assert manifest_io.read(bundle) == sealed
    assert sealed.files["chat_template.jinja"].bytes == len("{{ messages }}")


def test_an_earlier_bundles_extra_records_are_read_into_their_fields(tiny_bundle, tmp_path):
    """Bundles written before fused attention, its window shift and the in-place weights had fields
    kept them in `extra`: they load with the same values."""
    import json
    import shutil

    from specdeploy.bundle import manifest as manifest_io

    old = tmp_path / "old.plan"
    shutil.copytree(tiny_bundle, old)
    data = json.loads((old / "manifest.json").read_text())
    data["extra"] = {**data.get("extra", {}), "fused_attention": {"draft": 2}, "attention_window_shift": 1,
                     "read_in_place": {"verify": [["w", 0, 16, "uint8", [4, 4]]]}}
    for key in ("fused_attention", "attention_window_shift", "read_in_place"):
        data.pop(key, None)
    (old / "manifest.json").write_text(json.dumps(data))
    m = manifest_io.read(old)
    assert m.fused_attention == {"draft": 2} and m.attention_window_shift == 1
    (weight,) = m.read_in_place["verify"]
    assert (weight.name, weight.offset, weight.length, weight.dtype, weight.shape) == ("w", 0, 16, "uint8", (4, 4))
    assert not {"fused_attention", "attention_window_shift", "read_in_place"} & set(m.extra)
