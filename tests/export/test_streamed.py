"""export/streamed.py and tensor_source.py: the model as a skeleton, its weights read a tensor at a time.

What the streamed export writes must be what `from_pretrained` loads, tensor for tensor, from a
Hugging Face directory and from a GGUF (whose names and q/k layout transformers maps), and the
reference that loads one layer at a time must compute what the loaded model computes.
"""

from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import EXAMPLE_GGUF, export_tiny, save_tiny_model, tiny_config
from specdeploy.export import streamed
from specdeploy.export.arch import load


def _same_weights(source: Path) -> None:
    skeleton, _, weights = streamed.load_skeleton(source)
    loaded, _ = load(source)
    assert all(p.is_meta for p in skeleton.parameters())  # nothing read by loading
    params = dict(skeleton.named_parameters())
    for name, param in loaded.named_parameters():
        np.testing.assert_array_equal(weights.parameter(params[name]), param.detach().numpy(), err_msg=name)
    for name, buffer in loaded.named_buffers():
        np.testing.assert_array_equal(dict(skeleton.named_buffers())[name].numpy(), buffer.numpy(), err_msg=name)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3_text"])
def test_a_directorys_weights_are_what_from_pretrained_loads(tmp_path, arch):
    _same_weights(save_tiny_model(arch, tmp_path / arch))


@pytest.mark.parametrize("shape", ["qwen2.5-0.5b", "llama3.1-8b"])  # qwen2 as stored; llama's q/k permuted
def test_a_gguf_files_weights_are_what_from_pretrained_loads(tmp_path, checkpoint_script, shape):
    tiny = dict(checkpoint_script.SHAPES[shape], hidden_size=64, num_hidden_layers=3, intermediate_size=96,
                num_attention_heads=4, num_key_value_heads=2, vocab_size=400)
    config, params = checkpoint_script.parameters(tiny)
    path = tmp_path / "tiny-q4_0.gguf"
    checkpoint_script.write_gguf(path, config, params)
    _same_weights(path)


@pytest.mark.integration
def test_the_example_ggufs_weights_are_what_from_pretrained_loads():
    if not EXAMPLE_GGUF.is_file():
        pytest.skip("example model not fetched; run scripts/fetch_model.sh")
    _same_weights(EXAMPLE_GGUF)


def test_the_layer_at_a_time_reference_computes_what_the_loaded_model_does(tmp_path):
    source = save_tiny_model("qwen2", tmp_path / "m", config=tiny_config("qwen2"))
    skeleton, _, weights = streamed.load_skeleton(source)
    loaded, _ = load(source)
    ids = torch.tensor([[3, 14, 15, 92, 65, 35]])
    with torch.no_grad(), weights.materialized() as runnable:
        got = runnable(ids).logits
        assert all(p.is_meta for p in runnable.model.layers[0].parameters())  # each layer's dropped after it ran
    with torch.no_grad():
        want = loaded(ids).logits
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert all(p.is_meta for p in skeleton.parameters())


def test_a_checkpoint_missing_a_tensor_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    from specdeploy.errors import ModelSourceError

    source = save_tiny_model("qwen2", tmp_path / "m")
    tensors = load_file(source / "model.safetensors")
    tensors.pop("model.layers.1.mlp.down_proj.weight")
    save_file(tensors, source / "model.safetensors", metadata={"format": "pt"})
    skeleton, _, weights = streamed.load_skeleton(source)
    param = skeleton.get_parameter("model.layers.1.mlp.down_proj.weight")
    with pytest.raises(ModelSourceError, match="model.layers.1.mlp.down_proj.weight"):
        weights.parameter(param)


def test_a_verify_graph_too_large_to_load_is_named_and_the_rest_still_validated(tmp_path, monkeypatch, capsys):
    from specdeploy.bundle import manifest as manifest_io
    from specdeploy.runtime import split_model

    monkeypatch.setattr(split_model, "too_large", lambda bundle, manifest: {"verify": "it is too large (test)"})
    bundle = export_tiny("llama", tmp_path)
    extra = manifest_io.read(bundle).extra
    assert extra["validation_skipped"] == {"verify": "it is too large (test)"}
    checked = set(extra["validation_max_abs_diff"])
    assert {"prefill.draft_hidden", "draft0.logits", "rollback.draft_hidden"} <= checked
    assert not any(name.endswith(("prefill.logits", "verify.logits")) for name in checked)
    assert "the verify graph was not validated: it is too large (test)" in capsys.readouterr().out


def test_graphs_larger_than_the_memory_available_are_found(tiny_bundle, monkeypatch):
    from specdeploy.bundle import manifest as manifest_io
    from specdeploy.runtime import memory_log, split_model

    manifest = manifest_io.read(tiny_bundle)
    monkeypatch.setattr(memory_log, "available_bytes", lambda: 1 << 40)
    assert split_model.too_large(tiny_bundle, manifest) == {}
    monkeypatch.setattr(memory_log, "available_bytes", lambda: 1024)
    found = split_model.too_large(tiny_bundle, manifest)
    assert set(found) == set(manifest.graphs) and "exceed 70% of the memory available here" in found["verify"]


def test_the_reference_over_a_mapped_gguf_warns_nothing(tmp_path, checkpoint_script):
    """A GGUF's tensors are read-only arrays over its mapped file; torch warns once per process
    about such arrays, so the check runs in a process of its own."""
    import subprocess
    import sys

    tiny = dict(checkpoint_script.SHAPES["qwen2.5-0.5b"], hidden_size=64, num_hidden_layers=2,
                intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, vocab_size=400)
    config, params = checkpoint_script.parameters(tiny)
    path = tmp_path / "tiny-q4_0.gguf"
    checkpoint_script.write_gguf(path, config, params)
    run = ("import sys, torch\nfrom specdeploy.export import streamed\n"
           "_, _, weights = streamed.load_skeleton(sys.argv[1])\n"
           "with torch.no_grad(), weights.materialized() as model:\n    model(torch.tensor([[1, 2, 3]]))\n")
    result = subprocess.run([sys.executable, "-W", "error", "-c", run, str(path)], capture_output=True, text=True)
    assert result.returncode == 0 and "not writable" not in result.stderr, result.stderr[-2000:]
