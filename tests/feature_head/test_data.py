"""Conversations as users keep them, and the target's features over them."""
import json

import numpy as np
import pytest

from specdeploy.errors import ConfigError
from specdeploy.feature_head.data import FeatureConfig, read_conversations, teacher_force

pytestmark = pytest.mark.unit


def test_the_three_forms_read_alike(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in [
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
        {"text": "plain text"},
    ]) + "\n")
    first, second, third = read_conversations(path)
    assert first == second == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert third == "plain text"


@pytest.mark.parametrize("line, message", [
    ('{"prompt": "x"}', r"c.jsonl:1: expected a conversation like"),
    ('{"messages": [{"role": "robot", "content": "x"}]}', "a turn needs a role"),
    ("not json", r"c.jsonl:1 is not valid JSON"),
])
def test_a_bad_line_is_named(tmp_path, line, message):
    (tmp_path / "c.jsonl").write_text(line + "\n")
    with pytest.raises(ConfigError, match=message):
        read_conversations(tmp_path / "c.jsonl")


def test_teacher_forcing_keeps_the_layers_inputs_and_the_top_k(tiny_model_and_tokenizer):
    import torch

    model, tokenizer = tiny_model_and_tokenizer
    texts = [[3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13], [2, 3]]  # the last is too short to learn from
    from specdeploy.feature_head.teachers import TorchTeacher

    data = teacher_force(TorchTeacher(model, (0, 2, 4)), tokenizer, texts, FeatureConfig((0, 2, 4), top_k=5))
    assert len(data) == 11 and list(np.unique(data.segment)) == [0, 1]
    with torch.no_grad():
        out = model(torch.tensor([texts[1]]), output_hidden_states=True)
    np.testing.assert_allclose(data.features[6:, 1], out.hidden_states[2][0].numpy(), rtol=1e-2, atol=1e-2)
    assert np.array_equal(data.teacher_ids[6:, 0], out.logits[0].argmax(-1).numpy())
    np.testing.assert_allclose(data.teacher_probs.astype(np.float32).sum(-1), 1.0, atol=1e-2)


def test_features_beyond_fp16s_range_are_kept_in_fp32():
    from specdeploy.feature_head.data import compact

    small, large = np.array([[1.5, -300.0]], np.float32), np.array([[1.5, 70000.0]], np.float32)
    assert compact(small).dtype == np.float16 and compact(large).dtype == np.float32
    assert np.isfinite(compact(large)).all() and (compact(large) == large).all()
