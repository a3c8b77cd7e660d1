"""A source's own precision: a quantized GGUF keeps it, a Hugging Face directory exports at fp32."""
from collections import Counter

import numpy as np
import pytest

from specdeploy.export import source_precision


@pytest.mark.parametrize("counts, expected", [
    (Counter(Q4_1=100), "int4"),
    (Counter(Q4_K=70, Q6_K=30), "int4"),          # Q4_K_M: 4-bit body, some 6-bit layers
    (Counter(Q8_0=100), "int8"),
    (Counter(Q5_0=60, Q4_0=40), "int8"),
    (Counter(F16=100), "fp32"),
    (Counter(F32=60, Q8_0=40), "fp32"),
    (Counter(), "fp32"),
])
def test_the_bulk_of_the_layer_weights_decides(counts, expected):
    assert source_precision.of_gguf(counts) == expected


def _write_gguf(path, kind):
    gguf = pytest.importorskip("gguf")
    from gguf import quants

    writer = gguf.GGUFWriter(str(path), "llama")
    rng = np.random.default_rng(0)
    qtype = getattr(gguf.GGMLQuantizationType, kind)
    for name in ("blk.0.attn_q.weight", "blk.0.ffn_up.weight"):
        raw = quants.quantize(rng.normal(size=(64, 64)).astype(np.float32), qtype)
        writer.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qtype)
    writer.add_tensor("token_embd.weight", rng.normal(size=(32, 64)).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("kind, expected", [("Q4_1", "int4"), ("Q8_0", "int8")])
def test_a_gguf_file_is_read_for_its_layer_weight_types(tmp_path, kind, expected):
    path = _write_gguf(tmp_path / "m.gguf", kind)
    counts = source_precision.layer_weight_types(path)
    assert set(counts) == {kind} and sum(counts.values()) == 2 * 64 * 64  # the embedding is not a layer weight
    precision, line = source_precision.choose(path)
    assert precision == expected
    assert line.startswith(f"precision {expected}: the file's own (layer weights {kind} 100%), its blocks carried; "
                           "--precision fp32|") and line.endswith(" chooses another")


def test_a_hugging_face_directory_stays_float(tiny_model_dir):
    precision, line = source_precision.choose(tiny_model_dir)
    assert precision == "fp32" and "--precision int4" in line
