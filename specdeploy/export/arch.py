"""Which decoder families the exporter can split, and how to load them.

The split only relies on the layout every Llama-like decoder in transformers shares:
`model.model.{embed_tokens, rotary_emb, layers, norm}` and `model.lm_head`, with attention modules
that call `cache.update(...)` and the registered attention function.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import UnsupportedModelError, require
from ..bundle.manifest import ModelInfo

SUPPORTED = {
    "llama": "Llama / SmolLM",
    "mistral": "Mistral",
    "qwen2": "Qwen2",
    "qwen3": "Qwen3",
}


def supported_names() -> str:
    return ", ".join(f"{v} ({k})" for k, v in SUPPORTED.items())


def check_supported(model_type: str) -> None:
    if model_type not in SUPPORTED:
        raise UnsupportedModelError(
            f"model type '{model_type}' is not supported; the exporter can split: {supported_names()}"
        )


def load(source: Path):
    """Load (model, tokenizer) from a Hugging Face directory or a .gguf file, in fp32 on the CPU."""
    from .inputs import check_source, load_failure

    transformers = require("transformers", "export", "exporting a model")
    torch = require("torch", "export", "exporting a model")
    source = Path(source)
    check_source(source, check_supported)
    kwargs = {}
    if source.suffix == ".gguf":
        require("gguf", "export", "loading a GGUF file")
        kwargs, directory = {"gguf_file": source.name}, source.parent
    else:
        directory = source
    try:
        config = transformers.AutoConfig.from_pretrained(directory, **kwargs)
    except Exception as exc:  # the loaders' own types; reported in one line with the file
        raise load_failure(source, exc) from exc
    check_supported(config.model_type)
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, **kwargs).eval()
        tokenizer = transformers.AutoTokenizer.from_pretrained(directory, **kwargs)
    except Exception as exc:
        raise load_failure(source, exc) from exc
    return model, tokenizer


def model_info(model, name: str, eos_token_ids: tuple[int, ...]) -> ModelInfo:
    cfg = model.config
    check_supported(cfg.model_type)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    return ModelInfo(
        name=name, architecture=cfg.model_type, num_layers=cfg.num_hidden_layers,
        hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size, num_kv_heads=kv_heads,
        head_dim=head_dim, eos_token_ids=tuple(eos_token_ids),
        bos_token_id=cfg.bos_token_id if isinstance(cfg.bos_token_id, int) else None,
    )


def eos_ids(model, tokenizer) -> tuple[int, ...]:
    ids: list[int] = []
    for source in (getattr(model.generation_config, "eos_token_id", None),
                   model.config.eos_token_id, tokenizer.eos_token_id):
        for i in source if isinstance(source, (list, tuple)) else [source]:
            if isinstance(i, int) and i not in ids:
                ids.append(i)
    return tuple(ids)
