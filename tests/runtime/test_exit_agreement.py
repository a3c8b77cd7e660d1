"""The exit's measured agreement decides whether the hybrid ever probes early exit."""
import dataclasses
import json

import numpy as np
import pytest

from specdeploy.bundle import manifest as manifest_io
from specdeploy.config import GenerationConfig
from specdeploy.runtime import exit_agreement
from specdeploy.runtime.engine import Engine
from specdeploy.runtime.stats import GenerationStats


class TableModel:
    """Full-model and draft-head greedy tokens given per position, as one-hot logits."""

    def __init__(self, full: list[int], draft: list[int], vocab: int):
        self.full, self.draft, self.vocab = full, draft, vocab

    def draft_pass(self, ids, start):
        return np.arange(len(ids), dtype=np.float32)[:, None]     # [S, 1]: each row its position

    def verify_pass(self, hidden, start):
        return hidden

    def logits(self, hidden):
        return np.eye(self.vocab)[[self.full[int(p)] for p in hidden[:, 0]]]       # [S, V]

    def draft_logits(self, hidden):
        return np.eye(self.vocab)[[self.draft[int(p)] for p in hidden[:, 0]]]      # [S, V']


def test_agreement_counts_positions_whose_greedy_tokens_match_in_the_full_vocabulary():
    model = TableModel(full=[5, 7, 9, 7], draft=[0, 1, 0, 2], vocab=10)
    vocab_ids = np.array([5, 7, 9])  # draft index -> full id: 5, 7, 5, 9
    assert exit_agreement.agreement(model, [[1, 2, 3, 4]], vocab_ids) == 0.5
    assert exit_agreement.agreement(TableModel([3, 3], [3, 4], 10), [[1, 2]], None) == 0.5
    assert exit_agreement.agreement(TableModel([3, 3], [3, 4], 10), [[1, 2], [1]], None) == pytest.approx(2 / 3)


def _with_agreement(bundle, tmp_path, value):
    """A copy of `bundle` whose manifest records `value` as the exit's agreement."""
    import shutil

    copy = tmp_path / f"agreement-{value}"
    shutil.copytree(bundle, copy)
    manifest = manifest_io.read(copy)
    manifest_io.write(copy, dataclasses.replace(manifest, exit_agreement=value))
    return copy


def test_the_floor_is_half_the_draft_graphs_share_of_layers(tiny_bundle):
    m = manifest_io.read(tiny_bundle)  # exit 2 of 4 layers
    assert m.exit_agreement_floor == 0.25
    assert m.replace(exit_agreement=None).exit_can_pay
    assert m.replace(exit_agreement=0.25).exit_can_pay
    assert not m.replace(exit_agreement=0.2499).exit_can_pay
    assert "never runs it" in exit_agreement.describe(m.replace(exit_agreement=0.1))
    assert "measures whether" in exit_agreement.describe(m.replace(exit_agreement=0.3))


def test_export_records_the_agreement_it_measured(tiny_bundle):
    recorded = json.loads((tiny_bundle / "manifest.json").read_text())["exit_agreement"]
    assert recorded == exit_agreement.measure_bundle(tiny_bundle, manifest_io.read(tiny_bundle))
    assert 0.0 <= recorded <= 1.0


def _early_exit_rounds(bundle) -> int:
    config = GenerationConfig(draft_source="hybrid", max_new_tokens=24, ignore_eos=True)
    stats = GenerationStats()
    with Engine(bundle) as engine:
        engine.generate_ids([9, 3, 27, 81, 12], config, stats)  # no token repeats: few lookup matches
    return stats.by_source.get("early_exit", [0])[0]


def test_the_hybrid_never_probes_an_exit_under_the_floor_and_probes_one_above_it(tiny_bundle, tmp_path):
    assert _early_exit_rounds(_with_agreement(tiny_bundle, tmp_path, 0.0)) == 0
    assert _early_exit_rounds(_with_agreement(tiny_bundle, tmp_path, 0.9)) >= 3   # the first probes
    assert _early_exit_rounds(_with_agreement(tiny_bundle, tmp_path, None)) >= 3  # written before: probed
