"""Which sequences draft and how many tokens (pagedllm/engine/drafter.py). Reference: the
rule that a draft's verification row must sample as a step without drafts would (its
token depends only on its position's logits and parameters), and that a step never
appends past max_tokens or max_model_len."""

import pytest

from pagedllm.config import SpeculativeConfig
from pagedllm.core.sequence import Sequence
from pagedllm.engine.drafter import Drafter, samples_positionwise
from pagedllm.sampling_params import SamplingParams, StructuredOutputsParams


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(temperature=0),
        dict(temperature=0.8, top_k=5, top_p=0.9, min_p=0.1),
        dict(temperature=0.8, logit_bias={3: 1.0}, allowed_token_ids=[3, 4, 5]),
        dict(temperature=0, stop=["x"], stop_token_ids=[2], n=2),
    ],
)
def test_rows_that_sample_by_position_alone_draft(kwargs: dict) -> None:
    assert samples_positionwise(SamplingParams(**kwargs))


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(temperature=0.8, seed=1),
        dict(temperature=0, logprobs=0),
        dict(temperature=0, presence_penalty=0.5),
        dict(temperature=0, frequency_penalty=0.5),
        dict(temperature=0, repetition_penalty=1.1),
        dict(temperature=0, bad_words=["x"]),
        dict(temperature=0, structured_outputs=StructuredOutputsParams(regex="a+")),
    ],
)
def test_rows_that_read_more_than_their_position_do_not_draft(kwargs: dict) -> None:
    assert not samples_positionwise(SamplingParams(**kwargs))


def decoding(prompt: list[int], outputs: list[int]) -> Sequence:
    seq = Sequence(0, prompt, block_size=4)
    for token in outputs:
        seq.append_token(token)
    return seq


CONFIG = SpeculativeConfig(num_speculative_tokens=4, prompt_lookup_min=1, prompt_lookup_max=3)
DRAFTER = Drafter(CONFIG, max_model_len=64)
PROMPT = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2]


def test_drafts_stop_short_of_max_tokens_and_max_model_len() -> None:
    seq = decoding(PROMPT, [3])  # "1 2 3" -> 4 5 6 7
    assert DRAFTER.drafts(seq, SamplingParams(temperature=0)) == [4, 5, 6, 7]
    # 2 more tokens allowed: 1 draft and the token after it.
    assert DRAFTER.drafts(seq, SamplingParams(temperature=0, max_tokens=3)) == [4]
    assert DRAFTER.drafts(seq, SamplingParams(temperature=0, max_tokens=2)) == []
    short = Drafter(CONFIG, max_model_len=14)  # 11 tokens: 3 more, 2 of them drafts
    assert short.drafts(seq, SamplingParams(temperature=0)) == [4, 5]


def test_min_tokens_still_counting_draft_nothing() -> None:
    seq = decoding(PROMPT, [3])
    assert DRAFTER.drafts(seq, SamplingParams(temperature=0, min_tokens=2)) == []
    assert DRAFTER.drafts(seq, SamplingParams(temperature=0, min_tokens=1)) == [4, 5, 6, 7]
