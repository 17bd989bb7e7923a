"""pagedllm/engine/output_collector.py: a request's outputs between the engine thread and
its consumer. References: the outputs put, merged by hand (DELTA) or the newest
(CUMULATIVE); an error raised by `get`."""

import asyncio

import pytest

from pagedllm.engine.output_collector import RequestOutputCollector
from pagedllm.outputs import CompletionOutput, RequestOutput


def _output(text: str, ids: list[int], finished: bool = False) -> RequestOutput:
    return RequestOutput("r", "p", [1], None, [CompletionOutput(0, text, ids)], finished)


def test_delta_outputs_put_before_the_consumer_takes_them_are_merged() -> None:
    async def main() -> list[RequestOutput]:
        collector = RequestOutputCollector(aggregate=True)
        collector.put(_output("a", [1]))
        collector.put(_output("b", [2]))
        first = await collector.get()
        collector.put(_output("c", [3], finished=True))
        return [first, await collector.get()]

    first, second = asyncio.run(main())
    assert (first.outputs[0].text, first.outputs[0].token_ids, first.finished) == (
        "ab",
        [1, 2],
        False,
    )
    assert (second.outputs[0].text, second.outputs[0].token_ids, second.finished) == (
        "c",
        [3],
        True,
    )


def test_a_cumulative_output_replaces_the_one_held() -> None:
    async def main() -> RequestOutput:
        collector = RequestOutputCollector(aggregate=False)
        collector.put(_output("a", [1]))
        collector.put(_output("ab", [1, 2]))
        return await collector.get()

    output = asyncio.run(main())
    assert (output.outputs[0].text, output.outputs[0].token_ids) == ("ab", [1, 2])


def test_get_waits_for_a_put_and_raises_an_error_that_replaced_the_output() -> None:
    async def main() -> list:
        collector = RequestOutputCollector(aggregate=True)
        waiting = asyncio.ensure_future(collector.get())
        await asyncio.sleep(0)
        assert not waiting.done()
        collector.put(_output("a", [1]))
        got = [await waiting]
        collector.put(_output("b", [2]))
        collector.put(ValueError("failed"))
        collector.put(_output("c", [3]))
        with pytest.raises(ValueError, match="failed"):
            await collector.get()
        late = asyncio.ensure_future(collector.get())
        await asyncio.sleep(0)
        return got + [late.done()]

    got, late_done = asyncio.run(main())
    assert got.outputs[0].text == "a" and not late_done
