"""`--target`: one option picks the graph forms, the manifest records it, the GPU targets' graphs are
checked against their kernel tables, and a bundle meets the provider it was made for."""
import onnxruntime as ort
import pytest
from click.testing import CliRunner

from specdeploy.backends import onnxruntime as ort_backend
from specdeploy.bundle import manifest as manifest_io
from specdeploy.checks import kernel_coverage as kc
from specdeploy.cli import main
from specdeploy.config import target_form
from specdeploy.errors import BackendError, ConfigError
from specdeploy.export import ExportConfig

unit = pytest.mark.unit


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@unit
@pytest.mark.parametrize("target, kernel, fused, tensorrt, opset", [
    ("cpu", None, True, False, None), ("cuda", "matmulnbits", False, False, None),
    ("tensorrt", "matmulnbits", False, True, None), ("jetson-orin", "matmulnbits", False, True, 23)])
def test_each_target_picks_its_forms(target, kernel, fused, tensorrt, opset):
    form = target_form(target, "auto", None)
    assert (form.int4_kernel, form.fused_attention, form.tensorrt_form, form.opset) == (kernel, fused, tensorrt, opset)


@unit
def test_export_options_follow_the_target(tmp_path):
    config = ExportConfig(source=tmp_path, exit_layer=2, target="jetson-orin", precision="int8")
    assert config.opset == 23 and config.int4_kernel == "matmulnbits"
    options = config.quantize_options()
    assert options.tensorrt and not options.compute.fused_attention and options.target == "jetson-orin"
    assert ExportConfig(source=tmp_path, exit_layer=2).opset == 24


@unit
@pytest.mark.parametrize("options, fragment", [
    (dict(target="cuda", int4_kernel="specdeploy"), "specdeploy's CPU operators"),
    (dict(target="jetson-orin", opset=24), "needs --opset 23"),
    (dict(target="jetson-orin", precision="fp8"), "no fp8"),
    (dict(target="gpu"), "target 'gpu' is unknown")])
def test_options_a_target_cannot_take_are_refused(tmp_path, options, fragment):
    with pytest.raises(ConfigError, match=fragment):
        ExportConfig(source=tmp_path, exit_layer=2, **options)


@pytest.mark.integration  # quantizes: not the fast tier
def test_quantize_for_cuda_records_the_target_and_reports_every_kernel(tiny_bundle, tmp_path):
    out = tmp_path / "cuda.plan"
    result = cli("quantize", tiny_bundle, "--precision", "int4", "--target", "cuda", "-o", out)
    assert result.exit_code == 0, result.output
    assert "kernels: every operator of the graphs has one on --target cuda (CUDAExecutionProvider of 1.31.1)" \
        in result.output
    manifest = manifest_io.read(out)
    assert manifest.target == "cuda" and not manifest.operators and kc.check(out, "cuda") == []
    refused = cli("quantize", tiny_bundle, "--precision", "int4", "--target", "cuda", "--attention", "fused",
                  "-o", tmp_path / "x")
    assert refused.exit_code == 1 and "drop --attention" in refused.output


@pytest.mark.integration  # quantizes: not the fast tier
def test_a_cpu_bundle_is_refused_on_cuda_naming_the_target(tiny_bundle, tmp_path):
    cpu = tmp_path / "cpu.plan"
    assert cli("quantize", tiny_bundle, "--precision", "int4", "-o", cpu).exit_code == 0
    with pytest.raises(BackendError, match="made for --target cpu.*export it with --target cuda"):
        ort_backend.check_provider(manifest_io.read(cpu), "cuda")


class SessionSeen(Exception):
    pass


@pytest.mark.integration  # quantizes: not the fast tier
def test_provider_cuda_takes_a_cuda_bundle_with_the_session_it_needs(tiny_bundle, tmp_path, monkeypatch):
    """No onnxruntime-gpu here: the provider's absence is one line; with it (its provider list and
    session faked), the CUDA bundle's graphs reach a session with the CUDA provider first."""
    cuda = tmp_path / "cuda.plan"
    assert cli("quantize", tiny_bundle, "--precision", "int4", "--target", "cuda", "-o", cuda).exit_code == 0
    manifest = manifest_io.read(cuda)
    with pytest.raises(BackendError, match="no CUDAExecutionProvider; install onnxruntime-gpu"):
        ort_backend.load_stages(cuda, manifest, provider="cuda")
    seen = {}

    def session(path, options, providers, provider_options):
        seen.update(path=path, providers=providers, options=options)
        raise SessionSeen("the session a GPU machine would make")

    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(ort, "InferenceSession", session)
    monkeypatch.setattr(ort_backend, "anonymous_regions", lambda: None)
    with pytest.raises((SessionSeen, BackendError)):
        ort_backend.load_stages(cuda, manifest, provider="cuda")
    assert seen["providers"] == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert seen["path"].endswith(manifest.graphs[next(iter(manifest.graphs))].file)
    assert kc.check(cuda, "cuda") == []


@pytest.mark.integration  # an export: not the fast tier
def test_jetson_orin_bundles_fit_tensorrt_10_1(tiny_model_dir, tmp_path):
    from specdeploy.export import export

    out = export(ExportConfig(source=tiny_model_dir, exit_layer=2, max_context=128, output=tmp_path / "j.plan",
                              precision="int8", target="jetson-orin"), echo=lambda s: None)
    manifest = manifest_io.read(out)
    assert manifest.target == "jetson-orin" and manifest.opset == 23
    assert all(g.tensorrt_file for g in manifest.graphs.values())
    assert kc.summary(kc.check(out, "jetson-orin")) == []
