"""Export without holding the model: a skeleton traced, its weights streamed one tensor at a time.

Loading a checkpoint in fp32 and letting the exporter serialise it held about 12 bytes a parameter
at once (the model, the exporter's copies, the protos): a 1.5B model needed ~18 GB before
quantization added its own. Here the model is built with every parameter on the meta device (its
buffers, the rotary frequencies and embedding scales, are small and real), the graphs are traced
from that skeleton (onnx_export: over zero-byte stand-ins) and saved without initializers, and each initializer is then
read from the source file (tensor_source.py), written into the shared weights file and dropped.
The validating reference runs the same skeleton with each decoder layer's weights loaded just
before the layer runs and dropped after, so it is as exact as the whole model and holds one layer.

Peak memory is then the largest tensor (the embedding) plus one layer, not the model.
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np

from ..errors import ModelSourceError, SpecDeployError, UnsupportedModelError, require


@contextlib.contextmanager
def _parameters_on_meta():
    """Parameters registered inside the block go to the meta device as they are created (their
    CPU allocation, never written, is freed at once); buffers stay real."""
    import torch

    original = torch.nn.Module.register_parameter

    def register(module, name, param):
        if param is not None and not param.is_meta:
            param = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        original(module, name, param)

    torch.nn.Module.register_parameter = register
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = original


def streamable(source: Path) -> bool:
    """Whether `source`'s weights can be read a tensor at a time: a GGUF, or a directory of
    safetensors whose model is a text decoder (a multimodal checkpoint is loaded whole)."""
    import json

    source = Path(source)
    if source.suffix == ".gguf":
        return True
    config = source / "config.json"
    return (any(source.glob("*.safetensors")) and config.is_file()
            and json.loads(config.read_text()).get("model_type") != "gemma3")


class StreamedWeights:
    """A skeleton's weights (its parameters on the meta device, its buffers real) read from the source."""

    def __init__(self, model, source):
        self.model, self.source = model, source
        self._names = source.names()
        self._aliases: dict[int, list[str]] = {}
        for name, param in model.named_parameters(remove_duplicate=False):
            self._aliases.setdefault(id(param), []).append(name)

    def parameter(self, param) -> np.ndarray:
        """`param`'s values (a tied head is the embedding under whichever name the file has)."""
        names = self._aliases.get(id(param), [])
        found = next((n for n in names if n in self._names), None)
        if found is None:
            raise ModelSourceError(f"the source has no tensor for {' / '.join(names) or 'an unnamed parameter'}; "
                              f"the checkpoint does not match its config: re-download the model")
        return self.source.get(found)

    def initializers(self, module) -> dict:
        """Initializer name in `module`'s traced graph -> a function giving its values."""
        values = {name: (lambda p=param: self.parameter(p) if p.is_meta else p.detach().numpy())
                  for name, param in module.named_parameters(remove_duplicate=False)}  # (a feature head's are real)
        for name, buffer in module.named_buffers(remove_duplicate=False):
            values[name] = lambda b=buffer: b.numpy()
        return values

    @contextlib.contextmanager
    def materialized(self):
        """The skeleton runnable for a reference: each unit's (a decoder layer, the embedding, the
        final norm, the head) weights loaded while it runs and dropped after."""
        import torch

        handles = []
        for unit in _units(self.model):
            handles.append(unit.register_forward_pre_hook(lambda m, args: self._load(m, torch)))
            handles.append(unit.register_forward_hook(lambda m, args, out: self._drop(m)))
        try:
            yield self.model
        finally:
            for handle in handles:
                handle.remove()

    def _load(self, unit, torch) -> None:
        """The unit's weights as tensors over the source's arrays, read-only where the source maps its
        file: the reference only reads them (torch warns that it could write)."""
        import warnings

        unit._meta_parameters = dict(unit.named_parameters(remove_duplicate=False))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            for name, param in unit._meta_parameters.items():
                _set(unit, name, torch.nn.Parameter(torch.from_numpy(self.parameter(param)), requires_grad=False))

    def _drop(self, unit) -> None:
        for name, param in unit.__dict__.pop("_meta_parameters").items():
            _set(unit, name, param)


