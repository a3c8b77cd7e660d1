"""bench/roofline.py: the weight bytes a step reads (a bundle's, a GGUF's) and what a pass over
more rows costs in one-row steps."""
import numpy as np
import pytest

from specdeploy.bench import roofline
from specdeploy.runtime.costs import CostModel


def _external(name: str, dims: list[int], offset: int):
    """A float32 initializer pointing into weights.bin at `offset` (nothing is read)."""
    from onnx import TensorProto

    tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=dims, data_location=TensorProto.EXTERNAL)
    length = 4 * int(np.prod(dims))
    for key, value in (("location", "weights.bin"), ("offset", str(offset)), ("length", str(length))):
        tensor.external_data.add(key=key, value=value)
    return tensor


def test_a_bundles_step_reads_every_matmul_weight_once_and_no_gathered_table(tmp_path):
    """The draft graph gathers from a table and multiplies by W1; verify by W2; the head by W1's
    bytes again (a tied head): a step reads W1 and W2 once each, not the table."""
    from types import SimpleNamespace

    import onnx
    from onnx import helper

    graphs = {"draft": [("Gather", _external("table", [50, 8], 0)), ("MatMul", _external("w1", [8, 8], 1600))],
              "verify": [("MatMul", _external("w2", [8, 16], 1856))],
              "head": [("MatMul", _external("tied", [8, 8], 1600))]}
    for name, nodes in graphs.items():
        graph = helper.make_graph([helper.make_node(op, ["x", t.name], [f"y{i}"]) for i, (op, t) in enumerate(nodes)],
                                  name, [], [], [t for _, t in nodes])
        onnx.save(helper.make_model(graph), str(tmp_path / f"{name}.onnx"))
    manifest = SimpleNamespace(graphs={name: SimpleNamespace(file=f"{name}.onnx") for name in graphs})
    assert roofline.bundle_weight_bytes(tmp_path, manifest) == 4 * (8 * 8 + 8 * 16)


@pytest.mark.parametrize("tied", [True, False])
def test_a_gguf_steps_bytes_leave_out_an_untied_embedding(tmp_path, checkpoint_script, tied):
    import gguf

    shape = dict(checkpoint_script.SHAPES["qwen2.5-0.5b"], hidden_size=64, num_hidden_layers=2, intermediate_size=96,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=400, tie_word_embeddings=tied)
    config, params = checkpoint_script.parameters(shape)
    path = tmp_path / "m.gguf"
    checkpoint_script.write_gguf(path, config, params)
    tensors = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(str(path)).tensors}
    expected = sum(tensors.values()) - (0 if tied else tensors["token_embd.weight"])
    assert roofline.gguf_weight_bytes(path) == expected


def test_pass_costs_and_the_roofline_fraction():
    costs = CostModel(num_layers=4, layer_step_s=1e-3, layer_rows_s={1: 1e-3, 2: 1.1e-3, 3: 1.3e-3},
                      head_s={1: 1e-3, 2: 1.2e-3, 3: 1.4e-3}, draft_head_s=1e-3)
    assert roofline.pass_costs(costs, 8) == {1: 1.0, 2: 1.12, 3: 1.32}
    found = roofline.roofline(weight_bytes=10**9, bandwidth=20e9, step_s=0.1)
    assert found == {"weight_gb": 1.0, "read_gb_s": 20.0, "roofline_tok_s": 20.0, "step_tok_s": 10.0, "fraction": 0.5}


def test_the_read_bandwidth_probe_reads_something_plausible():
    bandwidth = roofline.read_bandwidth(threads=1, size=1 << 24, repeats=2)
    assert 1e8 < bandwidth < 1e13


def test_the_probe_reads_every_word_with_the_operator_library_or_numpy(monkeypatch):
    """The library's reduction ORs every word it is given (a bit set anywhere shows); without the
    library the probe still measures, by NumPy's reduction."""
    pytest.importorskip("onnxruntime")
    from specdeploy import kernels

    if kernels.unavailable():
        pytest.skip(kernels.unavailable())
    kernels.ensure()
    reduce = roofline._library_read()
    for where in (0, 1, 2, 3, 1001, 1023):
        data = np.zeros(1024, np.uint64)
        data[where] = 1 << (where % 64)
        assert reduce(data) == 1 << (where % 64)
    monkeypatch.setattr(roofline, "_library_read", lambda: None)
    assert 1e8 < roofline.read_bandwidth(threads=1, size=1 << 24, repeats=2) < 1e13
