"""Quality of a (quantized) bundle against its fp32 original, measured with the runtime alone.

Top-1 agreement and perplexity are teacher-forced over held-out text; acceptance and tokens/s
come from real generations. Everything runs on the same machine in one process.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..bundle import manifest as manifest_io
from ..config import UNWARPED, GenerationConfig
from ..errors import ConfigError
from ..runtime.engine import Engine
from ..runtime.split_model import SplitModel, graph_at_a_time
from ..runtime.tokenizer import Tokenizer, encode_plain


def teacher_forced_logits(engine: Engine, ids: list[int]) -> np.ndarray:
    """Full-model logits [S, V] for every position of `ids` (one prefill pass)."""
    model = engine.model
    hidden = model.verify_pass(model.draft_pass(ids, 0).copy(), 0).copy()  # [S, H]
    return model.logits(hidden).astype(np.float64)              # [S, V]


def teacher_forced(bundle, manifest, texts: list[list[int]]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per text (token ids), the full model's greedy token at every position [S] and its log
    probability of each next token [S-1], one graph at a time (runtime.split_model.graph_at_a_time):
    an fp32 reference of a large model never holds all its graphs' weights."""
    model = SplitModel(manifest, graph_at_a_time(bundle, manifest))
    try:
        hidden = [model.draft_pass(ids, 0).copy() for ids in texts]                    # [S, H] each
        model.draft_stage.close()
        hidden = [model.verify_pass(h, 0).copy() for h in hidden]                      # [S, H] each
        model.verify_stage.close()
        return [_summary(model.logits(h).astype(np.float64), ids) for h, ids in zip(hidden, texts)]
    finally:
        model.close()


def _summary(logits: np.ndarray, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    shifted = logits[:-1] - logits[:-1].max(-1, keepdims=True)                        # [S-1, V]
    logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return logits.argmax(-1), logp[np.arange(len(ids) - 1), ids[1:]]


def compare_text(reference: Path, candidate: Path, texts: list[str]) -> dict:
    """Top-1 agreement and perplexities of the `candidate` bundle against `reference` over `texts`."""
    ref_manifest, cand_manifest = manifest_io.read(reference), manifest_io.read(candidate)
    tokenizer = Tokenizer(Path(candidate) / cand_manifest.tokenizer, None, cand_manifest.model.bos_token_id)
    encoded = (encode_plain(tokenizer, cand_manifest.model, t)[: cand_manifest.max_context] for t in texts)
    ids = [i for i in encoded if len(i) >= 2]
    if not ids:  # nothing to predict (a tokenizer that drops every text)
        raise ConfigError("the bundle's tokenizer turns every passage of the quality report into fewer than two "
                          "tokens; check its tokenizer.json encodes plain text")
    ref, cand = teacher_forced(reference, ref_manifest, ids), teacher_forced(candidate, cand_manifest, ids)
    agree = sum(int((r[0] == c[0]).sum()) for r, c in zip(ref, cand))
    total, n = sum(map(len, ids)), sum(len(i) - 1 for i in ids)
    nll_ref, nll_cand = -sum(r[1].sum() for r in ref), -sum(c[1].sum() for c in cand)
    return {"top1_agreement": round(agree / total, 4), "perplexity": round(float(np.exp(nll_cand / n)), 3),
            "perplexity_fp32": round(float(np.exp(nll_ref / n)), 3)}


def speed_and_acceptance(engine: Engine, prompts: list[str], max_new_tokens: int = 48) -> dict:
    from ..runtime.timing import run_modes

    chat = engine.tokenizer.chat_template is not None
    ids = [engine.encode_prompt([{"role": "user", "content": p}] if chat else p) for p in prompts]
    base = dict(max_new_tokens=max_new_tokens, temperature=0.0, **UNWARPED)  # greedy, whatever the bundle's defaults
    modes = {"plain": GenerationConfig(speculative=False, **base), "speculative": GenerationConfig(**base)}
    res = run_modes(engine, ids, modes, repeats=2)
    identical = res["plain"].outputs == res["speculative"].outputs
    return {"plain_tokens_per_second": round(res["plain"].tokens_per_second, 2),
            "speculative_tokens_per_second": round(res["speculative"].tokens_per_second, 2),
            "acceptance_rate": round(res["speculative"].acceptance_rate, 4),
            "greedy_identical": identical}


def report(reference_bundle, candidate_bundle, texts: list[str], prompts: list[str]) -> dict:
    out = compare_text(Path(reference_bundle), Path(candidate_bundle), texts)
    with Engine(candidate_bundle) as cand:
        out.update(speed_and_acceptance(cand, prompts))
    return out
