"""The real example model (SmolLM2-135M-Instruct): exactness and behaviour on real text."""
import pytest

from specdeploy.config import GenerationConfig
from specdeploy.runtime.engine import Engine
from specdeploy.runtime.stats import GenerationStats

pytestmark = pytest.mark.integration  # servers, a browser, real models or every family: not the fast tier

PROMPTS = [
    "Explain in three sentences why the sky is blue.",
    "Write a Python function that returns the n-th Fibonacci number.",
]


@pytest.fixture(scope="module")
def example_engine(example_bundle):
    with Engine(example_bundle) as engine:
        yield engine


@pytest.mark.parametrize("source", ["early_exit", "hybrid"])
def test_greedy_speculative_equals_plain_on_example_model(example_engine, source):
    for prompt in PROMPTS:
        ids = example_engine.encode_prompt([{"role": "user", "content": prompt}])
        plain = example_engine.generate_ids(ids, GenerationConfig(max_new_tokens=48, speculative=False))
        spec = example_engine.generate_ids(ids, GenerationConfig(max_new_tokens=48, draft_source=source))
        assert spec == plain


def test_repeated_passage_is_accepted_in_long_rounds(example_engine, monkeypatch):
    """The real model takes a repeated passage's copies: copying all a match offers, most are
    accepted in long rounds, and greedy output equals plain copying all and as priced. The priced
    length follows timings measured as the engine runs (a loaded machine makes rows look dear),
    so its choices are tested on replayed rounds (tests/runtime/test_copy_length.py), not timed here."""
    passage = "The quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat."
    prompt = [{"role": "user", "content": f"Repeat this sentence exactly: {passage} {passage}"}]
    ids = example_engine.encode_prompt(prompt)
    config = GenerationConfig(max_new_tokens=40, draft_source="lookup", num_draft_tokens=8)
    plain = example_engine.generate_ids(ids, GenerationConfig(max_new_tokens=40, speculative=False))
    priced = example_engine.generate_ids(ids, config)
    length = example_engine.decoder.drafters["lookup"].length
    monkeypatch.setattr(length, "choose", lambda match, offered: offered)  # copy all a match offers
    stats = GenerationStats()
    copied = example_engine.generate_ids(ids, config, stats)
    assert priced == plain and copied == plain
    assert stats.acceptance_rate > 0.6 and stats.tokens_per_round > 2.5


@pytest.mark.slow
def test_sampled_output_is_fluent_text(example_engine):
    result = example_engine.generate([{"role": "user", "content": "Name three colours."}],
                                     max_new_tokens=30, temperature=0.7, seed=1)
    assert len(result.text.split()) >= 3 and result.stats.generated_tokens > 3


