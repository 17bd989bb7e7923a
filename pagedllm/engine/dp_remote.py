"""Data-parallel replicas on other nodes (vLLM's --data-parallel-size-local,
--data-parallel-start-rank, --data-parallel-address, --data-parallel-rpc-port, --headless).

Rank 0's node (the one that serves) listens at data_parallel_address:data_parallel_rpc_port
with a multiprocessing.connection Listener; each other node runs `pagedllm serve --headless`,
which spawns its replicas, and each replica connects to that address, says its rank and
then speaks the same messages as a local replica over its pipe (engine/engine_core_proc.py).
The connection is authenticated with PAGEDLLM_DP_AUTHKEY (the same on every node); the
messages are pickles, so the port must be reachable from the cluster's nodes only.
"""

import multiprocessing as mp
import os
import threading
import time
from multiprocessing.connection import Client, Connection, Listener

from pagedllm.config import resolve_device
from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.engine.dp_placement import local_ranks, replica_environment
from pagedllm.engine.engine_core_proc import run_engine_core
from pagedllm.logger import init_logger

logger = init_logger(__name__)

DEFAULT_AUTHKEY = b"pagedllm-data-parallel"
CONNECT_RETRY_S = 0.5


def authkey() -> bytes:
    return os.environ.get("PAGEDLLM_DP_AUTHKEY", "").encode() or DEFAULT_AUTHKEY


def listen_remote(engine_args: EngineArgs) -> Listener:
    """The listener other nodes' replicas connect to, opened before this node's replicas
    start, so an address it cannot take is a ValueError at once, not after they load."""
    address = (engine_args.data_parallel_address, engine_args.data_parallel_rpc_port)
    try:
        return Listener(address, authkey=authkey())
    except OSError as e:
        raise ValueError(
            f"cannot listen for data-parallel replicas at {address[0]}:{address[1]} "
            f"(--data-parallel-address, --data-parallel-rpc-port): {e.strerror or e}"
        ) from e


def accept_remote(listener: Listener, ranks: range, deadline: float) -> dict[int, Connection]:
    """A connection from each replica of `ranks` (on other nodes), by rank; closes
    `listener` once they are in."""
    conns: dict[int, Connection] = {}
    with listener:
        logger.info("waiting for data-parallel ranks %s at %s:%d", list(ranks), *listener.address)
        while len(conns) < len(ranks):
            conn = _accept(listener, deadline)
            hello = conn.recv() if conn.poll(max(0.0, deadline - time.monotonic())) else None
            rank = hello[1] if isinstance(hello, tuple) and hello[0] == "hello" else None
            if rank not in ranks or rank in conns:
                conn.close()
                raise ValueError(f"a data-parallel replica said {hello!r}; expected {ranks}")
            logger.info("data-parallel engine %d connected", rank)
            conns[rank] = conn
    return conns


def _accept(listener: Listener, deadline: float) -> Connection:
    """listener.accept(), in a daemon thread so a missing node ends in a timeout."""
    box: list = []
    thread = threading.Thread(target=lambda: box.append(_try(listener.accept)), daemon=True)
    thread.start()
    thread.join(max(0.0, deadline - time.monotonic()))
    if not box:
        raise TimeoutError("data-parallel replicas on other nodes did not connect in time")
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


def _try(fn):  # noqa: ANN001, ANN202 - a thread's result or its exception
    try:
        return fn()
    except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
        return e


def run_remote_engine_core(engine_args: EngineArgs, rank: int, deadline: float) -> None:
    """A replica on a headless node: connect to rank 0's node (retrying until it listens),
    say the rank, then run as a local replica does."""
    address = (engine_args.data_parallel_address, engine_args.data_parallel_rpc_port)
    while True:
        try:
            conn = Client(address, authkey=authkey())
            break
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(CONNECT_RETRY_S)
    conn.send(("hello", rank))
    run_engine_core(engine_args, rank, conn)


def run_headless(engine_args: EngineArgs, start_timeout_s: float) -> int:
    """`pagedllm serve --headless`: run this node's replicas until they end (rank 0's node
    stops, or they fail); the highest exit code among them."""
    ranks = local_ranks(engine_args)
    if 0 in ranks:
        raise ValueError("--headless runs replicas of other nodes: --data-parallel-start-rank >= 1")
    context = mp.get_context("spawn")
    deadline = time.time() + start_timeout_s
    processes = [
        context.Process(
            target=_run_until,
            args=(engine_args, rank, deadline),
            name=f"pagedllm-dp-engine-{rank}",
        )
        for rank in ranks
    ]
    device = resolve_device(engine_args.device)
    for index, (rank, process) in enumerate(zip(ranks, processes)):
        world_size = engine_args.tensor_parallel_size * engine_args.pipeline_parallel_size
        with replica_environment(device, index, len(ranks), world_size):
            process.start()
        logger.info("data-parallel engine %d: pid %d", rank, process.pid)
    try:
        for process in processes:
            process.join()
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
                process.join()
    return max(abs(p.exitcode or 0) for p in processes)


def _run_until(engine_args: EngineArgs, rank: int, wall_deadline: float) -> None:
    """The spawned process's entry: the deadline crosses processes as wall-clock time."""
    run_remote_engine_core(engine_args, rank, time.monotonic() + wall_deadline - time.time())
