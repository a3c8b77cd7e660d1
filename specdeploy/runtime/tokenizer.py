"""Tokenizer, chat template and UTF-8-safe streaming detokenization (no transformers needed)."""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import BundleError, ConfigError


class Tokenizer:
    def __init__(self, path: Path, chat_template: str | None, bos_token_id: int | None = None):
        from tokenizers import Tokenizer as HFTokenizer

        if not Path(path).is_file():
            raise BundleError(f"tokenizer file {path} is missing; re-export the bundle")
        self._tok = HFTokenizer.from_file(str(path))
        self.chat_template = chat_template
        self._template = None
        self.bos_token = self._tok.id_to_token(bos_token_id) if bos_token_id is not None else ""
        self._byte_level: bool | None = None  # its decoder maps bytes to GPT-2's printable alphabet

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def token_text(self, token: int) -> str:
        """One token's own text, special tokens included (what logprobs name it by)."""
        return self._tok.decode([token], skip_special_tokens=False)

    def token_bytes(self, token: int) -> bytes:
        """One token's own bytes, a character's first byte alone included (OpenAI's logprobs `bytes`):
        byte-level BPE's alphabet mapped back, SentencePiece's <0xNN> and "▁" read; else its text's UTF-8."""
        piece = self._tok.id_to_token(token)
        if piece is None:
            return b""
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            return bytes([int(piece[3:5], 16)])
        if self._byte_level is None:
            self._byte_level = byte_level(json.loads(self._tok.to_str()))
        if self._byte_level and all(c in BYTE_OF for c in piece):
            return bytes(BYTE_OF[c] for c in piece)
        return self.token_text(token).encode("utf-8")

    def apply_chat_template(self, messages: list[dict]) -> str:
        """Render chat messages with the model's own template, ready for the assistant's turn."""
        if not self.chat_template:
            raise ConfigError("this model has no chat template; send a plain prompt instead")
        if not isinstance(messages, list) or not messages:
            raise ConfigError("messages must be a non-empty list of {role, content} objects")
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise ConfigError("each message needs a string 'role' and a string 'content'")
        if self._template is None:
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise
            self._template = env.from_string(self.chat_template)
        try:
            return self._template.render(
                messages=messages, add_generation_prompt=True, bos_token=self.bos_token, eos_token=""
            )
        except ConfigError:
            raise
        except Exception as exc:  # the template's own error (jinja2's, or a type error inside it)
            raise ConfigError(f"the model's chat template could not render these messages: {exc}") from None


def _raise(message):
    raise ConfigError(f"chat template rejected the messages: {message}")


class StreamDecoder:
    """Turns a growing token list into text deltas without splitting multi-byte characters.

    Decodes a short window of recent tokens and holds text back while it ends in an incomplete
    UTF-8 sequence (the replacement character), so streamed text equals the final decode.
    """

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer, self.ids = tokenizer, []
        self.prefix_offset = self.read_offset = 0

    def push(self, tokens) -> str:
        self.ids.extend(tokens)
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset])
        text = self.tokenizer.decode(self.ids[self.prefix_offset :])
        if len(text) > len(prefix) and not text.endswith("\ufffd"):
            delta = text[len(prefix) :]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return delta
        return ""

    def flush(self) -> str:
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset])
        text = self.tokenizer.decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return text[len(prefix) :] if len(text) > len(prefix) else ""


def encode_plain(tokenizer: Tokenizer, model, text: str) -> list[int]:
    """Token ids of plain text as the model's own tokenizer makes them (`model`: the manifest's
    ModelInfo; Gemma's starts with BOS)."""
    ids = tokenizer.encode(text)
    bos = model.bos_token_id
    if model.add_bos_token and bos is not None and ids[:1] != [bos]:
        ids = [bos, *ids]
    return ids


def byte_level(data: dict) -> bool:
    """Whether a tokenizer.json's decoder maps bytes through GPT-2's byte-level alphabet (itself, or
    as a step of a sequence)."""
    decoder = data.get("decoder") or {}
    steps = (decoder.get("decoders") or []) if decoder.get("type") == "Sequence" else [decoder]
    return any(isinstance(step, dict) and step.get("type") == "ByteLevel" for step in steps)


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet: each byte's printable stand-in, as byte-level BPE vocabularies write bytes."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


BYTE_OF = _byte_alphabet()
