import json

import pytest

from conftest import export_tiny, save_tiny_model
from specdeploy.bundle import manifest as manifest_io
from specdeploy.errors import ConfigError, ModelSourceError, UnsupportedModelError
from specdeploy.export import ExportConfig, export


@pytest.mark.integration  # a whole export (or Hugging Face generate): not the fast tier
@pytest.mark.parametrize("arch", ["mistral", "qwen2", "qwen3"])
def test_other_families_export_validate_and_decode_exactly(arch, tmp_path):
    from specdeploy.config import GenerationConfig
    from specdeploy.runtime.engine import Engine

    bundle = export_tiny(arch, tmp_path, exit_layer=1)
    diffs = manifest_io.read(bundle).extra["validation_max_abs_diff"]
    assert max(diffs.values()) < 1e-3
    with Engine(bundle) as engine:
        cfg = dict(max_new_tokens=24, ignore_eos=True)
        plain = engine.generate_ids([3, 4, 5, 6], GenerationConfig(speculative=False, **cfg))
        spec = engine.generate_ids([3, 4, 5, 6], GenerationConfig(num_draft_tokens=3, **cfg))
    assert spec == plain and len(plain) == 24


def test_manifest_records_graphs_io_and_kv_layout(tiny_bundle):
    m = manifest_io.read(tiny_bundle)
    assert m.exit_layer == 2 and m.model.num_layers == 4 and m.max_context == 128
    assert m.graph("draft").layers == range(0, 2) and m.graph("verify").layers == range(2, 4)
    assert "past_key.0" in m.graph("draft").inputs and "present_value.3" in m.graph("verify").outputs
    assert m.kv_shape == (1, 2, 128, 16)
    assert (tiny_bundle / m.chat_template).read_text().startswith("{% for")
    assert json.loads((tiny_bundle / "manifest.json").read_text())["schema_version"] == 2
    on_disk = {p.name for p in tiny_bundle.iterdir() if p.name != "manifest.json"}
    assert set(m.files) == on_disk  # every file recorded, nothing unrecorded beside them
    assert m.files["weights.bin"].bytes == (tiny_bundle / "weights.bin").stat().st_size
    assert m.lookup_ngram == (1, 4)
    older = {k: v for k, v in json.loads(m.to_json()).items() if k != "lookup_ngram"}
    assert manifest_io.from_dict(older).lookup_ngram == (1, 4)  # bundles written before the field


def test_weights_are_stored_once_across_graphs(tiny_bundle):
    import onnx

    m = manifest_io.read(tiny_bundle)
    locations = set()
    for graph in m.graphs.values():
        model = onnx.load(str(tiny_bundle / graph.file), load_external_data=False)
        for t in model.graph.initializer:
            if t.data_location == onnx.TensorProto.EXTERNAL:
                entry = {e.key: e.value for e in t.external_data}
                assert entry["location"] == "weights.bin"
                locations.add(entry["offset"])
    assert list(tiny_bundle.glob("*.data")) == []
    # the tied embedding / LM head is referenced by draft and head but written once
    assert m.extra["weights_bytes"] < m.extra["weights_bytes_before_dedup"]


def test_unsupported_architecture_is_named(tmp_path):
    import transformers

    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(UnsupportedModelError, match="gpt2.*Llama"):
        export(ExportConfig(source=tmp_path / "gpt2", exit_layer=1, output=tmp_path / "out"))


def test_exit_layer_out_of_range(tmp_path):
    model = save_tiny_model("llama", tmp_path / "m")
    with pytest.raises(ConfigError, match="must be < num_layers=4; pick 1..3"):
        export(ExportConfig(source=model, exit_layer=4, output=tmp_path / "out"))
    with pytest.raises(ConfigError, match=">= 1"):
        ExportConfig(source=model, exit_layer=0)


@pytest.mark.unit
def test_the_default_exit_is_a_quarter_of_the_layers():
    from specdeploy.export.pipeline import default_exit_layer

    assert [default_exit_layer(n) for n in (30, 28, 36, 24, 4, 2)] == [8, 7, 9, 6, 1, 1]
    with pytest.raises(ConfigError, match="a layer number, 'auto' or 'quarter'"):
        ExportConfig(source=".", exit_layer="half")


