"""AsyncLLM (pagedllm/engine/async_llm.py) on a tiny random checkpoint. Reference: the
synchronous LLMEngine's greedy tokens for the same prompts; the engine's free-block count
after requests finish or are dropped by their caller."""

import asyncio
import logging
from collections.abc import Awaitable, Callable

import pytest

from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.engine.async_llm import AsyncLLM, EngineDeadError
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.sampling_params import RequestOutputKind, SamplingParams

LLAMA = "llama-gqa-llama3"
PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12], [13], [14, 15, 16, 17], [20] * 20, [30, 31]]


def make_engine(path: str) -> LLMEngine:
    args = EngineArgs(
        path, skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=256
    )
    return LLMEngine.from_engine_args(args)


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(
        temperature=0, max_tokens=max_tokens, ignore_eos=True, output_kind=RequestOutputKind.DELTA
    )


def run_async(engine: LLMEngine, body: Callable[[AsyncLLM], Awaitable[object]]) -> object:
    """Start an AsyncLLM over `engine`, await body(llm), shut it down."""

    async def main() -> object:
        llm = AsyncLLM(engine)
        llm.start()
        try:
            return await body(llm)
        finally:
            await llm.shutdown()

    return asyncio.run(main())


async def collect_tokens(llm: AsyncLLM, prompt: list[int], max_tokens: int, rid: str) -> list:
    tokens = []
    async for output in llm.generate({"prompt_token_ids": prompt}, greedy(max_tokens), rid):
        tokens += output.outputs[0].token_ids
    return tokens


async def wait_all_blocks_free(llm: AsyncLLM) -> None:
    for _ in range(200):
        if llm.stats.num_free_blocks == llm.stats.num_blocks and llm.stats.num_running == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"blocks still in use: {llm.stats}")


def test_concurrent_requests_match_sync_engine_greedy(tiny_model_path: Callable) -> None:
    path = tiny_model_path(LLAMA)
    reference = make_engine(path)
    for i, prompt in enumerate(PROMPTS):
        reference.add_request(str(i), {"prompt_token_ids": prompt}, greedy(12))
    expected = {}
    while reference.has_unfinished_requests():
        for out in reference.step():
            expected.setdefault(out.request_id, []).extend(out.outputs[0].token_ids)

    async def body(llm: AsyncLLM) -> list:
        calls = [collect_tokens(llm, p, 12, str(i)) for i, p in enumerate(PROMPTS)]
        results = await asyncio.gather(*calls)
        await wait_all_blocks_free(llm)
        return results

    results = run_async(make_engine(path), body)
    assert results == [expected[str(i)] for i in range(len(PROMPTS))]


def test_request_arriving_mid_run_joins_the_batch(tiny_model_path: Callable) -> None:
    """A second request added after the first has started finishes first (it is short),
    so it ran in the same batch rather than after the first."""

    async def body(llm: AsyncLLM) -> list[str]:
        order, started = [], asyncio.Event()

        async def run(rid: str, prompt: list[int], max_tokens: int) -> None:
            async for _ in llm.generate({"prompt_token_ids": prompt}, greedy(max_tokens), rid):
                started.set()
            order.append(rid)

        long = asyncio.ensure_future(run("long", PROMPTS[0], 120))
        await started.wait()
        await run("short", PROMPTS[1], 4)
        await long
        return order

    assert run_async(make_engine(tiny_model_path(LLAMA)), body) == ["short", "long"]


def test_closing_the_stream_aborts_and_frees_blocks(tiny_model_path: Callable) -> None:
    async def body(llm: AsyncLLM) -> None:
        stream = llm.generate({"prompt_token_ids": PROMPTS[4]}, greedy(200), "r")
        async for output in stream:
            if len(output.outputs[0].token_ids) > 0:
                break
        await stream.aclose()
        await wait_all_blocks_free(llm)
        assert not llm.engine.has_unfinished_requests()

    run_async(make_engine(tiny_model_path(LLAMA)), body)


def test_bad_request_raises_and_engine_keeps_serving(tiny_model_path: Callable) -> None:
    async def body(llm: AsyncLLM) -> list:
        with pytest.raises(ValueError, match="outside the vocabulary"):
            await collect_tokens(llm, [5, 100000], 4, "bad")
        with pytest.raises(ValueError, match="already in use"):
            await asyncio.gather(
                collect_tokens(llm, PROMPTS[0], 4, "same"),
                collect_tokens(llm, PROMPTS[1], 4, "same"),
            )
        await wait_all_blocks_free(llm)
        return await collect_tokens(llm, PROMPTS[0], 4, "good")

    assert len(run_async(make_engine(tiny_model_path(LLAMA)), body)) == 4


