"""The TensorRT build and binding logic, run on the CPU against a faithful fake of the API."""
import shutil

import numpy as np
import pytest

import fake_tensorrt
from specdeploy.bundle import manifest as manifest_io
from specdeploy.backends.tensorrt.build import BuildConfig, build_engines, profiles
from specdeploy.config import GenerationConfig
from specdeploy.errors import BackendError, BundleError, ConfigError, MissingDependencyError
from specdeploy.quantization.quality import teacher_forced_logits
from specdeploy.runtime.engine import Engine


@pytest.fixture
def trt_bundle(tiny_bundle, tmp_path, monkeypatch):
    bundle = tmp_path / "trt"
    shutil.copytree(tiny_bundle, bundle)
    fake_tensorrt.install(monkeypatch)
    build_engines(bundle, BuildConfig(max_draft_tokens=6, max_prompt=64), echo=lambda s: None)
    return bundle


@pytest.fixture
def cudart(trt_bundle):
    import sys

    return sys.modules["cuda.bindings.runtime"]


def test_engines_are_recorded_with_version_and_gpu(trt_bundle):
    record = manifest_io.read(trt_bundle).tensorrt
    assert record["version"] == "10.3.0" and record["compute_capability"] == "8.7"
    assert all(len(e["profiles"]) == 2 for e in record["engines"].values())  # decode + prefill, heads too
    assert record["engines"]["verify"]["file"] == "verify.trt"
    assert (trt_bundle / record["engines"]["verify"]["file"]).is_file()
    assert fake_tensorrt.Builder.created_flags[-1] == 1 << 1  # TensorRT 10: STRONGLY_TYPED requested


def test_tensorrt_backend_decodes_exactly_like_onnxruntime(trt_bundle):
    prompt = [int(t) for t in np.random.default_rng(0).integers(2, 96, 12)]
    cfg = dict(max_new_tokens=30, ignore_eos=True)
    with Engine(trt_bundle) as ort_engine:
        expected = ort_engine.generate_ids(prompt, GenerationConfig(speculative=False, **cfg))
    with Engine(trt_bundle, backend="tensorrt") as engine:
        assert engine.generate_ids(prompt, GenerationConfig(speculative=False, **cfg)) == expected
        assert engine.generate_ids(prompt, GenerationConfig(num_draft_tokens=4, **cfg)) == expected
        assert engine.generate_ids(prompt, GenerationConfig(draft_source="hybrid", **cfg)) == expected


def test_kv_outputs_share_the_input_address(trt_bundle):
    with Engine(trt_bundle, backend="tensorrt") as engine:
        stage = engine.model.stages["draft"]
        for ctx in stage.contexts:
            assert ctx.addresses["present_key.0"] == ctx.addresses["past_key.0"]
            assert ctx.addresses["present_value.1"] == ctx.addresses["past_value.1"]


def test_prompt_beyond_prefill_profile_is_prefilled_in_profile_sized_chunks(trt_bundle):
    prompt, config = list(range(2, 82)), GenerationConfig(max_new_tokens=8, speculative=False)
    with Engine(trt_bundle, prefill_chunk=64) as ort_engine:
        expected = ort_engine.generate_ids(prompt, config)
    with Engine(trt_bundle, backend="tensorrt") as engine:
        assert engine.model.max_rows == 64 and engine.decoder.prefill_chunk == 64
        assert engine.generate_ids(prompt, config) == expected


def test_head_runs_teacher_forced_prompts_and_drafts_beyond_the_decode_profile(trt_bundle):
    """The head has a prefill profile: logits over a whole prompt, and γ above --max-draft-tokens."""
    prompt = [int(t) for t in np.random.default_rng(3).integers(2, 96, 40)]
    with Engine(trt_bundle) as ort_engine:
        expected = teacher_forced_logits(ort_engine, prompt)
        plain = ort_engine.generate_ids(prompt, GenerationConfig(max_new_tokens=20, speculative=False, ignore_eos=True))
    with Engine(trt_bundle, backend="tensorrt") as engine:
        assert np.abs(teacher_forced_logits(engine, prompt) - expected).max() < 1e-4
        spec = engine.generate_ids(prompt, GenerationConfig(max_new_tokens=20, num_draft_tokens=10,
                                                            draft_source="early_exit", ignore_eos=True))
        assert spec == plain