@pytest.mark.slow
def test_the_readme_commands_export_the_example_at_its_own_int4_exact_and_smaller(example_bundle, tmp_path):
    """The README's first commands on the real model: `export` keeps the GGUF's precision (int4, its
    Q4_1 weights carried, its Q8_0 tied embedding / head at 8 bits) and says so; `generate` streams;
    `inspect --verify` checks every hash. Integer compute: bitwise row-independent graphs, greedy
    speculative == plain for every source, and the quality report's targets: top-1 agreement >= 95%,
    perplexity within 10%."""
    from click.testing import CliRunner

    from specdeploy.bundle import manifest as manifest_io
    from specdeploy.bundle.describe import describe
    from specdeploy.cli import main

    gguf = manifest_io.read(example_bundle).extra["source"]  # the example's GGUF, as fetched
    bundle = tmp_path / "engine.plan"
    result = CliRunner().invoke(main, ["export", "--exit-layer", "8", gguf, "--output", str(bundle),
                                       "--max-context", "1024"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert any(line.startswith("precision int4: the file's own (layer weights Q4_1") for line in lines), lines
    for args in (["generate", str(bundle), "Why is the sky blue?", "--max-tokens", "16"],
                 ["inspect", str(bundle), "--verify"]):
        out = CliRunner().invoke(main, args)
        assert out.exit_code == 0 and out.output.strip(), out.output
    assert "SHA-256 verified" in out.output
    manifest = manifest_io.read(bundle)
    assert manifest.row_check["passed"] and "embedding: 8-bit blocks (GatherBlockQuantized)" in lines
    fp32_bytes = (example_bundle / "weights.bin").stat().st_size
    assert (bundle / "weights.bin").stat().st_size < 0.3 * fp32_bytes
    assert manifest.precision == "int4"
    q = manifest.quality
    assert q["greedy_identical"] and q["top1_agreement"] >= 0.95 and q["perplexity"] < 1.1 * q["perplexity_fp32"]
    assert sum(manifest.extra["gguf_carried_weights"].values()) == 30 * 4 + 1   # q/k/v, o, gate/up, down; head
    # specdeploy's Q4_1MatMul reading the file's blocks (the default where the kernels build), or
    # in MatMulNBits the Q4_1 minima folded into every body matmul (integer zero points and
    # block-sum rows), or, where this CPU's row check refuses that form, kept exact, saying so
    if manifest.operators:
        from specdeploy import kernels

        assert kernels.Q4_K in manifest.operators and "folded_offsets" not in manifest.extra
        assert "from GGUF   121 weights carried losslessly" in describe(bundle)
    elif "folded_offsets" in manifest.extra:
        assert sum(manifest.extra["folded_offsets"].values()) == 30 * 4
        assert ("from GGUF   121 weights carried from the source file's blocks (draft 32, head 1, verify 88): "
                "values and scales losslessly, the float minima folded into 120 matmuls") in describe(bundle)
    else:
        assert any("offsets folded is not row-independent on this machine" in line for line in lines)
        assert "from GGUF   121 weights carried losslessly" in describe(bundle)
    with Engine(bundle) as engine:
        for prompt in PROMPTS:
            ids = engine.encode_prompt([{"role": "user", "content": prompt}])
            plain = engine.generate_ids(ids, GenerationConfig(max_new_tokens=32, speculative=False))
            for source in ("early_exit", "lookup", "hybrid"):
                assert engine.generate_ids(ids, GenerationConfig(max_new_tokens=32, draft_source=source)) == plain


@pytest.mark.slow
@pytest.mark.long
def test_int8_example_bundle_keeps_activation_outliers_in_float(example_bundle, tmp_path):
    """int8 on the real model computes its activation outlier channels in float (the down
    projections' reach 4600x the median channel): the quality report's top-1 agreement target
    (98%; 99.2% on the VNNI machine the docs record, whose integer kernels differ from AVX2's, so
    held here at 97%) with perplexity within 2%, rows independent, greedy speculative == plain."""
    from specdeploy.bundle import manifest as manifest_io
    from specdeploy.quantization.quantize import QuantizeOptions, quantize

    bundle = quantize(example_bundle, tmp_path / "int8", QuantizeOptions("int8"), echo=lambda line: None)
    manifest = manifest_io.read(bundle)
    q, found = manifest.quality, manifest.extra["float_outlier_channels"]
    assert manifest.row_check["passed"] and found["verify"] > 100 and found["draft"] > 20
    assert q["greedy_identical"] and q["top1_agreement"] >= 0.97 and q["perplexity"] < 1.02 * q["perplexity_fp32"]


@pytest.mark.slow
@pytest.mark.long
def test_gptq_re_quantizes_the_example_closer_to_fp32_than_round_to_nearest(example_bundle, tmp_path):
    """Without GGUF blocks to carry (an fp32 source), int4 is re-quantized: GPTQ on minmax's grid
    reaches the quality targets that round to nearest misses by far (70.7% top-1, perplexity +8%;
    GPTQ 97.1% and +0.4% with the LM head at 8 bits, the default; 86.8-90.1% with a 4-bit head:
    the body is on minmax's grid already, lab/notes/benchmarks-history.md)."""
    import shutil

    from specdeploy.bundle import manifest as manifest_io
    from specdeploy.quantization.quantize import QuantizeOptions, quantize

    source = shutil.copytree(example_bundle, tmp_path / "fp32")  # copies: onnx refuses hard-linked data
    manifest = manifest_io.read(source)
    manifest_io.write(source, manifest.replace(extra={k: v for k, v in manifest.extra.items() if k != "source"}))
    lines = []
    bundle = quantize(source, tmp_path / "int4", QuantizeOptions("int4", method="gptq"), echo=lines.append)
    manifest = manifest_io.read(bundle)
    assert "gguf_carried_weights" not in manifest.extra and manifest.row_check["passed"]
    q = manifest.quality
    assert q["greedy_identical"] and q["top1_agreement"] >= 0.85 and q["perplexity"] < 1.1 * q["perplexity_fp32"]


# ---- structured output and tools on the real tokenizer (llguidance), speculation on ----------------

SCHEMAS = [
    {"type": "object", "additionalProperties": False, "required": ["city", "days"],
     "properties": {"city": {"type": "string"},
                    "days": {"type": "array", "minItems": 1, "maxItems": 3,
                             "items": {"type": "object", "required": ["day", "sky", "high_c"],
                                       "properties": {"day": {"enum": ["mon", "tue", "wed"]},
                                                      "sky": {"enum": ["sun", "cloud", "rain"]},
                                                      "high_c": {"type": "number", "minimum": -30, "maximum": 50}}}}}},
    {"type": "object", "required": ["name", "age", "address"],
     "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
                    "address": {"type": "object", "required": ["street", "zip"],
                                "properties": {"street": {"type": "string"}, "zip": {"type": "string",
                                                                                     "pattern": "^[0-9]{5}$"}}}}},
]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_json_schema_output_validates_greedy_and_sampled_with_speculation(example_engine, schema):
    import json

    import jsonschema

    from specdeploy.config import ResponseFormat

    fmt = ResponseFormat("json_schema", schema=schema)
    messages = [{"role": "user", "content": "Give me the data as JSON."}]
    ids = example_engine.encode_prompt(messages)
    greedy = example_engine.generate_ids(ids, GenerationConfig(max_new_tokens=160, response_format=fmt, temperature=0))
    plain = example_engine.generate_ids(ids, GenerationConfig(max_new_tokens=160, response_format=fmt, temperature=0,
                                                              speculative=False))
    assert greedy == plain
    for seed in range(3):
        for options in (dict(temperature=0.0), dict(temperature=0.8, seed=seed)):
            result = example_engine.generate(messages, GenerationConfig(max_new_tokens=160, response_format=fmt,
                                                                        **options))
            assert result.finish_reason == "stop", result.text
            jsonschema.validate(json.loads(result.text), schema)


@pytest.fixture(scope="module")
def example_server(example_bundle):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent / "serve"))
    from tests_serve_support import RunningServer

    server = RunningServer(example_bundle)
    yield server
    server.stop()