def _set(root, dotted: str, value) -> None:
    *path, leaf = dotted.split(".")
    (root.get_submodule(".".join(path)) if path else root)._parameters[leaf] = value


def _units(model) -> list:
    """Each decoder layer, and each module with parameters of its own outside the layers."""
    layers = list(model.model.layers)
    inside = {id(m) for layer in layers for m in layer.modules()}
    others = [m for m in model.modules() if id(m) not in inside and any(True for _ in m.parameters(recurse=False))]
    return layers + others


def load_skeleton(source: Path):
    """(skeleton model, tokenizer, StreamedWeights) for a .gguf file or a safetensors directory,
    checked as `arch.load` checks; no weight is read."""
    from .arch import check_options, check_supported
    from .inputs import check_source, load_failure

    transformers = require("transformers", "export", "exporting a model")
    torch = require("torch", "export", "exporting a model")
    source = Path(source)
    check_source(source, check_supported)
    directory, kwargs = (source.parent, {"gguf_file": source.name}) if source.suffix == ".gguf" else (source, {})
    try:
        config = transformers.AutoConfig.from_pretrained(directory, **kwargs)
        check_supported(config.model_type)
        check_options(config)
        with _parameters_on_meta():
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
        model.generation_config = _generation_config(transformers, directory, kwargs, config)
        tokenizer = transformers.AutoTokenizer.from_pretrained(directory, **kwargs)
        from .tensor_source import open_source

        weights = StreamedWeights(model, open_source(source, model))
    except SpecDeployError:
        raise
    except Exception as exc:  # the loaders' own types; reported in one line with the file
        raise load_failure(source, exc) from exc
    return model, tokenizer, weights


def _generation_config(transformers, directory: Path, kwargs: dict, config):
    try:
        return transformers.GenerationConfig.from_pretrained(directory, **kwargs)
    except (OSError, ValueError):
        return transformers.GenerationConfig.from_model_config(config)


def write_weights(graphs: dict, values: dict, out_dir: Path, weights_file: str) -> dict[str, int]:
    """Add each traced graph's initializers (`graphs`: name -> (saved graph, its initializer specs);
    `values`: name -> {initializer: values()}) to it, the large ones in the shared weights file
    (bundle/weights.SharedFile), one tensor in memory at a time; returns byte counts as
    `weights.share` does."""
    import onnx
    from onnx import numpy_helper

    from ..bundle.weights import INLINE_LIMIT, SharedFile, point

    with SharedFile(out_dir / weights_file) as blob:
        for name, (path, specs) in graphs.items():
            model = onnx.load(str(path))
            for tensor in model.graph.initializer:  # traced with real weights (a feature head's projection)
                if len(tensor.raw_data) >= INLINE_LIMIT:
                    point(tensor, weights_file, *blob.add(tensor.raw_data, tensor.data_type))
            for init, (dims, dtype) in specs.items():
                array = _checked(values[name], init, dims, dtype)
                if array.nbytes < INLINE_LIMIT:
                    model.graph.initializer.append(numpy_helper.from_array(array, init))
                    continue
                # hashed and written from the array's own buffer: no copy of a large tensor is made
                tensor = onnx.TensorProto(name=init, dims=array.shape,
                                          data_type=onnx.helper.np_dtype_to_tensor_dtype(array.dtype))
                data = memoryview(np.ascontiguousarray(array)).cast("B")
                point(tensor, weights_file, *blob.add(data, tensor.data_type))
                model.graph.initializer.append(tensor)
                del array, data
            onnx.save(model, str(out_dir / f"{name}.onnx"))
    return blob.sizes()


def _checked(values: dict, name: str, dims: tuple, dtype) -> np.ndarray:
    if name not in values:
        raise UnsupportedModelError(f"the traced graph needs '{name}', which is neither a weight nor a buffer of the model; "
                          f"this family cannot be exported streamed: please report it with the model config")
    array = np.asarray(values[name]()).astype(dtype, copy=False)
    if tuple(array.shape) != tuple(dims):
        raise ModelSourceError(f"{name}: the source holds shape {tuple(array.shape)}, the model expects {tuple(dims)}; "
                          f"the checkpoint does not match its config: re-download the model")
    return array
