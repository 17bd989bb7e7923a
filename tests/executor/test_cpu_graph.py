"""Captured decode steps (pagedllm/executor/cpu_graph.py). Reference: the same engine with
enforce_eager=True, whose every step runs the model's Python forward: replayed steps must
give the same tokens and the same logprobs, bit for bit, for every batch size the scheduler
makes (padded to a captured size or not), and anything capture cannot replay must run
eagerly instead."""

import subprocess
import sys
from collections.abc import Callable

import pytest
import torch

from pagedllm import LLM, SamplingParams, _cpu_kernels
from pagedllm.config import default_model_path
from pagedllm.executor.batch import SeqChunk
from pagedllm.executor.cpu_graph import (
    CAPTURE_SIZES,
    LORA_CAPTURES_PER_SIZE,
    CaptureUnsupported,
    CpuGraphRunner,
    _CaptureMode,
)
from pagedllm.executor.model_runner import ModelRunner, StepInput
from pagedllm.lora.layers import LoRAMapping, set_lora_mapping

needs_kernels = pytest.mark.skipif(not _cpu_kernels.available(), reason="no pagedllm._C")

# Five requests ending after 4, 8, ..., 20 tokens: decode steps of 5, 4, 3, 2 and 1 rows.
PROMPTS = [{"prompt_token_ids": [3 + i, 40, 7 * i + 9, 11, 60 + i][: 2 + i]} for i in range(5)]


def _generate(llm: LLM) -> list[tuple[list[int], list]]:
    """One request alone, then the five together."""
    params = [SamplingParams(temperature=0, max_tokens=4 * (i + 1), logprobs=2) for i in range(5)]
    outputs = llm.generate(PROMPTS[:1], params[:1], use_tqdm=False)
    outputs += llm.generate(PROMPTS, params, use_tqdm=False)
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outputs]


def _runner(llm: LLM) -> ModelRunner:
    return llm.llm_engine.executor.runner


def _both(model: str, **kwargs: object) -> tuple[LLM, list, list]:
    """(the replaying engine, its outputs, the eager engine's outputs)."""
    kwargs = {"num_kv_blocks": 64, "max_model_len": 256, "skip_tokenizer_init": True, **kwargs}
    eager = _generate(LLM(model, enforce_eager=True, **kwargs))
    llm = LLM(model, **kwargs)
    return llm, _generate(llm), eager


@needs_kernels
@pytest.mark.parametrize(
    "name,dtype",
    [
        ("llama-gqa-llama3", "float32"),
        ("llama-gqa-llama3", "bfloat16"),
        ("llama-tied-mqa", "bfloat16"),
        ("qwen2", "float32"),
        ("mistral", "bfloat16"),
        ("smollm3", "bfloat16"),  # NoPE layers: their q and k through the rotary kernel
        ("ernie4_5", "float32"),  # GPT-J's rotary pairs
        ("olmo3", "bfloat16"),
        ("exaone4", "bfloat16"),
        ("glm4", "bfloat16"),
        ("starcoder2", "float32"),
        ("starcoder2", "bfloat16"),
    ],
)
def test_replayed_decode_steps_equal_eager_ones(
    tiny_model_path: Callable[[str], str], name: str, dtype: str
) -> None:
    llm, replayed, eager = _both(tiny_model_path(name), dtype=dtype)
    assert replayed == eager
    graphs = _runner(llm).graph_runner.graphs
    assert sorted(graphs) == [(s, ()) for s in (1, 2, 4, 8)] and all(graphs.values())


@needs_kernels
def test_the_default_models_gguf_blocks_replay_like_eager() -> None:
    """Q4_1 linears and a Q8_0 LM head (gguf_mm launches), whose rows do not depend on the
    batch: steps of 1, then 3 rows (replayed padded to 4) and 1, equal eager ones exactly."""
    params = [
        SamplingParams(temperature=0, max_tokens=n, logprobs=2, ignore_eos=True) for n in (4, 4, 8)
    ]

    def generate(llm: LLM) -> list:
        outputs = llm.generate(PROMPTS[:1], params[:1], use_tqdm=False)
        outputs += llm.generate(PROMPTS[:3], params, use_tqdm=False)
        return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outputs]

    kwargs = {"num_kv_blocks": 64, "max_model_len": 256}
    llm = LLM(default_model_path(), **kwargs)
    assert generate(llm) == generate(LLM(default_model_path(), enforce_eager=True, **kwargs))
    assert sorted(_runner(llm).graph_runner.graphs) == [(1, ()), (4, ())]


@needs_kernels
def test_a_model_with_torch_compute_in_its_forward_runs_eagerly(
    tiny_model_path: Callable[[str], str],
) -> None:
    """Qwen3-MoE routes its experts in torch: no size is captured, the outputs are eager's."""
    llm, replayed, eager = _both(tiny_model_path("qwen3-moe"), dtype="float32")
    assert replayed == eager
    graphs = _runner(llm).graph_runner.graphs
    assert graphs and not any(graphs.values())


@needs_kernels
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_torch_attention_backend_runs_padded_steps_eagerly(
    tiny_model_path: Callable[[str], str], dtype: str
) -> None:
    """TORCH_SDPA writes the cache in torch: its capture stops at that write, before it
    runs on the padding rows' slot -1 (which index_copy_ would refuse), and the steps of
    3 and 5 rows run eagerly, as the eager engine's."""
    llm, replayed, eager = _both(
        tiny_model_path("llama-gqa-llama3"), dtype=dtype, attention_backend="TORCH_SDPA"
    )
    assert replayed == eager
    assert not any(_runner(llm).graph_runner.graphs.values())


