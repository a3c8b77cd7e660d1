import pytest

from specdeploy.config import GenerationConfig
from specdeploy.errors import ConfigError
from specdeploy.runtime.engine import _StopFilter
from specdeploy.runtime.stats import GenerationStats


def test_stream_concatenates_to_generate(tiny_engine):
    cfg = GenerationConfig(max_new_tokens=20, ignore_eos=True)
    stats = GenerationStats()
    pieces = list(tiny_engine.stream("w3 w4 w5", cfg, stats))
    result = tiny_engine.generate("w3 w4 w5", cfg)
    assert "".join(p.text for p in pieces) == result.text
    assert result.finish_reason == "length" and result.stats.generated_tokens == 20
    # the hybrid's timed choices differ between the two runs; each piece's flag matches its own run
    assert sum(p.drafted for p in pieces) == stats.accepted


def test_stop_string_cuts_text_and_reports_stop(tiny_engine):
    full = tiny_engine.generate("w3 w4 w5", max_new_tokens=20, ignore_eos=True).text
    words = full.split()
    stop = words[5]
    cut = tiny_engine.generate("w3 w4 w5", max_new_tokens=20, ignore_eos=True, stop=(stop,))
    assert cut.text == full[: full.index(stop)] and cut.finish_reason == "stop"


def test_chat_messages_use_the_template(tiny_engine):
    ids = tiny_engine.encode_prompt([{"role": "user", "content": "w9"}])
    assert ids == [2, 9, 3, 4]
    with pytest.raises(ConfigError, match="role"):
        tiny_engine.encode_prompt([{"content": "w9"}])


def test_stop_filter_holds_back_partial_matches():
    f = _StopFilter(("END",))
    assert f.feed("abc E") == "abc "
    assert f.feed("N") == ""
    assert f.feed("D tail") == "" and f.stopped
    assert f.feed("more") == "" and f.flush() == ""
    g = _StopFilter(("END",))
    assert g.feed("abc EN") + g.feed("x") + g.flush() == "abc ENx"


def test_generation_config_validation():
    for bad in (dict(max_new_tokens=0), dict(num_draft_tokens=0), dict(num_draft_tokens=99),
                dict(draft_source="medusa"), dict(temperature=-0.5), dict(stop=("",))):
        with pytest.raises(ConfigError):
            GenerationConfig(**bad)


def test_plain_prompts_start_with_bos_where_the_model_tokenizer_adds_it(tiny_bundle, tmp_path):
    import json
    import shutil

    from specdeploy.runtime.engine import Engine

    bundle = tmp_path / "bos"
    shutil.copytree(tiny_bundle, bundle)
    data = json.loads((bundle / "manifest.json").read_text())
    data["model"]["add_bos_token"] = True
    (bundle / "manifest.json").write_text(json.dumps(data))
    with Engine(tiny_bundle) as plain, Engine(bundle) as with_bos:
        assert plain.encode_prompt("w3 w4") == [3, 4]
        assert with_bos.encode_prompt("w3 w4") == [0, 3, 4] and with_bos.encode_prompt("w0 w3") == [0, 3]
        assert with_bos.encode_prompt([{"role": "user", "content": "w9"}]) == [2, 9, 3, 4]  # template decides
