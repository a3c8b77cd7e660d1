"""The row-independence check: passes on exported bundles, fails on a stage whose rows depend on
how many a call carries, and runs at load for bundles checked on another machine."""
import json
import shutil

import numpy as np
import pytest

from specdeploy.backends import load_stages
from specdeploy.constants import MAX_DRAFT_TOKENS
from specdeploy.bundle import manifest as manifest_io
from specdeploy.errors import BundleError
from specdeploy.runtime import row_check
from specdeploy.runtime.engine import Engine
from specdeploy.runtime.split_model import SplitModel


class RowDependent:
    """Wraps a stage; a multi-row call (or one of `rows` rows only) gets its last bit flipped, as a
    different kernel would."""

    def __init__(self, stage, rows=None):
        self.stage, self.rows = stage, rows

    def run(self, feeds):
        out = self.stage.run(feeds)
        rows = next(iter(feeds.values())).shape[1]
        if rows > 1 and self.rows in (None, rows):
            hidden = out["hidden_out"]
            hidden[...] = np.nextafter(hidden, np.inf)
        return out

    def __getattr__(self, name):
        return getattr(self.stage, name)


def _model(bundle, wrap=None, rows=None):
    manifest = manifest_io.read(bundle)
    stages = load_stages(bundle, manifest)
    if wrap:
        stages[wrap] = RowDependent(stages[wrap], rows)
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


@pytest.mark.parametrize("rows", [4, 11, MAX_DRAFT_TOKENS + 1])
def test_every_row_count_a_pass_can_carry_is_checked(tiny_bundle, rows):
    """A kernel with its own code for one row count (a tile of 4, of 11, the longest verify pass)
    is caught at that count."""
    assert row_check.CHECK_ROWS == tuple(range(2, MAX_DRAFT_TOKENS + 2))
    model = _model(tiny_bundle, wrap="verify", rows=rows)
    result = row_check.check_model(model)
    model.close()
    assert not result.passed and result.max_diff["verify"] > 0 and result.max_diff["draft"] == 0


def test_a_rebuilt_operator_library_is_checked_again(tmp_path, monkeypatch):
    """The recorded machine names the operator library's build for a bundle that uses it: a
    library rebuilt (other bytes) is another machine; a bundle without operators does not care."""
    from specdeploy import kernels

    library = tmp_path / "libspecdeploy_kernels.so"
    monkeypatch.setattr(kernels, "library_path", lambda flags=kernels.FLAGS: library)
    plain = row_check.machine_fingerprint()
    library.write_bytes(b"one build")
    first = row_check.machine_fingerprint("cpu", (kernels.Q4_0,))
    library.write_bytes(b"another build")
    assert row_check.machine_fingerprint("cpu", (kernels.Q4_0,)) not in (first, plain)
    assert row_check.machine_fingerprint() == plain and first.startswith(plain)


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