def test_close_frees_every_device_buffer_and_the_stream(trt_bundle, cudart):
    engine = Engine(trt_bundle, backend="tensorrt")
    allocated = set(cudart.memory)
    assert allocated and not cudart.freed
    engine.close()
    assert set(cudart.freed) == allocated and len(cudart.freed) == len(allocated)  # each once
    assert cudart.destroyed_streams == cudart.streams[-1:]


def test_run_failures_are_backend_errors(trt_bundle, monkeypatch):
    with Engine(trt_bundle, backend="tensorrt") as engine:
        monkeypatch.setattr(fake_tensorrt.Context, "fail_runs", True)
        with pytest.raises(BackendError, match="failed to run"):
            engine.generate_ids([3, 4, 5], GenerationConfig(max_new_tokens=4))


def test_onnxruntime_settings_are_refused_not_ignored(trt_bundle):
    with pytest.raises(ConfigError, match="--provider cpu is an ONNX Runtime setting"):
        Engine(trt_bundle, backend="tensorrt", provider="cpu")
    with pytest.raises(ConfigError, match="threads"):
        Engine(trt_bundle, backend="tensorrt", threads=2)


def test_engines_from_another_tensorrt_or_gpu_are_refused(trt_bundle, monkeypatch):
    fake_tensorrt.install(monkeypatch, version="10.7.0")
    with pytest.raises(BundleError, match="rebuild them"):
        Engine(trt_bundle, backend="tensorrt")
    fake_tensorrt.install(monkeypatch, capability=(8, 6))
    with pytest.raises(BundleError, match="8.6"):
        Engine(trt_bundle, backend="tensorrt")


def test_tensorrt_11_networks_need_no_flag(tiny_bundle, tmp_path, monkeypatch):
    bundle = tmp_path / "b"
    shutil.copytree(tiny_bundle, bundle)
    fake_tensorrt.install(monkeypatch, version="11.4.1", capability=(9, 0))
    build_engines(bundle, echo=lambda s: None)
    assert fake_tensorrt.Builder.created_flags[-1] == 0


def test_fp8_is_refused_on_a_gpu_without_it(tiny_bundle, tmp_path, monkeypatch):
    bundle = tmp_path / "b"
    shutil.copytree(tiny_bundle, bundle)
    m = manifest_io.read(bundle)
    graphs = {n: g.__class__(**{**g.__dict__, "precision": "fp8"}) for n, g in m.graphs.items()}
    manifest_io.write(bundle, m.replace(graphs=graphs))
    fake_tensorrt.install(monkeypatch, capability=(8, 7))
    with pytest.raises(ConfigError, match="no FP8.*Jetson Orin"):
        build_engines(bundle, echo=lambda s: None)


def test_profiles_cover_decode_and_prefill(tiny_bundle):
    m = manifest_io.read(tiny_bundle)
    draft = profiles(m.graph("draft"), m, BuildConfig(max_draft_tokens=4, max_prompt=100))
    assert draft[0]["input_ids"] == ((1, 1), (1, 5), (1, 5))
    assert draft[1]["input_ids"][2] == (1, 100) and draft[0]["attention_mask"][2] == (1, 128)
    assert "past_key.0" not in draft[0]


def test_without_tensorrt_the_message_says_what_to_install(tiny_bundle, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "tensorrt", None)
    with pytest.raises(MissingDependencyError, match="tensorrt"):
        Engine(tiny_bundle, backend="tensorrt")


def _dequantized(model, name):
    from onnx import numpy_helper

    return numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == name))


