"""Structured output: which tokens a grammar allows at each row of a round, through llguidance.

llguidance (the constrained-decoding library ONNX Runtime GenAI and llama.cpp use) compiles a JSON
Schema or a Lark grammar in about a millisecond, computes a 49k-token mask in microseconds, needs
neither torch nor a GPU, ships wheels for x86-64 and aarch64 (Jetson), and can roll its state back:
exactly what a verify pass needs, a mask for each draft's prefix and a return to the accepted one.
xgrammar is as fast but wants torch at run time; outlines-core has no rollback.

Two choices keep a small model's output finite, and always valid against the schema as given: JSON
output is compact (no whitespace between tokens unless a schema's "x-guidance" asks for it), and an
object whose schema lists its properties admits only those unless it says `additionalProperties`
(OpenAI's strict mode asks the same): allowed free whitespace or invented keys, a 135M model pads
until max_tokens and its JSON never closes.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..config import ResponseFormat
from ..constants import MAX_DRAFT_TOKENS
from ..errors import ConfigError
from .tokenizer import byte_level

JSON_OPTIONS = {"whitespace_flexible": False}
ANY_OBJECT = {"type": "object"}


SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")


def closed(schema):
    """The schema with `additionalProperties: false` on every object that lists properties and says nothing."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if "properties" in out and "additionalProperties" not in out and "patternProperties" not in out:
        out["additionalProperties"] = False
    for key in SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed(sub) for name, sub in out[key].items()}
    for key in SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed(sub) for sub in out[key]]
    for key in ("items", "additionalProperties", "not", "if", "then", "else"):
        if isinstance(out.get(key), dict):
            out[key] = closed(out[key])
    return out


def _llguidance():
    try:
        import llguidance
        import llguidance.numpy
    except ImportError:
        raise ConfigError("structured output (response_format) needs llguidance: "
                          "pip install 'specdeploy[serve]' (or pip install llguidance)") from None
    return llguidance


def _tokenizer_json(path: Path) -> str:
    """The bundle's tokenizer.json, its decoder as llguidance reads byte-level tokens: a decoder
    that wraps ByteLevel in a sequence (ByteFallback, Fuse, ...) would make it take the byte-level
    alphabet literally and refuse every token that starts with a space."""
    data = json.loads(path.read_text())
    if byte_level(data) and (data.get("decoder") or {}).get("type") == "Sequence":
        data["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    return json.dumps(data)


class Grammars:
    """One bundle's tokenizer as llguidance sees it (built once, ~0.2 s), and the grammars of requests."""

    def __init__(self, manifest, bundle: Path):
        self.llg = _llguidance()
        text = _tokenizer_json(Path(bundle) / manifest.tokenizer)
        self.vocab_size = manifest.model.vocab_size
        try:
            self.tokenizer = self.llg.LLTokenizer(text, n_vocab=self.vocab_size,
                                                  eos_token=list(manifest.model.eos_token_ids))
        except ValueError as exc:
            raise ConfigError(f"structured output cannot read this model's tokenizer ({exc}); "
                              f"llguidance reads byte-level BPE and SentencePiece tokenizers") from None

    def grammar(self, fmt: ResponseFormat) -> str:
        """llguidance's grammar text for a response format."""
        matcher = self.llg.LLMatcher
        if fmt.type == "lark":
            return matcher.grammar_from_lark(fmt.grammar)
        schema = closed(fmt.schema) if fmt.type == "json_schema" else ANY_OBJECT
        try:
            return matcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"the JSON schema cannot be read: {exc}") from None

    def constraint(self, fmt: ResponseFormat) -> "Constraint":
        """A fresh matcher for one generation; a schema or grammar llguidance cannot use is refused
        with its reason."""
        grammar = self.grammar(fmt)
        limits = self.llg.LLParserLimits(verbose_errors=False)
        problem = self.llg.LLMatcher.validate_grammar(grammar, self.tokenizer, limits=limits)
        if problem:
            raise ConfigError(f"the {fmt.type.replace('_', ' ')} cannot be used for structured output: "
                              f"{problem.splitlines()[0]}; simplify it or remove the unsupported keywords")
        matcher = self.llg.LLMatcher(self.tokenizer, grammar, log_level=0, limits=limits)
        return Constraint(self.llg, matcher, self.vocab_size)


class Constraint:
    """One generation's grammar state: masks for a round's rows, then the kept tokens consumed."""

    def __init__(self, llg, matcher, vocab_size: int):
        self.llg, self.matcher = llg, matcher
        self.bitmask = llg.numpy.allocate_token_bitmask(MAX_DRAFT_TOKENS + 1, vocab_size)  # [R, ceil(V/32)]
        self.vocab_size = vocab_size

    def allowed(self, tokens: list[int]) -> int:
        """How many of `tokens`, from the first, the grammar accepts from here (state unchanged)."""
        return self.matcher.validate_tokens(tokens) if tokens else 0

    def masks(self, drafts: list[int]) -> np.ndarray:
        """[m+1, V] allowed tokens after drafts[:i] for each row i. Rows past the first draft the
        grammar refuses repeat that row's mask: a verify pass never accepts past that draft."""
        fill = self.llg.numpy.fill_next_token_bitmask
        valid = self.allowed(drafts)
        fill(self.matcher, self.bitmask, 0)
        for i in range(valid):
            self.matcher.consume_token(drafts[i])
            fill(self.matcher, self.bitmask, i + 1)
        if valid and not self.matcher.rollback(valid):
            raise RuntimeError(f"grammar state lost: {self.matcher.get_error()}")
        rows = len(drafts) + 1
        self.bitmask[valid + 1 : rows] = self.bitmask[valid]
        bits = np.unpackbits(self.bitmask[:rows].view(np.uint8), axis=-1, bitorder="little")
        return bits[:, : self.vocab_size].astype(bool)                                        # [m+1, V]

    def commit(self, tokens: list[int]) -> None:
        """Consume the round's kept tokens (each was allowed by its row's mask)."""
        for token in tokens:
            if not self.matcher.consume_token(token):
                raise RuntimeError(f"token {token} broke the grammar: {self.matcher.get_error()}")

    @property
    def done(self) -> bool:
        """The grammar is complete and allows nothing more (only end of text)."""
        return self.matcher.is_stopped()
