"""pagedllm/entrypoints/openai/streaming.py: accumulate and merge_streams. References: the
concatenation of DELTA outputs (what CUMULATIVE would have shown), and every merged stream
closed when the merged iterator is closed early."""

import asyncio
from collections.abc import AsyncIterator

from pagedllm.entrypoints.openai.streaming import accumulate, merge_streams
from pagedllm.outputs import CompletionOutput, Logprob, RequestOutput


def delta(
    texts: dict[int, str], finished: bool, prompt_logprobs: list | None = None
) -> RequestOutput:
    outputs = [
        CompletionOutput(i, text, [len(text)], finish_reason="length" if finished else None)
        for i, text in texts.items()
    ]
    return RequestOutput("r", "p", [1, 2, 3], prompt_logprobs, outputs, finished)


def test_accumulate_joins_text_tokens_and_prompt_logprob_pieces() -> None:
    piece_1, piece_2 = [None, {2: Logprob(-1.0)}], [{3: Logprob(-2.0)}]
    total = None
    for d in (
        delta({}, False, piece_1),
        delta({0: "Hel", 1: "A"}, False, piece_2),
        delta({0: "lo", 1: ""}, True),
    ):
        total = accumulate(total, d)
    assert [c.text for c in total.outputs] == ["Hello", "A"]
    assert [c.token_ids for c in total.outputs] == [[3, 2], [1, 0]]
    assert total.prompt_logprobs == piece_1 + piece_2
    assert total.finished and total.outputs[0].finish_reason == "length"


def test_closing_the_merged_stream_closes_every_stream() -> None:
    closed = []

    async def numbers(name: str) -> AsyncIterator[int]:
        try:
            for i in range(1000):
                await asyncio.sleep(0)
                yield i
        finally:
            closed.append(name)

    async def main() -> list:
        merged = merge_streams([numbers("a"), numbers("b"), numbers("c")])
        seen = [await anext(merged) for _ in range(5)]
        await merged.aclose()
        return seen

    seen = asyncio.run(main())
    assert len(seen) == 5 and {i for i, _ in seen} <= {0, 1, 2}
    assert sorted(closed) == ["a", "b", "c"]
