"""A multi-turn chat for an embedded application, kept as the token ids it was decoded as.

A reply's tokens are not always the tokens its text encodes to (a model may emit "\\n\\n" as one
token where the tokenizer makes two), so a chat re-rendered from text each turn leaves the KV rows
of the last reply from the first such token on. A `Conversation` keeps the ids: each turn's prompt
is the previous prompt and reply as decoded, then the template's text for what follows them, so
prefix reuse covers the whole history and a turn's first token waits only for the new message.
Where the template does not render the history as a prefix of the next turn (it trims content, or
a stop string cut the reply), the turn is encoded from its text instead.
"""
from __future__ import annotations

from typing import Iterator

from ..config import GenerationConfig
from .engine import Engine, Piece
from .stats import GenerationStats


class Conversation:
    def __init__(self, engine: Engine, system: str | None = None):
        self.engine = engine
        self.messages: list[dict] = [{"role": "system", "content": system}] if system else []
        self.ids: list[int] = []   # the prompt and reply of the last turn, as decoded
        self.rendered = ""         # the text those ids stand for

    def _prompt(self) -> list[int]:
        text = self.engine.tokenizer.apply_chat_template(self.messages)
        if self.ids and text.startswith(self.rendered):
            return self.ids + self.engine.tokenizer.encode(text[len(self.rendered):])
        return self.engine.encode_prompt(self.messages)

    def stream(self, content: str, config: GenerationConfig | None = None,
               stats: GenerationStats | None = None) -> Iterator[Piece]:
        """Add a user message and stream the reply; the reply joins the history when it ends."""
        self.messages.append({"role": "user", "content": content})
        texts, tokens = [], []
        try:
            prompt = self._prompt()
            rendered = self.engine.tokenizer.apply_chat_template(self.messages)
            for piece in self.engine.stream_ids(prompt, config or GenerationConfig(), stats):
                texts.append(piece.text)
                tokens.extend(piece.tokens)
                yield piece
        except BaseException:
            self.messages.pop()  # a failed or abandoned turn leaves the history as it was
            raise
        reply = "".join(texts)
        self.messages.append({"role": "assistant", "content": reply})
        whole = self.engine.tokenizer.decode(tokens) == reply  # else a stop string cut the reply's text
        self.ids, self.rendered = (prompt + tokens, rendered + reply) if whole else ([], "")

    def say(self, content: str, config: GenerationConfig | None = None) -> str:
        """The whole reply to one user message."""
        return "".join(piece.text for piece in self.stream(content, config))