def test_generate_needs_start(tiny_model_path: Callable) -> None:
    llm = AsyncLLM(make_engine(tiny_model_path(LLAMA)))

    async def first() -> None:
        await anext(llm.generate({"prompt_token_ids": [5]}, greedy(1), "r"))

    with pytest.raises(RuntimeError, match="start"):
        asyncio.run(first())


def test_failed_step_fails_its_requests_and_the_loop_goes_on(
    tiny_model_path: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine(tiny_model_path(LLAMA))
    real_step = engine.step
    monkeypatch.setattr(engine, "step", lambda: 1 / 0)

    async def body(llm: AsyncLLM) -> list:
        with pytest.raises(EngineDeadError, match="ZeroDivisionError"):
            await collect_tokens(llm, PROMPTS[0], 4, "doomed")
        assert not engine.has_unfinished_requests()
        monkeypatch.setattr(engine, "step", real_step)
        return await collect_tokens(llm, PROMPTS[0], 4, "fine")

    assert len(run_async(engine, body)) == 4


def test_shutdown_ends_open_requests(tiny_model_path: Callable) -> None:
    async def main() -> None:
        llm = AsyncLLM(make_engine(tiny_model_path(LLAMA)))
        llm.start()
        stream = llm.generate({"prompt_token_ids": PROMPTS[0]}, greedy(200), "r")
        await anext(stream)
        await llm.shutdown()
        with pytest.raises(EngineDeadError, match="shut down"):
            async for _ in stream:
                pass
        assert not llm.engine.has_unfinished_requests()

    asyncio.run(main())


def test_a_shut_down_engine_refuses_requests_until_started_again(
    tiny_model_path: Callable,
) -> None:
    async def main() -> None:
        llm = AsyncLLM(make_engine(tiny_model_path(LLAMA)))
        llm.start()
        expected = await collect_tokens(llm, PROMPTS[0], 3, "a")
        await llm.shutdown()
        with pytest.raises(EngineDeadError, match="shut down"):
            await collect_tokens(llm, PROMPTS[0], 3, "b")
        llm.start()
        assert await collect_tokens(llm, PROMPTS[0], 3, "c") == expected
        await llm.shutdown()

    asyncio.run(main())


def test_failed_request_raises_in_its_stream_only(tiny_model_path: Callable) -> None:
    """No token can be sampled for "doomed" (its only allowed token is banned by
    min_tokens): its stream raises ValueError; a request running beside it completes."""
    engine = make_engine(tiny_model_path(LLAMA))
    doomed = SamplingParams(
        allowed_token_ids=[5], stop_token_ids=[5], min_tokens=2, output_kind=RequestOutputKind.DELTA
    )

    async def body(llm: AsyncLLM) -> list:
        bystander = asyncio.ensure_future(collect_tokens(llm, PROMPTS[1], 12, "bystander"))
        with pytest.raises(ValueError, match="no token can be sampled"):
            async for _ in llm.generate({"prompt_token_ids": PROMPTS[0]}, doomed, "doomed"):
                pass
        return await bystander

    assert len(run_async(engine, body)) == 12
    assert engine.get_stats().num_free_blocks == engine.num_blocks


def test_add_request_crash_fails_that_request_only(
    tiny_model_path: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine(tiny_model_path(LLAMA))
    real_add = engine.add_request

    def add_request(request_id: str, *args: object, **kwargs: object) -> None:
        if request_id == "crash":
            raise MemoryError("no room for its generators")
        real_add(request_id, *args, **kwargs)

    monkeypatch.setattr(engine, "add_request", add_request)

    async def body(llm: AsyncLLM) -> list:
        with pytest.raises(MemoryError):
            await collect_tokens(llm, PROMPTS[0], 4, "crash")
        assert llm.is_running
        return await collect_tokens(llm, PROMPTS[0], 4, "fine")

    assert len(run_async(engine, body)) == 4


def test_broken_executor_kills_the_engine(
    tiny_model_path: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step that fails with the executor broken (a dead tensor-parallel worker) ends the
    engine: open requests and new ones get EngineDeadError, `dead` is set."""
    engine = make_engine(tiny_model_path(LLAMA))
    monkeypatch.setattr(engine, "step", lambda: 1 / 0)
    monkeypatch.setattr(engine, "is_healthy", lambda: False)

    async def body(llm: AsyncLLM) -> None:
        with pytest.raises(EngineDeadError, match="ZeroDivisionError"):
            await collect_tokens(llm, PROMPTS[0], 4, "doomed")
        await asyncio.wait_for(llm.dead.wait(), timeout=5)
        assert not llm.is_running
        with pytest.raises(EngineDeadError):
            await collect_tokens(llm, PROMPTS[0], 4, "late")

    run_async(engine, body)


def test_idle_engine_notices_a_broken_executor(
    tiny_model_path: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine(tiny_model_path(LLAMA))

    async def body(llm: AsyncLLM) -> None:
        monkeypatch.setattr(engine, "is_healthy", lambda: False)
        await asyncio.wait_for(llm.dead.wait(), timeout=5)
        assert "tensor-parallel worker (or engine replica) died" in str(llm.dead_error)

    run_async(engine, body)


def test_a_consumer_that_falls_behind_gets_the_outputs_it_missed_merged(
    tiny_model_path: Callable,
) -> None:
    """A consumer that waits for several steps between reads gets fewer outputs than
    tokens, each holding every token made since its last read: the synchronous engine's
    greedy tokens, in order."""
    path = tiny_model_path(LLAMA)
    reference = make_engine(path)
    reference.add_request("r", {"prompt_token_ids": PROMPTS[0]}, greedy(24))
    expected = []
    while reference.has_unfinished_requests():
        for out in reference.step():
            expected += out.outputs[0].token_ids

    async def body(llm: AsyncLLM) -> list[list[int]]:
        pieces = []
        async for output in llm.generate({"prompt_token_ids": PROMPTS[0]}, greedy(24), "r"):
            pieces.append(output.outputs[0].token_ids)
            await asyncio.sleep(0.02)  # the engine steps meanwhile
        return pieces

    pieces = run_async(make_engine(path), body)
    assert [t for piece in pieces for t in piece] == expected
    assert len(pieces) < len(expected) and max(map(len, pieces)) > 1


def test_stats_lines_show_the_running_requests(tiny_model_path: Callable, caplog) -> None:
    """vLLM's periodic line (engine/stat_logger.py) from a serving AsyncLLM: while three
    requests generate, a line says so, with tokens flowing; after them, Running: 0."""
    args = EngineArgs(
        tiny_model_path(LLAMA),
        skip_tokenizer_init=True,
        dtype="float32",
        device="cpu",
        max_model_len=512,
    )

    async def main() -> list[str]:
        llm = AsyncLLM(LLMEngine.from_engine_args(args), log_stats_interval_s=0.1)
        llm.start()
        try:
            calls = [collect_tokens(llm, [5 + i] * 4, 480, str(i)) for i in range(3)]
            await asyncio.gather(*calls)
            await asyncio.sleep(0.25)  # a line after they finished
        finally:
            await llm.shutdown()
        return [r.getMessage() for r in caplog.records if r.name.endswith("stat_logger")]

    with caplog.at_level(logging.INFO, logger="pagedllm.engine.stat_logger"):
        lines = asyncio.run(main())
    busy = [line for line in lines if "Running: 3 reqs, Waiting: 0 reqs" in line]
    assert busy, lines
    assert all(line.startswith("Engine 000: Avg prompt throughput: ") for line in lines)
    assert "Avg generation throughput: 0.0 tokens/s" not in busy[-1]
    assert "Running: 0 reqs" in lines[-1]


def test_from_engine_args_logs_stats_unless_disabled(
    tiny_model_path: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's --disable-log-stats; PAGEDLLM_LOG_STATS_INTERVAL sets the interval."""
    monkeypatch.setenv("PAGEDLLM_LOG_STATS_INTERVAL", "0.2")
    args = dict(skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=256)
    path = tiny_model_path(LLAMA)
    assert AsyncLLM.from_engine_args(EngineArgs(path, **args)).log_stats_interval_s == 0.2
    disabled = EngineArgs(path, disable_log_stats=True, **args)
    assert AsyncLLM.from_engine_args(disabled).log_stats_interval_s is None
