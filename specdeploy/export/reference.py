"""PyTorch reference stages over the split modules: the golden model for parity checks.

Same Stage protocol as the real backends, so the exporter validates ONNX Runtime against it by
running one schedule through both. Needs torch (export extra); never used by the runtime.
"""
from __future__ import annotations

import numpy as np
import torch

from ..bundle import io_names
from ..bundle.manifest import Manifest


class TorchStage:
    def __init__(self, name: str, module: torch.nn.Module, layers: range, kv_shape):
        self.name, self.module, self.layers = name, module.eval(), layers
        self.kv = [torch.zeros(kv_shape) for _ in range(2 * len(layers))]

    @torch.no_grad()
    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        tensors = {k: torch.from_numpy(np.array(v)) for k, v in feeds.items()}
        if io_names.HIDDEN_IN in tensors and not len(self.layers):
            return {io_names.LOGITS: self.module(tensors[io_names.HIDDEN_IN]).numpy()}
        first = tensors.get(io_names.INPUT_IDS, tensors.get(io_names.HIDDEN_IN))
        outputs = self.module(
            first, tensors[io_names.POSITION_IDS], tensors[io_names.WRITE_INDEX],
            tensors[io_names.ATTENTION_MASK], self.kv,
        )
        features = getattr(self.module, "features", ())
        self.kv = list(outputs[1 + len(features):])
        out = {io_names.feature(j): f.numpy() for j, f in zip(features, outputs[1:])}
        return {io_names.HIDDEN_OUT: outputs[0].numpy(), **out}

    def kv_buffer(self, name: str):
        names = io_names.kv_inputs(self.layers)
        return self.kv[names.index(name)].numpy() if name in names else None

    def close(self) -> None:
        pass


def reference_stages(model, manifest: Manifest, adapter=None, vocab_ids=None) -> dict:
    from .split import DraftModule, HeadModule, VerifyModule

    k, shape, num_layers = manifest.exit_layer, manifest.kv_shape, manifest.model.num_layers
    draft = io_names.graph_features(manifest.feature_layers, 0, k)
    verify = io_names.graph_features(manifest.feature_layers, k, num_layers)
    stages = {
        io_names.DRAFT: TorchStage("draft", DraftModule(model, k, draft), range(0, k), shape),
        io_names.VERIFY: TorchStage("verify", VerifyModule(model, k, verify), range(k, num_layers), shape),
        io_names.HEAD: TorchStage("head", HeadModule(model), range(0), shape),
    }
    if io_names.DRAFT_HEAD in manifest.graphs:
        stages[io_names.DRAFT_HEAD] = TorchStage(
            "draft_head", HeadModule(model, adapter, vocab_ids), range(0), shape
        )
    return stages
