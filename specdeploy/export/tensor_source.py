"""A model's weights read one tensor at a time, as fp32, from the file they live in.

The streamed export (export/streamed.py) never holds the model: it traces a skeleton whose
parameters live on the meta device and asks a source for each weight only when that weight is
written (or, while validating, when the layer that owns it runs). A GGUF is memory-mapped and a
tensor dequantized when asked; a safetensors file is memory-mapped and a tensor converted when
asked. Names are the Hugging Face module's own (`model.layers.0.self_attn.q_proj.weight`), mapped
from a GGUF's with transformers' own name map and per-architecture processing (Llama's q/k
permutation, Gemma's norm offsets), so a tensor read here is the tensor `from_pretrained` loads.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..errors import ModelSourceError


class SafetensorsSource:
    """The tensors of a Hugging Face directory's *.safetensors files, by name."""

    def __init__(self, directory: Path):
        from safetensors import safe_open

        self._files, self._open = {}, safe_open
        index = directory / "model.safetensors.index.json"
        files = (sorted({directory / f for f in json.loads(index.read_text())["weight_map"].values()})
                 if index.is_file() else sorted(directory.glob("*.safetensors")))
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():
                    self._files[key] = file

    def names(self) -> set[str]:
        return set(self._files)

    def get(self, name: str) -> np.ndarray:
        import torch

        with self._open(str(self._files[name]), framework="pt") as f:
            return f.get_tensor(name).to(torch.float32).numpy()


class GgufSource:
    """The tensors of a GGUF file under the names its Hugging Face model gives them.

    Only each tensor's place in the file is kept (the parsed metadata, a vocabulary's worth of small
    objects, is dropped), and a tensor is mapped when asked and unmapped after: the file's pages do
    not stay resident between reads."""

    def __init__(self, path: Path, skeleton):
        import gguf
        from transformers import modeling_gguf_pytorch_utils as hf_gguf

        reader = gguf.GGUFReader(path)
        arch = str(bytes(reader.fields["general.architecture"].parts[-1]), "utf-8")
        config = hf_gguf.load_gguf_checkpoint(path, return_tensors=False).get("config", {})
        self._path = Path(path)
        self._processor = hf_gguf.TENSOR_PROCESSORS.get(arch, hf_gguf.TensorProcessor)(config=config)
        self._mapping = hf_gguf.get_gguf_hf_weights_map(skeleton, self._processor)
        self._tensors = {self._mapping[t.name]: (t.name, t.tensor_type, t.data_offset, t.data.shape, t.data.dtype)
                         for t in reader.tensors if t.name in self._mapping}

    def names(self) -> set[str]:
        return set(self._tensors)

    def get(self, name: str) -> np.ndarray:
        from gguf import dequantize

        gguf_name, kind, offset, shape, dtype = self._tensors[name]
        data = np.memmap(self._path, dtype=dtype, mode="r", offset=offset, shape=shape)
        weights = dequantize(data, kind)
        del data
        result = self._processor.process(weights=weights, name=gguf_name, tensor_key_mapping=self._mapping,
                                         parsed_parameters={"config": self._processor.config, "tensors": {}})
        return np.ascontiguousarray(result.weights, dtype=np.float32)


def open_source(source: Path, skeleton):
    """The tensor source of a .gguf file or a Hugging Face directory (`skeleton` names a GGUF's)."""
    source = Path(source)
    if source.suffix == ".gguf":
        return GgufSource(source, skeleton)
    if not any(source.glob("*.safetensors")):
        raise ModelSourceError(f"{source} has no *.safetensors weights; the streamed export reads safetensors "
                               f"(convert a PyTorch .bin checkpoint with transformers' save_pretrained)")
    return SafetensorsSource(source)
