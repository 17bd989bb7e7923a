"""DPEngine: `data_parallel_size` engine replicas behind LLMEngine's own interface
(add_request / step / abort_request / get_stats / is_healthy), so AsyncLLM serves it and
LLM runs offline jobs on it unchanged.

Each replica is a process (multiprocessing spawn) running engine/engine_core_proc.py: a
full LLMEngine with its own executor (tensor-parallel workers inside it as usual) and KV
cache. This process keeps the config and tokenizer, picks a replica for each request
(engine/dp_balancer.py: least outstanding, preferring the replica that recently took the
same first KV block), sends it over the replica's pipe, and `step` gathers what the
replicas have sent. A replica that exits makes `step` raise and `is_healthy` false, which
AsyncLLM turns into a dead engine (its open requests fail, the server exits non-zero).
"""

import dataclasses
import multiprocessing as mp
import pickle
import time
import weakref
from collections.abc import Iterable
from multiprocessing.connection import Connection, wait

from pagedllm.config import EngineConfig
from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.engine.dp_balancer import DPLoadBalancer, prefix_key
from pagedllm.engine.dp_placement import local_ranks, replica_environment
from pagedllm.engine.dp_remote import accept_remote, listen_remote
from pagedllm.engine.engine_core_proc import run_engine_core
from pagedllm.engine.llm_engine import LLMEngine, PromptType
from pagedllm.engine.stats import EngineStats, HistogramCounts, LoRAStats
from pagedllm.engine.tokenizer import get_tokenizer
from pagedllm.executor.multiproc_executor import BOOTSTRAP_ADVICE
from pagedllm.logger import init_logger
from pagedllm.lora.registry import make_lora_registry
from pagedllm.lora.request import LoRARequest
from pagedllm.outputs import PoolingRequestOutput, RequestOutput
from pagedllm.pooling_params import PoolingParams
from pagedllm.sampling_params import SamplingParams

logger = init_logger(__name__)

ENGINE_START_TIMEOUT_S = 300.0
STEP_WAIT_S = 0.005  # how long `step` waits for a replica's message before returning none
STOP_TIMEOUT_S = 10.0

Output = RequestOutput | PoolingRequestOutput


class DataParallelEngineError(RuntimeError):
    """A data-parallel engine replica exited or failed to start."""


def make_engine(engine_args: EngineArgs, wait_for_add: bool = True) -> "LLMEngine | DPEngine":
    """The engine `engine_args` asks for: one LLMEngine, or a DPEngine over
    `data_parallel_size` replica processes."""
    if engine_args.data_parallel_size > 1:
        return DPEngine(engine_args, wait_for_add)
    return LLMEngine.from_engine_args(engine_args)


