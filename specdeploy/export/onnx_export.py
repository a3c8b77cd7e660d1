"""torch.onnx (dynamo, opset 24) export of the split modules, with names and axes from io_names."""
from __future__ import annotations

import contextlib
import logging
import warnings
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Traced:
    """A traced graph's module, and the initializers {name: (dims, dtype)} left for the caller to
    write (a skeleton's: streamed.py; none for a loaded model, whose weights are saved with it)."""

    module: object
    initializers: dict


def _export(module, args, names, path: Path, dynamic_shapes, opset: int = OPSET) -> Traced:
    """Trace `module` into `path`; a skeleton's graph (parameters on the meta device: streamed.py) is
    traced over zero-byte stand-ins and saved without initializers."""
    from . import split

    inputs, outputs = names
    split.EXPORT_OPSET["value"] = opset
    skeleton = any(p.is_meta for p in module.parameters())
    # torch's exporter logs once per export that torchvision, which a decoder never uses, is absent
    # (torch re-initialises its loggers on import, so this is set here, not in the CLI)
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with warnings.catch_warnings(), _stand_ins(module) if skeleton else contextlib.nullcontext():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            module.eval(), args, None if skeleton else str(path), dynamo=True, opset_version=opset,
            input_names=inputs, output_names=outputs, dynamic_shapes=dynamic_shapes,
            external_data=True, optimize=False, verbose=False,
        )
    if not skeleton:
        _standard_splits(path)
        return Traced(module, {})
    specs = {v.name: (tuple(v.shape), v.dtype.numpy()) for v in program.model.graph.initializers.values()}
    program.save(str(path), include_initializers=False)
    _standard_splits(path)
    return Traced(module, specs)


def _standard_splits(path: Path) -> None:
    """Sequences the exporter made of `chunk` become Split nodes (optimize/decompose.py), in place."""
    import onnx

    from ..optimize.decompose import sequence_splits

    model = onnx.load(str(path), load_external_data=False)
    if sequence_splits(model):
        onnx.save(model, str(path))


@contextlib.contextmanager
def _stand_ins(module):
    """Each meta parameter as a CPU tensor of its shape over one broadcast element: the trace is the
    one a loaded model gives (same device, same ops), and no weight's bytes exist."""
    stand_in, swapped = {}, []
    for owner in module.modules():
        for name, param in list(owner._parameters.items()):
            if param is not None and param.is_meta:
                if id(param) not in stand_in:
                    zero = torch.zeros((), dtype=param.dtype).expand(param.shape)
                    stand_in[id(param)] = torch.nn.Parameter(zero, requires_grad=False)
                owner._parameters[name] = stand_in[id(param)]
                swapped.append((owner, name, param))
    try:
        yield
    finally:
        for owner, name, param in swapped:
            owner._parameters[name] = param


def _decoder_shapes(first_name: str, kv_count: int) -> dict:
    seq = torch.export.Dim(io_names.SEQ, min=1, max=4096)
    total = torch.export.Dim(io_names.TOTAL, min=2, max=8192)
    return {
        first_name: {1: seq}, "position_ids": {1: seq}, "write_index": None,
        "attention_mask": {1: total}, "past": [None] * kv_count,
    }


def export_draft(model, exit_layer: int, max_context: int, path: Path, opset: int = OPSET,
                 features: tuple[int, ...] = ()) -> Traced:
    layers = range(0, exit_layer)
    kv = sample_kv(model, layers, max_context)
    args = _decoder_args(torch.tensor([[1, 2, 3]]), 3, 2, kv)
    names = io_names.decoder_io(io_names.INPUT_IDS, layers, features)
    return _export(DraftModule(model, exit_layer, features), args, names, path,
                   _decoder_shapes("input_ids", len(kv)), opset)


def export_verify(model, exit_layer: int, max_context: int, path: Path, opset: int = OPSET,
                  features: tuple[int, ...] = ()) -> Traced:
    layers = range(exit_layer, model.config.num_hidden_layers)
    kv = sample_kv(model, layers, max_context)
    hidden = torch.randn(1, 3, model.config.hidden_size)
    args = _decoder_args(hidden, 3, 2, kv)
    names = io_names.decoder_io(io_names.HIDDEN_IN, layers, features)
    return _export(VerifyModule(model, exit_layer, features), args, names, path,
                   _decoder_shapes("hidden_in", len(kv)), opset)


def export_head(model, path: Path, adapter=None, vocab_ids=None, opset: int = OPSET) -> Traced:
    hidden = torch.randn(1, 2, model.config.hidden_size)
    shapes = {"hidden_in": {1: torch.export.Dim(io_names.SEQ, min=1, max=4096)}}
    module = HeadModule(model, adapter=adapter, vocab_ids=vocab_ids)
    return _export(module, (hidden,), io_names.head_io(), path, shapes, opset)
