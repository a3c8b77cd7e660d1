"""The TensorRT build and binding logic, run on the CPU against a faithful fake of the API."""
import shutil

import numpy as np
import pytest

import fake_tensorrt
from specdeploy import manifest as manifest_io
from specdeploy.backends.tensorrt.build import BuildConfig, build_engines, profiles
from specdeploy.config import GenerationConfig
from specdeploy.errors import BundleError, ConfigError, MissingDependencyError
from specdeploy.runtime.engine import Engine


@pytest.fixture
def trt_bundle(tiny_bundle, tmp_path, monkeypatch):
    bundle = tmp_path / "trt"
    shutil.copytree(tiny_bundle, bundle)
    fake_tensorrt.install(monkeypatch)
    build_engines(bundle, BuildConfig(max_draft_tokens=6, max_prompt=64), echo=lambda s: None)
    return bundle


def test_engines_are_recorded_with_version_and_gpu(trt_bundle):
    record = manifest_io.read(trt_bundle).tensorrt
    assert record["version"] == "10.3.0" and record["compute_capability"] == "8.7"
    assert len(record["engines"]["draft"]["profiles"]) == 2 and len(record["engines"]["head"]["profiles"]) == 1
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


def test_prompt_beyond_prefill_profile_is_a_clear_error(trt_bundle):
    with Engine(trt_bundle, backend="tensorrt") as engine:
        with pytest.raises(BundleError, match="--max-prompt"):
            engine.generate_ids(list(range(2, 82)), GenerationConfig(max_new_tokens=4))


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