def test_int4_and_int8_bundles_build_from_their_dequantize_form(tiny_bundle, tmp_path, monkeypatch):
    """TensorRT gets DequantizeLinear(block_size) weights holding exactly MatMulNBits' values (and,
    for folded offsets, the offset term holding the offsets the folded node computes with)."""
    import dataclasses

    import onnx

    from specdeploy.quantization import folding, nbits
    from specdeploy.quantization.quantize import QuantizeOptions, quantize

    fake_tensorrt.install(monkeypatch)
    for kind in ("int4", "int8", "int4-minmax"):
        precision, method = (kind.split("-") + ["rtn"])[:2]
        bundle = quantize(tiny_bundle, tmp_path / kind, QuantizeOptions(precision, report=False, tensorrt=True,
                                                                        method=method), echo=lambda s: None)
        manifest = manifest_io.read(bundle)
        for name, graph in manifest.graphs.items():
            ort_graph = onnx.load(str(bundle / graph.file))
            trt_graph = onnx.load(str(bundle / graph.tensorrt_file))
            assert not [n for n in trt_graph.graph.node if n.domain == "com.microsoft"]
            # the fused rotary goes back to the exporter's elementwise form (standard ops TensorRT parses)
            fused = "RotaryEmbedding" in {n.op_type for n in ort_graph.graph.node}
            assert fused == (name != "head") and "RotaryEmbedding" not in {n.op_type for n in trt_graph.graph.node}
            dq = {n.output[0]: n for n in trt_graph.graph.node if n.op_type == "DequantizeLinear"}
            for node in ort_graph.graph.node:
                if node.op_type != "MatMulNBits":
                    continue
                attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
                arrays = [_dequantized(ort_graph, name) for name in node.input[1:]]
                if len(arrays) == 3:  # folded: the symmetric values, the offsets as a float term
                    blocks = folding.unfold(*arrays, attrs["K"], attrs["bits"], attrs["block_size"])
                    out = node.output[0].removesuffix(".two_rows")  # TensorRT's form takes its own rows
                    np.testing.assert_array_equal(_dequantized(trt_graph, out + ".offsets"), blocks.offsets.T)
                    blocks = dataclasses.replace(blocks, offsets=None)
                else:
                    blocks = nbits.unpack(*arrays, attrs["bits"], attrs["block_size"])
                assert (len(arrays) == 3) == (kind == "int4-minmax")
                weight = dq[node.name + ".weight"]
                q = _dequantized(trt_graph, weight.input[0]).astype(np.float32)            # [K, N]
                scale = np.repeat(_dequantized(trt_graph, weight.input[1]), attrs["block_size"], axis=0)  # [K, N]
                assert (scale > 0).all()
                np.testing.assert_array_equal(q * scale, blocks.dequantize())
        build_engines(bundle, BuildConfig(max_draft_tokens=6, max_prompt=64), echo=lambda s: None)
        prompt = [int(t) for t in np.random.default_rng(1).integers(2, 96, 10)]
        cfg = dict(max_new_tokens=20, ignore_eos=True)
        with Engine(bundle, backend="tensorrt") as engine:
            plain = engine.generate_ids(prompt, GenerationConfig(speculative=False, **cfg))
            assert engine.generate_ids(prompt, GenerationConfig(num_draft_tokens=4, **cfg)) == plain


def test_an_int4_bundle_without_its_tensorrt_form_says_how_to_make_it(tiny_bundle, tmp_path, monkeypatch):
    from specdeploy.quantization.quantize import QuantizeOptions, quantize

    fake_tensorrt.install(monkeypatch)
    bundle = quantize(tiny_bundle, tmp_path / "int4", QuantizeOptions("int4", report=False), echo=lambda s: None)
    with pytest.raises(ConfigError, match="quantize --precision int4 --tensorrt"):
        build_engines(bundle, BuildConfig(max_draft_tokens=6, max_prompt=64), echo=lambda s: None)
    graph = manifest_io.read(bundle).graph("draft")
    network = fake_tensorrt.Network(0)
    assert not fake_tensorrt.OnnxParser(network, None).parse_from_file(str(bundle / graph.file))


def test_a_feature_head_builds_and_drafts_as_with_onnxruntime(head_bundle, tmp_path, monkeypatch):
    bundle = tmp_path / "trt-head"
    shutil.copytree(head_bundle[0], bundle)
    fake_tensorrt.install(monkeypatch)
    build_engines(bundle, BuildConfig(max_draft_tokens=6, max_prompt=64), echo=lambda s: None)
    engines = manifest_io.read(bundle).tensorrt["engines"]
    assert {"feature_fc", "feature_head"} <= set(engines)
    prompt = [int(t) for t in np.random.default_rng(1).integers(2, 96, 12)]
    config = GenerationConfig(max_new_tokens=20, ignore_eos=True, draft_source="feature", num_draft_tokens=3)
    with Engine(bundle) as ort_engine:
        expected = ort_engine.generate_ids(prompt, GenerationConfig(max_new_tokens=20, ignore_eos=True,
                                                                    speculative=False))
        assert ort_engine.generate_ids(prompt, config) == expected
    with Engine(bundle, backend="tensorrt") as engine:
        assert engine.generate_ids(prompt, config) == expected
