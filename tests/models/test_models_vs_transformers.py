"""Every registered architecture against transformers on the same tiny random weights:
fp32 logits of a paged prefill + 8 decode steps within 1e-4, greedy tokens identical."""

import random

import pytest
import torch
import transformers

from pagedllm.config import ModelConfig
from pagedllm.executor.batch import SeqChunk, prepare_batch
from pagedllm.executor.kv_cache import bind_kv_cache
from pagedllm.forward_context import set_forward_context
from pagedllm.model_loader.loader import get_model
from tests.models.tiny_models import tiny_configs

BLOCK_SIZE = 4
NUM_DECODE_STEPS = 8


def run_step(model, chunks: list[SeqChunk], all_positions: bool) -> torch.Tensor:
    batch = prepare_batch(chunks, BLOCK_SIZE, "cpu")
    with torch.no_grad(), set_forward_context(batch.attn_metadata):
        hidden = model(batch.input_ids, batch.positions)
        if not all_positions:
            hidden = hidden[batch.attn_metadata.query_start_loc[1:].long() - 1]
        return model.compute_logits(hidden)


def paged_greedy(model, prompts: list[list[int]]) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Prefill all prompts in one batch, then decode; returns the token lists and each
    sequence's logits at every computed position."""
    max_len = max(map(len, prompts)) + NUM_DECODE_STEPS + 1
    blocks_per_seq = -(-max_len // BLOCK_SIZE)
    block_ids = list(range(len(prompts) * blocks_per_seq + 5))
    random.Random(0).shuffle(block_ids)
    bind_kv_cache(model, len(block_ids), BLOCK_SIZE, torch.float32, "cpu")
    tables = [block_ids[i * blocks_per_seq : (i + 1) * blocks_per_seq] for i in range(len(prompts))]

    logits = run_step(model, [SeqChunk(p, 0, t) for p, t in zip(prompts, tables)], True)
    per_seq = list(logits.split([len(p) for p in prompts]))
    seqs = [p + [int(lg[-1].argmax())] for p, lg in zip(prompts, per_seq)]
    for _ in range(NUM_DECODE_STEPS):
        chunks = [SeqChunk([s[-1]], len(s) - 1, t) for s, t in zip(seqs, tables)]
        step_logits = run_step(model, chunks, False)
        for i, row in enumerate(step_logits):
            per_seq[i] = torch.cat([per_seq[i], row[None]])
            seqs[i].append(int(row.argmax()))
    return seqs, per_seq


def assert_language_model_matches(
    folder: str, hf_class: type, architecture: str, atol: float = 1e-4
) -> None:
    """An image-and-text checkpoint run as its language model (`architecture`): logits of a
    prefill and 8 decodes within atol of transformers' `hf_class` (the whole multimodal
    model) on the same text, greedy tokens identical."""
    model_config = ModelConfig.create(folder, dtype="float32")
    assert model_config.architecture == architecture
    model = get_model(model_config)
    hf = hf_class.from_pretrained(folder, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 300, (n,), generator=gen).tolist() for n in (9, 21)]
    seqs, logits = paged_greedy(model, prompts)
    for seq, ours in zip(seqs, logits):
        with torch.no_grad():
            ref = hf(input_ids=torch.tensor([seq[:-1]])).logits[0]
        torch.testing.assert_close(ours, ref, atol=atol, rtol=0)
        assert seq[-NUM_DECODE_STEPS - 1 :] == ref[-NUM_DECODE_STEPS - 1 :].argmax(-1).tolist()


@pytest.mark.parametrize("name", list(tiny_configs()))
def test_logits_match_transformers(name: str, tiny_model_path) -> None:
    path = tiny_model_path(name)
    model = get_model(ModelConfig.create(path, dtype="float32"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 320, (n,), generator=gen).tolist() for n in (5, 17, 11)]

    seqs, logits = paged_greedy(model, prompts)

    for seq, ours in zip(seqs, logits):
        with torch.no_grad():
            ref = hf(torch.tensor([seq[:-1]])).logits[0]
        assert ref.std() > 0.1, "reference logits too flat to test anything"
        torch.testing.assert_close(ours, ref, atol=1e-4, rtol=0)
        assert seq[-NUM_DECODE_STEPS - 1 :] == ref[-NUM_DECODE_STEPS - 1 :].argmax(-1).tolist()
