"""Token embedding and LM head, split by vocabulary rows across tensor-parallel ranks.

The vocabulary is padded to a multiple of 64 * tp_size so every rank holds the same
number of rows; padding rows stay zero and LogitsProcessor trims them, so they are
never sampled.
"""

import torch
import torch.nn.functional as F
from torch import nn

from pagedllm.distributed import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_reduce,
)
from pagedllm.layers.inference_module import InferenceModule
from pagedllm.layers.parameter import check_shape, new_parameter

DEFAULT_VOCAB_PADDING_SIZE = 64


def pad_vocab_size(vocab_size: int, pad_to: int) -> int:
    return -(-vocab_size // pad_to) * pad_to


class VocabParallelEmbedding(InferenceModule):
    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_size: int = DEFAULT_VOCAB_PADDING_SIZE,
    ) -> None:
        super().__init__()
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.num_embeddings = num_embeddings
        self.num_embeddings_padded = pad_vocab_size(num_embeddings, padding_size * self.tp_size)
        self.num_embeddings_per_partition = self.num_embeddings_padded // self.tp_size
        self.vocab_start_index = self.tp_rank * self.num_embeddings_per_partition
        self.vocab_end_index = self.vocab_start_index + self.num_embeddings_per_partition
        shape = (self.num_embeddings_per_partition, embedding_dim)
        self.weight = new_parameter(shape, self.weight_loader)

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
    ) -> None:
        """Copy this rank's rows of the unpadded [vocab, dim] checkpoint tensor; zero the rest."""
        check_shape(
            torch.empty(self.num_embeddings, *param.shape[1:], device="meta"),
            loaded_weight,
            "embedding",
        )
        start = min(self.vocab_start_index, self.num_embeddings)
        end = min(self.vocab_end_index, self.num_embeddings)
        param.data.zero_()
        param.data[: end - start].copy_(loaded_weight[start:end])

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        outside = (input_ids < self.vocab_start_index) | (input_ids >= self.vocab_end_index)
        local_ids = torch.where(outside, 0, input_ids - self.vocab_start_index)
        embeddings = F.embedding(local_ids, self.weight).masked_fill(outside.unsqueeze(-1), 0)
        return tensor_model_parallel_all_reduce(embeddings)

    def extra_repr(self) -> str:
        return (
            f"vocab={self.num_embeddings}, padded={self.num_embeddings_padded}, "
            f"per_partition={self.num_embeddings_per_partition}"
        )


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection; its weight may be tied to the embedding's.

    It is applied by LogitsProcessor, which gathers the vocab shards and trims padding.
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        bias: bool = False,
        padding_size: int = DEFAULT_VOCAB_PADDING_SIZE,
    ) -> None:
        super().__init__(num_embeddings, embedding_dim, padding_size)
        self.bias = None
        if bias:
            self.bias = new_parameter((self.num_embeddings_per_partition,), self.weight_loader)

    def tie_weights(self, embed_tokens: VocabParallelEmbedding) -> None:
        self.weight = embed_tokens.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("ParallelLMHead is applied through LogitsProcessor")
