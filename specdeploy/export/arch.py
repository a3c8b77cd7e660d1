"""Which decoder families the exporter can split, and how to load them.

The split only relies on the layout every Llama-like decoder in transformers shares:
`model.model.{embed_tokens, rotary_emb, layers, norm}` and `model.lm_head`, with attention modules
that call `cache.update(...)` and the registered attention function.
"""
from __future__ import annotations

import contextlib
from pathlib import Path

from ..errors import UnsupportedModelError, require
from ..bundle.manifest import ModelInfo

SUPPORTED = {
    "llama": "Llama / SmolLM2 / Llama 3.x",
    "mistral": "Mistral",
    "qwen2": "Qwen2 / Qwen2.5",
    "qwen3": "Qwen3",
    "gemma2": "Gemma 2",
    "gemma3_text": "Gemma 3 (text)",
    "gemma3": "Gemma 3 (multimodal checkpoint: its text decoder)",
    "phi3": "Phi-3 / Phi-3.5 / Phi-4-mini",
    "smollm3": "SmolLM3",
    "granite": "Granite 3.x",
    "olmo2": "OLMo 2",
}
# RoPE variants whose positions do not depend on the sequence length seen so far; "dynamic" NTK
# rescales with the current length, which a graph with a static cache cannot reproduce
ROPE_TYPES = {"default", "linear", "llama3", "longrope", "yarn", "su", "proportional"}


def supported_names() -> str:
    return ", ".join(f"{v} ({k})" for k, v in SUPPORTED.items())


def check_supported(model_type: str) -> None:
    if model_type not in SUPPORTED:
        raise UnsupportedModelError(
            f"model type '{model_type}' is not supported; the exporter can split: {supported_names()}"
        )


def _rope_types(config) -> set[str]:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if isinstance(params, dict) and all(isinstance(v, dict) for v in params.values()) and params:
        return {v.get("rope_type", v.get("type", "default")) for v in params.values()}  # per layer type
    return {params.get("rope_type", params.get("type", "default"))} if isinstance(params, dict) else {"default"}


def check_options(config) -> None:
    """A known family with an option the split would get wrong is refused, naming the option."""
    config = getattr(config, "text_config", None) or config  # a multimodal checkpoint's decoder
    odd = sorted(_rope_types(config) - ROPE_TYPES)
    if odd:
        raise UnsupportedModelError(
            f"{config.model_type}: rope type {', '.join(odd)} is not supported (its positions depend on the "
            f"sequence length); supported: {', '.join(sorted(ROPE_TYPES))}"
        )
    if getattr(config, "use_bidirectional_attention", False):
        raise UnsupportedModelError(f"{config.model_type}: use_bidirectional_attention=True (an embedding "
                                    f"model) cannot decode; export a causal checkpoint")
    types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if types - {"full_attention", "sliding_attention"}:
        raise UnsupportedModelError(f"{config.model_type}: layer types {sorted(types)} are not supported; "
                                    f"full_attention and sliding_attention are")


def check_context(config, max_context: int) -> None:
    """LongRoPE switches to its long factors past the original context, depending on the sequence seen so
    far; a bundle whose KV capacity stays within the original context always uses the short factors."""
    if "longrope" in _rope_types(config) or "su" in _rope_types(config):
        original = getattr(config, "original_max_position_embeddings", None) or \
            (getattr(config, "rope_parameters", None) or {}).get("original_max_position_embeddings")
        if original and max_context > original:
            raise UnsupportedModelError(
                f"{config.model_type}: LongRoPE switches to its long factors past {original} tokens, which a "
                f"static graph cannot follow; export with --max-context {original} or less")


def load(source: Path):
    """Load (model, tokenizer) from a Hugging Face directory or a .gguf file, in fp32 on the CPU."""
    from .inputs import check_source, load_failure

    transformers = require("transformers", "export", "exporting a model")
    torch = require("torch", "export", "exporting a model")
    source = Path(source)
    check_source(source, check_supported)
    kwargs, directory, once = {}, source, contextlib.nullcontext()
    if source.suffix == ".gguf":
        require("gguf", "export", "loading a GGUF file")
        from .gguf_reads import parsed_once

        kwargs, directory, once = {"gguf_file": source.name}, source.parent, parsed_once()
    with once:
        try:
            config = transformers.AutoConfig.from_pretrained(directory, **kwargs)
        except Exception as exc:  # the loaders' own types; reported in one line with the file
            raise load_failure(source, exc) from exc
        check_supported(config.model_type)
        check_options(config)
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, **kwargs).eval()
            tokenizer = transformers.AutoTokenizer.from_pretrained(directory, **kwargs)
        except Exception as exc:
            raise load_failure(source, exc) from exc
    return text_decoder(model), tokenizer


def text_decoder(model):
    """The text decoder of a multimodal checkpoint (Gemma 3) as its own causal LM, the vision tower
    dropped: speculation drafts and verifies text, and the split needs the decoder's own layout."""
    if model.config.model_type != "gemma3":
        return model
    import copy

    import transformers

    config = copy.deepcopy(model.config.text_config)
    config.final_logit_softcapping = None  # the multimodal head does not cap (released Gemma 3 never does)
    text = transformers.Gemma3ForCausalLM(config).eval()
    text.model.load_state_dict(model.model.language_model.state_dict())
    text.lm_head.load_state_dict(model.lm_head.state_dict())
    text.generation_config = model.generation_config
    return text


def adds_bos(tokenizer) -> bool:
    """Whether the model's own tokenizer starts a plain text with BOS (Gemma's does, SmolLM2's not)."""
    bos = tokenizer.bos_token_id
    ids = tokenizer("a").input_ids
    return bos is not None and bool(ids) and ids[0] == bos


def model_info(model, name: str, eos_token_ids: tuple[int, ...], add_bos_token: bool = False) -> ModelInfo:
    cfg = model.config
    check_supported(cfg.model_type)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    return ModelInfo(
        name=name, architecture=cfg.model_type, num_layers=cfg.num_hidden_layers,
        hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size, num_kv_heads=kv_heads,
        head_dim=head_dim, eos_token_ids=tuple(eos_token_ids),
        bos_token_id=cfg.bos_token_id if isinstance(cfg.bos_token_id, int) else None,
        add_bos_token=add_bos_token,
    )


def eos_ids(model, tokenizer) -> tuple[int, ...]:
    ids: list[int] = []
    for source in (getattr(model.generation_config, "eos_token_id", None),
                   model.config.eos_token_id, tokenizer.eos_token_id):
        for i in source if isinstance(source, (list, tuple)) else [source]:
            if isinstance(i, int) and i not in ids:
                ids.append(i)
    return tuple(ids)
