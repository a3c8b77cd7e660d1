"""The alternatives users would pick, on the same model, prompts and machine (greedy).

Each runs where installed; the table says which were skipped and why.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np


def _prompts(prompt_set, per_category: int = 1) -> list[list[dict]]:
    return [[{"role": "user", "content": p}] for ps in prompt_set.values() for p in ps[:per_category]]


def _encode(tokenizer, conversations):
    from ..calibration.data import render

    return [tokenizer(render(tokenizer, c), return_tensors="pt", add_special_tokens=False).input_ids
            for c in conversations]


def _time_generate(model, encoded, max_new_tokens, **kwargs) -> float:
    import torch

    tokens, seconds = 0, 0.0
    with torch.no_grad():
        for ids in encoded:
            began = time.perf_counter()
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                 do_sample=False, min_new_tokens=max_new_tokens, **kwargs)
            seconds += time.perf_counter() - began
            tokens += out.shape[1] - ids.shape[1]
    return tokens / seconds


def _hf(config, conversations, exit_layer) -> dict:
    from ..calibration.data import hf_attention

    try:
        from ..export.arch import load
    except ImportError as exc:
        return {"hf_generate": {"skipped": f"transformers/torch not installed ({exc})"}}
    model, tokenizer = load(config.compare_model)
    model.config._attn_implementation = hf_attention(model.config)
    encoded = _encode(tokenizer, conversations)
    out = {"hf_generate": {"tokens_per_second": _time_generate(model, encoded, config.max_new_tokens),
                           "note": "transformers generate, fp32, sdpa, greedy"}}
    try:
        tps = _time_generate(model, encoded, config.max_new_tokens, assistant_early_exit=exit_layer)
        out["hf_assistant_early_exit"] = {"tokens_per_second": tps,
                                          "note": f"transformers assisted generation, assistant_early_exit={exit_layer}"}
    except Exception as exc:  # an API change or unsupported model: report, do not fail the bench
        out["hf_assistant_early_exit"] = {"skipped": f"failed: {str(exc).splitlines()[0][:120]}"}
    return out


def _optimum(config, conversations) -> dict:
    try:
        from optimum.onnxruntime import ORTModelForCausalLM  # noqa: F401
    except ImportError:
        return {"skipped": "optimum[onnxruntime] is not installed (pip install 'optimum-onnx[onnxruntime]')"}
    if Path(config.compare_model).suffix == ".gguf":
        return {"skipped": "Optimum exports from a Hugging Face directory, not a .gguf file"}
    from transformers import AutoTokenizer

    model = ORTModelForCausalLM.from_pretrained(config.compare_model, export=True)
    tokenizer = AutoTokenizer.from_pretrained(config.compare_model)
    encoded = _encode(tokenizer, conversations)
    return {"tokens_per_second": _time_generate(model, encoded, config.max_new_tokens),
            "note": "Optimum ORTModelForCausalLM, fp32, greedy"}


def compare(config, prompt_set, results) -> dict:
    if config.compare_model is None:
        reason = "needs --model (the source model the bundle was exported from)"
        return {n: {"skipped": reason} for n in ("hf_generate", "hf_assistant_early_exit", "optimum_ort")}
    conversations = _prompts(prompt_set)
    out = _hf(config, conversations, results["bundle"]["exit_layer"])
    out["optimum_ort"] = _optimum(config, conversations)
    plain = results["overall"].get("0.0", {}).get("plain", {}).get("tokens_per_second")
    for r in out.values():
        if r.get("tokens_per_second") and plain:
            r["tokens_per_second"] = round(float(r["tokens_per_second"]), 2)
            r["vs_specdeploy_plain"] = round(float(np.float64(r["tokens_per_second"]) / plain), 3)
    return out
