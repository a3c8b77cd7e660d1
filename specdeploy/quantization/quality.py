"""Quality of a (quantized) bundle against its fp32 original, measured with the runtime alone.

Top-1 agreement and perplexity are teacher-forced over held-out text; acceptance and tokens/s
come from real generations. Everything runs on the same machine in one process.
"""
from __future__ import annotations

import numpy as np

from ..config import GenerationConfig
from ..errors import ConfigError
from ..runtime.engine import Engine


def teacher_forced_logits(engine: Engine, ids: list[int]) -> np.ndarray:
    """Full-model logits [S, V] for every position of `ids` (one prefill pass)."""
    model = engine.model
    hidden = model.verify_pass(model.draft_pass(ids, 0).copy(), 0).copy()  # [S, H]
    return model.logits(hidden).astype(np.float64)              # [S, V]


def _nll(logits: np.ndarray, targets: list[int]) -> float:
    shifted = logits - logits.max(-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return float(-logp[np.arange(len(targets)), targets].mean())


def compare_text(reference: Engine, candidate: Engine, texts: list[str]) -> dict:
    agree, total, nll_ref, nll_cand, n = 0, 0, 0.0, 0.0, 0
    for text in texts:
        ids = reference.encode_prompt(text)[: reference.manifest.max_context]
        if len(ids) < 2:  # nothing to predict (a tokenizer that drops this text)
            continue
        ref, cand = teacher_forced_logits(reference, ids), teacher_forced_logits(candidate, ids)
        agree += int((ref.argmax(-1) == cand.argmax(-1)).sum())
        total += len(ids)
        nll_ref += _nll(ref[:-1], ids[1:]) * (len(ids) - 1)
        nll_cand += _nll(cand[:-1], ids[1:]) * (len(ids) - 1)
        n += len(ids) - 1
    if not n:
        raise ConfigError("the bundle's tokenizer turns every passage of the quality report into fewer than two "
                          "tokens; check its tokenizer.json encodes plain text")
    return {"top1_agreement": round(agree / total, 4), "perplexity": round(float(np.exp(nll_cand / n)), 3),
            "perplexity_fp32": round(float(np.exp(nll_ref / n)), 3)}


def speed_and_acceptance(engine: Engine, prompts: list[str], max_new_tokens: int = 48) -> dict:
    from ..runtime.timing import run_modes

    chat = engine.tokenizer.chat_template is not None
    ids = [engine.encode_prompt([{"role": "user", "content": p}] if chat else p) for p in prompts]
    modes = {"plain": GenerationConfig(max_new_tokens=max_new_tokens, speculative=False),
             "speculative": GenerationConfig(max_new_tokens=max_new_tokens)}
    res = run_modes(engine, ids, modes, repeats=2)
    identical = res["plain"].outputs == res["speculative"].outputs
    return {"plain_tokens_per_second": round(res["plain"].tokens_per_second, 2),
            "speculative_tokens_per_second": round(res["speculative"].tokens_per_second, 2),
            "acceptance_rate": round(res["speculative"].acceptance_rate, 4),
            "greedy_identical": identical}


def report(reference_bundle, candidate_bundle, texts: list[str], prompts: list[str]) -> dict:
    with Engine(reference_bundle) as ref, Engine(candidate_bundle) as cand:
        out = compare_text(ref, cand, texts)
        out.update(speed_and_acceptance(cand, prompts))
    return out
