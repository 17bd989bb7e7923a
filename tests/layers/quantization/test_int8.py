"""quantization="int8": a float checkpoint's linear layers, embedding and LM head quantized
at load to Q8_0 blocks, against the same checkpoint in float32."""

from collections.abc import Callable

import pytest
import torch

from pagedllm import LLM, SamplingParams, _cpu_kernels
from pagedllm.config import ModelConfig
from pagedllm.layers.quantization.int8 import Q8_0, Int8Config, Int8LinearMethod
from pagedllm.model_loader.loader import get_model, weight_bytes

ENGINE = dict(skip_tokenizer_init=True, num_kv_blocks=32, max_logprobs=20, dtype="float32")
PROMPT = {"prompt_token_ids": [1, 17, 250, 33, 9, 120, 64, 5, 301, 77]}


def greedy_logprobs(path: str, quantization: str | None) -> tuple[list[int], list[float]]:
    params = SamplingParams(max_tokens=8, temperature=0, logprobs=0)
    with LLM(path, quantization=quantization, **ENGINE) as llm:
        (output,) = llm.generate(PROMPT, params, use_tqdm=False)
    completion = output.outputs[0]
    chosen = [lp[t].logprob for lp, t in zip(completion.logprobs, completion.token_ids)]
    return completion.token_ids, chosen


@pytest.mark.parametrize("name", ["llama-tied-mqa", "qwen3-moe"])
def test_int8_follows_the_float_model(name: str, tiny_model_path: Callable[[str], str]) -> None:
    """Weights rounded to 8 bits per block of 32 (and activations to 8 bits in the kernels)
    move a tiny random model's logprobs by a few hundredths; its greedy path is the same."""
    tokens, logprobs = greedy_logprobs(tiny_model_path(name), "int8")
    ref_tokens, ref_logprobs = greedy_logprobs(tiny_model_path(name), None)
    assert tokens == ref_tokens
    torch.testing.assert_close(
        torch.tensor(logprobs), torch.tensor(ref_logprobs), atol=0.05, rtol=0
    )


def test_int8_weights_are_q8_0_blocks_except_the_router(
    tiny_model_path: Callable[[str], str],
) -> None:
    path = tiny_model_path("qwen3-moe")
    model = get_model(ModelConfig.create(path, "float32", quantization="int8"))
    layer = model.model.layers[0]
    qkv, w2 = layer.self_attn.qkv_proj.weight, layer.mlp.experts.w2_weight
    assert qkv.dtype == w2.dtype == torch.uint8
    if _cpu_kernels.available():  # Q8_0 blocks packed for the CPU kernels, in about their bytes
        assert qkv.packed == ((4 + 2 + 2) * 16, 64) and w2.packed == (64, 32)
        assert qkv.shape == _cpu_kernels.gguf_packed_shape(Q8_0, (4 + 2 + 2) * 16, 64)
        assert w2.shape == (8, *_cpu_kernels.gguf_packed_shape(Q8_0, 64, 32))
    else:  # Q8_0 blocks, 34 bytes per 32 weights
        assert qkv.shape == ((4 + 2 + 2) * 16, 64 // 32 * 34)
        assert w2.shape == (8, 64, 32 // 32 * 34)
    assert layer.mlp.gate.weight.dtype == torch.float32  # the router stays float
    assert model.model.embed_tokens.weight.dtype == torch.uint8
    float_bytes = weight_bytes(get_model(ModelConfig.create(path, "float32")))
    # 34 bytes per 32 weights instead of 128 (0.27), plus float norms, router, rotary cache
    assert weight_bytes(model) < 0.35 * float_bytes


def test_tied_lm_head_shares_the_quantized_embedding(
    tiny_model_path: Callable[[str], str],
) -> None:
    model = get_model(ModelConfig.create(tiny_model_path("llama-tied-mqa"), quantization="int8"))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.lm_head.weight.dtype == torch.uint8


def test_rows_that_are_not_whole_blocks_stay_float() -> None:
    from pagedllm.layers.linear import ReplicatedLinear

    layer = ReplicatedLinear(48, 8, quant_config=Int8Config(), prefix="model.layers.0.x")
    layer.weight.data.normal_()
    layer.quant_method.process_weights_after_loading(layer)
    assert isinstance(layer.quant_method, Int8LinearMethod)
    assert layer.weight.dtype == torch.float32 and not layer.quant_method.quantized
