"""`specdeploy train-head` end to end on the tiny model: a head in the EAGLE-3 format, its
acceptance measured, the target's features cached and training resumed rather than redone."""
import json

import pytest
from click.testing import CliRunner

from specdeploy.cli import main
from specdeploy.feature_head import eagle3

pytestmark = pytest.mark.integration


@pytest.fixture
def conversations(tmp_path):
    path = tmp_path / "chats.jsonl"
    rows = [{"messages": [{"role": "user", "content": " ".join(f"w{(i * 7 + j) % 90 + 3}" for j in range(12))},
                          {"role": "assistant", "content": " ".join(f"w{(i + j) % 90 + 3}" for j in range(20))}]}
            for i in range(24)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_train_head_writes_a_head_and_resumes(tiny_model_dir, conversations, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEPLOY_CACHE", str(tmp_path / "cache"))
    args = ["train-head", str(tiny_model_dir), "--data", str(conversations), "-o", str(tmp_path / "head"),
            "--tokens", "1000", "--steps", "4", "--draft-vocab", "48", "--held-out", "4"]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    assert "acceptance per draft position" in first.output and "tau" in first.output
    config, tensors = eagle3.read(tmp_path / "head")
    assert config.draft_vocab_size == 48 and config.target_num_layers == 4
    measured = eagle3.read_acceptance(tmp_path / "head")  # kept with the head: a bundle made from it says it
    assert len(measured["per_position"]) == 4 and f"tau {measured['tau']:.2f}" in first.output
    second = CliRunner().invoke(main, args)
    assert second.exit_code == 0, second.output
    assert "target features: cached" in second.output
    assert "step 1/4" not in second.output  # resumed at its last checkpoint: no step ran again
    _, again = eagle3.read(tmp_path / "head")
    assert all((again[k] == v).all() for k, v in tensors.items())


def test_missing_data_is_one_line(tiny_model_dir, tmp_path):
    result = CliRunner().invoke(main, ["train-head", str(tiny_model_dir), "--data", str(tmp_path / "none.jsonl"),
                                       "-o", str(tmp_path / "head")])
    assert result.exit_code != 0
    assert "--data" in result.output and "does not exist" in result.output and "Traceback" not in result.output


def test_train_head_teacher_forces_with_the_bundles_graphs(features_bundle, tmp_path, conversations, monkeypatch):
    monkeypatch.setenv("SPECDEPLOY_CACHE", str(tmp_path / "cache"))
    bundle = features_bundle
    args = ["train-head", str(bundle.parent / "llama-model"), "--data", str(conversations), "-o",
            str(tmp_path / "head"), "--tokens", "1000", "--steps", "4", "--draft-vocab", "48", "--held-out", "4",
            "--bundle", str(bundle)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "teacher: the bundle's graphs" in result.output and "teacher-forcing the target (the bundle's" in result.output
    assert eagle3.read_acceptance(tmp_path / "head")["teacher"] == "bundle"
    exported = CliRunner().invoke(main, ["export", str(bundle.parent / "llama-model"), "--exit-layer", "2",
                                         "--max-context", "128", "--feature-head", str(tmp_path / "head"),
                                         "-o", str(tmp_path / "with-head")])
    assert exported.exit_code == 0, exported.output


def test_a_bundle_without_features_is_one_line(tiny_bundle, tiny_model_dir, conversations, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEPLOY_CACHE", str(tmp_path / "cache"))
    result = CliRunner().invoke(main, ["train-head", str(tiny_model_dir), "--data", str(conversations), "-o",
                                       str(tmp_path / "head"), "--tokens", "1000", "--held-out", "4",
                                       "--bundle", str(tiny_bundle)])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "export --features" in result.output
    result = CliRunner().invoke(main, ["train-head", str(tiny_model_dir), "--data", str(conversations), "-o",
                                       str(tmp_path / "head"), "--bundle", str(tmp_path / "nowhere")])
    assert result.exit_code != 0 and "is not a bundle" in result.output and "Traceback" not in result.output