class DPEngine:
    """`wait_for_add`: add_request waits for the replica's verdict and raises a bad
    request's ValueError, as LLMEngine's does (the offline LLM); without it (AsyncLLM,
    whose thread must not wait on a busy replica) the error comes back from a later `step`
    as the request's finished output with `error` set."""

    def __init__(self, engine_args: EngineArgs, wait_for_add: bool = True) -> None:
        if getattr(mp.current_process(), "_inheriting", False):  # as MultiprocExecutor's
            raise RuntimeError(
                "an LLM was created while a data-parallel engine re-imported the main "
                "module: " + BOOTSTRAP_ADVICE
            )
        self.config: EngineConfig = engine_args.create_engine_config()
        self.model_config = self.config.model_config
        skip = self.config.skip_tokenizer_init
        self.tokenizer = None if skip else get_tokenizer(self.model_config)
        self.wait_for_add = wait_for_add
        self.lora_registry = make_lora_registry(self.config)
        size = engine_args.data_parallel_size
        ranks = local_ranks(engine_args)
        if ranks.start != 0:
            raise ValueError("the serving node runs rank 0: --data-parallel-start-rank 0")
        self.balancer = DPLoadBalancer(size)
        self._engine_of: dict[str, int] = {}  # request id -> replica
        self._pending: list[Output] = []  # outputs gathered while waiting for an add
        self.processes: list[mp.process.BaseProcess] = []  # this node's, ranks 0..
        self.conns: list[Connection] = []  # by rank; other nodes' after this node's
        self._finalizer = weakref.finalize(self, _stop, self.processes, self.conns)
        listener = listen_remote(engine_args) if len(ranks) < size else None
        try:
            deadline = time.monotonic() + ENGINE_START_TIMEOUT_S
            self._spawn(engine_args, ranks)
            if listener is not None:
                remote = accept_remote(listener, range(len(ranks), size), deadline)
                self.conns += [remote[rank] for rank in sorted(remote)]
            self._stats = self._wait_ready(deadline)
        except BaseException:
            if listener is not None:
                listener.close()
            self.shutdown()
            raise

    def _spawn(self, engine_args: EngineArgs, ranks: range) -> None:
        context = mp.get_context("spawn")
        for rank in ranks:
            parent_end, child_end = context.Pipe()
            process = context.Process(
                target=run_engine_core,
                args=(engine_args, rank, child_end),
                name=f"pagedllm-dp-engine-{rank}",
            )
            world_size = self.config.parallel_config.world_size  # its TP x PP ranks
            with replica_environment(self.config.device, rank, len(ranks), world_size):
                process.start()
            child_end.close()
            logger.info("data-parallel engine %d: pid %d", rank, process.pid)
            self.processes.append(process)
            self.conns.append(parent_end)

    def _wait_ready(self, deadline: float) -> list[EngineStats]:
        """Each replica's first stats, once all are loaded; raises at the first failure."""
        stats: dict[int, EngineStats] = {}
        while len(stats) < len(self.conns):
            if time.monotonic() > deadline:
                raise DataParallelEngineError("data-parallel engines did not start in time")
            for rank, conn in enumerate(self.conns):
                if rank in stats or not conn.poll(0.05):
                    continue
                message = self._recv(rank)
                if message[0] == "error":
                    raise _start_error(rank, message[1])
                stats[rank] = message[1]
            self._check_alive()
        return [stats[rank] for rank in range(len(self.conns))]

    # LLMEngine's interface.

    @property
    def requests(self) -> dict[str, int]:
        """The requests in flight, by id (to the replica running each)."""
        return self._engine_of

    def add_request(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams | PoolingParams | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
        lora_request: LoRARequest | None = None,
    ) -> None:
        """The replica checks the request (priority included) as LLMEngine does; a LoRA
        adapter is checked here first, so a bad one fails at once."""
        if request_id in self._engine_of:
            raise ValueError(f"request_id {request_id!r} is already in use")
        lora = self.lora_registry.check(lora_request)
        try:
            message = pickle.dumps(("add", request_id, prompt, params, priority, lora_request))
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            raise ValueError(f"the request cannot be sent to an engine replica: {e}") from e
        key = prefix_key(prompt, self.config.cache_config.block_size)
        rank = self.balancer.choose(key)
        self._engine_of[request_id] = rank
        self._send_bytes(rank, message)
        if self.wait_for_add:
            error = self._wait_added(rank, request_id)
            if error is not None:
                raise error
        self.lora_registry.keep(lora)

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """LLMEngine's: checked and loaded here, and its weights sent to every replica, so
        each runs what was read now (a request naming an adapter no add_lora gave is read
        by the replica that takes it)."""
        loaded = self.lora_registry.check(lora_request)
        self.lora_registry.keep(loaded)
        self._broadcast(("add_lora", loaded))
        return True

    def remove_lora(self, lora_int_id: int) -> bool:
        """LLMEngine's, on every replica."""
        if not self.lora_registry.remove(lora_int_id):
            return False
        self._broadcast(("remove_lora", lora_int_id))
        return True

    def list_loras(self) -> set[int]:
        return self.lora_registry.list()

    def abort_request(self, request_id: str | Iterable[str]) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        by_rank: dict[int, list[str]] = {}
        for rid in ids:
            rank = self._forget(rid)
            if rank is not None:
                by_rank.setdefault(rank, []).append(rid)
        for rank, rids in by_rank.items():
            self._send_bytes(rank, pickle.dumps(("abort", rids)))

    def abort_after_failed_step(self) -> list[str]:
        """Abort every request in flight after `step` raised (replicas still alive are
        told, as far as their pipes work); their ids."""
        logger.exception("data-parallel step failed; aborting the requests in flight")
        request_ids = list(self._engine_of)
        try:
            self.abort_request(request_ids)
        except DataParallelEngineError:
            pass  # a replica is gone: the engine is unhealthy, and stops
        return request_ids

    def step(self) -> list[Output]:
        """What the replicas have sent: waits up to STEP_WAIT_S for the first message,
        then takes every message already there. Raises DataParallelEngineError if a
        replica has exited."""
        outputs, self._pending = self._pending, []
        ready = wait([*self.conns, *(p.sentinel for p in self.processes)], STEP_WAIT_S)
        self._check_alive()
        for rank, conn in enumerate(self.conns):
            if conn in ready:
                while conn.poll():
                    outputs += self._handle(rank, self._recv(rank))
        return outputs

    def has_unfinished_requests(self) -> bool:
        return bool(self._engine_of)

    def get_stats(self) -> EngineStats:
        """All replicas' load and counters summed (KV usage over all their blocks)."""
        return sum_stats(self._stats)

    def get_stats_per_engine(self) -> list[EngineStats]:
        """Each replica's latest stats, by rank (its `engine` label in /metrics)."""
        return list(self._stats)

    def is_healthy(self) -> bool:
        """Every replica of this node alive, and every other node's still connected (what
        they sent meanwhile is kept for `step`)."""
        if not all(p.is_alive() for p in self.processes):
            return False
        try:
            for rank in range(len(self.processes), len(self.conns)):
                while self.conns[rank].poll():
                    self._pending += self._handle(rank, self._recv(rank))
        except DataParallelEngineError:
            return False
        return True

    def shutdown(self) -> None:
        """Stop the replicas (each stops its own tensor-parallel workers)."""
        self._finalizer()

    # Messages.

    def _wait_added(self, rank: int, request_id: str) -> Exception | None:
        """The replica's verdict on the add just sent; other messages are kept for `step`."""
        while True:
            if not self.conns[rank].poll(0.05):
                self._check_alive()
                continue
            message = self._recv(rank)
            if message[0] == "added" and message[1] == request_id:
                if message[2] is not None:
                    self._forget(request_id)
                return message[2]
            self._pending += self._handle(rank, message)

    def _handle(self, rank: int, message: tuple) -> list[Output]:
        kind = message[0]
        if kind == "stats":
            self._stats[rank] = message[1]
            return []
        if kind == "outputs":
            self._stats[rank] = message[2]
            return self._take(rank, message[1])
        if kind == "added":
            _, request_id, error = message
            if error is None or self._forget(request_id) is None:
                return []
            return [_failed_output(request_id, error)]
        if kind == "failed":
            _, request_ids, text = message
            taken = [rid for rid in request_ids if self._forget(rid) is not None]
            return [_failed_output(rid, RuntimeError(text)) for rid in taken]
        raise DataParallelEngineError(f"data-parallel engine {rank} sent {kind!r}")

    def _take(self, rank: int, outputs: list[Output]) -> list[Output]:
        """Replica `rank`'s outputs of requests still open (not aborted meanwhile), marked
        with its index; finished ones close."""
        taken = [o for o in outputs if o.request_id in self._engine_of]
        for output in taken:
            output.engine_index = rank
            if output.finished:
                self._forget(output.request_id)
        return taken

    def _forget(self, request_id: str) -> int | None:
        rank = self._engine_of.pop(request_id, None)
        if rank is not None:
            self.balancer.finished(rank)
        return rank

    def _broadcast(self, message: tuple) -> None:
        """`message` to every replica."""
        data = pickle.dumps(message)
        for rank in range(len(self.conns)):
            self._send_bytes(rank, data)

    def _send_bytes(self, rank: int, message: bytes) -> None:
        try:
            self.conns[rank].send_bytes(message)
        except (BrokenPipeError, OSError) as e:
            raise DataParallelEngineError(f"data-parallel engine {rank} is gone") from e

    def _recv(self, rank: int) -> tuple:
        try:
            return self.conns[rank].recv()
        except (EOFError, OSError) as e:
            raise DataParallelEngineError(self._exit_reason(rank)) from e

    def _check_alive(self) -> None:
        for rank, process in enumerate(self.processes):
            if not process.is_alive():
                raise DataParallelEngineError(self._exit_reason(rank))

    def _exit_reason(self, rank: int) -> str:
        if rank >= len(self.processes):
            return f"data-parallel engine {rank} (on another node) disconnected"
        process = self.processes[rank]
        process.join(0.5)
        return f"data-parallel engine {rank} (pid {process.pid}) exited: {process.exitcode}"


