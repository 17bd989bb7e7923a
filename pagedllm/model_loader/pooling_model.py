"""A generative model as a pooling model (vLLM's `as_embedding_model`): the LM head goes
(pooling reads the final hidden states), and the weights load from a `*ForCausalLM`
checkpoint or from a bare `*Model` one, whose names lack the `model.` prefix (as
sentence-transformers and Qwen3-Embedding save them)."""

from collections.abc import Iterable, Iterator

import torch
from torch import nn


def drop_lm_head(model: nn.Module) -> None:
    """No logits are computed: the head's weights need no loading and no memory."""
    model.lm_head = None


def pooling_weights(
    weights: Iterable[tuple[str, torch.Tensor]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors under the `*ForCausalLM` names, the LM head's skipped."""
    for name, tensor in weights:
        if name.startswith("lm_head."):
            continue
        yield causal_lm_name(name), tensor


def causal_lm_name(name: str) -> str:
    """A checkpoint tensor's name in the `*ForCausalLM` model."""
    return name if name.startswith("model.") else "model." + name
