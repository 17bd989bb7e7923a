"""`pagedllm serve` in a subprocess on a free localhost port (vLLM's RemoteOpenAIServer)."""

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx

MAX_MODEL_LEN = 2048
NUM_KV_BLOCKS = 512
MODEL_NAME = "SmolLM2-135M-Instruct"
STARTUP_TIMEOUT_S = 180


@dataclass
class Server:
    url: str
    process: subprocess.Popen
    log_path: str

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_healthy(server: Server) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"the server exited at start-up:\n{server.log()}")
        try:
            if httpx.get(server.url + "/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the server was not healthy after {STARTUP_TIMEOUT_S} s:\n{server.log()}")


@contextmanager
def remote_server(
    *flags: str, model: str | None = None, env: dict[str, str] | None = None
) -> Iterator[Server]:
    """`model` (default: the default model) with a small KV cache, `env` added to this
    process's environment; stopped (SIGTERM, then SIGKILL) on exit."""
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="pagedllm-serve-", suffix=".log", delete=False)
    command = [sys.executable, "-m", "pagedllm.entrypoints.openai.api_server"]
    command += [model] if model else []
    command += ["--port", str(port)]
    command += ["--num-kv-blocks", str(NUM_KV_BLOCKS), "--max-model-len", str(MAX_MODEL_LEN)]
    command += ["--quantization", "none", "--dtype", "float32"]  # greedy texts batch-invariant
    command += ["--uvicorn-log-level", "warning", *flags]
    environment = {**os.environ, **(env or {})}
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environment)
    server = Server(f"http://127.0.0.1:{port}", process, log.name)
    try:
        wait_until_healthy(server)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()
        os.unlink(log.name)