def test_capture_mode_refuses_an_in_place_op_before_it_runs() -> None:
    x = torch.zeros(4)
    with pytest.raises(CaptureUnsupported), _CaptureMode():
        x.index_copy_(0, torch.tensor([-1]), torch.ones(1))  # would raise IndexError if run
    assert not x.any()


@needs_kernels
def test_qk_norm_models_replay_every_size(tiny_model_path: Callable[[str], str]) -> None:
    """Qwen3 normalizes q and k per head on the fused qkv's column slices, which the norm
    kernel reads in place: captured at every size."""
    llm, replayed, eager = _both(tiny_model_path("qwen3"), dtype="float32")
    assert replayed == eager
    graphs = _runner(llm).graph_runner.graphs
    assert sorted(graphs) == [(s, ()) for s in (1, 2, 4, 8)] and all(graphs.values())


def test_enforce_eager_and_tensor_parallel_take_no_graph_runner(
    tiny_model_path: Callable[[str], str],
) -> None:
    llm = LLM(
        tiny_model_path("llama-tied-mqa"),
        num_kv_blocks=8,
        max_model_len=64,
        enforce_eager=True,
        skip_tokenizer_init=True,
    )
    assert _runner(llm).graph_runner is None
    cpu = torch.device("cpu")
    assert not CpuGraphRunner.applies(cpu, world_size=2, enforce_eager=False)
    assert not CpuGraphRunner.applies(torch.device("meta"), 1, False)


@needs_kernels
def test_a_bad_index_in_a_replayed_step_raises_and_drops_the_graphs(
    tiny_model_path: Callable[[str], str],
) -> None:
    """A slot past the cache fails the replay's index check: the graphs are dropped and the
    eager forward raises the same ValueError, with the process and cache intact."""
    llm = LLM(
        tiny_model_path("llama-tied-mqa"),
        num_kv_blocks=8,
        max_model_len=64,
        skip_tokenizer_init=True,
    )
    runner = _runner(llm)
    runner.forward(StepInput([SeqChunk([5], 3, [1])], [], [0], []))
    assert runner.graph_runner.graphs[(1, ())] is not None
    with pytest.raises(ValueError, match="slot_mapping"):
        runner.forward(StepInput([SeqChunk([5], 3, [8])], [], [0], []))
    assert runner.graph_runner.graphs == {}


def test_capture_mode_lets_allocations_and_views_through_and_nothing_else() -> None:
    x = torch.randn(4, 6)
    with _CaptureMode() as mode:
        y = x.new_empty(4, 6)
        torch.empty_like(x).view(24)
        x[:, :3].reshape(4, 3)
        x.split([2, 4], dim=-1)
    assert len(mode.tensors) >= 4 and y.shape == (4, 6)
    computes = [
        lambda: x + 1,
        lambda: x.add_(1),
        lambda: x[:, :3].contiguous(),
        lambda: x.to(torch.bfloat16),
        lambda: torch.zeros(3),
        lambda: y.copy_(x),
    ]
    for op in computes:
        with pytest.raises(CaptureUnsupported), _CaptureMode():
            op()


def test_capture_sizes_are_increasing_from_one() -> None:
    assert CAPTURE_SIZES[0] == 1 and list(CAPTURE_SIZES) == sorted(set(CAPTURE_SIZES))


FRESH_PROCESS_DROP = """
import gc, sys, weakref
from pagedllm import LLM, SamplingParams
assert "torch._dynamo" not in sys.modules, "the check needs a process without it"
gc.disable()  # only reference counting frees the dropped LLM
llm = LLM(sys.argv[1], dtype="float32", skip_tokenizer_init=True, num_kv_blocks=32)
llm.generate([{"prompt_token_ids": [5, 6]}], SamplingParams(max_tokens=4), use_tqdm=False)
assert "torch._dynamo" in sys.modules, "the capture imports it"
model = weakref.ref(llm.llm_engine.executor.runner.model)
del llm
print("freed" if model() is None else "alive")
"""


def test_a_fresh_processs_first_capture_leaves_no_cycle_holding_the_model(
    tiny_model_path: Callable[[str], str],
) -> None:
    """torch imports torch._dynamo inside the first capture, and that import leaves a frame
    cycle holding the callers' frames (this process's tests import it earlier, so only a
    fresh process shows it)."""
    path = tiny_model_path("llama-gqa4")
    result = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS_DROP, path], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "freed"


def test_lora_steps_capture_their_set_of_slots_up_to_a_bound() -> None:
    """A step with LoRA rows replays the capture of the slots its rows use (it pays for
    those only); past LORA_CAPTURES_PER_SIZE sets in one size, the capture of every slot."""
    runner = CpuGraphRunner(torch.nn.Module(), max_blocks=4, kept=[], lora_slots=8)
    rows = torch.tensor([3, -1], dtype=torch.int32)
    assert runner._lora_slots_key(2) == ()
    for n in range(LORA_CAPTURES_PER_SIZE):
        with set_lora_mapping(LoRAMapping(rows, (n,))):
            assert runner._lora_slots_key(2) == (n,)
        runner.graphs[(2, (n,))] = None
    with set_lora_mapping(LoRAMapping(rows, (1,))):
        assert runner._lora_slots_key(2) == (1,), "a set already captured"
    with set_lora_mapping(LoRAMapping(rows, (7,))):
        assert runner._lora_slots_key(2) == tuple(range(8))
        assert runner._lora_slots_key(4) == (7,), "another size has its own bound"
