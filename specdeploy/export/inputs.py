"""Checks of a model source before it is loaded, so a bad file gets one clear line, not a traceback.

Loading a checkpoint goes through transformers, safetensors and gguf, which report a corrupt or
partial input with their own exception types and messages deep inside their stacks. The cheap
checks here read only headers; whatever they cannot see is caught around the load and reported
with the file it came from.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Callable

from ..errors import ModelSourceError

GGUF_MAGIC = b"GGUF"
FLOAT_DTYPES = {"F32", "F16", "BF16", "F64"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
HINT = "pass a Hugging Face model directory (config.json, *.safetensors, tokenizer) or a .gguf file"


def check_gguf(path: Path) -> None:
    with open(path, "rb") as f:
        head = f.read(8)
    if head[:4] != GGUF_MAGIC:
        raise ModelSourceError(f"{path} is not a GGUF file (it does not start with the GGUF magic bytes); "
                               f"re-download it, or {HINT}")
    version = struct.unpack("<I", head[4:8])[0] if len(head) == 8 else None
    if version not in (2, 3):
        raise ModelSourceError(f"{path} has GGUF version {version}; only versions 2 and 3 can be read")


def read_config(directory: Path) -> dict:
    path = directory / "config.json"
    if not path.is_file():
        raise ModelSourceError(f"{directory} has no config.json; {HINT}")
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelSourceError(f"{path} is not valid JSON ({exc}); fix it or re-download the model") from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise ModelSourceError(f"{path} has no 'model_type'; it is incomplete: re-download the model")
    if config.get("quantization_config"):
        method = config["quantization_config"].get("quant_method", "?")
        raise ModelSourceError(f"{directory} is a pre-quantized checkpoint ({method}); export needs float "
                               f"weights: use the original model, then --precision int8/fp16")
    return config


def check_safetensors(path: Path) -> None:
    """Header present and parseable, every tensor inside the file, float dtypes only."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        length = struct.unpack("<Q", raw)[0] if len(raw) == 8 else None
        if length is None or length + 8 > size:
            raise ModelSourceError(f"{path} is truncated or not a safetensors file; re-download the model")
        try:
            header = json.loads(f.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ModelSourceError(f"{path} has a corrupt header; re-download the model") from None
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    end = max((t["data_offsets"][1] for t in tensors.values()), default=0)
    if 8 + length + end > size:
        raise ModelSourceError(f"{path} is truncated ({size} bytes, its header needs {8 + length + end}); "
                               f"re-download the model")
    odd = sorted({t["dtype"] for t in tensors.values()} - FLOAT_DTYPES)
    if odd:
        raise ModelSourceError(f"{path} stores weights as {', '.join(odd)}; export needs float weights "
                               f"({', '.join(sorted(FLOAT_DTYPES))}): use the original, unquantized checkpoint")


def check_directory(directory: Path, check_model_type: Callable[[str], None]) -> dict:
    config = read_config(directory)
    check_model_type(config["model_type"])  # an unsupported family is named before anything else
    weights = sorted(directory.glob("*.safetensors"))
    if not weights and not any(directory.glob("pytorch_model*.bin")):
        raise ModelSourceError(f"{directory} has no weights (*.safetensors); {HINT}")
    for path in weights:
        check_safetensors(path)
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        raise ModelSourceError(f"{directory} has no tokenizer ({' or '.join(TOKENIZER_FILES)}); copy the "
                               f"model's tokenizer files next to config.json")
    return config


def check_source(source: Path, check_model_type: Callable[[str], None]) -> None:
    """One-line errors for a missing, corrupt or partial model source; returns if it looks loadable."""
    if not source.exists():
        raise ModelSourceError(f"{source} does not exist; {HINT}")
    if source.is_dir():
        check_directory(source, check_model_type)
    elif source.suffix == ".gguf":
        check_gguf(source)
    else:
        raise ModelSourceError(f"{source} is neither a model directory nor a .gguf file; {HINT}")


def load_failure(source: Path, exc: Exception) -> ModelSourceError:
    """What the loaders raised, as one line naming the source."""
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    return ModelSourceError(f"cannot load {source}: {type(exc).__name__}: {first}; the files may be corrupt "
                            f"or partial: re-download the model")
