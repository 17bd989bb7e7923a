"""The Triton backend (pagedllm/layers/attention_backends/triton_attn.py) under Triton's
interpreter on CPU tensors: through the Attention layer against dense attention and the torch
reference backend, and the whole engine with attention_backend="TRITON_ATTN" against
transformers' greedy tokens on the tiny test models."""

import pytest
import torch

from pagedllm import LLM, SamplingParams
from pagedllm.executor.cuda_graph import CudaGraphRunner
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


def triton_attention(num_heads: int, num_kv_heads: int, block_size: int, device: torch.device):
    with selector.use_attn_backend("TRITON_ATTN"):
        attn = make_attention(num_heads, num_kv_heads, block_size, device)
    assert isinstance(attn.backend, TritonAttentionBackend)
    return attn


@pytest.mark.parametrize("num_heads,num_kv_heads,block_size", [(8, 2, 16), (4, 4, 32)])
def test_the_triton_backend_matches_dense_attention_step_after_step(
    triton_device: torch.device, num_heads: int, num_kv_heads: int, block_size: int
) -> None:
    """Reference: dense attention and the cache contents (step_and_check): a mixed step of
    prefill chunks, a chunk after cached context beside decodes, then decodes."""
    attn = triton_attention(num_heads, num_kv_heads, block_size, triton_device)
    seqs = make_seqs([31, 41, 9], attn, block_size, seed=num_heads)
    for num_new in ([12, 17, 9], [18, 1, 0], [1, 1, 0]):
        active = [(s, n) for s, n in zip(seqs, num_new) if n]
        step_and_check(attn, [s for s, _ in active], [n for _, n in active], block_size)


def test_the_triton_backend_matches_the_reference_backend(triton_device: torch.device) -> None:
    """Reference: TorchSdpaBackend on copies of the same caches, within 1e-5."""
    attn, ref = triton_attention(8, 1, 16, triton_device), make_attention(8, 1, 16, triton_device)
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


def generate(path: str, device: torch.device, prompts: list[list[int]], **engine) -> list:
    """Greedy, 6 tokens with their logprobs; chunked prefill (16-token chunks beside
    decodes), block size 16."""
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=0)
    with LLM(
        path,
        skip_tokenizer_init=True,
        dtype="float32",
        device=str(device),
        num_kv_blocks=32,
        max_model_len=128,
        max_num_batched_tokens=16,
        **engine,
    ) as llm:
        runner = llm.llm_engine.executor.runner
        backends = {a.backend.name for a in attention_layers(runner.model)}
        assert backends == {engine["attention_backend"]}
        if backends == {"TRITON_ATTN"}:
            # Captured CPU steps replay _C's launches only; CUDA graphs replay Triton's.
            graphs = CudaGraphRunner if device.type == "cuda" else type(None)
            assert isinstance(runner.graph_runner, graphs)
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [out.outputs[0] for out in outputs]


@pytest.mark.parametrize("name", ["llama-gqa-llama3", "qwen3", "gemma2", "gemma3"])
def test_the_engine_on_triton_attn_gives_transformers_greedy_tokens(
    triton_device: torch.device, name: str, tiny_model_path, hf_greedy, spread_prompts
) -> None:
    """Tokens equal and logprobs within 1e-4 of transformers', a prefix-cache hit included
    (a prompt twice); Gemma 2 and 3 with their sliding windows and Gemma 2's soft caps."""
    prompts = [spread_prompts[1], spread_prompts[3], spread_prompts[3]]
    reference = hf_greedy(name, prompts, 6)
    outputs = generate(
        tiny_model_path(name), triton_device, prompts, attention_backend="TRITON_ATTN"
    )
    for out, ref in zip(outputs, reference, strict=True):
        ref.assert_matches(out)


def test_the_engine_on_an_fp8_cache_matches_the_reference_backend_on_one(
    triton_device: torch.device, tiny_model_path, spread_prompts
) -> None:
    """kv_cache_dtype="fp8" (reference: TORCH_SDPA on the same fp8 cache values): the same
    tokens, logprobs within 1e-4."""
    path, prompts = tiny_model_path("llama-gqa-llama3"), spread_prompts[2:4]
    outputs, reference = (
        generate(path, triton_device, prompts, attention_backend=name, kv_cache_dtype="fp8")
        for name in ("TRITON_ATTN", "TORCH_SDPA")
    )
    for out, ref in zip(outputs, reference, strict=True):
        assert out.token_ids == ref.token_ids
        logprobs = [[lp[t].logprob for lp, t in zip(o.logprobs, o.token_ids)] for o in (out, ref)]
        assert logprobs[0] == pytest.approx(logprobs[1], abs=1e-4)