def test_the_openai_clients_parse_helper_gets_a_valid_object(example_server):
    import openai
    import pydantic

    class Forecast(pydantic.BaseModel):
        city: str
        high_c: int = pydantic.Field(ge=-30, le=50)
        sky: str

    client = openai.OpenAI(base_url=example_server.url + "/v1", api_key="unused", max_retries=0)
    r = client.chat.completions.parse(model="m", response_format=Forecast, max_tokens=120, messages=[
        {"role": "user", "content": "What is the weather in Paris tomorrow?"}])
    assert isinstance(r.choices[0].message.parsed, Forecast)


@pytest.mark.parametrize("tool_choice", ["required", "auto"])
def test_tool_calls_always_parse_against_the_tools_schema(example_server, tool_choice):
    import json

    import jsonschema
    import openai

    params = {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
              "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}}}
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                               "parameters": params}}]
    client = openai.OpenAI(base_url=example_server.url + "/v1", api_key="unused", max_retries=0)
    for stream in (False, True):
        messages = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
        r = client.chat.completions.create(model="m", messages=messages, tools=tools, tool_choice=tool_choice,
                                           max_tokens=120, stream=stream)
        if stream:
            chunks = list(r)
            calls = [c for ch in chunks if ch.choices for c in (ch.choices[0].delta.tool_calls or [])]
            content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        else:
            calls, content = r.choices[0].message.tool_calls or [], r.choices[0].message.content
        if tool_choice == "required" or calls:
            assert len(calls) == 1 and calls[0].function.name == "get_weather"
            jsonschema.validate(json.loads(calls[0].function.arguments), params)
        else:
            assert content  # "auto" may answer in text instead


def test_the_structured_output_example(example_server):
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parents[1] / "examples" / "structured_output.py"
    out = subprocess.run([sys.executable, str(example), example_server.url + "/v1"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("command: ") and "tool call: get_weather({'city': " in out.stdout


@pytest.mark.parametrize("target", ["cuda", "tensorrt"])
def test_the_examples_gpu_forms_have_every_kernel(example_bundle, tmp_path, target):
    from specdeploy.checks import kernel_coverage as kc
    from specdeploy.quantization.options import QuantizeOptions, for_target
    from specdeploy.quantization.quantize import quantize

    options = for_target(QuantizeOptions("int4", method="rtn", report=False), target)
    out = quantize(example_bundle, tmp_path / f"{target}.plan", options, echo=lambda s: None)
    assert kc.summary(kc.check(out, target)) == []
