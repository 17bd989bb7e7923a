"""One data-parallel engine replica in its own process (vLLM's EngineCoreProc): a full
LLMEngine (its own executor, tensor-parallel workers included, and KV cache) driven by
messages over a multiprocessing pipe from the DPEngine in the server's (or LLM's) process.

In (parent -> replica):  ("add", request_id, prompt, params, priority, lora_request),
                          ("abort", [request_id, ...]),
                          ("add_lora", loaded_adapter), ("remove_lora", lora_int_id),
                          ("stop",)
Out (replica -> parent): ("ready", stats) once loaded, or ("error", error) and exit 1: the
                          ValueError / TypeError of a bad setting, else the traceback;
                          ("added", request_id, error | None) for each add, in order;
                          ("outputs", [output, ...], stats) after each step;
                          ("failed", [request_id, ...], message) when a step failed;
                          ("stats", stats) after a batch of commands.
The replica exits when told to stop, when the pipe closes (its parent is gone), or, with a
non-zero status, when its executor breaks (a tensor-parallel worker died).
"""

import dataclasses
import signal
import traceback
from multiprocessing.connection import Connection

from pagedllm.config import resolve_device
from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.engine.dp_placement import local_ranks, pin_cpu_share
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.executor.worker import die_with_parent
from pagedllm.logger import init_logger
from pagedllm.outputs import PoolingRequestOutput, RequestOutput

logger = init_logger(__name__)

IDLE_POLL_S = 1.0  # how often an idle replica checks its executor's health


def run_engine_core(engine_args: EngineArgs, rank: int, conn: Connection) -> None:
    """The replica process's entry point (multiprocessing spawn). Ctrl-C reaches the whole
    process group: the replica ignores it and stops when its parent tells it to."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _place(engine_args, rank)
    try:
        one = dataclasses.replace(engine_args, data_parallel_size=1)
        engine = LLMEngine.from_engine_args(one, node_replicas=len(local_ranks(engine_args)))
    except (ValueError, TypeError) as e:  # a bad setting: its message says what to change
        conn.send(("error", _portable_error(e)))
        raise SystemExit(1) from None
    except BaseException:  # a bug: its traceback
        conn.send(("error", traceback.format_exc()))
        raise SystemExit(1) from None
    try:
        conn.send(("ready", engine.get_stats()))
        EngineCore(engine, conn).run()
    except (EOFError, BrokenPipeError):
        pass  # the parent is gone
    except BaseException:
        logger.exception("data-parallel engine %d died", rank)
        raise SystemExit(1) from None
    finally:
        engine.abort_request(list(engine.requests))
        engine.shutdown()


def _place(engine_args: EngineArgs, rank: int) -> None:
    """A CPU replica takes its share of the node's cores (a GPU replica's GPUs were set
    before it started: engine/dp_placement.py)."""
    if resolve_device(engine_args.device) == "cpu":
        ranks = local_ranks(engine_args)
        pin_cpu_share(ranks.index(rank), len(ranks))


class EngineCore:
    """The replica's loop: run the queued commands, step while requests are in flight,
    send the outputs."""

    def __init__(self, engine: LLMEngine, conn: Connection) -> None:
        self.engine = engine
        self.conn = conn

    def run(self) -> None:
        while True:
            busy = self.engine.has_unfinished_requests()
            if self.conn.poll(0 if busy else IDLE_POLL_S):
                if not self._handle_commands():
                    return
            elif not busy and not self.engine.is_healthy():
                raise RuntimeError("a tensor-parallel worker died")
            if self.engine.has_unfinished_requests():
                outputs = [_portable(o) for o in self._step()]
                self.conn.send(("outputs", outputs, self.engine.get_stats()))

    def _handle_commands(self) -> bool:
        """Every command waiting on the pipe; False once told to stop."""
        while self.conn.poll():
            command = self.conn.recv()
            if command[0] == "stop":
                return False
            if command[0] == "abort":
                self.engine.abort_request(command[1])
            elif command[0] == "remove_lora":
                self.engine.remove_lora(command[1])
            elif command[0] == "add_lora":
                self._add_lora(command[1])
            else:
                _, request_id, prompt, params, priority, lora_request = command
                error = self._add(request_id, prompt, params, priority, lora_request)
                self.conn.send(("added", request_id, error))
        self.conn.send(("stats", self.engine.get_stats()))
        return True

    def _add(
        self, request_id: str, prompt: object, params: object, priority: int, lora: object
    ) -> Exception | None:
        try:
            self.engine.add_request(
                request_id, prompt, params, priority=priority, lora_request=lora
            )
        except Exception as e:  # noqa: BLE001 - a request that can't be added fails alone
            return _portable_error(e)
        return None

    def _add_lora(self, loaded: object) -> None:
        """The adapter the parent's add_lora loaded, its weights with it; refused (an id or
        name this replica holds for another), it is logged, and requests naming it fail
        here when added."""
        try:
            self.engine.lora_registry.adopt(loaded)
        except (ValueError, TypeError) as e:
            logger.warning("data-parallel engine: add_lora %s failed: %s", loaded.request, e)

    def _step(self) -> list[RequestOutput | PoolingRequestOutput]:
        """One step; as in AsyncLLM, a failed step fails the requests in flight and the
        replica goes on unless its executor is broken."""
        try:
            return self.engine.step()
        except Exception as e:
            request_ids = self.engine.abort_after_failed_step()
            if not self.engine.is_healthy():
                raise
            self.conn.send(("failed", request_ids, f"the engine failed while stepping: {e!r}"))
            return []


def _portable_error(error: Exception) -> Exception:
    """An exception the parent can unpickle whatever its class's constructor: a
    ValueError / TypeError keeps its kind (a 400 on the server), anything else becomes a
    RuntimeError with the original's repr."""
    if isinstance(error, ValueError):
        return ValueError(str(error))
    if isinstance(error, TypeError):
        return TypeError(str(error))
    return RuntimeError(repr(error))


def _portable(output: RequestOutput | PoolingRequestOutput) -> RequestOutput | PoolingRequestOutput:
    if output.error is not None:
        output.error = _portable_error(output.error)
    return output
