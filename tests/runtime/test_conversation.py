"""A Conversation keeps the chat as decoded tokens: every turn reuses the whole history, and its
replies are what a fresh engine gives for the same tokens."""
import pytest

from specdeploy.config import GenerationConfig
from specdeploy.runtime.conversation import Conversation
from specdeploy.runtime.engine import Engine
from specdeploy.runtime.stats import GenerationStats

pytestmark = pytest.mark.unit
CONFIG = GenerationConfig(max_new_tokens=6, temperature=0)
# as ChatML: the generation prompt opens the assistant's turn that the next rendering closes
CHATML = ("{% for m in messages %}w2 {{ 'w10' if m.role == 'user' else 'w11' }} {{ m.content }} w3 {% endfor %}"
          "{% if add_generation_prompt %}w2 w11 {% endif %}")


def chatml(engine):
    engine.tokenizer.chat_template, engine.tokenizer._template = CHATML, None
    return engine


def test_each_turn_reuses_the_whole_history_and_matches_a_fresh_engine(tiny_bundle):
    with Engine(tiny_bundle) as engine, Engine(tiny_bundle, prefix_reuse=False) as fresh:
        chat = Conversation(chatml(engine))
        for turn, words in enumerate(["w5 w6 w7", "w8", "w9 w10"]):
            previous = list(chat.ids)
            stats = GenerationStats()
            reply = "".join(p.text for p in chat.stream(words, CONFIG, stats))
            prompt = chat.ids[: stats.prompt_tokens]
            assert prompt[: len(previous)] == previous  # the history as decoded, then the new text
            if turn:
                assert stats.cached_tokens >= len(previous) - 1
            assert fresh.tokenizer.decode(fresh.generate_ids(prompt, CONFIG)) == reply
        assert [m["role"] for m in chat.messages] == ["user", "assistant"] * 3


def test_an_abandoned_turn_leaves_the_history_as_it_was(tiny_bundle):
    with Engine(tiny_bundle) as engine:
        chat = Conversation(engine, system="w2")
        chat.say("w5", CONFIG)
        before = (list(chat.messages), list(chat.ids))
        stream = chat.stream("w6", CONFIG)
        next(stream)
        stream.close()
        assert (chat.messages, chat.ids) == before


def test_a_reply_cut_by_a_stop_string_is_re_encoded_from_its_text(tiny_engine):
    chat = Conversation(tiny_engine)
    reply = chat.say("w5 w6", GenerationConfig(max_new_tokens=8, temperature=0, ignore_eos=True))
    stop = reply.split()[2]
    chat2 = Conversation(tiny_engine)
    chat2.say("w5 w6", GenerationConfig(max_new_tokens=8, temperature=0, ignore_eos=True, stop=(stop,)))
    assert chat2.ids == [] and chat2.messages[-1]["content"] == reply[: reply.index(stop)]
