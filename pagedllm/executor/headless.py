"""A node past the first of a multi-node world (vLLM's --nnodes with --headless): no engine,
no API server; it starts this node's ranks and they follow rank 0's broadcasts.

Node k runs ranks k * R .. (k + 1) * R - 1, R = world_size / nnodes, each a spawned
worker (worker.worker_main) that meets the others at master_addr:master_port. The node exits
0 when rank 0 shuts its workers down, and 1 as soon as one of its ranks fails (its traceback
is logged), killing the others: a supervisor then restarts the node.
"""

import multiprocessing as mp
from multiprocessing.connection import Connection, wait
from typing import NoReturn

from pagedllm.config import EngineConfig
from pagedllm.executor.multiproc_executor import rendezvous_address
from pagedllm.executor.worker import ERROR, worker_main
from pagedllm.logger import init_logger

logger = init_logger(__name__)


def run_headless(config: EngineConfig) -> NoReturn:
    """Start this node's ranks, wait for them, and exit the process with their status."""
    parallel = config.parallel_config
    if parallel.nnodes == 1 or parallel.node_rank == 0:
        raise ValueError(
            "a headless node runs the ranks of node_rank > 0 of a multi-node world; "
            f"got nnodes={parallel.nnodes}, node_rank={parallel.node_rank}"
        )
    per_node = parallel.ranks_per_node
    first = parallel.node_rank * per_node
    ctx = mp.get_context("spawn")
    workers: dict[int, tuple[mp.Process, Connection]] = {}
    try:
        for rank in range(first, first + per_node):
            parent_conn, child_conn = ctx.Pipe(duplex=False)
            process = ctx.Process(
                target=worker_main,
                args=(config, rank, parallel.world_size, rendezvous_address(parallel), child_conn),
                name=f"pagedllm-tp-worker-{rank}",
                daemon=True,
            )
            process.start()
            child_conn.close()
            workers[rank] = (process, parent_conn)
        logger.info(
            "node %d of %d: ranks %d..%d follow rank 0 at %s:%d",
            parallel.node_rank,
            parallel.nnodes,
            first,
            first + per_node - 1,
            parallel.master_addr,
            parallel.master_port,
        )
        raise SystemExit(_follow(workers))
    finally:
        for process, _ in workers.values():
            if process.is_alive():
                process.kill()
            process.join(timeout=5)


def _follow(workers: dict[int, tuple[mp.Process, Connection]]) -> int:
    """Wait until every rank has exited: 0 if all exited cleanly, else 1 at the first
    failure (the caller kills the rest). Start-up reports are read and dropped; an error
    report is logged."""
    running = {process.sentinel: rank for rank, (process, _) in workers.items()}
    pipes = {conn: rank for rank, (_, conn) in workers.items()}
    while running:
        for ready in wait([*running, *pipes]):
            if ready in pipes:
                _read_report(ready, pipes)
                continue
            rank = running.pop(ready)
            process = workers[rank][0]
            process.join()
            if process.exitcode != 0:
                logger.error("rank %d exited with code %s", rank, process.exitcode)
                return 1
    return 0


def _read_report(conn: Connection, pipes: dict[Connection, int]) -> None:
    try:
        kind, detail = conn.recv()
    except EOFError:  # the worker exited; its sentinel tells how
        del pipes[conn]
        return
    if kind == ERROR:
        logger.error("rank %d failed:\n%s", pipes[conn], detail)
