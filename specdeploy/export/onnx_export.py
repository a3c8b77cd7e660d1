"""torch.onnx (dynamo, opset 24) export of the split modules, with names and axes from io_names."""
from __future__ import annotations

import logging
import warnings
from pathlib import Path

import torch

from ..bundle import io_names
from ..constants import DEFAULT_OPSET
from .split import DraftModule, HeadModule, VerifyModule

OPSET = DEFAULT_OPSET


def sample_kv(model, layers: range, max_context: int) -> list[torch.Tensor]:
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    shape = (1, kv_heads, max_context, head_dim)
    return [torch.zeros(shape) for _ in range(2 * len(layers))]


def _decoder_args(first, seq: int, write: int, kv):
    positions = torch.arange(write, write + seq).view(1, -1)
    return (first, positions, torch.tensor([write]), torch.ones(1, write + seq, dtype=torch.int64), kv)


def _export(module, args, names, path: Path, dynamic_shapes, opset: int = OPSET) -> None:
    from . import split

    inputs, outputs = names
    split.EXPORT_OPSET["value"] = opset
    # torch's exporter logs once per export that torchvision, which a decoder never uses, is absent
    # (torch re-initialises its loggers on import, so this is set here, not in the CLI)
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module.eval(), args, str(path), dynamo=True, opset_version=opset,
            input_names=inputs, output_names=outputs, dynamic_shapes=dynamic_shapes,
            external_data=True, optimize=False, verbose=False,
        )


def _decoder_shapes(first_name: str, kv_count: int) -> dict:
    seq = torch.export.Dim(io_names.SEQ, min=1, max=4096)
    total = torch.export.Dim(io_names.TOTAL, min=2, max=8192)
    return {
        first_name: {1: seq}, "position_ids": {1: seq}, "write_index": None,
        "attention_mask": {1: total}, "past": [None] * kv_count,
    }


def export_draft(model, exit_layer: int, max_context: int, path: Path, opset: int = OPSET) -> None:
    layers = range(0, exit_layer)
    kv = sample_kv(model, layers, max_context)
    args = _decoder_args(torch.tensor([[1, 2, 3]]), 3, 2, kv)
    names = io_names.decoder_io(io_names.INPUT_IDS, layers)
    _export(DraftModule(model, exit_layer), args, names, path, _decoder_shapes("input_ids", len(kv)), opset)


def export_verify(model, exit_layer: int, max_context: int, path: Path, opset: int = OPSET) -> None:
    layers = range(exit_layer, model.config.num_hidden_layers)
    kv = sample_kv(model, layers, max_context)
    hidden = torch.randn(1, 3, model.config.hidden_size)
    args = _decoder_args(hidden, 3, 2, kv)
    names = io_names.decoder_io(io_names.HIDDEN_IN, layers)
    _export(VerifyModule(model, exit_layer), args, names, path, _decoder_shapes("hidden_in", len(kv)), opset)


def export_head(model, path: Path, adapter=None, vocab_ids=None, opset: int = OPSET) -> None:
    hidden = torch.randn(1, 2, model.config.hidden_size)
    shapes = {"hidden_in": {1: torch.export.Dim(io_names.SEQ, min=1, max=4096)}}
    module = HeadModule(model, adapter=adapter, vocab_ids=vocab_ids)
    _export(module, (hidden,), io_names.head_io(), path, shapes, opset)
