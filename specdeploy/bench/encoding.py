"""Bench prompts as the ids a user's request would be: through the chat template where the bundle
has one, as plain text for a base model."""
from __future__ import annotations


def encode(engine, text: str) -> list[int]:
    """Prompt ids: the chat template when the bundle has one, the text itself for a base model."""
    chat = engine.tokenizer.chat_template is not None
    return engine.encode_prompt([{"role": "user", "content": text}] if chat else text)
