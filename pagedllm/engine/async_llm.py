"""AsyncLLM: the engine behind an asyncio server, with continuous batching across callers.

One background thread owns the LLMEngine: it alone calls add_request, abort_request and
step, so the engine needs no locks. Callers talk to it through a FIFO command queue
(add / abort / stop) and get outputs back through a per-request RequestOutputCollector,
filled from the thread with `loop.call_soon_threadsafe` (a caller that falls behind gets
the outputs it missed merged into one: output_collector.py). A step runs while the event
loop keeps serving, and a request that arrives mid-step joins the running batch at the
next step.

With `log_stats_interval_s` set, an asyncio task logs vLLM's periodic stats lines from
the engine's published snapshots (stat_logger.py), as vLLM's server does unless
--disable-log-stats.
"""

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from pagedllm.config import EngineConfig
from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.engine.data_parallel import DPEngine, make_engine
from pagedllm.engine.llm_engine import LLMEngine, PromptType
from pagedllm.engine.output_collector import RequestOutputCollector
from pagedllm.engine.stat_logger import LoggingStatLogger, kv_cache_label, log_stats_interval
from pagedllm.logger import init_logger
from pagedllm.lora.request import LoRARequest
from pagedllm.outputs import PoolingRequestOutput, RequestOutput
from pagedllm.pooling_params import PoolingParams
from pagedllm.sampling_params import RequestOutputKind, SamplingParams

logger = init_logger(__name__)

IDLE_HEALTH_CHECK_S = 1.0


@dataclass
class _Add:
    request_id: str
    prompt: PromptType
    params: SamplingParams | PoolingParams
    added: asyncio.Future
    priority: int = 0
    lora_request: LoRARequest | None = None


@dataclass
class _Call:
    """A call of the engine's (add_lora, ...) on the engine thread; `done` gets its result."""

    fn: Callable[[], object]
    done: asyncio.Future


@dataclass
class _Abort:
    request_id: str


class _Stop:
    pass


class EngineDeadError(RuntimeError):
    """The engine failed while stepping, or was shut down; its open requests were aborted."""


class RequestFailedError(RuntimeError):
    """This request alone failed inside the engine (the others go on); `__cause__` says why."""


