"""Activation outlier channels in float beside MatMulNBits: found from the fp32 graphs, exact in
float, rows independent, and much closer to x @ W than int8 activations over the whole row."""
import numpy as np
import onnx
import pytest
from test_quantize import INT4_ROW_BLOCK, _matmul_model, _session, assert_rows_independent

from specdeploy.bundle import manifest as manifest_io
from specdeploy.quantization import compute, nbits, outliers
from specdeploy.quantization.quantize import quantize
from specdeploy.quantization.options import QuantizeOptions


def test_outlier_channels_are_the_few_far_above_the_median_channel():
    flat = np.ones(64, np.float32)
    spiky = flat.copy()
    spiky[[3, 40]] = [50.0, 9.0]
    many = np.concatenate([np.full(60, 100.0), flat[:4]])  # "outliers" are most of K: none stand out
    chosen = outliers.outlier_channels({"a": flat, "b": spiky, "c": many * 0 + flat, "d": spiky * 0})
    assert list(chosen) == ["b"] and chosen["b"].tolist() == [3, 40]
    capped = np.ones(64, np.float32)
    capped[:10] = np.arange(10, 20)  # ten candidates, cap 64 / 16 = 4: the four largest
    assert outliers.outlier_channels({"x": capped})["x"].tolist() == [6, 7, 8, 9]
    assert not outliers.outlier_channels({"x": many})


def test_channel_maxima_reads_every_weight_matmuls_input(tmp_path):
    weight = np.random.default_rng(0).normal(size=(32, 8)).astype(np.float32)
    path = tmp_path / "g.onnx"
    onnx.save(_matmul_model(weight), str(path))
    xs = [np.random.default_rng(i).normal(size=(1, 5, 32)).astype(np.float32) for i in (1, 2)]
    maxima = outliers.channel_maxima(path, [lambda x=x: {"x": x} for x in xs])
    np.testing.assert_array_equal(maxima["x"], np.abs(np.concatenate(xs, 1)).max(axis=(0, 1)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.onnx"]  # the probe graph is gone


def _decomposed(weight, channels, bits=8, method="absmax"):
    model = _matmul_model(weight)
    compute._own_blocks(model, compute.ComputeForm(bits=bits, block_size=32), method, None,
                        {"x": channels} if channels is not None else None)
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("bits, method", [(8, "absmax"), (4, "minmax")])
def test_outlier_channels_in_float_keep_x_at_w_and_rows_independent(bits, method):
    """An outlier channel 300x its neighbours wipes out its block's other channels under int8
    activations; masked out and added in float, the product is several times closer to x @ W
    (int4 minmax: with the offset term, which still sums the whole row), row by row bitwise."""
    rng = np.random.default_rng(7)
    k, n, rows = 128, 48, 5
    weight = rng.normal(size=(k, n)).astype(np.float32)
    x = rng.normal(size=(1, rows, k)).astype(np.float32)
    x[..., [5, 70]] *= 300.0
    channels = np.array([5, 70])
    plain, split = _session(_decomposed(weight, None, bits, method)), _session(_decomposed(weight, channels, bits, method))
    dequantized = nbits.quantize(weight, bits, 32, method).dequantize()  # [K, N]: what both hold
    want = x @ dequantized
    error = lambda s: np.abs(s.run(None, {"x": x})[0] - want).max()  # noqa: E731
    assert error(split) < error(plain) / 4
    if bits == 8 or INT4_ROW_BLOCK == 32:  # this test's 4-bit blocks are 32 wide
        assert_rows_independent(split, x)
    ops = [nd.op_type for nd in _decomposed(weight, channels, bits, method).graph.node]
    assert ops[:3] == ["Mul", "Gather", "MatMulNBits"] and ops[3:5] == ["MatMul", "Add"]


def test_the_tensorrt_form_keeps_the_outlier_term():
    from specdeploy.quantization import tensorrt_form

    rng = np.random.default_rng(8)
    weight = rng.normal(size=(64, 16)).astype(np.float32)
    model = _decomposed(weight, np.array([9]))
    assert tensorrt_form.convert(model) == 1
    x = rng.normal(size=(1, 3, 64)).astype(np.float32)
    want = x @ nbits.quantize(weight, 8, 32, "absmax").dequantize()
    np.testing.assert_allclose(_session(model, optimize=False).run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-3)


def test_int8_bundles_compute_outlier_channels_in_float_and_stay_exact(tiny_bundle, tmp_path, monkeypatch):
    """The tiny random model has no real outliers: a looser rule makes some, to check the wiring."""
    rule = outliers.outlier_channels
    monkeypatch.setattr(outliers, "outlier_channels", lambda maxima: rule(maxima, factor=1.5))
    lines = []
    out = quantize(tiny_bundle, tmp_path / "int8", QuantizeOptions("int8"), echo=lines.append)
    m = manifest_io.read(out)
    found = m.extra["float_outlier_channels"]
    assert found["draft"] > 0 and found["verify"] > 0 and m.row_check["passed"]
    assert m.quality["greedy_identical"]
    assert any("activation outlier channels" in line for line in lines)
    verify = onnx.load(str(out / m.graph("verify").file), load_external_data=False)
    gathers = [nd for nd in verify.graph.node if nd.op_type == "Gather" and nd.name.endswith(".outliers")]
    assert len(gathers) >= 1
    off = quantize(tiny_bundle, tmp_path / "int4", QuantizeOptions("int4", report=False), echo=lambda line: None)
    assert "float_outlier_channels" not in manifest_io.read(off).extra  # int4: off unless asked


def test_float_outliers_where_they_cannot_apply_is_a_clear_error(tiny_bundle, tmp_path):
    from specdeploy.errors import ConfigError
    from specdeploy.quantization.compute import ComputeOptions

    for precision, method in (("int8", "ort"), ("fp16", "rtn")):
        with pytest.raises(ConfigError, match="--float-outliers applies to int4 / int8"):
            quantize(tiny_bundle, tmp_path / precision,
                     QuantizeOptions(precision, method=method, report=False,
                                     compute=ComputeOptions(float_outliers=True)), echo=lambda line: None)
        assert not (tmp_path / precision).exists()
