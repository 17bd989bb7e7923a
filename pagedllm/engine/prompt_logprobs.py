"""Prompt logprobs: the logprob of each prompt token given the tokens before it.

Computed from the raw model logits of each prefill chunk as it runs; positions already
filled (a sequence recomputed after preemption) are not added twice.
"""

import torch
from transformers import PreTrainedTokenizerBase

from pagedllm.engine.request import Request
from pagedllm.engine.sample_logprobs import logprob_dict


def append_prompt_logprobs(
    request: Request,
    logits: torch.Tensor,
    start: int,
    tokenizer: PreTrainedTokenizerBase | None,
) -> None:
    """logits [n, V] at positions start..start+n-1 give the logprobs of the prompt tokens
    at start+1..start+n; the first prompt token has None."""
    if request.prompt_logprobs is None:
        request.prompt_logprobs = [None]
    prompt = request.prompt_token_ids
    first = len(request.prompt_logprobs)  # next prompt position to fill
    end = min(start + logits.shape[0], len(prompt) - 1)  # last row predicting a prompt token
    if first - 1 >= end or first - 1 < start:
        return
    rows = logits[first - 1 - start : end - start].log_softmax(dim=-1)
    targets = torch.tensor(prompt[first : end + 1], device=rows.device)
    chosen = rows.gather(1, targets[:, None])
    ranks = ((rows > chosen).sum(dim=1) + 1).tolist()
    n = request.params.prompt_logprobs
    k = rows.shape[1] if n == -1 else n
    top_values, top_ids = rows.topk(k, dim=1) if k > 0 else (rows[:, :0], rows[:, :0].long())
    for j, (tid, lp) in enumerate(zip(targets.tolist(), chosen[:, 0].tolist())):
        request.prompt_logprobs.append(
            logprob_dict(tid, lp, ranks[j], top_ids[j].tolist(), top_values[j].tolist(), tokenizer)
        )
