"""DPEngine: LLM(data_parallel_size=2) runs two replica processes and gives what one engine
gives, in input order; bad requests and a dead replica fail as on one engine."""

import os
import signal

import pytest

from pagedllm import LLM
from pagedllm.engine.data_parallel import DataParallelEngineError, DPEngine
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
    """Outputs equal one engine's, in input order; a bad request raises at generate; a
    killed replica makes generate raise."""
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
