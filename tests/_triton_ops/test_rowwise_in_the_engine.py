"""The row-wise Triton kernels (RMSNorm with and without the residual, RoPE, SiLU-and-mul,
a MoE layer's routing) inside the engine: what _custom_ops runs for CUDA tensors. On a GPU
that is the plain dispatch; on CPU tensors under Triton's interpreter the dispatch is
pointed at the Triton kernels here, so the whole model runs through them. Either way,
transformers' greedy tokens and logprobs within 1e-4, and every kernel called."""

import collections

import pytest
import torch

pytest.importorskip("triton")

from pagedllm import LLM, SamplingParams  # noqa: E402
from pagedllm._custom_ops import fused_moe, rowwise  # noqa: E402
from pagedllm._triton_ops import activation, layernorm, rotary, topk_softmax  # noqa: E402

KERNELS = [
    (layernorm, "rms_norm"),
    (layernorm, "fused_add_rms_norm"),
    (rotary, "rotary_embedding"),
    (activation, "silu_and_mul"),
    (topk_softmax, "topk_softmax"),
]


@pytest.fixture
def triton_calls(
    triton_device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> collections.Counter:
    """Counts the calls of each row-wise Triton kernel; on CPU, sends CPU tensors to them."""
    calls: collections.Counter = collections.Counter()
    for module, name in KERNELS:
        kernel = getattr(module, name)

        def counted(*args, _kernel=kernel, _name=name, **kwargs):
            calls[_name] += 1
            return _kernel(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    if triton_device.type == "cpu":
        monkeypatch.setattr(rowwise, "cpu_kernels_apply", lambda *tensors, **dtypes: False)
        for module in (rowwise, fused_moe):
            monkeypatch.setattr(module, "triton_kernels_apply", lambda *tensors: True)
    return calls


@pytest.mark.parametrize("name", ["llama-gqa-llama3", "qwen3", "qwen3-moe"])
def test_the_engine_through_the_row_wise_kernels_gives_transformers_tokens(
    triton_device: torch.device,
    triton_calls: collections.Counter,
    name: str,
    tiny_model_path,
    hf_greedy,
    spread_prompts,
) -> None:
    """qwen3 norms q and k per head (RMSNorm on [T, heads, head_size] slices of qkv);
    qwen3-moe routes its tokens (on a CPU its experts run torch's loop, each expert's
    activation the SiLU-and-mul kernel)."""
    prompts = [spread_prompts[1], spread_prompts[3]]
    reference = hf_greedy(name, prompts, 4)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=0)
    with LLM(
        tiny_model_path(name),
        skip_tokenizer_init=True,
        dtype="float32",
        device=str(triton_device),
        num_kv_blocks=32,
        max_model_len=128,
        enforce_eager=True,
    ) as llm:
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for out, ref in zip(outputs, reference, strict=True):
        ref.assert_matches(out.outputs[0])
    expected = {name for _, name in KERNELS}
    if name != "qwen3-moe":
        expected.remove("topk_softmax")
    assert set(triton_calls) == expected
