"""The feature head's shape: one decoder layer over the target's own features (EAGLE-3).

The head reads the residual stream entering three of the target's layers (a low, a middle and a
high one), concatenated and projected to its width by `fc`, together with the embedding of the
next token, and predicts the token after it through its own LM head over a draft vocabulary.
`feature_layers` counts as Hugging Face's `hidden_states` and vLLM's
`eagle_aux_hidden_state_layer_ids` do: id j is the input of layer j (the output of layer j - 1;
0 is the embedding).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError


def default_feature_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's choice (and vLLM's default): a low, the middle and a high layer."""
    return (2, num_layers // 2, num_layers - 3)


@dataclass(frozen=True)
class HeadConfig:
    hidden_size: int                       # the head's width (EAGLE-3: the target's hidden size)
    target_hidden_size: int                # the width of each feature read from the target
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int                        # the target's vocabulary
    draft_vocab_size: int                  # the head's LM head rows (a pruned vocabulary)
    feature_layers: tuple[int, int, int]
    target_num_layers: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 8192
    norm_before_residual: bool = False     # EAGLE-3 checkpoints differ here; the default is the paper's

    def __post_init__(self):
        sizes = {k: getattr(self, k) for k in ("hidden_size", "target_hidden_size", "intermediate_size",
                                               "num_attention_heads", "num_key_value_heads", "head_dim",
                                               "vocab_size", "draft_vocab_size")}
        bad = [f"{k}={v}" for k, v in sizes.items() if not isinstance(v, int) or v < 1]
        if bad:
            raise ConfigError(f"feature head sizes must be positive integers: {', '.join(bad)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(f"num_attention_heads={self.num_attention_heads} must be a multiple of "
                              f"num_key_value_heads={self.num_key_value_heads}")
        if self.draft_vocab_size > self.vocab_size:
            raise ConfigError(f"draft_vocab_size={self.draft_vocab_size} exceeds the target's vocabulary "
                              f"({self.vocab_size}); pick at most {self.vocab_size}")
        layers = tuple(self.feature_layers)
        if len(layers) != 3 or not all(0 <= i <= self.target_num_layers for i in layers):
            raise ConfigError(f"feature_layers={list(layers)} must be three layer ids in 0..{self.target_num_layers} "
                              f"(the input of each layer; the default is {list(default_feature_layers(self.target_num_layers))})")
        object.__setattr__(self, "feature_layers", layers)

    @property
    def feature_size(self) -> int:
        return 3 * self.target_hidden_size

    @classmethod
    def for_target(cls, target, draft_vocab_size: int | None = None,
                   feature_layers: tuple[int, int, int] | None = None) -> "HeadConfig":
        """A head shaped like one of the target's layers (a transformers config)."""
        heads = target.num_attention_heads
        return cls(
            hidden_size=target.hidden_size, target_hidden_size=target.hidden_size,
            intermediate_size=target.intermediate_size, num_attention_heads=heads,
            num_key_value_heads=getattr(target, "num_key_value_heads", None) or heads,
            head_dim=getattr(target, "head_dim", None) or target.hidden_size // heads,
            vocab_size=target.vocab_size, draft_vocab_size=draft_vocab_size or target.vocab_size,
            feature_layers=feature_layers or default_feature_layers(target.num_hidden_layers),
            target_num_layers=target.num_hidden_layers, rms_norm_eps=target.rms_norm_eps,
            rope_theta=_rope_theta(target), max_position_embeddings=target.max_position_embeddings,
        )


def _rope_theta(config) -> float:
    """transformers 5 keeps rope_theta under rope_parameters; older configs at the top level."""
    params = getattr(config, "rope_parameters", None) or {}
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"])
    return float(getattr(config, "rope_theta", 10000.0))
