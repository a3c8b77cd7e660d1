"""GPTQ: the same grid and layout as round-to-nearest, a smaller error where it counts (x @ W over
correlated activations), and round-to-nearest itself when the activations do not correlate."""
import numpy as np
import onnx
import pytest
from test_quantize import INT4_ROW_BLOCK, _matmul_model, _session, assert_rows_independent

from specdeploy.quantization import compute, gptq, nbits


def _activations(rng, rows=3000, k=128):
    """Rows [rows, K] spanning few directions, with one channel far above the rest (as in LLMs)."""
    x = rng.normal(size=(rows, k // 8)) @ rng.normal(size=(k // 8, k)) + 0.1 * rng.normal(size=(rows, k))
    x[:, 5] *= 20.0
    return x.astype(np.float32)


@pytest.mark.parametrize("bits, grid", [(4, "absmax"), (4, "minmax"), (8, "absmax")])
def test_gptq_keeps_the_grid_and_cuts_the_output_error(bits, grid):
    rng = np.random.default_rng(3)
    x, w = _activations(rng), (rng.normal(size=(128, 48)) + 0.4).astype(np.float32)
    h = x.T.astype(np.float64) @ x
    nearest, rounded = nbits.quantize(w, bits, 32, grid), gptq.quantize(w, h, bits, 32, grid)
    np.testing.assert_array_equal(rounded.scales, nearest.scales)  # the grid is round-to-nearest's
    if grid == "minmax":
        np.testing.assert_array_equal(rounded.offsets, nearest.offsets)
    top = 2 ** (bits - 1)
    assert rounded.q.shape == nearest.q.shape and rounded.q.min() >= -top and rounded.q.max() < top
    error = gptq.output_error(w, rounded.dequantize(), h)
    direct = float(((x.astype(np.float64) @ (w - rounded.dequantize())) ** 2).sum())
    assert error == pytest.approx(direct, rel=1e-6)  # trace(dWᵀ H dW) is the error over the rows
    assert error < gptq.output_error(w, nearest.dequantize(), h) / 5


def test_gptq_over_uncorrelated_activations_is_round_to_nearest():
    """With H diagonal no row's error has anywhere to go: every weight rounds to nearest."""
    rng = np.random.default_rng(4)
    w = rng.normal(size=(64, 16)).astype(np.float32)
    h = np.diag(rng.uniform(0.5, 2.0, 64))
    for grid in ("absmax", "minmax"):
        np.testing.assert_array_equal(gptq.quantize(w, h, 4, 16, grid).q, nbits.quantize(w, 4, 16, grid).q)


@pytest.mark.parametrize("gathered, block", [(6, 512), (512, 12)])  # rows at once; H's rows a product makes
def test_gram_matrices_sum_each_weight_inputs_rows(tmp_path, monkeypatch, gathered, block):
    monkeypatch.setattr(gptq, "GRAM_ROWS", gathered)
    monkeypatch.setattr(gptq, "GRAM_BLOCK", block)  # 12: K = 32 in blocks of 12, 12 and 8, two mirrored
    weight = np.random.default_rng(0).normal(size=(32, 8)).astype(np.float32)
    path = tmp_path / "g.onnx"
    onnx.save(_matmul_model(weight), str(path))
    xs = [np.random.default_rng(i).normal(size=(1, 5, 32)).astype(np.float32) for i in (1, 2, 3)]
    grams = gptq.gram_matrices(path, [lambda x=x: {"x": x} for x in xs])
    rows = np.concatenate(xs, 1)[0].astype(np.float64)
    np.testing.assert_allclose(grams["x"], rows.T @ rows, rtol=1e-5, atol=1e-5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.onnx"]  # the probe graph is gone


def test_gptq_blocks_run_as_matmulnbits_with_rows_independent():
    rng = np.random.default_rng(5)
    x, w = _activations(rng), rng.normal(size=(128, 40)).astype(np.float32)
    h = x.T.astype(np.float64) @ x
    model = _matmul_model(w)
    block = INT4_ROW_BLOCK  # the block int4 bundles use on this CPU
    compute._own_blocks(model, compute.ComputeForm(bits=4, block_size=block), "gptq", grams={"x": h})
    onnx.checker.check_model(model)
    session = _session(model)
    rows = x[None, :6]
    want = rows @ gptq.quantize(w, h, 4, block, "minmax").dequantize()
    np.testing.assert_allclose(session.run(None, {"x": rows})[0], want, rtol=0.05, atol=0.05 * np.abs(want).max())
    assert_rows_independent(session, rows)


@pytest.mark.parametrize("k", [40, 1100])  # one triangular solve; halves inverted recursively
def test_the_inverse_factor_is_the_upper_cholesky_factor_of_the_damped_inverse(k):
    rng = np.random.default_rng(6)
    x = rng.normal(size=(k + 50, k))
    h = x.T @ x
    u = gptq._inverse_factor(h.astype(np.float32)).astype(np.float64)
    damped = h + np.eye(k) * gptq.DAMP * np.diag(h).mean()
    assert np.array_equal(u, np.triu(u)) and (np.diag(u) > 0).all()
    np.testing.assert_allclose(u.T @ u @ damped, np.eye(k), atol=2e-3)


def test_gptq_in_column_slices_rounds_as_the_whole_walk(monkeypatch):
    """Output columns never mix: walking W 64 MB at a time (COLUMNS) changes no weight's rounding
    beyond the last bits of float32 sums that may tip a rare tie."""
    rng = np.random.default_rng(7)
    x, w = _activations(rng), rng.normal(size=(128, 96)).astype(np.float32)
    h = x.T @ x
    whole = gptq.quantize(w, h, 4, 32, "minmax")
    monkeypatch.setattr(gptq, "COLUMNS", 128 * 20)  # slices of 20 columns, the last of 16
    sliced = gptq.quantize(w, h, 4, 32, "minmax")
    np.testing.assert_array_equal(sliced.scales, whole.scales)
    assert (sliced.q == whole.q).mean() > 0.995
    assert gptq.output_error(w, sliced.dequantize(), h) == pytest.approx(gptq.output_error(w, whole.dequantize(), h),
                                                                         rel=0.02)


def test_weights_reading_one_input_share_its_h_and_factor(tmp_path, monkeypatch):
    """q, k and v (gate and up) read one input: its H and the inverse's factor are made once."""
    made = []
    factor = gptq._inverse_factor
    monkeypatch.setattr(gptq, "_inverse_factor", lambda h: made.append(len(h)) or factor(h))
    weight = np.random.default_rng(0).normal(size=(32, 8)).astype(np.float32)
    path = tmp_path / "g.onnx"
    onnx.save(_matmul_model(weight), str(path))
    xs = [np.random.default_rng(i).normal(size=(1, 40, 32)).astype(np.float32) for i in (1, 2)]
    spilled = gptq.SpilledGrams(path, [lambda x=x: {"x": x} for x in xs])
    try:
        first, second = spilled.get("x"), spilled.get("x")
        assert first is second
        a, b = gptq.quantize(weight, first, 4, 16), gptq.quantize(weight[:, ::-1].copy(), second, 4, 16)
        assert made == [32] and a.q.shape == b.q.shape
    finally:
        spilled.close()


def test_a_graphs_spilled_activations_go_when_the_next_graph_asks_for_its_own(monkeypatch):
    """Graphs are rounded one after another: the draft graph's spilled rows and kept H are freed
    when the verify graph's are made, not held until the end."""
    from specdeploy.quantization import feeds

    class Spilled:
        def __init__(self, file, feeds, outputs=()):
            self.file, self.closed, self.outputs = file, False, {name: [] for name in outputs}

        def close(self):
            self.closed = True

    monkeypatch.setattr(gptq, "SpilledGrams", Spilled)
    calibration = feeds.Calibration(lambda: {"draft": [], "verify": []}, {}, {"draft": "d.onnx", "verify": "v.onnx"})
    grams = calibration.grams("draft")  # what the draft graph's matmuls call, each weight in turn
    draft = grams()
    assert grams() is draft is not None and not draft.closed
    verify = calibration.grams("verify")()
    assert draft.closed and not verify.closed
    calibration.close()
    assert verify.closed


def test_gptq_feeds_each_graph_the_hidden_states_its_spilling_pass_returned(tiny_bundle, monkeypatch):
    """No separate fp32 pass over the calibration text: the draft graph's spilling pass returns the
    exit hidden states the verify graph is fed, the verify graph's the head's; each H is the one
    the whole fp32 pass (the runtime's sessions) gives."""
    from specdeploy.bundle import io_names, manifest as manifest_io
    from specdeploy.quantization import feeds
    from specdeploy.quantization.compute import ComputeOptions

    manifest = manifest_io.read(tiny_bundle)
    texts = feeds.calibration_texts(None)[:4]
    plan = {name: "int4" for name in manifest.graphs}
    whole = feeds.calibration_feeds(tiny_bundle, manifest, texts)
    monkeypatch.setattr(feeds, "calibration_feeds", lambda *a, **k: pytest.fail("a separate feeding pass ran"))
    calibration = feeds.calibrate(tiny_bundle, manifest, plan, "gptq", ComputeOptions(), texts)
    try:
        for name in (io_names.DRAFT, io_names.VERIFY, io_names.HEAD):
            spilled = calibration.grams(name)()
            expected = gptq.gram_matrices(tiny_bundle / manifest.graph(name).file, whole[name])
            assert set(spilled._files) == set(expected)
            for key, h in expected.items():
                np.testing.assert_allclose(spilled.get(key).gram, h, rtol=1e-4, atol=1e-3 * np.abs(h).max())
        assert "feeds" not in calibration.__dict__
    finally:
        calibration.close()


def test_gptq_rounds_the_graphs_in_feeding_order_with_no_separate_feeding_pass(tiny_bundle, tmp_path, monkeypatch):
    """The manifest lists the head before the verify graph; GPTQ rounds the verify graph first so that
    the head is fed what the verify graph's spilling pass returned."""
    from specdeploy.quantization import feeds
    from specdeploy.quantization.options import QuantizeOptions
    from specdeploy.quantization.quantize import quantize

    assert feeds.feeding_order(["draft", "head", "verify"]) == ["draft", "verify", "head"]
    monkeypatch.setattr(feeds, "calibration_feeds", lambda *a, **k: pytest.fail("a separate feeding pass ran"))
    lines = []
    quantize(tiny_bundle, tmp_path / "q.plan", QuantizeOptions("int4"), echo=lines.append)
    assert [line.split(":")[0] for line in lines if line.startswith(("draft:", "verify:", "head:"))] == \
        ["draft", "verify", "head"]
    rows = [line for line in lines if line.startswith("gptq: Gram matrices over ")]
    assert len(rows) == 1 and int(rows[0].split()[4].replace(",", "")) % 32 == 0  # windows of 32 tokens


def test_a_graph_too_large_to_run_at_fp32_is_rounded_to_nearest_and_named(tiny_bundle, tmp_path, monkeypatch):
    """An 8B model's fp32 verify graph does not fit in a 24 GB machine's ONNX Runtime session: GPTQ
    rounds the graphs it can run (the draft graph); the verify graph, and the head it feeds, are
    rounded to nearest with the reason named, instead of the export being killed for memory."""
    from specdeploy.quantization.options import QuantizeOptions
    from specdeploy.quantization.quantize import quantize
    from specdeploy.runtime import split_model

    reason = "its weights (19.5 GiB) exceed 70% of the memory available here (21.9 GiB)"
    monkeypatch.setattr(split_model, "too_large", lambda bundle, manifest: {"verify": reason})
    asked = []
    monkeypatch.setattr(gptq, "SpilledGrams", lambda file, feeds, outputs=(), real=gptq.SpilledGrams:
                        asked.append(file.name) or real(file, feeds, outputs))
    lines = []
    quantize(tiny_bundle, tmp_path / "q.plan", QuantizeOptions("int4", report=False), echo=lines.append)
    graphs = {line.split(":")[0]: line for line in lines if line.startswith(("draft:", "verify:", "head:"))}
    assert asked == ["draft.onnx"] and "rounded to nearest" not in graphs["draft"]
    assert f"rounded to nearest, not by GPTQ: its fp32 pass would not fit here: {reason}" in graphs["verify"]
    assert "rounded to nearest, not by GPTQ: it is fed the verify graph's fp32 pass" in graphs["head"]


def test_gptq_logs_its_calibration_tokens_when_outliers_made_the_feeds_first(tiny_bundle, tmp_path):
    """int8 finds activation outlier channels, which make the whole feeding pass before GPTQ runs:
    the log still says how many calibration tokens GPTQ's Gram matrices came from."""
    from specdeploy.quantization.options import QuantizeOptions
    from specdeploy.quantization.quantize import quantize

    lines = []
    quantize(tiny_bundle, tmp_path / "q.plan", QuantizeOptions("int8", method="gptq", report=False), echo=lines.append)
    rows = [line for line in lines if line.startswith("gptq: Gram matrices over ")]
    assert len(rows) == 1 and int(rows[0].split()[4].replace(",", "")) % 32 == 0
