"""VocabParallelEmbedding and ParallelLMHead against F.embedding on the full table.

Rank r holds rows [r*V_pad/P, (r+1)*V_pad/P) of the table padded with zero rows to a
multiple of 64 * P. Built without a process group, a rank's forward returns its masked
partial lookup (the all-reduce is the identity), so the partials must sum to the lookup.
"""

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pagedllm.distributed.parallel_state import override_tensor_parallel
from pagedllm.layers.vocab_embedding import ParallelLMHead, VocabParallelEmbedding

VOCAB, DIM = 100, 8
BuildPerRank = Callable[[Callable[[], nn.Module], int], list[nn.Module]]


def _load_into_garbage(layer: VocabParallelEmbedding, table: torch.Tensor) -> None:
    """Load after filling with NaN, so rows the loader fails to write cannot pass as zero."""
    layer.weight.data.fill_(float("nan"))
    layer.weight.weight_loader(layer.weight, table)


@pytest.mark.parametrize(
    "vocab, tp_size, padded",
    [(100, 1, 128), (128, 1, 128), (100, 2, 128), (100, 4, 256), (128256, 8, 128512)],
)
def test_vocab_is_padded_to_the_next_multiple_of_64_times_tp(
    vocab: int, tp_size: int, padded: int
) -> None:
    """Reference: ceil(vocab / (64 * tp)) * 64 * tp, split evenly across ranks."""
    with torch.device("meta"), override_tensor_parallel(tp_size - 1, tp_size):
        layer = VocabParallelEmbedding(vocab, DIM)
    assert layer.num_embeddings_padded == padded
    assert layer.weight.shape == (padded // tp_size, DIM)
    assert layer.vocab_start_index == (tp_size - 1) * padded // tp_size


@pytest.mark.parametrize("tp_size", [1, 2, 4])
def test_rank_holds_its_rows_of_the_zero_padded_table(
    tp_size: int, build_per_rank: BuildPerRank
) -> None:
    """Reference: the checkpoint table with zero rows appended, cut into tp equal slices."""
    table = torch.randn(VOCAB, DIM)
    layers = build_per_rank(lambda: VocabParallelEmbedding(VOCAB, DIM), tp_size)
    padded = torch.cat([table, torch.zeros(layers[0].num_embeddings_padded - VOCAB, DIM)])
    for rank, layer in enumerate(layers):
        _load_into_garbage(layer, table)
        torch.testing.assert_close(layer.weight.data, padded.chunk(tp_size)[rank], rtol=0, atol=0)


@pytest.mark.parametrize("tp_size", [1, 2, 4])
def test_masked_partial_lookups_sum_to_f_embedding(
    tp_size: int, build_per_rank: BuildPerRank
) -> None:
    """Reference: F.embedding(ids, table); each id is found on exactly one rank."""
    table = torch.randn(VOCAB, DIM)
    ids = torch.tensor([[0, 1, 31, 32], [63, 64, 98, 99]])
    layers = build_per_rank(lambda: VocabParallelEmbedding(VOCAB, DIM), tp_size)
    for layer in layers:
        _load_into_garbage(layer, table)
    partials = torch.stack([layer(ids) for layer in layers])
    torch.testing.assert_close(partials.sum(0), F.embedding(ids, table), rtol=0, atol=0)
    assert partials.ne(0).any(-1).sum(0).eq(1).all(), "an id was embedded by several ranks"


def test_embedding_loader_rejects_a_table_of_the_wrong_shape() -> None:
    """Reference: the checkpoint holds the unpadded [vocab, dim] table."""
    layer = VocabParallelEmbedding(VOCAB, DIM)
    with pytest.raises(ValueError, match=r"embedding shape mismatch.*\(128, 8\).*\(100, 8\)"):
        layer.weight.weight_loader(layer.weight, torch.randn(128, DIM))


def test_tied_lm_head_shares_the_embedding_storage() -> None:
    """Reference: tie_word_embeddings, lm_head.weight is embed_tokens.weight."""
    embed, lm_head = VocabParallelEmbedding(VOCAB, DIM), ParallelLMHead(VOCAB, DIM)
    lm_head.tie_weights(embed)
    table = torch.randn(VOCAB, DIM)
    _load_into_garbage(embed, table)
    assert lm_head.weight is embed.weight
    assert lm_head.weight.data_ptr() == embed.weight.data_ptr()
    torch.testing.assert_close(lm_head.weight.data[:VOCAB], table, rtol=0, atol=0)


def test_lm_head_cannot_be_called_as_an_embedding() -> None:
    """Reference: vLLM's ParallelLMHead, applied only through LogitsProcessor."""
    with pytest.raises(RuntimeError, match="LogitsProcessor"):
        ParallelLMHead(VOCAB, DIM)(torch.tensor([0]))
