"""scripts/make_checkpoint.py: edge-shaped checkpoints with random weights, written one chunk at a time."""
import json

import numpy as np
import pytest



@pytest.fixture(scope="module")
def script(checkpoint_script):
    return checkpoint_script


def test_the_shapes_are_the_models_own_sizes(script):
    counts = {}
    for name in ("qwen2.5-0.5b", "qwen2.5-1.5b", "llama3.1-8b"):
        _, params = script.parameters(script.SHAPES[name])
        counts[name] = sum(int(np.prod(d)) for _, d in params) / 1e9
    assert 0.45 < counts["qwen2.5-0.5b"] < 0.52 and 1.5 < counts["qwen2.5-1.5b"] < 1.6
    assert 7.9 < counts["llama3.1-8b"] < 8.1


def test_a_written_file_loads_as_safetensors_with_every_tensor(script, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    monkeypatch.setattr(script, "CHUNK", 7)  # several chunks per tensor
    params = [("model.layers.0.mlp.up_proj.weight", (6, 5)), ("model.norm.weight", (5,))]
    written = script.write_safetensors(tmp_path / "m.safetensors", params)
    assert written == 2 * (30 + 5)
    header_size = int.from_bytes((tmp_path / "m.safetensors").read_bytes()[:8], "little")
    header = json.loads((tmp_path / "m.safetensors").read_bytes()[8 : 8 + header_size])
    assert header["model.norm.weight"]["dtype"] == "BF16" and header_size % 8 == 0
    # bf16 as the upper half of float32: read back through numpy's float32
    raw = (tmp_path / "m.safetensors").read_bytes()[8 + header_size :]
    values = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
    assert np.all(values[30:] == 1.0) and 0 < np.abs(values[:30]).std() < 0.1
    loaded = load_file(tmp_path / "m.safetensors")
    assert {k: tuple(v.shape) for k, v in loaded.items()} == dict(params)
    assert np.array_equal(loaded["model.norm.weight"].float().numpy(), values[30:])


def test_a_borrowed_tokenizer_brings_its_bos_and_eos_ids(script, tmp_path):
    """--tokenizer-from: a real model's tokenizer replaces the byte-level one, and the config's
    BOS / EOS ids are that tokenizer's."""
    from transformers import AutoTokenizer

    source = tmp_path / "source"
    script.write_tokenizer(source, 300)
    config, _ = script.parameters(script.SHAPES["qwen2.5-0.5b"])
    config.bos_token_id = config.eos_token_id = 99
    script.copy_tokenizer(source, tmp_path / "out", config)
    copied = AutoTokenizer.from_pretrained(tmp_path / "out")
    assert (config.bos_token_id, config.eos_token_id) == (0, 1) == (copied.bos_token_id, copied.eos_token_id)
    assert copied.encode("hi there") == AutoTokenizer.from_pretrained(source).encode("hi there")
    config.vocab_size = 100
    with pytest.raises(SystemExit, match="more than this shape's"):
        script.copy_tokenizer(source, tmp_path / "small", config)
