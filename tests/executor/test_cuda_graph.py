"""CUDA graphs for decode steps (pagedllm/executor/cuda_graph.py).

On the CPU the graphs are stood in for by a capture that reruns the recorded forward on the
static inputs at each replay (in the forward context of its capture, as a graph replays
the kernels of its capture): the batch's rows, padding, the padding block, the choice of
size and the capture-time metadata are then the runner's own, and the engine's tokens and
logprobs must equal those of the same engine with enforce_eager=True. On CUDA the real
graphs are captured and held to the same reference."""

from collections.abc import Callable

import pytest
import torch

from pagedllm import LLM, SamplingParams
from pagedllm.executor import cuda_graph
from pagedllm.executor.batch import host_batch
from pagedllm.executor.cpu_graph import CpuGraphRunner
from pagedllm.executor.cuda_graph import (
    CudaGraphRunner,
    Graph,
    StaticDecodeInputs,
    capture_sizes,
    unsupported_reason,
)
from pagedllm.executor.model_runner import ModelRunner, SeqChunk
from pagedllm.forward_context import get_attn_metadata, set_forward_context
from pagedllm.layers.attention_backends.backend import AttentionCGSupport
from pagedllm.layers.attention_backends.torch_sdpa import TorchSdpaBackend
from tests.devices import needs_cuda

# Requests ending after 4, 8, ..., 20 tokens: decode steps of 5, 4, 3, 2 and 1 rows.
PROMPTS = [{"prompt_token_ids": [3 + i, 40, 7 * i + 9, 11, 60 + i][: 2 + i]} for i in range(5)]


def test_capture_sizes_are_vllms_up_to_max_num_seqs() -> None:
    assert capture_sizes(1) == [1]
    assert capture_sizes(3) == [1, 2, 4]
    default = capture_sizes(256)
    assert default[:5] == [1, 2, 4, 8, 16] and default[-2:] == [248, 256] and len(default) == 35
    assert capture_sizes(100)[-2:] == [96, 104]  # the first size that holds 100 decodes
    assert capture_sizes(300)[-2:] == [288, 304]
    assert capture_sizes(10_000)[-1] == 512


def test_static_inputs_pad_past_the_batch_into_the_padding_block() -> None:
    inputs = StaticDecodeInputs(8, 6, pad_block=9, block_size=4, device=torch.device("cpu"))
    chunks = [SeqChunk([5], 6, [2, 3]), SeqChunk([7], 0, [4])]
    inputs.load(host_batch(chunks, 4), 4)
    d = inputs.device
    assert d["input_ids"][:4].tolist() == [5, 7, 0, 0]
    assert d["positions"][:4].tolist() == [6, 0, 0, 0]
    assert d["slot_mapping"][:4].tolist() == [3 * 4 + 2, 4 * 4, 36, 36]
    assert d["seq_lens"][:4].tolist() == [7, 1, 1, 1]
    assert d["block_tables"][:4].tolist() == [
        [2, 3, 0, 0, 0, 0],
        [4, 0, 0, 0, 0, 0],
        [9, 0, 0, 0, 0, 0],
        [9, 0, 0, 0, 0, 0],
    ]
    md = inputs.metadata(4, max_model_len=24)
    assert md.max_seq_len == 24 and md.query_lens_cpu == [1] * 4
    assert md.query_start_loc.tolist() == [0, 1, 2, 3, 4]


class _GraphSafeTorch(TorchSdpaBackend):
    """The torch reference declared graph-safe: its decode is right at any max_seq_len
    bound (slow at max_model_len, which a test does not mind)."""

    cudagraph_support = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE


def test_unsupported_reasons(tiny_model_path: Callable[[str], str]) -> None:
    # On the CPU (the default device would be a GPU where there is one), whose attention
    # backend has no CUDA graph support.
    llm = LLM(
        tiny_model_path("llama-gqa-llama3"),
        enforce_eager=True,
        skip_tokenizer_init=True,
        device="cpu",
    )
    model = llm.llm_engine.executor.runner.model
    cuda = torch.device("cuda")
    assert "not a CUDA device" in unsupported_reason(model, torch.device("cpu"), False)
    assert "enforce_eager" in unsupported_reason(model, cuda, True)
    assert "has no CUDA graph support" in unsupported_reason(model, cuda, False)
    for layer in cuda_graph.attention_layers(model):
        layer.backend = _GraphSafeTorch()
    assert unsupported_reason(model, cuda, False) is None
    model.model.layers[0].syncs_host = True
    assert "reads device tensors on the host" in unsupported_reason(model, cuda, False)


class _RerunGraph:
    """A forward recorded by rerunning it, in its capture's forward context, into the
    output tensor of its capture."""

    def __init__(self, forward: Callable[[], torch.Tensor]) -> None:
        self.forward, self.metadata = forward, get_attn_metadata()
        self.output = forward()
        self.replays = 0

    def replay(self) -> None:
        with set_forward_context(self.metadata):
            self.output.copy_(self.forward())
        self.replays += 1


