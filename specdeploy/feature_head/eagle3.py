"""The EAGLE-3 checkpoint format: how a feature head moves between specdeploy and other runtimes.

A directory with `config.json` (a Llama config with `architectures: ["LlamaForCausalLMEagle3"]`,
`num_hidden_layers: 1`, `draft_vocab_size`, and the target layers it reads under
`eagle_aux_hidden_state_layer_ids`) and its weights (`model.safetensors`, or the original EAGLE
repository's `pytorch_model.bin`) under the names the EAGLE repository, vLLM, SGLang and
TensorRT-LLM load:

    fc.weight                                   [H, 3 T]   the three features, projected
    midlayer.hidden_norm.weight                 [H]        RMS norm of the projected features
    midlayer.input_layernorm.weight             [H]        RMS norm of the next token's embedding
    midlayer.self_attn.{q,k,v}_proj.weight      [*, 2 H]   attention over [embedding, features]
    midlayer.self_attn.o_proj.weight            [H, heads * D]
    midlayer.post_attention_layernorm.weight    [H]
    midlayer.mlp.{gate,up}_proj.weight          [I, H];  midlayer.mlp.down_proj.weight [H, I]
    norm.weight                                 [H]
    lm_head.weight                              [V', H]    the draft vocabulary's rows
    d2t                                         [V'] int64 target id of draft row i = i + d2t[i]
    t2d                                         [V] bool   which target ids the draft vocabulary has

The embedding is the target's (a checkpoint's own `embed_tokens.weight`, where one has it, is
ignored: the head runs beside the target it was trained on).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..errors import ModelSourceError
from .config import HeadConfig, default_feature_layers

ARCHITECTURE = "LlamaForCausalLMEagle3"
WEIGHTS = "model.safetensors"
LAYER = "midlayer"
NORMS = ("hidden_norm", "input_layernorm", "post_attention_layernorm")
PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
IGNORED = ("embed_tokens.weight",)


def shapes(config: HeadConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of a head in this format, with its shape."""
    h, i, d = config.hidden_size, config.intermediate_size, config.head_dim
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    out = {"fc.weight": (h, config.feature_size), "norm.weight": (h,),
           "lm_head.weight": (config.draft_vocab_size, h),
           "d2t": (config.draft_vocab_size,), "t2d": (config.vocab_size,)}
    out.update({f"{LAYER}.{n}.weight": (h,) for n in NORMS})
    dims = {"self_attn.q_proj": (q, 2 * h), "self_attn.k_proj": (kv, 2 * h), "self_attn.v_proj": (kv, 2 * h),
            "self_attn.o_proj": (h, q), "mlp.gate_proj": (i, h), "mlp.up_proj": (i, h), "mlp.down_proj": (h, i)}
    out.update({f"{LAYER}.{n}.weight": dims[n] for n in PROJECTIONS})
    return out


