"""Sampler logprob tensors -> the per-token dicts of CompletionOutput.logprobs."""

from transformers import PreTrainedTokenizerBase

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
