"""The row-independence check: passes on exported bundles, fails on a stage whose rows depend on
how many a call carries, and runs at load for bundles checked on another machine."""
import json
import shutil

import numpy as np
import pytest

from specdeploy.backends import load_stages
from specdeploy.bundle import manifest as manifest_io
from specdeploy.errors import BundleError
from specdeploy.runtime import row_check
from specdeploy.runtime.engine import Engine
from specdeploy.runtime.split_model import SplitModel


class RowDependent:
    """Wraps a stage; a multi-row call gets its last bit flipped, as a different kernel would."""

    def __init__(self, stage):
        self.stage = stage

    def run(self, feeds):
        out = self.stage.run(feeds)
        rows = next(iter(feeds.values())).shape[1]
        if rows > 1:
            hidden = out["hidden_out"]
            hidden[...] = np.nextafter(hidden, np.inf)
        return out

    def __getattr__(self, name):
        return getattr(self.stage, name)


def _model(bundle, wrap=None):
    manifest = manifest_io.read(bundle)
    stages = load_stages(bundle, manifest)
    if wrap:
        stages[wrap] = RowDependent(stages[wrap])
    return SplitModel(manifest, stages)


def test_exported_bundle_is_bitwise_row_independent(tiny_bundle):
    recorded = manifest_io.read(tiny_bundle).row_check
    assert recorded["passed"] and recorded["machine"] == row_check.machine_fingerprint()
    model = _model(tiny_bundle)
    result = row_check.check_model(model)
    model.close()
    assert result.passed and set(result.max_diff) == {"draft", "verify", "head"}
    assert set(result.max_diff.values()) == {0.0}


@pytest.mark.parametrize("graph", ["draft", "verify"])
def test_a_row_dependent_graph_fails_the_check(tiny_bundle, graph):
    model = _model(tiny_bundle, wrap=graph)
    result = row_check.check_model(model)
    model.close()
    assert not result.passed and result.max_diff[graph] > 0
    assert f"{graph} differs" in row_check.describe(result)


def _moved(bundle, tmp_path, machine):
    copy = tmp_path / "elsewhere"
    shutil.copytree(bundle, copy)
    data = json.loads((copy / "manifest.json").read_text())
    data["row_check"]["machine"] = machine
    (copy / "manifest.json").write_text(json.dumps(data))
    return copy


def test_a_bundle_checked_elsewhere_is_checked_at_load(tiny_bundle, tmp_path, monkeypatch):
    copy = _moved(tiny_bundle, tmp_path, "another machine")
    with Engine(copy) as engine:
        assert engine.row_check is not None and engine.row_check.passed
    with Engine(tiny_bundle) as engine:  # checked here: not again
        assert engine.row_check is None
    wrapped = row_check.check_model

    def on_row_dependent_kernels(model, provider="cpu"):
        model.draft_stage = RowDependent(model.draft_stage)
        return wrapped(model, provider)

    monkeypatch.setattr(row_check, "check_model", on_row_dependent_kernels)
    with pytest.raises(BundleError, match="not row-independent on this machine.*re-export"):
        Engine(copy)