def vocab_maps(vocab_ids: np.ndarray, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(d2t, t2d) for a draft vocabulary given as sorted target ids."""
    vocab_ids = np.asarray(vocab_ids, np.int64)
    t2d = np.zeros(vocab_size, bool)
    t2d[vocab_ids] = True
    return vocab_ids - np.arange(len(vocab_ids), dtype=np.int64), t2d


def vocab_ids(d2t: np.ndarray) -> np.ndarray:
    """The target id of each draft row."""
    return np.arange(len(d2t), dtype=np.int64) + np.asarray(d2t, np.int64)


def config_json(config: HeadConfig) -> dict:
    return {
        "architectures": [ARCHITECTURE], "model_type": "llama", "num_hidden_layers": 1,
        "hidden_size": config.hidden_size, "target_hidden_size": config.target_hidden_size,
        "intermediate_size": config.intermediate_size, "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads, "head_dim": config.head_dim,
        "hidden_act": "silu", "rms_norm_eps": config.rms_norm_eps, "rope_theta": config.rope_theta,
        "max_position_embeddings": config.max_position_embeddings, "vocab_size": config.vocab_size,
        "draft_vocab_size": config.draft_vocab_size, "tie_word_embeddings": False,
        "norm_before_residual": config.norm_before_residual, "torch_dtype": "float32",
        "eagle_aux_hidden_state_layer_ids": list(config.feature_layers),
        "eagle_config": {"use_aux_hidden_state": True,
                         "eagle_aux_hidden_state_layer_ids": list(config.feature_layers)},
        "target_num_hidden_layers": config.target_num_layers,
    }


def parse_config(raw: dict, target_num_layers: int | None, where: str) -> HeadConfig:
    """A HeadConfig from an EAGLE-3 config.json; `target_num_layers` fills what the file leaves out."""
    if raw.get("num_hidden_layers", 1) != 1:
        raise ModelSourceError(f"{where}: a head with {raw['num_hidden_layers']} layers; specdeploy runs "
                               f"EAGLE-3 heads of one decoder layer (num_hidden_layers: 1)")
    missing = [k for k in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size") if k not in raw]
    if missing:
        raise ModelSourceError(f"{where} lacks {', '.join(missing)}: not an EAGLE-3 head's config.json")
    layers = (raw.get("eagle_aux_hidden_state_layer_ids")
              or (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids"))
    target_layers = raw.get("target_num_hidden_layers") or target_num_layers
    if target_layers is None:
        raise ModelSourceError(f"{where} does not say how many layers its target has; load it against "
                               f"the target's bundle (which does)")
    heads = raw["num_attention_heads"]
    return HeadConfig(
        hidden_size=raw["hidden_size"], target_hidden_size=raw.get("target_hidden_size") or raw["hidden_size"],
        intermediate_size=raw["intermediate_size"], num_attention_heads=heads,
        num_key_value_heads=raw.get("num_key_value_heads") or heads,
        head_dim=raw.get("head_dim") or raw["hidden_size"] // heads, vocab_size=raw["vocab_size"],
        draft_vocab_size=raw.get("draft_vocab_size") or raw["vocab_size"],
        feature_layers=tuple(layers) if layers else default_feature_layers(target_layers),
        target_num_layers=target_layers, rms_norm_eps=raw.get("rms_norm_eps", 1e-5),
        rope_theta=float(raw.get("rope_theta") or (raw.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
        max_position_embeddings=raw.get("max_position_embeddings", 8192),
        norm_before_residual=bool(raw.get("norm_before_residual", False)),
    )


def _read_tensors(directory: Path) -> dict[str, np.ndarray]:
    """fp32 (int64 / bool maps kept) arrays from model.safetensors or pytorch_model.bin."""
    import torch

    files = sorted(directory.glob("*.safetensors"))
    if files:
        from safetensors.torch import load_file

        raw = {k: v for f in files for k, v in load_file(str(f)).items()}
    elif (directory / "pytorch_model.bin").is_file():
        raw = torch.load(directory / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise ModelSourceError(f"{directory} has no model.safetensors or pytorch_model.bin: not an EAGLE-3 head")
    return {k: (v.to(torch.float32) if v.is_floating_point() else v).numpy() for k, v in raw.items()}


def read(directory: Path, target_num_layers: int | None = None) -> tuple[HeadConfig, dict[str, np.ndarray]]:
    """A head in the EAGLE-3 format: its config and its tensors by name, checked against the format."""
    directory = Path(directory)
    path = directory / "config.json"
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelSourceError(f"cannot read {path} ({exc}); point at an EAGLE-3 head's directory") from None
    config = parse_config(raw, target_num_layers, str(path))
    tensors = {k: v for k, v in _read_tensors(directory).items() if k not in IGNORED}
    if "d2t" not in tensors:  # a head over the whole vocabulary may leave the maps out
        tensors["d2t"], tensors["t2d"] = vocab_maps(np.arange(config.draft_vocab_size), config.vocab_size)
    tensors.setdefault("t2d", vocab_maps(vocab_ids(tensors["d2t"]), config.vocab_size)[1])
    check(config, tensors, str(directory))
    return config, tensors


def check(config: HeadConfig, tensors: dict[str, np.ndarray], where: str) -> None:
    """Every tensor present with its shape, no stranger, and the two vocabulary maps in agreement."""
    expected = shapes(config)
    problems = [f"{k} missing" for k in expected if k not in tensors]
    problems += [f"unexpected {k}" for k in tensors if k not in expected]
    problems += [f"{k} is {list(tensors[k].shape)}, expected {list(s)}" for k, s in expected.items()
                 if k in tensors and tuple(tensors[k].shape) != s]
    if not problems:
        ids = vocab_ids(tensors["d2t"])
        if ids.min() < 0 or ids.max() >= config.vocab_size or not np.all(np.diff(ids) > 0):
            problems.append("d2t maps draft rows outside the target's vocabulary or out of order")
        elif not np.array_equal(np.flatnonzero(tensors["t2d"]), ids):
            problems.append("t2d and d2t name different draft vocabularies")
    if problems:
        raise ModelSourceError(f"{where} is not an EAGLE-3 head for this config: {'; '.join(problems[:4])}"
                               + (f" (and {len(problems) - 4} more)" if len(problems) > 4 else ""))


def write(directory: Path, config: HeadConfig, tensors: dict[str, np.ndarray]) -> Path:
    """The head as an EAGLE-3 directory (config.json, model.safetensors), checked before writing."""
    from safetensors.numpy import save_file

    check(config, tensors, "the head to save")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    arrays = {k: np.ascontiguousarray(v if k in ("d2t", "t2d") else np.asarray(v, np.float32))
              for k, v in tensors.items()}
    save_file(arrays, str(directory / WEIGHTS), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(config_json(config), indent=2) + "\n")
    return directory


ACCEPTANCE = "acceptance.json"  # ours, beside the EAGLE-3 files (other runtimes ignore it)


def write_acceptance(directory: Path, measured: dict) -> None:
    """What `train-head` measured for this head (held-out acceptance per draft position, tau),
    kept with it so a bundle made from it can say so."""
    (Path(directory) / ACCEPTANCE).write_text(json.dumps(measured, indent=2) + "\n")


def read_acceptance(directory: Path) -> dict | None:
    path = Path(directory) / ACCEPTANCE
    try:
        measured = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # a head from elsewhere: nothing measured here
    return measured if isinstance(measured, dict) and isinstance(measured.get("per_position"), list) else None
