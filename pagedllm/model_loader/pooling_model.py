"""A generative model as a pooling model (vLLM's `as_embedding_model`, and the decoder of
`as_seq_cls_model`): the LM head goes
(pooling reads the final hidden states), and the weights load from a `*ForCausalLM`
checkpoint or from a bare `*Model` one, whose names lack the `model.` prefix (as
sentence-transformers and Qwen3-Embedding save them)."""

from collections.abc import Callable, Iterable, Iterator

import torch
from torch import nn


def drop_lm_head(model: nn.Module) -> None:
    """No logits are computed: the head's weights need no loading and no memory."""
    model.lm_head = None


def pooling_keep(owned: Callable[[str], bool]) -> Callable[[str], bool]:
    """The checkpoint tensors a pooling model reads: those of its decoder that `owned` (the
    rank's filter, by `*ForCausalLM` names) takes; the LM head's and a classifier's score
    head's are never read (seq_cls_model.py reads the score head)."""
    return lambda name: not name.startswith(("lm_head.", "score.")) and owned(causal_lm_name(name))


def pooling_weights(
    weights: Iterable[tuple[str, torch.Tensor]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors (read with pooling_keep) under the `*ForCausalLM` names."""
    for name, tensor in weights:
        yield causal_lm_name(name), tensor


def causal_lm_name(name: str) -> str:
    """A checkpoint tensor's name in the `*ForCausalLM` model."""
    return name if name.startswith("model.") else "model." + name
