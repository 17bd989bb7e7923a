"""The Triton backend (pagedllm/layers/attention_backends/triton_attn.py) under Triton's
interpreter on CPU tensors: through the Attention layer against dense attention and the torch
reference backend, and the whole engine with attention_backend="TRITON_ATTN" against
transformers' greedy tokens on the tiny test models."""

import pytest
import torch

from pagedllm import LLM, SamplingParams
from pagedllm.executor.kv_cache import attention_layers
from pagedllm.forward_context import set_forward_context
from pagedllm.layers.attention_backends import selector
from pagedllm.layers.attention_backends.torch_sdpa import TorchSdpaBackend
from pagedllm.layers.attention_backends.triton_attn import TritonAttentionBackend
from tests.layers.paged_attention_steps import (
    HEAD_SIZE,
    build_metadata,
    make_attention,
    make_seqs,
    step_and_check,
)


def triton_attention(num_heads: int, num_kv_heads: int, block_size: int):
    with selector.use_attn_backend("TRITON_ATTN"):
        attn = make_attention(num_heads, num_kv_heads, block_size)
    assert isinstance(attn.backend, TritonAttentionBackend)
    return attn


@pytest.mark.parametrize("num_heads,num_kv_heads,block_size", [(8, 2, 16), (4, 4, 32)])
def test_the_triton_backend_matches_dense_attention_step_after_step(
    triton_device: torch.device, num_heads: int, num_kv_heads: int, block_size: int
) -> None:
    """Reference: dense attention and the cache contents (step_and_check): a mixed step of
    prefill chunks, a chunk after cached context beside decodes, then decodes."""
    attn = triton_attention(num_heads, num_kv_heads, block_size)
    seqs = make_seqs([31, 41, 9], attn, block_size, seed=num_heads)
    for num_new in ([12, 17, 9], [18, 1, 0], [1, 1, 0]):
        active = [(s, n) for s, n in zip(seqs, num_new) if n]
        step_and_check(attn, [s for s, _ in active], [n for _, n in active], block_size)


def test_the_triton_backend_matches_the_reference_backend(triton_device: torch.device) -> None:
    """Reference: TorchSdpaBackend on copies of the same caches, within 1e-5."""
    attn, ref = triton_attention(8, 1, 16), make_attention(8, 1, 16)
    ref.backend = TorchSdpaBackend()
    seqs = make_seqs([25, 7], attn, 16, seed=7)
    for num_new in ([20, 6], [5, 1]):
        metadata = build_metadata(seqs, num_new, 16)
        rows = [s.num_computed for s in seqs]
        qkv = torch.cat(
            [torch.cat([s.q, s.k, s.v], 1)[r : r + n] for s, r, n in zip(seqs, rows, num_new)]
        )
        q, k, v = qkv.split([8 * HEAD_SIZE, HEAD_SIZE, HEAD_SIZE], dim=1)
        with set_forward_context(metadata):
            torch.testing.assert_close(attn(q, k, v), ref(q, k, v), rtol=1e-5, atol=1e-5)
        for seq, n in zip(seqs, num_new, strict=True):
            seq.num_computed += n


@pytest.mark.parametrize("name", ["llama-gqa-llama3", "qwen3"])
def test_the_engine_on_triton_attn_gives_transformers_greedy_tokens(
    triton_device: torch.device, name: str, tiny_model_path, hf_greedy, spread_prompts
) -> None:
    """Chunked prefill (16-token chunks beside decodes), a prefix-cache hit (a prompt twice),
    block size 16; tokens equal and logprobs within 1e-4 of transformers'."""
    prompts = [spread_prompts[1], spread_prompts[3], spread_prompts[3]]
    reference = hf_greedy(name, prompts, 6)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=0)
    with LLM(
        tiny_model_path(name),
        skip_tokenizer_init=True,
        dtype="float32",
        device=str(triton_device),
        num_kv_blocks=32,
        max_model_len=128,
        max_num_batched_tokens=16,
        attention_backend="TRITON_ATTN",
    ) as llm:
        runner = llm.llm_engine.executor.runner
        assert {type(a.backend) for a in attention_layers(runner.model)} == {TritonAttentionBackend}
        assert runner.graph_runner is None  # captured steps replay _C's launches only
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for out, ref in zip(outputs, reference, strict=True):
        ref.assert_matches(out.outputs[0])
