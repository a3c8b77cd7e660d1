"""The model's sampling defaults: read at export, recorded in the manifest, used where a caller says nothing."""
import json

import numpy as np
import pytest

from specdeploy.bundle.manifest import SamplingDefaults
from specdeploy.config import GenerationConfig
from specdeploy.errors import ConfigError
from specdeploy.export.sampling_defaults import parse_options, recorded
from specdeploy.runtime.settings import resolve

pytestmark = pytest.mark.unit


def hf_dir(tmp_path, **generation):
    (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    return tmp_path


def test_a_sampling_models_generation_config_is_recorded(tmp_path):
    d = recorded(hf_dir(tmp_path, do_sample=True, temperature=0.6, top_p=0.95, top_k=20, bos_token_id=1), {})
    assert (d.temperature, d.top_p, d.top_k, d.min_p) == (0.6, 0.95, 20, None)
    assert d.source == "the model's generation_config"


def test_a_greedy_generation_config_keeps_only_its_repetition_penalty(tmp_path):
    d = recorded(hf_dir(tmp_path, do_sample=False, temperature=0.6, repetition_penalty=1.2), {})
    assert d.temperature is None and d.repetition_penalty == 1.2


def test_export_options_override_and_nothing_records_nothing(tmp_path):
    d = recorded(hf_dir(tmp_path, do_sample=True, temperature=0.6), {"temperature": 0.2, "top_p": 0.9})
    assert (d.temperature, d.top_p) == (0.2, 0.9) and "export --sampling" in d.source
    empty = tmp_path / "no-generation-config"
    empty.mkdir()
    assert recorded(empty, {}) is None


@pytest.mark.parametrize("bad, fragment", [(["heat=1"], "KEY one of"), (["temperature"], "KEY=VALUE"),
                                           (["top_p=high"], "not a number")])
def test_bad_sampling_options_are_refused(bad, fragment):
    with pytest.raises(ConfigError, match=fragment):
        parse_options(bad)


def test_out_of_range_defaults_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="top_p"):
        recorded(tmp_path, {"top_p": 1.5})


def test_a_caller_overrides_each_default_and_zero_turns_one_off(tiny_engine):
    manifest = tiny_engine.manifest.replace(sampling_defaults=SamplingDefaults(
        "test", temperature=0.7, top_k=20, top_p=0.9, repetition_penalty=1.1))
    said_nothing = resolve(GenerationConfig(), manifest)
    assert (said_nothing.sampling.temperature, said_nothing.sampling.top_k, said_nothing.penalties.repetition) == \
           (0.7, 20, 1.1)
    greedy = resolve(GenerationConfig(temperature=0, top_k=0, repetition_penalty=1.0), manifest)
    assert greedy.sampling.greedy and greedy.sampling.top_k is None and not greedy.penalties.active
    assert resolve(GenerationConfig(), tiny_engine.manifest).sampling.greedy  # no defaults: greedy


def test_a_bundle_with_defaults_samples_when_asked_nothing(tiny_bundle, tmp_path, monkeypatch):
    from specdeploy.bundle import manifest as manifest_io
    from specdeploy.runtime.engine import Engine

    defaults = SamplingDefaults("test", temperature=1.0, top_p=0.9)
    monkeypatch.setattr(manifest_io, "read", lambda b, _read=manifest_io.read:
                        _read(b).replace(sampling_defaults=defaults))
    prompt = [int(t) for t in np.random.default_rng(1).integers(2, 96, 6)]
    with Engine(tiny_bundle) as engine:
        said_nothing = engine.generate_ids(prompt, GenerationConfig(max_new_tokens=16, seed=3, ignore_eos=True))
        explicit = engine.generate_ids(prompt, GenerationConfig(max_new_tokens=16, seed=3, ignore_eos=True,
                                                                temperature=1.0, top_p=0.9))
        greedy = engine.generate_ids(prompt, GenerationConfig(max_new_tokens=16, ignore_eos=True, temperature=0))
    assert said_nothing == explicit != greedy


def test_measurements_decode_greedy_and_unwarped_whatever_the_defaults(tiny_bundle, monkeypatch):
    """The quality report, the bench and calibration judge the model's own greedy output: a bundle's
    sampling defaults (here T=1 with penalties) never reach them."""
    from specdeploy.bench.runner import modes_for
    from specdeploy.bundle import manifest as manifest_io
    from specdeploy.quantization.quality import speed_and_acceptance
    from specdeploy.runtime.engine import Engine

    defaults = SamplingDefaults("test", temperature=1.0, top_k=5, top_p=0.5, min_p=0.2, repetition_penalty=1.5)
    monkeypatch.setattr(manifest_io, "read", lambda b, _read=manifest_io.read:
                        _read(b).replace(sampling_defaults=defaults))
    with Engine(tiny_bundle) as engine:
        for config in modes_for(0.0, "hybrid", 8).values():
            settings = resolve(config, engine.manifest)
            assert settings.sampling.greedy and not settings.penalties.active
        for config in modes_for(1.0, "hybrid", 8).values():
            sampling = resolve(config, engine.manifest).sampling
            assert (sampling.top_k, sampling.top_p, sampling.min_p) == (None, 1.0, 0.0)
        assert speed_and_acceptance(engine, ["w5 w6 w7", "w8 w9"], max_new_tokens=8)["greedy_identical"]
