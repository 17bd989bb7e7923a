"""Logprob tensors -> the per-token dicts users see: sampled tokens' (CompletionOutput.
logprobs, from the sampler's tensors) and prompt tokens' (RequestOutput.prompt_logprobs:
the logprob of each prompt token given the tokens before it, from the raw logits of each
prefill chunk as it runs; positions already filled, e.g. by a sequence recomputed after
preemption, are not added twice)."""

import torch
from transformers import PreTrainedTokenizerBase

from pagedllm.device_copy import tensor_to_device
from pagedllm.engine.request import Request
from pagedllm.outputs import Logprob
from pagedllm.sample.ops.logprobs import LogprobsTensors


def decode_token(tokenizer: PreTrainedTokenizerBase | None, token_id: int) -> str | None:
    return None if tokenizer is None else tokenizer.decode([token_id])


def logprob_dict(
    token_id: int,
    token_logprob: float,
    token_rank: int,
    top_ids: list[int],
    top_logprobs: list[float],
    tokenizer: PreTrainedTokenizerBase | None,
) -> dict[int, Logprob]:
    """The chosen token first (with its rank), then the top-n by rank 1..n."""
    decode = tokenizer is not None and len(top_ids) <= 1024
    result = {
        token_id: Logprob(
            token_logprob, token_rank, decode_token(tokenizer, token_id) if decode else None
        )
    }
    for rank, (tid, lp) in enumerate(zip(top_ids, top_logprobs), start=1):
        if tid not in result:
            result[tid] = Logprob(lp, rank, decode_token(tokenizer, tid) if decode else None)
    return result


def logprobs_rows(
    tensors: LogprobsTensors | None,
    num_logprobs: list[int | None],
    tokenizer: PreTrainedTokenizerBase | None,
) -> list[dict[int, Logprob] | None]:
    """One dict per sampler row, trimmed to what that row asked for (None: not asked)."""
    if tensors is None:
        return [None] * len(num_logprobs)
    ids = tensors.logprob_token_ids.tolist()
    values = tensors.logprobs.tolist()
    ranks = tensors.selected_token_ranks.tolist()
    rows = []
    for r, n in enumerate(num_logprobs):
        if n is None:
            rows.append(None)
            continue
        end = len(ids[r]) if n == -1 else n + 1
        rows.append(
            logprob_dict(
                ids[r][0], values[r][0], ranks[r], ids[r][1:end], values[r][1:end], tokenizer
            )
        )
    return rows


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
    targets = prompt[first : end + 1]
    chosen = rows.gather(1, tensor_to_device(torch.tensor(targets)[:, None], rows.device))
    ranks = (rows >= chosen).sum(dim=1)  # vLLM's rank, as sample/ops/logprobs.py
    n = request.params.prompt_logprobs
    k = rows.shape[1] if n == -1 else n
    top_values, top_ids = rows.topk(k, dim=1) if k > 0 else (rows[:, :0], rows[:, :0].long())
    # Read back whole tensors, not a row at a time: on a GPU each read waits for the device.
    chosen, ranks, top_values, top_ids = (
        t.tolist() for t in (chosen[:, 0], ranks, top_values, top_ids)
    )
    for j, tid in enumerate(targets):
        request.prompt_logprobs.append(
            logprob_dict(tid, chosen[j], ranks[j], top_ids[j], top_values[j], tokenizer)
        )
