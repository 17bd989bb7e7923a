"""A generative model as a pooling model (vLLM's `as_embedding_model`, and the decoder of
`as_seq_cls_model`): the LM head goes
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
    """The checkpoint's tensors under the `*ForCausalLM` names, the LM head's and a
    classifier's score head's skipped (seq_cls_model.py loads the score head)."""
    for name, tensor in weights:
        if is_decoder_weight(name):
            yield causal_lm_name(name), tensor


def is_decoder_weight(name: str) -> bool:
    """Not a head's tensor: the heads are never read into the decoder."""
    return not name.startswith(("lm_head.", "score."))


def causal_lm_name(name: str) -> str:
    """A checkpoint tensor's name in the `*ForCausalLM` model."""
    return name if name.startswith("model.") else "model." + name
