"""Loading a GGUF parses the file once (transformers alone parses it for the config, the tokenizer
and the weights: ~5 s each for the example, ~20 s for Gemma 3's 262k-token vocabulary)."""
from pathlib import Path

import pytest

EXAMPLE_GGUF = Path(__file__).resolve().parents[2] / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture
def parses(monkeypatch):
    """Paths every GGUFReader construction parsed, in order."""
    gguf = pytest.importorskip("gguf")
    seen, original = [], gguf.GGUFReader

    def counting(path, mode="r"):
        seen.append(Path(path).name)
        return original(path, mode)

    monkeypatch.setattr(gguf, "GGUFReader", counting)
    return seen


@pytest.mark.integration  # a whole export (or Hugging Face generate): not the fast tier
def test_a_gguf_export_load_parses_the_file_once(parses):
    if not EXAMPLE_GGUF.is_file():
        pytest.skip(f"example model not fetched ({EXAMPLE_GGUF}); run scripts/fetch_model.sh")
    from specdeploy.export.arch import load

    model, tokenizer = load(EXAMPLE_GGUF)
    assert parses == [EXAMPLE_GGUF.name]
    assert model.config.num_hidden_layers == 30 and tokenizer("Hi").input_ids


def test_readers_are_shared_only_inside_the_block_and_per_file(parses, tmp_path):
    import gguf

    from specdeploy.export.gguf_reads import parsed_once

    files = []
    for name in ("a.gguf", "b.gguf"):
        writer = gguf.GGUFWriter(tmp_path / name, "llama")
        writer.add_uint32("test.value", len(files))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.close()
        files.append(tmp_path / name)
    with parsed_once():
        with parsed_once():  # nested: the outer block's readers
            first = gguf.GGUFReader(files[0])
        assert gguf.GGUFReader(str(files[0])) is first
        assert gguf.GGUFReader(files[1]) is not first
    assert parses == ["a.gguf", "b.gguf"]
    gguf.GGUFReader(files[0])
    assert parses == ["a.gguf", "b.gguf", "a.gguf"]
