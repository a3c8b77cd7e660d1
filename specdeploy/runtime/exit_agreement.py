"""How often the early exit's greedy token is the full model's: measured when a bundle is written.

The hybrid learns whether early-exit rounds pay by running some (`drafting.Verdict`: three
one-token probes to start, then a re-check now and then). On the example's uncalibrated int4
bundle each probe cost 1.78 plain steps for the one token it emitted (`lab/scripts/round_overhead.py
engine-int4.plan --category qa`), most of what a fresh engine lost to plain decoding on its first
QA answers, and the whole of it on a single short request. A probe costs at least one more pass
through the draft graph's k of L layers, and yields one token more only when the exit agrees with
the full model, so an exit that agrees less often than half of k / L loses on every machine and
text: the hybrid never probes it (`Manifest.exit_can_pay`). The example's uncalibrated exit at layer 8
of 30 agrees on 3–4% of held-out tokens (floor 13%); calibrated exit adapters 33–40%
(docs/DESIGN.md). A bundle without the measurement (written before it) is probed as before.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..prompts import PASSAGES
from .split_model import SplitModel

TEXTS = 4  # held-out passages (~240 tokens on the example): a pass over each, well under a second


def agreement(model: SplitModel, texts: list[list[int]], vocab_ids: np.ndarray | None) -> float:
    """Fraction of positions where the draft head's greedy token equals the full model's,
    teacher-forced over each text (token ids) from position 0."""
    agree = total = 0
    for ids in texts:
        hidden_k = model.draft_pass(ids, 0).copy()                          # [S, H]
        full = model.logits(model.verify_pass(hidden_k, 0)).argmax(-1)      # [S]
        draft = model.draft_logits(hidden_k).argmax(-1)                     # [S] in the draft vocabulary
        if vocab_ids is not None:
            draft = vocab_ids[draft]
        agree += int((draft == full).sum())
        total += len(ids)
    return agree / total


def measure_bundle(bundle: Path, manifest) -> float | None:
    """`agreement` of the bundle in `bundle` (described by `manifest`) over the held-out passages;
    None where its tokenizer makes nothing of them (the hybrid then measures the exit itself)."""
    from ..backends import load_stages
    from .tokenizer import Tokenizer

    bundle = Path(bundle)
    tokenizer = Tokenizer(bundle / manifest.tokenizer, None, manifest.model.bos_token_id)
    vocab_ids = np.load(bundle / manifest.draft_vocab) if manifest.draft_vocab else None
    model = SplitModel(manifest, load_stages(bundle, manifest))
    try:
        rows = min(model.max_context, model.max_rows)
        texts = [ids for ids in (tokenizer.encode(text)[:rows] for text in PASSAGES[:TEXTS]) if ids]
        return round(agreement(model, texts, vocab_ids), 4) if texts else None
    finally:
        model.close()


def describe(manifest) -> str:
    """One line for the export / quantize log."""
    if manifest.exit_agreement is None:
        return "early exit: no held-out text to measure its agreement on; the hybrid measures whether its rounds pay"
    share = f"early exit agrees with the full model on {manifest.exit_agreement:.1%} of held-out tokens"
    if manifest.exit_can_pay:
        return f"{share}: the hybrid measures whether its rounds pay"
    layers = f"{manifest.exit_layer} of {manifest.model.num_layers} layers"
    return f"{share}, under {manifest.exit_agreement_floor:.1%} (half the draft graph's {layers}): the hybrid never runs it"