def _start_error(rank: int, error: Exception | str) -> Exception:
    """A replica's start-up failure: a bad setting's ValueError / TypeError as that error
    (what `pagedllm serve` reports in one line, exit 2, as with one engine), anything else
    with the replica's traceback."""
    if isinstance(error, Exception):
        return type(error)(f"data-parallel engine {rank}: {error}")
    return DataParallelEngineError(f"data-parallel engine {rank}: {error}")


def _failed_output(request_id: str, error: Exception) -> RequestOutput:
    """A request that ended in its replica before any output: finished, with `error`."""
    return RequestOutput(request_id, None, [], None, [], True, error=error)


def sum_stats(stats: list[EngineStats]) -> EngineStats:
    """Replicas' stats as one engine's: counts, counters and per-step histograms add up,
    KV usage is of all blocks, the adapters in use are all replicas' (speculative decoding
    runs without data parallelism)."""
    apart = ("iteration_tokens", "spec_decoding", "lora")
    names = [f.name for f in dataclasses.fields(EngineStats) if f.name not in apart]
    total = EngineStats(**{name: sum(getattr(s, name) for s in stats) for name in names})
    total.kv_cache_usage = 1 - total.num_free_blocks / total.num_blocks if total.num_blocks else 0
    histograms = [s.iteration_tokens for s in stats]
    total.iteration_tokens = HistogramCounts(
        histograms[0].buckets,
        [sum(counts) for counts in zip(*(h.counts for h in histograms))],
        sum(h.sum for h in histograms),
    )
    loras = [s.lora for s in stats if s.lora is not None]
    if loras:
        running = sorted({name for lora in loras for name in lora.running})
        waiting = sorted({name for lora in loras for name in lora.waiting})
        total.lora = LoRAStats(loras[0].max_lora, running, waiting)
    return total


def _stop(processes: list[mp.process.BaseProcess], conns: list[Connection]) -> None:
    """Ask each replica to stop, then terminate (and kill) what still runs."""
    for conn in conns:
        try:
            conn.send(("stop",))
        except (BrokenPipeError, OSError):
            pass
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            process.terminate()
            process.join(2.0)
        if process.is_alive():
            process.kill()
            process.join()
    for conn in conns:
        conn.close()
