"""Each layer's attention as one GroupQueryAttention kernel (quantization/attention.py, gqa_probe.py)."""
import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from specdeploy.bundle import manifest as manifest_io
from specdeploy.cli import main
from specdeploy.config import GenerationConfig
from specdeploy.errors import BackendError
from specdeploy.quantization import tensorrt_form
from specdeploy.optimize.gqa_probe import kernel_row_independent
from specdeploy.quantization.quantize import quantize
from specdeploy.quantization.options import QuantizeOptions
from specdeploy.runtime.engine import Engine

FUSED_HERE = kernel_row_independent(4, 2, 16)  # the tiny models' heads: 4 query, 2 KV, 16 wide


@pytest.fixture(scope="module")
def int4_bundle(tiny_bundle, tmp_path_factory):
    lines = []
    out = quantize(tiny_bundle, tmp_path_factory.mktemp("attention") / "int4", QuantizeOptions("int4", report=False), echo=lines.append)
    return out, lines


def test_the_probe_refuses_what_the_kernel_refuses():
    """ONNX Runtime's kernel takes head sizes in multiples of 16: a probe that runs it says no to 8
    (and the rewrite never matches such a layer)."""
    assert kernel_row_independent(4, 1, 8) is False


def test_a_quantized_bundle_says_which_attention_it_runs(int4_bundle):
    bundle, lines = int4_bundle
    m = manifest_io.read(bundle)
    if FUSED_HERE:
        assert m.fused_attention == {"draft": 2, "verify": 2}
        assert "attention: one GroupQueryAttention kernel a layer (draft 2, verify 2 layers)" in lines
        assert m.kv_spare_rows == 1 and m.kv_shape == (1, 2, 129, 16)
    else:  # the kernel's rows depend on the call on this machine: op by op, said so
        assert not m.fused_attention and m.kv_spare_rows == 0
        assert any(line.startswith("attention: op by op") for line in lines)
    assert m.row_check["passed"]


@pytest.mark.skipif(not FUSED_HERE, reason="GroupQueryAttention's rows depend on the call on this machine")
def test_a_fused_bundle_decodes_exactly_up_to_its_last_row(int4_bundle):
    """The padded row of a call that ends at max_context lands in the spare KV row; speculative
    output equals plain output to the end of the context."""
    bundle, _ = int4_bundle
    prompt = [int(t) for t in np.random.default_rng(3).integers(2, 96, 40)]
    cfg = dict(max_new_tokens=128 - len(prompt), ignore_eos=True)
    with Engine(bundle) as engine:
        plain = engine.generate_ids(prompt, GenerationConfig(speculative=False, **cfg))
        assert len(plain) == 88
        for source in ("early_exit", "lookup", "hybrid"):
            spec = engine.generate_ids(prompt, GenerationConfig(num_draft_tokens=4, draft_source=source, **cfg))
            assert spec == plain, source


@pytest.mark.skipif(not FUSED_HERE, reason="GroupQueryAttention's rows depend on the call on this machine")
def test_fused_attention_runs_on_the_cpu_provider_only(int4_bundle):
    from specdeploy.backends.onnxruntime import load_stages

    bundle, _ = int4_bundle
    with pytest.raises(BackendError, match="export it with --target cuda"):
        load_stages(bundle, manifest_io.read(bundle), provider="cuda")
    graph = manifest_io.read(bundle).graph("verify")
    with pytest.raises(ValueError, match="--tensorrt"):
        tensorrt_form.write(bundle / graph.file, bundle / "verify.trt.onnx")


def test_attention_ops_keeps_the_exported_form(tiny_bundle, tmp_path):
    out = tmp_path / "ops"
    result = CliRunner().invoke(main, ["quantize", str(tiny_bundle), "--precision", "int4", "--attention", "ops",
                                       "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "attention: op by op (as asked (--attention ops))" in result.output
    m = manifest_io.read(out)
    assert not m.fused_attention and m.kv_shape[2] == m.max_context
    ops = {n.op_type for n in onnx.load(str(out / m.graph("draft").file), load_external_data=False).graph.node}
    assert "GroupQueryAttention" not in ops and "RotaryEmbedding" in ops


def test_a_row_dependent_fused_bundle_is_refused_with_the_way_out(int4_bundle, monkeypatch):
    from specdeploy.errors import RowDependenceError
    from specdeploy.runtime import row_check

    bundle, _ = int4_bundle
    manifest = manifest_io.read(bundle)
    monkeypatch.setattr(row_check, "check_bundle", lambda *a, **k: row_check.RowCheck(False, {"verify": 1e-7}, "m"))
    fused = manifest.replace(fused_attention={"draft": 2, "verify": 2})
    with pytest.raises(RowDependenceError, match="or quantize with --attention ops"):
        row_check.require(bundle, fused, echo=lambda s: None)
    plain = manifest.replace(fused_attention={})
    with pytest.raises(RowDependenceError) as refused:
        row_check.require(bundle, plain, echo=lambda s: None)
    assert "--attention ops" not in str(refused.value)


def test_the_shipped_window_probe_is_the_model_the_code_makes():
    from specdeploy.backends import attention_window
    from specdeploy.optimize.gqa_probe import window_probe_model

    assert onnx.load(str(attention_window.PROBE)).SerializeToString() == window_probe_model().SerializeToString()
    assert attention_window.shift() in (0, 1)  # the two counts measured (ONNX Runtime 1.32, 1.23)


@pytest.mark.parametrize("form", [dict(packed=False), dict(softcap=3.0), dict(window=4), dict(rotary=False)])
def test_the_probe_runs_every_form_the_rewrite_makes(form):
    """Apart q/k/v, soft-capping, a window, no rotary: each configuration the rewrite emits is
    probed with those attributes (on this machine the kernel keeps rows independent for all, or for
    none when it does not for the plain form either)."""
    assert kernel_row_independent(4, 2, 16, **form) == FUSED_HERE
