"""A classifier's head (vLLM's ClassifierPooler, and TokenClassifierPoolerHead per token):
the pooled hidden state [H] (a token classifier's every row [T, H]) -> the score head's
logits [num_labels] ([T, num_labels]) -> the task's activation over the labels
(classifier_config.py says which). It runs in float32 on the engine's host, once a
request, as vLLM runs its classifier head in float32 (`head_dtype`): the logits are the
same bits whichever batch or chunks the prompt ran in.
"""

import torch
import torch.nn.functional as F

from pagedllm.classifier_config import ClassifierConfig

_ACTIVATIONS = {
    "identity": lambda x: x,
    "sigmoid": torch.sigmoid,
    "softmax": lambda x: F.softmax(x, dim=-1),
    "tanh": torch.tanh,
    "relu": F.relu,
    "gelu": F.gelu,
    "silu": F.silu,
}


class SequenceClassifier:
    """`weight` [num_labels, hidden]: the checkpoint's score head (or the LM head rows it
    is made of, model_loader/seq_cls_model.py); `bias` [num_labels]: a token classifier's,
    where its head has one."""

    def __init__(
        self, weight: torch.Tensor, config: ClassifierConfig, bias: torch.Tensor | None = None
    ) -> None:
        assert weight.shape[0] == config.num_labels, (weight.shape, config.num_labels)
        self.weight = weight.float().cpu()
        self.bias = None if bias is None else bias.float().cpu()
        self.config = config

    def __call__(
        self, pooled: torch.Tensor, task: str, use_activation: bool = True
    ) -> torch.Tensor:
        """The labels' scores of one pooled vector [H] for `task` ("classify" or "score"),
        or of each token's row [T, H] for "token_classify" ([T, num_labels])."""
        logits = F.linear(pooled.to("cpu", torch.float32), self.weight, self.bias)
        if not use_activation:
            return logits
        name = self.config.score_activation if task == "score" else self.config.classify_activation
        if name == "classify":  # vLLM's PoolerClassify
            name = "sigmoid" if self.config.num_labels < 2 else "softmax"
        return _ACTIVATIONS[name](logits)