def _rerun_capture(device: torch.device) -> Callable:
    def capture(forward: Callable[[], torch.Tensor]) -> tuple[Graph, torch.Tensor]:
        graph = _RerunGraph(forward)
        return graph, graph.output

    return capture


def _generate(llm: LLM) -> list[tuple[list[int], list]]:
    """One request alone, then five together: decode steps of 1, then 5, 4, 3, 2, 1 rows."""
    params = [SamplingParams(temperature=0, max_tokens=4 * (i + 1), logprobs=2) for i in range(5)]
    outputs = llm.generate(PROMPTS[:1], params[:1], use_tqdm=False)
    outputs += llm.generate(PROMPTS, params, use_tqdm=False)
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outputs]


def _graph_runner(llm: LLM) -> CudaGraphRunner:
    runner: ModelRunner = llm.llm_engine.executor.runner
    assert isinstance(runner.graph_runner, CudaGraphRunner)
    return runner.graph_runner


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_replayed_steps_equal_eager_ones_on_cpu(
    tiny_model_path: Callable[[str], str], monkeypatch: pytest.MonkeyPatch, async_scheduling: bool
) -> None:
    """The engine through the CUDA graph runner (graphs stood in for by reruns), max_num_seqs
    8: sizes 1, 2, 4, 8; a padding block past the 64 the scheduler gets. Under async
    scheduling the placeholders' tokens are written into the static input ids."""
    kwargs = {"num_kv_blocks": 64, "max_model_len": 64, "skip_tokenizer_init": True}
    kwargs |= {"max_num_seqs": 8, "device": "cpu"}  # also where a GPU is the default
    model = tiny_model_path("llama-gqa-llama3")
    eager = _generate(LLM(model, enforce_eager=True, **kwargs))
    monkeypatch.setattr(CpuGraphRunner, "applies", staticmethod(lambda *args: False))
    monkeypatch.setattr(cuda_graph, "unsupported_reason", lambda *args: None)
    monkeypatch.setattr(cuda_graph, "cuda_capture", _rerun_capture)
    llm = LLM(model, async_scheduling=async_scheduling, **kwargs)
    assert _generate(llm) == eager
    graphs = _graph_runner(llm).graphs
    assert sorted(graphs) == [1, 2, 4, 8]
    assert all(graph.replays > 0 for graph, _ in graphs.values())
    runner = llm.llm_engine.executor.runner
    assert runner.kv_cache.shape[2] == 65 and _graph_runner(llm).inputs.pad_block == 64


def test_prefill_steps_and_large_batches_run_eagerly() -> None:
    runner = CudaGraphRunner.__new__(CudaGraphRunner)
    runner.sizes = [1, 2, 4]
    runner.inputs = StaticDecodeInputs(4, 4, 0, 16, torch.device("cpu"))
    decode = [SeqChunk([1], 3, [1])]
    assert runner.size_for(host_batch(decode * 3, 16).attn_metadata) == 4
    assert runner.size_for(host_batch(decode * 5, 16).attn_metadata) is None
    assert runner.size_for(host_batch([SeqChunk([1, 2], 0, [1])], 16).attn_metadata) is None
    assert (
        runner.size_for(host_batch([SeqChunk([1], 80, list(range(6)))], 16).attn_metadata) is None
    )


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=needs_cuda)])
def test_cuda_graphs_equal_eager_steps(
    tiny_model_path: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
    device: str,
    async_scheduling: bool,
) -> None:
    """Real torch.cuda graphs, float32, whatever the attention backend declares (the torch
    reference is right at any max_seq_len bound, only slow): the same tokens as eager
    steps, logprobs within float32 noise (the graphs' decode attention is padded to
    max_model_len); under async scheduling too, each step launched before the last one's
    tokens are read on the host."""
    kwargs = {"num_kv_blocks": 64, "max_model_len": 64, "skip_tokenizer_init": True}
    kwargs |= {"max_num_seqs": 8, "device": device, "dtype": "float32"}
    model = tiny_model_path("llama-gqa-llama3")
    eager = _generate(LLM(model, enforce_eager=True, **kwargs))
    monkeypatch.setattr(cuda_graph, "unsupported_reason", lambda *args: None)
    llm = LLM(model, async_scheduling=async_scheduling, **kwargs)
    replayed = _generate(llm)
    assert sorted(_graph_runner(llm).graphs) == [1, 2, 4, 8]
    assert [tokens for tokens, _ in replayed] == [tokens for tokens, _ in eager]
    for (_, ours), (_, theirs) in zip(replayed, eager, strict=True):
        for a, b in zip(ours, theirs, strict=True):
            assert a.keys() == b.keys()
            for token in a:
                assert a[token].logprob == pytest.approx(b[token].logprob, abs=1e-4)


def test_a_failed_capture_names_enforce_eager() -> None:
    runner = CudaGraphRunner.__new__(CudaGraphRunner)
    runner.sizes, runner.graphs = [1, 2], {}

    def fail(size: int) -> None:
        raise RuntimeError("operation not permitted when stream is capturing")

    runner._capture = fail
    with pytest.raises(RuntimeError, match="decode steps of 2 sequences .* enforce_eager=True"):
        runner.capture_all()
