"""IncrementalDetokenizer (pagedllm/engine/detokenizer.py) on the default model's byte-level
BPE tokenizer. Reference: `tokenizer.decode` of all the output ids at once."""

import random

import pytest

from pagedllm.config import default_model_path
from pagedllm.engine.detokenizer import IncrementalDetokenizer
from pagedllm.gguf.tokenizer import load_gguf_tokenizer

# ASCII, 2-, 3- and 4-byte characters, an emoji with a modifier, and pieces whose spacing a
# tokenizer's cleanup could change.
PIECES = list("abc xyz.,!?'\n") + list("éüñ世界中文🎉😀👍🏽") + [" don't", " .", "  "]
NUM_TRIALS = 150


@pytest.fixture(scope="module")
def tokenizer():
    return load_gguf_tokenizer(default_model_path())


def random_text(rng: random.Random, max_pieces: int) -> str:
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(1, max_pieces)))


def deltas(tokenizer, prompt_ids: list[int], output_ids: list[int]) -> list[str]:
    detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids)
    out = [detokenizer.add_token(t) for t in output_ids]
    assert detokenizer.output_text == "".join(out)
    return out


def test_multibyte_text_is_split_into_bytes(tokenizer) -> None:
    """Guards the tests below: the emoji and CJK characters span several tokens."""
    ids = tokenizer.encode("héllo 世界 🎉")
    assert len(ids) > len("héllo 世界 🎉".split()) + 4
    assert [tokenizer.decode([t]) for t in ids].count("\ufffd") >= 3


def test_deltas_concatenate_to_decoded_text(tokenizer) -> None:
    rng = random.Random(0)
    for _ in range(NUM_TRIALS):
        prompt = tokenizer.encode(random_text(rng, 10))
        text = random_text(rng, 20)
        output = tokenizer.encode(text)
        parts = deltas(tokenizer, prompt, output)
        assert "".join(parts) == tokenizer.decode(output) == text
        assert not any(p.endswith("\ufffd") for p in parts), parts


def test_hello_world_fed_back_token_by_token(tokenizer) -> None:
    text = "héllo 世界 🎉"
    parts = deltas(tokenizer, tokenizer.encode("Say:"), tokenizer.encode(text))
    assert "".join(parts) == text
    assert "\ufffd" not in "".join(parts)


def test_random_token_ids_hold_back_only_an_incomplete_tail(tokenizer) -> None:
    """Any ids, even invalid UTF-8 byte runs: the text so far equals decode(ids) except an
    incomplete character at the end, which waits for the bytes that complete it."""
    rng = random.Random(1)
    multibyte_ids = tokenizer.encode("".join(PIECES))
    for _ in range(NUM_TRIALS):
        prompt = tokenizer.encode(random_text(rng, 10))
        output = [
            rng.choice(multibyte_ids) if rng.random() < 0.7 else rng.randrange(len(tokenizer))
            for _ in range(rng.randint(1, 20))
        ]
        text, expected = "".join(deltas(tokenizer, prompt, output)), tokenizer.decode(output)
        assert expected.startswith(text)
        assert set(expected[len(text) :].strip()) <= {"\ufffd"}, (text, expected)
        if not expected.endswith("\ufffd"):
            assert text == expected


def test_special_tokens_skipped_or_kept(tokenizer) -> None:
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    output = tokenizer.encode(" Paris") + [end]
    skipped = "".join(deltas(tokenizer, [1, 2], output))
    detokenizer = IncrementalDetokenizer(tokenizer, [1, 2], skip_special_tokens=False)
    kept = "".join(detokenizer.add_token(t) for t in output)
    assert (skipped, kept) == (" Paris", " Paris<|im_end|>")
