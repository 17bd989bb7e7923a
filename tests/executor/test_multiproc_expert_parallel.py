"""enable_expert_parallel over spawned workers (gloo on CPU): 2 and 4 ranks, each holding
whole experts, against one rank on the same weights. Reference: the one-rank run's greedy
tokens and logprobs, on the tiny Qwen3-MoE, Mixtral, Qwen2-MoE and Granite MoE checkpoints
(float32) and on a GGUF whose Q4_K experts tensor parallelism would cut; and inspect's
per-rank bytes, which rank 0's model holds."""

import pytest

from pagedllm import LLM, SamplingParams
from pagedllm.config import ModelConfig
from pagedllm.entrypoints.inspect import inspect_model
from tests.executor.test_multiproc_executor import ENGINE, PARAMS, mixed_prompts, param_bytes
from tests.layers.quantization.quantized_gguf import write_quantized_gguf


def assert_same_generations(expected: list, got: list, logprob_atol: float) -> None:
    for want, have in zip(expected, got, strict=True):
        a, b = want.outputs[0], have.outputs[0]
        assert a.token_ids == b.token_ids
        for lp_a, lp_b, token in zip(a.logprobs, b.logprobs, a.token_ids, strict=True):
            assert abs(lp_a[token].logprob - lp_b[token].logprob) <= logprob_atol


def rank0_experts(llm: LLM) -> int:
    return llm.llm_engine.executor.runner.model.model.layers[0].mlp.experts.local_num_experts


@pytest.fixture(scope="module", params=["qwen3-moe", "mixtral", "qwen2-moe", "granitemoe"])
def moe_checkpoint(request: pytest.FixtureRequest, tiny_model_path) -> tuple[str, list]:
    """A tiny MoE of 8 experts (Qwen3-MoE; Mixtral, whose checkpoint names them
    block_sparse_moe.experts.{e}.w1/w3/w2; Qwen2-MoE, whose shared expert the ranks split as
    a dense MLP; Granite MoE, whose experts are fused in one tensor each rank reads whole)
    and one rank's generations on it (prompts of 1 to 40 tokens, prefilled in chunks of
    16)."""
    path = tiny_model_path(request.param)
    with LLM(path, max_num_batched_tokens=16, **ENGINE) as one:
        return path, one.generate(mixed_prompts(), PARAMS, use_tqdm=False)


@pytest.mark.parametrize("size", [2, 4])
def test_ep_matches_one_rank(size: int, moe_checkpoint: tuple[str, list]) -> None:
    """float32: the ranks' partial sums differ from one rank's sum only in rounding."""
    path, expected = moe_checkpoint
    engine = dict(ENGINE, max_num_batched_tokens=16)
    with LLM(path, tensor_parallel_size=size, enable_expert_parallel=True, **engine) as ep:
        got = ep.generate(mixed_prompts(), PARAMS, use_tqdm=False)
        assert rank0_experts(ep) == 8 // size
        rank_bytes = param_bytes(ep)
    assert_same_generations(expected, got, 1e-5)
    config = ModelConfig.create(path, dtype="float32")
    report = inspect_model(config, tp=size, enable_expert_parallel=True)
    assert rank_bytes == report["bytes_per_rank"]


GGUF_PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=3)
GGUF_PROMPTS = [
    {"prompt_token_ids": [1, 5, 9, 33, 17, 60, 2, 41, 8, 8, 23]},
    {"prompt_token_ids": [3, 4]},
]


@pytest.fixture(scope="module")
def q4_k_moe(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list]:
    """A tiny Qwen3-MoE GGUF with 6 experts (so 4 ranks hold 2, 2, 1, 1) whose down
    projections are rows of one Q4_K block (tests/layers/quantization/quantized_gguf.py),
    and one rank's generations on it, run as stored."""
    path = str(tmp_path_factory.mktemp("q4_k_moe") / "qwen3moe.gguf")
    write_quantized_gguf(path, "qwen3moe", num_experts=6)
    with LLM(path, **ENGINE) as one:
        return path, one.generate(GGUF_PROMPTS, GGUF_PARAMS, use_tqdm=False)


@pytest.mark.parametrize("size, rank0_holds", [(2, 3), (4, 2)])
def test_ep_runs_q4_k_experts_tp_would_cut(
    size: int, rank0_holds: int, q4_k_moe: tuple[str, list]
) -> None:
    """Each expert's rows stay whole blocks on its rank, so its output is one rank's; the
    runs differ only where the ranks' float sums round differently (attention's and the
    experts' all-reduce) and that moves an 8-bit activation quantization step downstream,
    which on this model stays under 1e-5 (1e-4 allowed)."""
    path, expected = q4_k_moe
    with LLM(path, tensor_parallel_size=size, enable_expert_parallel=True, **ENGINE) as ep:
        got = ep.generate(GGUF_PROMPTS, GGUF_PARAMS, use_tqdm=False)
        assert rank0_experts(ep) == rank0_holds
    assert_same_generations(expected, got, 1e-4)
