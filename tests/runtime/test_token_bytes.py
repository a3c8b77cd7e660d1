"""A token's own bytes (logprobs' `bytes`): byte-level BPE's alphabet mapped back, so a character
split across tokens shows its bytes where each token's text cannot."""
import pytest
from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers, trainers

from specdeploy.runtime.tokenizer import Tokenizer

pytestmark = pytest.mark.unit
TEXT = "héllo 你好 wörld\n\n1."


@pytest.fixture(scope="module")
def byte_level(tmp_path_factory):
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["hello world", "wörld"] * 20, trainer)  # the Chinese characters stay single bytes
    path = tmp_path_factory.mktemp("byte-level") / "tokenizer.json"
    tok.save(str(path))
    return Tokenizer(path, None)


def test_tokens_bytes_join_into_the_texts_utf8(byte_level):
    ids = byte_level.encode(TEXT)
    pieces = [byte_level.token_bytes(i) for i in ids]
    assert b"".join(pieces) == TEXT.encode("utf-8")
    assert any(p and p[0] >= 0x80 and len(p) < 3 for p in pieces)  # part of a character, on its own


def test_a_word_level_tokens_bytes_are_its_text(tiny_engine):
    token = tiny_engine.tokenizer.encode("w5")[0]
    assert tiny_engine.tokenizer.token_bytes(token) == tiny_engine.tokenizer.token_text(token).encode()
