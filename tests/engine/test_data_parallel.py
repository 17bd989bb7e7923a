"""DPEngine: LLM(data_parallel_size=2) runs two replica processes and gives what one engine
gives, in input order; bad requests and a dead replica fail as on one engine."""

import dataclasses
import os
import signal
import socket
from types import SimpleNamespace

import pytest

from pagedllm import LLM
from pagedllm.engine.data_parallel import DataParallelEngineError, DPEngine, sum_stats
from pagedllm.engine.dp_balancer import DPLoadBalancer
from pagedllm.engine.stats import EngineStats, LoRAStats
from pagedllm.lora.registry import LoRARegistry
from pagedllm.sampling_params import SamplingParams
from tests.engine.engine_helpers import LLAMA

ENGINE_KWARGS = {
    "num_kv_blocks": 64,
    "max_model_len": 256,
    "dtype": "float32",
    "skip_tokenizer_init": True,
}


def _prompts() -> list[dict]:
    """Prompts of different lengths, some sharing a first block (block_size 16)."""
    shared = list(range(5, 37))
    return [{"prompt_token_ids": shared[: 16 + i] + [100 + i] * (i % 3)} for i in range(6)] + [
        {"prompt_token_ids": [7 + i, 8, 9]} for i in range(4)
    ]


def test_offline_data_parallel_equals_one_engine_in_order(tiny_model_path) -> None:
    """Outputs equal one engine's, in input order; a bad request (a priority the replica's
    policy refuses among them) raises at generate; a killed replica makes generate raise."""
    model = tiny_model_path(LLAMA)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    with LLM(model, **ENGINE_KWARGS) as one:
        expected = one.generate(_prompts(), params, use_tqdm=False)
    with LLM(model, data_parallel_size=2, **ENGINE_KWARGS) as two:
        engine = two.llm_engine
        assert isinstance(engine, DPEngine) and len(engine.processes) == 2
        got = two.generate(_prompts(), params, use_tqdm=False)
        per_engine = engine.get_stats_per_engine()
        with pytest.raises(ValueError, match="max_tokens"):
            two.generate(_prompts()[:1], SamplingParams(max_tokens=0))
        with pytest.raises(ValueError, match="Got priority 1 but priority scheduling"):
            two.generate(_prompts()[:1], params, priority=[1])  # the replica's check
        assert not engine.has_unfinished_requests()
        os.kill(engine.processes[1].pid, signal.SIGKILL)
        engine.processes[1].join(10)
        assert not engine.is_healthy()
        with pytest.raises(DataParallelEngineError, match="engine 1"):
            two.generate(_prompts(), params, use_tqdm=False)
    assert [o.request_id for o in got] == [str(i) for i in range(len(got))]
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in expected]
    # Both replicas ran prompts, and none ran twice: their generated tokens add up.
    assert all(s.num_generation_tokens > 0 for s in per_engine)
    assert sum(s.num_generation_tokens for s in per_engine) == 6 * len(got)
    assert not any(p.is_alive() for p in engine.processes)


class _WatchedTokenizer:
    """A tokenizer that records every use (and fails it): routing must not tokenize."""

    def __init__(self) -> None:
        self.used: list[str] = []

    def __getattr__(self, name: str) -> object:
        self.used.append(name)
        raise AssertionError(f"routing used the tokenizer's {name}")

    def __call__(self, *args: object, **kwargs: object) -> object:
        return self.__getattr__("__call__")


class _Pipe:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def send_bytes(self, message: bytes) -> None:
        self.sent.append(message)


def _routing_engine(num_engines: int) -> DPEngine:
    """A DPEngine's router alone: its balancer, a watched tokenizer, pipes to no process."""
    engine = DPEngine.__new__(DPEngine)
    engine.config = SimpleNamespace(cache_config=SimpleNamespace(block_size=16))
    engine.tokenizer = _WatchedTokenizer()
    engine.wait_for_add = False
    engine.balancer = DPLoadBalancer(num_engines)
    engine._engine_of = {}
    engine.conns = [_Pipe() for _ in range(num_engines)]
    engine.lora_registry = LoRARegistry(None, {})
    return engine


def test_a_replicas_bad_setting_is_its_value_error(tiny_model_path) -> None:
    """A replica's start-up ValueError (a KV cache smaller than max_model_len) reaches the
    caller as that ValueError, its message one line as one engine's (`pagedllm serve`
    reports it and exits 2), not a DataParallelEngineError quoting a traceback."""
    kwargs = {**ENGINE_KWARGS, "num_kv_blocks": 8}
    with pytest.raises(ValueError, match="fewer than max_model_len=256") as raised:
        LLM(tiny_model_path(LLAMA), data_parallel_size=2, **kwargs)
    assert str(raised.value).startswith("data-parallel engine ")
    assert "Traceback" not in str(raised.value)


def test_an_rpc_port_in_use_is_refused_before_any_replica_starts(
    tiny_model_path, monkeypatch
) -> None:
    """Replicas on other nodes connect to rank 0's --data-parallel-rpc-port: a port taken
    is a ValueError naming it, and no replica was spawned."""
    spawned = []
    monkeypatch.setattr(DPEngine, "_spawn", lambda self, *args: spawned.append(args))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ValueError, match=f"127.0.0.1:{port} .*--data-parallel-rpc-port"):
            LLM(
                tiny_model_path(LLAMA),
                data_parallel_size=2,
                data_parallel_size_local=1,
                data_parallel_rpc_port=port,
                **ENGINE_KWARGS,
            )
    assert spawned == []


def test_text_prompts_route_on_a_shared_prefix_without_the_tokenizer() -> None:
    """A text prompt sharing a long prefix with an earlier one goes to its replica, where
    the least loaded would be the other; the tokenizer is never touched."""
    engine = _routing_engine(2)
    system = "You are a careful assistant who answers briefly. " * 3
    engine.add_request("a", system + "What is 2 + 2?")
    engine.add_request("b", "A short prompt.")
    engine.add_request("c", {"prompt": "Another short one."})
    assert engine.balancer.outstanding == [2, 1]  # the least loaded is 1 ...
    engine.add_request("d", {"prompt": system + "Name a prime."})
    assert engine.requests["d"] == engine.requests["a"] == 0  # ... the prefix's owner is 0
    assert engine.tokenizer.used == []
    assert [len(pipe.sent) for pipe in engine.conns] == [3, 1]


def test_sum_stats_names_every_replicas_adapters() -> None:
    """Replicas' LoRA adapters in use, as one engine's: the union of their names."""

    def stats(running: list[str], waiting: list[str]) -> EngineStats:
        counts = dict.fromkeys(
            ["num_running", "num_waiting", "num_preemptions", "num_free_blocks"], 0
        )
        return EngineStats(
            **counts,
            kv_cache_usage=0.0,
            num_blocks=4,
            prefix_cache_queries=0,
            prefix_cache_hits=0,
            num_prompt_tokens=0,
            num_generation_tokens=0,
            lora=LoRAStats(2, running, waiting),
        )

    total = sum_stats([stats(["a"], ["c"]), stats(["b", "a"], [])])
    assert (total.lora.max_lora, total.lora.running, total.lora.waiting) == (2, ["a", "b"], ["c"])
    assert sum_stats([dataclasses.replace(stats([], []), lora=None)]).lora is None
