"""LogitsProcessor against hidden @ W^T on the unpadded vocabulary, single-process and in a
real 2-rank gloo group (where the tp layers' collectives actually run)."""

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from pagedllm.distributed.parallel_state import (
    destroy_distributed_environment,
    init_distributed_environment,
)
from pagedllm.layers.linear import ColumnParallelLinear, RowParallelLinear
from pagedllm.layers.logits_processor import LogitsProcessor
from pagedllm.layers.vocab_embedding import ParallelLMHead, VocabParallelEmbedding

VOCAB, HIDDEN = 100, 16


def _lm_head(weight: torch.Tensor, bias: torch.Tensor | None = None) -> ParallelLMHead:
    head = ParallelLMHead(VOCAB, HIDDEN, bias=bias is not None)
    head.weight.weight_loader(head.weight, weight)
    if bias is not None:
        head.bias.weight_loader(head.bias, bias)
    return head


@pytest.mark.parametrize("with_bias", [False, True])
def test_logits_equal_hidden_times_lm_head_weight_without_padding(with_bias: bool) -> None:
    """Reference: F.linear(h, W, b) over the 100 real tokens; the 28 padding rows are cut."""
    weight, hidden = torch.randn(VOCAB, HIDDEN), torch.randn(5, HIDDEN)
    bias = torch.randn(VOCAB) if with_bias else None
    logits = LogitsProcessor(VOCAB)(_lm_head(weight, bias), hidden)
    assert logits.shape == (5, VOCAB)
    torch.testing.assert_close(logits, F.linear(hidden, weight, bias))


def test_logits_are_multiplied_by_scale() -> None:
    """Reference: logit_scale * (h @ W^T), as in Cohere."""
    weight, hidden = torch.randn(VOCAB, HIDDEN), torch.randn(5, HIDDEN)
    logits = LogitsProcessor(VOCAB, scale=0.25)(_lm_head(weight), hidden)
    torch.testing.assert_close(logits, 0.25 * F.linear(hidden, weight))


def test_logits_are_soft_capped() -> None:
    """Reference: tanh(logits / cap) * cap, Gemma 2's final_logit_softcapping."""
    weight, hidden = torch.randn(VOCAB, HIDDEN), torch.randn(5, HIDDEN)
    raw = F.linear(hidden, weight)
    assert raw.abs().max() > 3.0, "the test needs logits beyond the cap"
    logits = LogitsProcessor(VOCAB, soft_cap=3.0)(_lm_head(weight), hidden)
    torch.testing.assert_close(logits, torch.tanh(raw / 3.0) * 3.0)
    assert logits.abs().max() <= 3.0


def test_tied_lm_head_logits_use_the_embedding_table() -> None:
    """Reference: tie_word_embeddings, logits = h @ E^T with E the input embedding table."""
    table, hidden = torch.randn(VOCAB, HIDDEN), torch.randn(5, HIDDEN)
    embed = VocabParallelEmbedding(VOCAB, HIDDEN)
    embed.weight.weight_loader(embed.weight, table)
    head = ParallelLMHead(VOCAB, HIDDEN)
    head.tie_weights(embed)
    torch.testing.assert_close(LogitsProcessor(VOCAB)(head, hidden), F.linear(hidden, table))


def _tp_layer_outputs(w: dict[str, torch.Tensor], x: torch.Tensor, ids: torch.Tensor) -> dict:
    """Build the tp layers for this process's rank, load the full weights, run them.

    RowParallelLinear takes this rank's slice of its input, as after a ColumnParallelLinear.
    """
    column = ColumnParallelLinear(HIDDEN, 8, bias=True, gather_output=True)
    row = RowParallelLinear(HIDDEN, 8, bias=True)
    embed = VocabParallelEmbedding(VOCAB, HIDDEN)
    head = ParallelLMHead(VOCAB, HIDDEN)
    for param, name in [
        (column.weight, "column_w"),
        (column.bias, "column_b"),
        (row.weight, "row_w"),
        (row.bias, "row_b"),
        (embed.weight, "embed"),
        (head.weight, "head"),
    ]:
        param.weight_loader(param, w[name])
    return {
        "column": column(x),
        "row": row(x.chunk(dist.get_world_size(), dim=-1)[dist.get_rank()]),
        "embed": embed(ids),
        "logits": LogitsProcessor(VOCAB)(head, x),
    }


def _tp_worker(rank: int, init_file: str, w: dict, x: torch.Tensor, ids: torch.Tensor) -> None:
    torch.set_num_threads(1)
    init_distributed_environment(2, rank, f"file://{init_file}", "gloo", timeout_s=30.0)
    try:
        outputs = _tp_layer_outputs(w, x, ids)
        expected = {
            "column": F.linear(x, w["column_w"], w["column_b"]),
            "row": F.linear(x, w["row_w"], w["row_b"]),
            "embed": F.embedding(ids, w["embed"]),
            "logits": F.linear(x, w["head"]),
        }
        for name, value in expected.items():
            torch.testing.assert_close(outputs[name], value, msg=f"rank {rank}: {name}")
    finally:
        destroy_distributed_environment()


def test_tp2_gloo_layers_equal_the_single_process_reference(tmp_path: Path) -> None:
    """Reference: F.linear / F.embedding on the full weights, checked on both ranks of a
    2-process gloo group (column all-gather, row and embedding all-reduce, logits gather)."""
    w = {
        "column_w": torch.randn(8, HIDDEN),
        "column_b": torch.randn(8),
        "row_w": torch.randn(8, HIDDEN),
        "row_b": torch.randn(8),
        "embed": torch.randn(VOCAB, HIDDEN),
        "head": torch.randn(VOCAB, HIDDEN),
    }
    x, ids = torch.randn(3, HIDDEN), torch.tensor([0, 1, 63, 64, 99])
    init_file = str(tmp_path / "gloo_init")
    mp.spawn(_tp_worker, args=(init_file, w, x, ids), nprocs=2, join=True)
