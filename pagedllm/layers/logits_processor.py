"""Hidden states -> logits: the LM head matmul, vocab gather, padding trim, scale, soft-cap."""

import torch

from pagedllm.distributed import tensor_model_parallel_all_gather
from pagedllm.layers.inference_module import InferenceModule
from pagedllm.layers.vocab_embedding import ParallelLMHead


class LogitsProcessor(InferenceModule):
    def __init__(self, vocab_size: int, scale: float = 1.0, soft_cap: float | None = None) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.scale = scale
        self.soft_cap = soft_cap

    def forward(self, lm_head: ParallelLMHead, hidden_states: torch.Tensor) -> torch.Tensor:
        """[N, hidden] -> [N, vocab_size] logits; padding rows of the vocab never appear."""
        logits = lm_head.quant_method.apply(lm_head, hidden_states, lm_head.bias)
        logits = tensor_model_parallel_all_gather(logits)[..., : self.vocab_size]
        if self.soft_cap is not None:
            logits = torch.tanh(logits / self.soft_cap) * self.soft_cap
        if self.scale != 1.0:
            logits = logits * self.scale
        return logits