class AsyncLLM:
    """Async front of an LLMEngine; `start()` inside a running event loop before use."""

    def __init__(
        self, engine: LLMEngine | DPEngine, log_stats_interval_s: float | None = None
    ) -> None:
        """`log_stats_interval_s`: seconds between stats lines; None logs none."""
        self.engine = engine
        self.log_stats_interval_s = log_stats_interval_s
        self._stats_task: asyncio.Task | None = None
        self.stats = self.engine.get_stats()
        self.stats_per_engine = self.engine.get_stats_per_engine()
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._collectors: dict[str, RequestOutputCollector] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.dead_error: EngineDeadError | None = None  # why the engine thread ended early
        self._stopped: EngineDeadError | None = None  # set by shutdown(): new requests fail
        self.dead = asyncio.Event()  # set (on the event loop) when dead_error is

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs) -> "AsyncLLM":
        """One engine, or a DPEngine over `data_parallel_size` replica processes; stats
        lines every log_stats_interval() seconds unless `disable_log_stats`."""
        interval = None if engine_args.disable_log_stats else log_stats_interval()
        return cls(make_engine(engine_args, wait_for_add=False), interval)

    @property
    def config(self) -> EngineConfig:
        return self.engine.config

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase | None:
        """The engine thread's own; callers on other threads must use a copy."""
        return self.engine.tokenizer

    def close(self) -> None:
        """Stop the engine's tensor-parallel workers (after shutdown)."""
        self.engine.shutdown()

    def abort(self, request_id: str) -> None:
        """Abort a request at the engine's next turn (closing its generate() does too)."""
        self._commands.put(_Abort(request_id))

    @property
    def is_running(self) -> bool:
        alive = self._thread is not None and self._thread.is_alive()
        return alive and self.dead_error is None

    def start(self) -> None:
        """Start the engine thread, bound to the calling event loop."""
        if self.is_running:
            raise RuntimeError("AsyncLLM is already running")
        self._loop = asyncio.get_running_loop()
        self._stopped = None
        self._thread = threading.Thread(target=self._run, name="pagedllm-engine", daemon=True)
        self._thread.start()
        if self.log_stats_interval_s is not None:
            self._stats_task = asyncio.ensure_future(self._log_stats(self.log_stats_interval_s))

    async def shutdown(self) -> None:
        """Stop the thread and wait for it; requests still open end with EngineDeadError."""
        if self._stats_task is not None:
            self._stats_task.cancel()
            self._stats_task = None
        if not self.is_running:
            return
        error = self._stopped = EngineDeadError("the engine was shut down")
        self._commands.put(_Stop())
        await asyncio.to_thread(self._thread.join)
        while not self._commands.empty():
            command = self._commands.get_nowait()
            if isinstance(command, _Add):
                _settle(command.added, error)
        self._fail(list(self._collectors), error)

    def encode(
        self, prompt: PromptType, params: PoolingParams, request_id: str
    ) -> AsyncIterator[PoolingRequestOutput]:
        """A pooling model's one output for the prompt, as `generate` runs it."""
        return self.generate(prompt, params, request_id)

    def has_request(self, request_id: str) -> bool:
        return request_id in self._collectors

    async def generate(
        self,
        prompt: PromptType,
        params: SamplingParams | PoolingParams,
        request_id: str,
        priority: int = 0,
        lora_request: LoRARequest | None = None,
    ) -> AsyncIterator[RequestOutput | PoolingRequestOutput]:
        """Outputs of one request as the engine makes them (as params.output_kind says;
        a pooling request's one output when it finishes). `priority`: vLLM's (lower is
        served first), for an engine whose scheduling policy is "priority";
        `lora_request`: the LoRA adapter it runs with (docs/lora.md).

        A bad request raises ValueError/TypeError before the first output. Closing the
        iterator early (or cancelling its consumer) aborts the request, which frees its
        KV blocks at the engine's next turn.
        """
        if self.dead_error is not None or self._stopped is not None:
            raise self.dead_error or self._stopped
        if not self.is_running:
            raise RuntimeError("AsyncLLM.start() was not called, or the engine stopped")
        if request_id in self._collectors:
            raise ValueError(f"request_id {request_id!r} is already in use")
        delta = isinstance(params, SamplingParams) and params.output_kind is RequestOutputKind.DELTA
        outputs = self._collectors[request_id] = RequestOutputCollector(aggregate=delta)
        added = self._loop.create_future()
        finished = False
        self._commands.put(_Add(request_id, prompt, params, added, priority, lora_request))
        try:
            await added
            while not finished:
                output = await outputs.get()
                finished = output.finished
                yield output
        finally:
            del self._collectors[request_id]
            if not finished:
                self.abort(request_id)

    async def add_lora(self, lora_request: LoRARequest) -> bool:
        """vLLM's: check an adapter and keep it known; ValueError for one the engine cannot
        run (LLMEngine.add_lora)."""
        return await self._call(lambda: self.engine.add_lora(lora_request))

    async def remove_lora(self, lora_int_id: int) -> bool:
        return await self._call(lambda: self.engine.remove_lora(lora_int_id))

    async def list_loras(self) -> set[int]:
        return await self._call(self.engine.list_loras)

    async def _call(self, fn: Callable[[], object]) -> object:
        """fn's result, run on the engine thread between steps."""
        if self.dead_error is not None or self._stopped is not None:
            raise self.dead_error or self._stopped
        if not self.is_running:
            raise RuntimeError("AsyncLLM.start() was not called, or the engine stopped")
        done = self._loop.create_future()
        self._commands.put(_Call(fn, done))
        return await done

    async def _log_stats(self, interval_s: float) -> None:
        """Every `interval_s`, a line per engine from the snapshots /metrics reads."""
        label = kv_cache_label(self.config.device)
        stat_logger = LoggingStatLogger(self.stats_per_engine, interval_s, label)
        while True:
            await asyncio.sleep(interval_s)
            stat_logger.log(self.stats_per_engine)

    # The engine thread.

    def _run(self) -> None:
        try:
            while self._handle_commands(block=not self.engine.has_unfinished_requests()):
                outputs = self._step() if self.engine.has_unfinished_requests() else []
                self._publish_stats()  # before the outputs: no caller sees older
                if outputs:
                    self._call_soon(self._dispatch, outputs)
        except BaseException as e:  # noqa: BLE001 - the thread dies; its callers must hear it
            logger.exception("the engine thread died")
            self._die(e)
        self.engine.abort_request(list(self.engine.requests))
        self._publish_stats()

    def _publish_stats(self) -> None:
        self.stats_per_engine = self.engine.get_stats_per_engine()
        self.stats = self.engine.get_stats()

    def _die(self, error: BaseException) -> None:
        """The engine can serve no more: record why; the event loop fails what is open."""
        dead = error if isinstance(error, EngineDeadError) else EngineDeadError(repr(error))
        self.dead_error = dead
        self._call_soon(self._on_dead)

    def _handle_commands(self, block: bool) -> bool:
        """Run the queued commands (waiting for one if `block`); False once told to stop.
        While idle, check the executor every second, so a dead tensor-parallel worker is
        noticed without waiting for a request."""
        try:
            command = self._commands.get(block=block, timeout=IDLE_HEALTH_CHECK_S)
        except queue.Empty:
            if block and not self.engine.is_healthy():
                raise EngineDeadError("a tensor-parallel worker (or engine replica) died") from None
            return True
        while True:
            if isinstance(command, _Stop):
                return False
            self._handle(command)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return True

    def _handle(self, command: _Add | _Abort | _Call) -> None:
        if isinstance(command, _Abort):
            self.engine.abort_request(command.request_id)
            return
        if isinstance(command, _Call):
            try:
                result = command.fn()
            except Exception as e:  # noqa: BLE001 - the caller hears it
                self._call_soon(_settle, command.done, e)
            else:
                self._call_soon(_settle, command.done, None, result)
            return
        if command.added.cancelled():
            return
        try:
            self.engine.add_request(
                command.request_id,
                command.prompt,
                command.params,
                priority=command.priority,
                lora_request=command.lora_request,
            )
        except Exception as e:  # noqa: BLE001 - a request that can't be added fails alone
            self._call_soon(_settle, command.added, e)
            return
        self._call_soon(_settle, command.added, None)

    def _step(self) -> list[RequestOutput | PoolingRequestOutput]:
        """One step. If it fails, the requests in flight end with EngineDeadError; the
        engine goes on unless its executor is broken (a tensor-parallel worker died)."""
        try:
            return self.engine.step()
        except Exception as e:
            request_ids = self.engine.abort_after_failed_step()
            error = EngineDeadError(f"the engine failed while stepping: {e!r}")
            if not self.engine.is_healthy():
                raise error from e
            self._call_soon(self._fail, request_ids, error)
            return []

    def _call_soon(self, callback: Callable, *args: object) -> None:
        self._loop.call_soon_threadsafe(callback, *args)

    # Back on the event loop.

    def _dispatch(self, outputs: list[RequestOutput | PoolingRequestOutput]) -> None:
        for output in outputs:
            collector = self._collectors.get(output.request_id)
            if collector is None:
                continue
            collector.put(output if output.error is None else _request_error(output.error))

    def _on_dead(self) -> None:
        """Fail every open request and every add still queued (generate checks dead_error
        before queueing, on this loop, so none can slip in after), then set `dead` so the
        server can exit and a supervisor restart it."""
        self._fail(list(self._collectors), self.dead_error)
        while not self._commands.empty():
            command = self._commands.get_nowait()
            if isinstance(command, _Add | _Call):
                _settle(
                    command.added if isinstance(command, _Add) else command.done, self.dead_error
                )
        self.dead.set()

    def _fail(self, request_ids: list[str], error: BaseException) -> None:
        for request_id in request_ids:
            collector = self._collectors.get(request_id)
            if collector is not None:
                collector.put(error)


def _request_error(error: Exception) -> Exception:
    """What the caller of a failed request gets: a ValueError stays one (the request's
    parameters caused it: a 400 on the server); anything else is a RequestFailedError."""
    if isinstance(error, ValueError | TypeError):
        return error
    failed = RequestFailedError(f"the request failed in the engine: {error!r}")
    failed.__cause__ = error
    return failed


def _settle(future: asyncio.Future, error: BaseException | None, result: object = None) -> None:
    """Resolve `future` (with `result`, or fail it with `error`) unless its waiter gave up
    (cancelled) meanwhile."""
    if future.done():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)
