"""Token embedding and LM head, split by vocabulary rows across tensor-parallel ranks.

The vocabulary is padded to a multiple of 64 * tp_size so every rank holds the same
number of rows; padding rows stay zero and LogitsProcessor trims them, so they are
never sampled. The weight belongs to the layer's quant method (float rows, or rows of
quantized blocks of which a lookup dequantizes only the rows it reads).
"""

import torch
from torch import nn

from pagedllm.distributed import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_reduce,
)
from pagedllm.layers.inference_module import InferenceModule
from pagedllm.layers.parameter import check_shape, new_parameter
from pagedllm.layers.quantization.base_config import (
    EmbeddingMethodBase,
    LayerKind,
    QuantizationConfig,
)
from pagedllm.layers.quantization.unquantized import UnquantizedEmbeddingMethod

DEFAULT_VOCAB_PADDING_SIZE = 64


def pad_vocab_size(vocab_size: int, pad_to: int) -> int:
    return -(-vocab_size // pad_to) * pad_to


class VocabParallelEmbedding(InferenceModule):
    quant_kind = LayerKind.EMBEDDING

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_size: int = DEFAULT_VOCAB_PADDING_SIZE,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.num_embeddings = num_embeddings
        self.num_embeddings_padded = pad_vocab_size(num_embeddings, padding_size * self.tp_size)
        self.num_embeddings_per_partition = self.num_embeddings_padded // self.tp_size
        self.vocab_start_index = self.tp_rank * self.num_embeddings_per_partition
        self.vocab_end_index = self.vocab_start_index + self.num_embeddings_per_partition
        self.embedding_dim = embedding_dim
        self.params_dtype = torch.get_default_dtype()
        method = quant_config.get_quant_method(self, prefix) if quant_config else None
        self.quant_method: EmbeddingMethodBase = method or UnquantizedEmbeddingMethod()
        self.quant_method.create_weights(
            self,
            embedding_dim,
            [self.num_embeddings_per_partition],
            embedding_dim,
            self.num_embeddings_padded,
            self.params_dtype,
            weight_loader=self.weight_loader,
        )

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
            return self.quant_method.embedding(self, input_ids)
        outside = (input_ids < self.vocab_start_index) | (input_ids >= self.vocab_end_index)
        local_ids = torch.where(outside, 0, input_ids - self.vocab_start_index)
        embeddings = self.quant_method.embedding(self, local_ids)
        embeddings = embeddings.masked_fill(outside.unsqueeze(-1), 0)
        return tensor_model_parallel_all_reduce(embeddings)

    def extra_repr(self) -> str:
        return (
            f"vocab={self.num_embeddings}, padded={self.num_embeddings_padded}, "
            f"per_partition={self.num_embeddings_per_partition}, "
            f"quant_method={type(self.quant_method).__name__}"
        )


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection; its weight may be tied to the embedding's.

    It is applied by LogitsProcessor, which gathers the vocab shards and trims padding.
    """

    quant_kind = LayerKind.LM_HEAD

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        bias: bool = False,
        padding_size: int = DEFAULT_VOCAB_PADDING_SIZE,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__(num_embeddings, embedding_dim, padding_size, quant_config, prefix)
        self.bias = None
        if bias:
            self.bias = new_parameter((self.num_embeddings_per_partition,), self.weight_loader)
        self.tied = False

    def tie_weights(self, embed_tokens: VocabParallelEmbedding) -> None:
        """Share the embedding's weight, and so its format and quant method."""
        self.weight = embed_tokens.weight
        self.quant_method = embed_tokens.quant_method
        self.tied = True

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("ParallelLMHead is applied through LogitsProcessor")
