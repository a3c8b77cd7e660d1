"""Training-time test against drafting: the unrolled training pass computes, for every position at
once, exactly what the head computes while drafting from a KV cache; a few steps learn; the
acceptance replay counts what greedy decoding would accept."""
import numpy as np
import pytest
import torch

from specdeploy.feature_head import evaluate
from specdeploy.feature_head.data import Features
from specdeploy.feature_head.model import FeatureHead
from specdeploy.feature_head.train import TrainConfig, train, unrolled, window

pytestmark = pytest.mark.unit


def features(config, n: int = 40, segments: int = 2, seed: int = 0) -> Features:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, config.vocab_size, (n, 4)).astype(np.int32)
    probs = rng.dirichlet(np.ones(4), n).astype(np.float16)
    return Features(tokens=rng.integers(0, config.vocab_size, n).astype(np.int32),
                    features=rng.standard_normal((n, 3, config.target_hidden_size)).astype(np.float16),
                    teacher_ids=ids, teacher_probs=probs,
                    segment=np.repeat(np.arange(segments), n // segments).astype(np.int32))


@pytest.fixture
def head(head_config, head_tensors) -> FeatureHead:
    model = FeatureHead(head_config)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in head_tensors.items()})
    return model.eval()


def test_each_unrolled_step_is_what_drafting_computes(head, head_config):
    """Step j at position t equals a drafting pass: the head's cache holding positions <= t from
    the target's features, then its own chain, one row per earlier step."""
    data = features(head_config, 12, 1)
    batch = window(data, np.array([0]), 12)
    embed = torch.nn.Embedding(head_config.vocab_size, head_config.hidden_size)
    with torch.no_grad():
        steps = [logits for _, logits, _, _ in unrolled(head, embed, batch, 3)]
        projected = head.fc(batch["features"])                                # [1, S, H]
        tokens = batch["tokens"]
        for t in (0, 4, 8):
            logits, out, past = head(projected[:, : t + 1], embed(tokens[:, 1 : t + 2]), torch.arange(t + 1)[None])
            torch.testing.assert_close(logits[:, t], steps[0][:, t], rtol=1e-4, atol=1e-4)
            for j in (1, 2):  # the chain: own output, the text's next token, position t + j
                logits, out, past = head(out[:, -1:], embed(tokens[:, t + j + 1 : t + j + 2]),
                                         torch.tensor([[t + j]]), past)
                torch.testing.assert_close(logits[:, 0], steps[j][:, t], rtol=1e-4, atol=1e-4)


def test_no_position_attends_across_conversations(head, head_config):
    data = features(head_config, 16, 2)
    batch = window(data, np.array([0]), 16)
    embed = torch.nn.Embedding(head_config.vocab_size, head_config.hidden_size)
    alone = window(features(head_config, 16, 2), np.array([8]), 8)
    with torch.no_grad():
        joined = next(unrolled(head, embed, batch, 1))[1]
        second = next(unrolled(head, embed, alone, 1))[1]
    torch.testing.assert_close(joined[:, 8:15], second, rtol=1e-4, atol=1e-4)


def test_a_few_steps_fit_the_teacher(head_config, tmp_path):
    torch.manual_seed(0)
    model = FeatureHead(head_config)
    model.d2t.zero_()  # the whole vocabulary's first rows: draft row i is target id i
    data = features(head_config, 64, 2)
    data.teacher_ids[:] = data.teacher_ids % head_config.draft_vocab_size
    embed = torch.nn.Embedding(head_config.vocab_size, head_config.hidden_size)
    losses = []
    config = TrainConfig(steps=60, sequence=16, batch=4, warmup=5, learning_rate=3e-3, checkpoint_every=30)
    train(model, embed, data, config, tmp_path / "ckpt.pt", report=lambda s, loss, a, eta: losses.append(loss))
    assert np.mean(losses[-10:]) < 0.7 * np.mean(losses[:5])
    saved = torch.load(tmp_path / "ckpt.pt", weights_only=False)
    assert saved["step"] == 60
    resumed = []  # a finished run resumes at its last step: nothing left to do
    train(FeatureHead(head_config), embed, data, config, tmp_path / "ckpt.pt",
          report=lambda s, loss, a, eta: resumed.append(s))
    assert resumed == []


def test_acceptance_replays_greedy_chains(head, head_config, monkeypatch):
    """A head whose drafts are right at chosen places: draft 1 everywhere, draft 2 at even t only."""
    n = 10
    data = features(head_config, n, 1)
    vocab = head.d2t.numpy() + np.arange(head_config.draft_vocab_size)
    greedy = vocab[np.arange(n) % head_config.draft_vocab_size]
    data.teacher_ids[:, 0] = greedy
    data.tokens[1:] = greedy[:-1]  # the text is the target's greedy choice everywhere

    def fake(head, embed, batch, steps):
        for j in range(steps):
            span = n - j - 1
            rows = (np.arange(span) + j + 1) % head_config.draft_vocab_size   # right: greedy[t + j + 1]
            if j == 1:
                rows = np.where(np.arange(span) % 2 == 0, rows, (rows + 1) % head_config.draft_vocab_size)
            if j >= 2:
                rows = (rows + 1) % head_config.draft_vocab_size
            logits = torch.full((1, span, head_config.draft_vocab_size), -1.0)
            logits[0, torch.arange(span), torch.from_numpy(rows)] = 1.0
            yield j, logits, None, slice(j + 1, n)

    monkeypatch.setattr(evaluate, "unrolled", fake)
    measured = evaluate.acceptance(head, None, data, gamma=3)
    assert measured.rounds == n - 1
    assert measured.per_position[0] == 1.0
    assert measured.per_position[1] == pytest.approx(4 / 8)  # t = 0, 2, 4, 6 of the 8 that reach it
    assert measured.per_position[2] == 0.0
    assert measured.tau == pytest.approx(1 + 1 + 0.5)
