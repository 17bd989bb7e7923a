"""transformers' greedy `generate` for one prompt, the reference of the end-to-end tests."""

import torch
from torch import nn
from transformers.generation.utils import GenerateOutput


def hf_generate(
    model: nn.Module, prompt: list[int], max_new_tokens: int, **kw: object
) -> GenerateOutput:
    """`generate(do_sample=False, **kw)` never stopping at EOS, as a dict output: the new
    token ids are `.sequences[0, len(prompt):]`."""
    ids = torch.tensor([prompt])
    return model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=None,
        pad_token_id=0,
        return_dict_in_generate=True,
        **kw,
    )