def test_export_without_an_exit_layer_takes_the_default_and_says_so(tiny_model_dir, tmp_path):
    from click.testing import CliRunner

    from specdeploy.cli import main

    result = CliRunner().invoke(main, ["export", str(tiny_model_dir), "--max-context", "64", "-o", str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    assert "exit layer 1 of 4 (the default: a quarter of the layers" in result.output
    assert manifest_io.read(tmp_path / "b").exit_layer == 1


def test_missing_source_is_a_clear_error(tmp_path):
    with pytest.raises(ModelSourceError, match="does not exist"):
        export(ExportConfig(source=tmp_path / "nope", exit_layer=1, output=tmp_path / "out"))


def test_failed_export_leaves_existing_bundle_untouched(tiny_bundle, tmp_path):
    before = (tiny_bundle / "manifest.json").read_text()
    with pytest.raises(ConfigError):
        export(ExportConfig(source=tiny_bundle.parent / "llama-model", exit_layer=9, output=tiny_bundle))
    assert (tiny_bundle / "manifest.json").read_text() == before


def test_reference_schedule_catches_a_broken_graph(tiny_bundle, tiny_model_dir):
    """The parity check must fail when a graph is wrong (control for the validation itself)."""
    import transformers

    from specdeploy.errors import ValidationError
    from specdeploy.export.validate import validate_bundle

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    m = manifest_io.read(tiny_bundle)
    validate_bundle(model, tiny_bundle, m)  # passes as exported
    with __import__("torch").no_grad():
        model.model.layers[3].mlp.down_proj.weight.mul_(1.5)
    with pytest.raises(ValidationError, match="disagree"):
        validate_bundle(model, tiny_bundle, m)


@pytest.mark.integration  # a whole export (or Hugging Face generate): not the fast tier
def test_opset_23_bundle_for_older_onnxruntime(tmp_path):
    """ScatterND instead of TensorScatter: what ONNX Runtime 1.23 (Python 3.10) can run."""
    import onnx

    from specdeploy.backends.onnxruntime import check_opset
    from specdeploy.config import GenerationConfig
    from specdeploy.errors import BackendError
    from specdeploy.runtime.engine import Engine

    bundle = export_tiny("llama", tmp_path, exit_layer=2, opset=23)
    m = manifest_io.read(bundle)
    assert m.opset == 23 and max(m.extra["validation_max_abs_diff"].values()) < 1e-3
    ops = {n.op_type for n in onnx.load(str(bundle / "draft.onnx"), load_external_data=False).graph.node}
    assert "ScatterND" in ops and "TensorScatter" not in ops
    with Engine(bundle) as engine:
        cfg = dict(max_new_tokens=30, ignore_eos=True)
        plain = engine.generate_ids([4, 5, 6], GenerationConfig(speculative=False, **cfg))
        assert engine.generate_ids([4, 5, 6], GenerationConfig(num_draft_tokens=4, **cfg)) == plain
    check_opset(m, "1.23.2")
    with pytest.raises(BackendError, match="--opset 23"):
        check_opset(m.replace(opset=24), "1.23.2")


@pytest.mark.integration  # a whole export (or Hugging Face generate): not the fast tier
def test_interrupted_export_leaves_existing_bundle_untouched(tiny_bundle, tiny_model_dir, tmp_path, monkeypatch):
    import shutil

    from specdeploy.export import writer

    existing = tmp_path / "existing"
    shutil.copytree(tiny_bundle, existing)
    before = {p.name: p.read_bytes() for p in existing.iterdir() if p.is_file()}

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(writer, "save_tokenizer", interrupted)  # after the graphs are written
    with pytest.raises(KeyboardInterrupt):
        export(ExportConfig(source=tiny_model_dir, exit_layer=1, max_context=64, output=existing))
    assert {p.name: p.read_bytes() for p in existing.iterdir() if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing"]


@pytest.mark.integration  # a whole export (or Hugging Face generate): not the fast tier
def test_export_shows_progress_not_exporter_noise(tiny_model_dir, tmp_path):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "specdeploy.cli", "export", str(tiny_model_dir), "--exit-layer", "1",
                           "--max-context", "64", "--output", str(tmp_path / "b")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "torchvision" not in proc.stdout + proc.stderr
    assert "exporting draft, verify and head graphs" in proc.stdout and "validated against" in proc.stdout


def test_graphs_are_written_for_row_independence(tiny_bundle):
    """Attention op by op (ONNX's Attention kernel differs between one and many query rows) and
    norms as RMSNormalization; the manifest records the bitwise check that the export passed."""
    import onnx

    manifest = manifest_io.read(tiny_bundle)
    for name in ("draft", "verify", "head"):
        ops = [n.op_type for n in onnx.load(str(tiny_bundle / manifest.graph(name).file),
                                            load_external_data=False).graph.node]
        assert "Attention" not in ops and "Pow" not in ops and "ReduceMean" not in ops
        assert ops.count("RMSNormalization") == {"draft": 4, "verify": 4, "head": 1}[name]  # 2 layers each
        if name != "head":
            assert ops.count("Softmax") == 2 and ops.count("Where") >= 2
    assert manifest.row_check["passed"]


def test_rms_norms_are_fused_by_behaviour_not_name():
    import torch

    from specdeploy.export.split import fuse_rms_norms

    class Scaled(torch.nn.Module):  # a Gemma-style norm: (1 + weight), under an unrelated name
        def __init__(self):
            super().__init__()
            self.weight, self.eps = torch.nn.Parameter(torch.randn(8) * 0.1), 1e-6

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1 + self.weight)

    class NotANorm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight, self.eps = torch.nn.Parameter(torch.ones(8)), 1e-6

        def forward(self, x):
            return x * self.weight

    model = torch.nn.Sequential(Scaled(), NotANorm())
    x = torch.randn(1, 4, 8)
    before = model(x)
    assert fuse_rms_norms(model) == 1 and fuse_rms_norms(model) == 0
    torch.testing.assert_close(model(x), before)
