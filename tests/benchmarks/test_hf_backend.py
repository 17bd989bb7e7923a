"""pagedllm/benchmarks/hf_backend.py: the peer runs transformers on exactly the checkpoint's
weights (reference: AutoModelForCausalLM.from_pretrained) and honours every output length."""

from collections.abc import Callable

import pytest
import torch
from transformers import AutoModelForCausalLM

from pagedllm.benchmarks.datasets import BenchRequest, random_requests
from pagedllm.benchmarks.hf_backend import (
    batches_by_output_len,
    generate_batch,
    left_pad,
    load_hf_model,
)
from pagedllm.config import ModelConfig
from tests.devices import DEVICES


def test_left_pad_right_aligns_prompts() -> None:
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def test_batches_by_output_len_sorts_then_cuts() -> None:
    requests = [BenchRequest([1], n) for n in (5, 2, 9, 2, 7)]
    batches = list(batches_by_output_len(requests, 2))
    assert [[r.output_len for r in b] for b in batches] == [[2, 2], [5, 7], [9]]


@pytest.mark.parametrize("name", ["llama-tied-mqa", "qwen3"])
def test_load_hf_model_matches_from_pretrained(
    tiny_model_path: Callable[[str], str], name: str
) -> None:
    path = tiny_model_path(name)
    ours = load_hf_model(ModelConfig.create(path, "float32"))
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert ours.config._attn_implementation == "sdpa"
    ids = torch.tensor([[3, 17, 42, 99, 5]])
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, reference(ids).logits, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_generate_batch_runs_past_eos(device: str, tiny_model_path: Callable[[str], str]) -> None:
    """EOS is made the greedy first token: only min_new_tokens keeps generation going. The
    model runs on the device it was loaded on (the engine's)."""
    config = ModelConfig.create(tiny_model_path("llama-tied-mqa"), "float32")
    model = load_hf_model(config, device)
    assert model.device.type == device
    batch = random_requests(1, (5, 5), (6, 6), vocab_size=320)
    first = generate_batch(model, batch, 1, 0.0)[0, 0].item()
    model.config.eos_token_id = model.generation_config.eos_token_id = first
    assert generate_batch(model, batch, 6, 0.0).shape == (1, 6)
    assert generate_batch(model, batch * 3, 4, 0.8).shape == (3, 4)
