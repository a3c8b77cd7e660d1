"""What teacher-forces the target over training text: the exported bundle's own graphs, or the
PyTorch model.

A teacher maps one text's token ids to the residual stream entering each feature layer and the
target's top-k next-token distribution at every position. The bundle's graphs (int4 / int8 as they
ship) are the teacher a head should learn from: they are what it drafts against, and a prefill pass
over a whole conversation runs on the same integer kernels as decoding (on the example, 2-core
AVX-512 VNNI VM: 1.2-1.5x the fp32 PyTorch model's positions a second; lab/scripts/teacher_rate.py).
The PyTorch model stays the teacher when no bundle is given (and the one that runs on a CUDA device).
"""
from __future__ import annotations

import numpy as np

from ..errors import ConfigError

Taught = tuple[np.ndarray, np.ndarray, np.ndarray]  # features [S, 3, T], top ids [S, k], their probs [S, k]


def top_k(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k likeliest ids of each row of logits [S, V], likeliest first, and their probabilities
    renormalised over the k (a softmax over the k logits: the full normaliser cancels). PyTorch's
    top-k where it is installed (training needs it; a fourth of NumPy's time over a 49k vocabulary)."""
    try:
        import torch
    except ImportError:
        return _numpy_top_k(logits, k)
    values, ids = torch.from_numpy(logits).topk(k, -1)                    # [S, k] each, likeliest first
    return ids.int().numpy(), torch.softmax(values.double(), -1).float().numpy()


def _numpy_top_k(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.argpartition(-logits, k - 1, axis=-1)[:, :k]                # [S, k] in no order
    values = np.take_along_axis(logits, ids, -1)                          # [S, k]
    order = np.argsort(-values, axis=-1, kind="stable")
    ids, values = np.take_along_axis(ids, order, -1), np.take_along_axis(values, order, -1)
    probs = np.exp((values - values[:, :1]).astype(np.float64))
    return ids.astype(np.int32), (probs / probs.sum(-1, keepdims=True)).astype(np.float32)


class BundleTeacher:
    """The bundle's draft and verify graphs over each text in prefill passes of `chunk` rows, its
    head graph over every row. The bundle must output the features the head reads (`specdeploy
    export --features`)."""

    name = "the bundle's graphs"

    def __init__(self, model, layers: tuple[int, ...], chunk: int = 512):
        m = model.manifest
        missing = [j for j in layers if j not in m.feature_layers]
        if missing:
            has = f"layers {list(m.feature_layers)}" if m.feature_layers else "none"
            raise ConfigError(f"the bundle outputs the features of {has}; the head reads layers {list(layers)}: "
                              f"re-export it with `specdeploy export --features` (or leave out --bundle)")
        self.model, self.chunk = model, min(chunk, model.max_rows)
        self.pick = [m.feature_layers.index(j) for j in layers]

    def __call__(self, ids: list[int], k: int) -> Taught:
        ids = ids[: self.model.max_context]
        features, top_ids, top_probs = [], [], []
        for start in range(0, len(ids), self.chunk):
            rows = ids[start : start + self.chunk]
            hidden = self.model.verify_pass(self.model.draft_pass(rows, start), start)  # [C, H]
            features.append(self.model.features()[:, self.pick])                         # [C, 3, H] a copy
            best, probs = top_k(self.model.logits(hidden), k)                             # [C, k] each
            top_ids.append(best)
            top_probs.append(probs)
        return np.concatenate(features), np.concatenate(top_ids), np.concatenate(top_probs)


class TorchTeacher:
    """The PyTorch model (fp32) over each whole text, on `device`."""

    name = "the PyTorch model"

    def __init__(self, model, layers: tuple[int, ...], device: str = "cpu"):
        self.model, self.layers, self.device = model.to(device), layers, device

    def __call__(self, ids: list[int], k: int) -> Taught:
        import torch

        with torch.no_grad():
            out = self.model(torch.tensor([ids], device=self.device), output_hidden_states=True)
            features = torch.stack([out.hidden_states[j][0] for j in self.layers], 1)    # [S, 3, T]
            top = torch.softmax(out.logits[0].float(), -1).topk(k, -1)                   # [S, k]
            probs = top.values / top.values.sum(-1, keepdim=True)
        return features.float().cpu().numpy(), top.indices.int().cpu().numpy(), probs.cpu().numpy()
