"""vLLM's default step sizes by device and entry point, and EngineArgs resolving them."""

import pytest

from pagedllm.engine import batch_defaults
from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.engine.batch_defaults import UsageContext, default_batch_limits

GiB = 1 << 30
LLM, SERVER = UsageContext.LLM_CLASS, UsageContext.OPENAI_API_SERVER


@pytest.mark.parametrize("context", [LLM, SERVER])
def test_cpu_keeps_the_measured_sizes(context: UsageContext) -> None:
    assert default_batch_limits("cpu", context) == (2048, 256)


@pytest.mark.parametrize(
    "name, memory, llm, server",
    [
        ("NVIDIA H200", 141 * GiB, (16384, 1024), (8192, 1024)),
        ("NVIDIA H100 80GB HBM3", 80 * GiB, (16384, 1024), (8192, 1024)),
        ("NVIDIA A100-SXM4-80GB", 80 * GiB, (8192, 256), (2048, 256)),  # vLLM's exception
        ("NVIDIA L4", 23 * GiB, (8192, 256), (2048, 256)),
        ("", 0, (8192, 256), (2048, 256)),  # torch could not tell
    ],
)
def test_gpu_sizes_follow_vllm(monkeypatch, name, memory, llm, server) -> None:
    monkeypatch.setattr(batch_defaults, "_gpu", lambda device: (name, memory))
    assert default_batch_limits("cuda", LLM) == llm
    assert default_batch_limits("cuda:1", SERVER) == server


def test_gpu_properties_unknown_without_cuda() -> None:
    if batch_defaults.torch.cuda.is_available():
        pytest.skip("a GPU is here")
    assert batch_defaults._gpu("cuda") == ("", 0)


def scheduler(tiny_model_path, **kwargs):
    args = EngineArgs(
        model=tiny_model_path("llama-gqa4"), device="cpu", skip_tokenizer_init=True, **kwargs
    )
    return args.create_engine_config().scheduler_config


def test_engine_args_take_the_defaults_unless_told(monkeypatch, tiny_model_path) -> None:
    sizes = {LLM: (16384, 1024), SERVER: (8192, 1024)}
    monkeypatch.setattr(
        "pagedllm.engine.arg_utils.default_batch_limits", lambda device, context: sizes[context]
    )
    sched = scheduler(tiny_model_path)
    assert (sched.max_num_batched_tokens, sched.max_num_seqs) == (16384, 1024)
    sched = scheduler(tiny_model_path, usage_context=SERVER)
    assert (sched.max_num_batched_tokens, sched.max_num_seqs) == (8192, 1024)
    sched = scheduler(tiny_model_path, max_num_batched_tokens=64, max_num_seqs=3)
    assert (sched.max_num_batched_tokens, sched.max_num_seqs) == (64, 3)


def test_without_chunked_prefill_a_default_step_holds_the_longest_prompt(tiny_model_path) -> None:
    long = {"hf_overrides": {"max_position_embeddings": 4096}, "enable_chunked_prefill": False}
    assert scheduler(tiny_model_path, **long).max_num_batched_tokens == 4096
    sched = scheduler(tiny_model_path, enable_chunked_prefill=False)  # 512 tokens
    assert sched.max_num_batched_tokens == 2048
    with pytest.raises(ValueError, match="must be >= max_model_len 4096 when chunked prefill"):
        scheduler(tiny_model_path, **long, max_num_batched_tokens=2048)
