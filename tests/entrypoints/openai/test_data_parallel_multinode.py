"""Data-parallel replicas on another "node" (a `--headless` process on loopback): rank 0's
server serves with both, and the headless node exits when the server stops."""

import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from tests.entrypoints.openai.remote_server import (
    MAX_MODEL_LEN,
    MODEL_NAME,
    NUM_KV_BLOCKS,
    free_port,
    remote_server,
)

EXIT_TIMEOUT_S = 30


def _dp_flags(rpc_port: int, start_rank: int) -> list[str]:
    return [
        "--data-parallel-size",
        "2",
        "--data-parallel-size-local",
        "1",
        "--data-parallel-start-rank",
        str(start_rank),
        "--data-parallel-address",
        "127.0.0.1",
        "--data-parallel-rpc-port",
        str(rpc_port),
    ]


def test_a_headless_node_serves_rank_1_until_the_server_stops() -> None:
    rpc_port = free_port()
    command = [sys.executable, "-m", "pagedllm.entrypoints.openai.api_server", "--headless"]
    command += ["--num-kv-blocks", str(NUM_KV_BLOCKS), "--max-model-len", str(MAX_MODEL_LEN)]
    command += ["--quantization", "none", "--dtype", "float32", *_dp_flags(rpc_port, 1)]
    with tempfile.TemporaryFile() as log:
        headless = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            with remote_server(*_dp_flags(rpc_port, 0)) as server:
                client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
                with ThreadPoolExecutor(4) as pool:
                    texts = list(pool.map(lambda i: _complete(client, i), range(4)))
                assert all(texts)
                metrics = httpx.get(server.url + "/metrics", timeout=10).text
                generated = {
                    s.labels["engine"]: s.value
                    for f in text_string_to_metric_families(metrics)
                    for s in f.samples
                    if s.name == "vllm:generation_tokens_total"
                }
                assert sorted(generated) == ["0", "1"]
                assert all(n > 0 for n in generated.values()), generated
            assert headless.wait(timeout=EXIT_TIMEOUT_S) == 0
        finally:
            if headless.poll() is None:
                headless.kill()
                log.seek(0)
                print(log.read().decode(errors="replace"))


def _complete(client: openai.OpenAI, i: int) -> str:
    response = client.completions.create(
        model=MODEL_NAME, prompt=f"Count to {i + 3}:", max_tokens=4, temperature=0
    )
    return response.choices[0].text
