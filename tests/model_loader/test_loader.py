"""pagedllm/model_loader/loader.py: weight_bytes counts what the model holds."""

import torch
from torch import nn

from pagedllm.model_loader.loader import weight_bytes


def test_weight_bytes_counts_tied_weights_once_and_buffers_on_request() -> None:
    embed = nn.Embedding(10, 4)
    head = nn.Linear(4, 10, bias=False)
    head.weight = embed.weight
    model = nn.ModuleList([embed, head, nn.Linear(4, 4, dtype=torch.float16)])
    model.register_buffer("table", torch.zeros(3, dtype=torch.float64))
    params = 10 * 4 * 4 + (16 + 4) * 2
    assert weight_bytes(model, buffers=False) == params
    assert weight_bytes(model) == params + 3 * 8
