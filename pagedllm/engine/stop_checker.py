"""When a sequence stops: EOS, stop token ids, stop strings, a completed structured-output
constraint, max_tokens, max_model_len."""

from dataclasses import dataclass

from pagedllm.core.sequence import Sequence, SequenceStatus
from pagedllm.sampling_params import SamplingParams


@dataclass
class StopDecision:
    status: SequenceStatus
    stop_reason: int | str | None = None
    truncate_text_to: int | None = None  # cut output text here (a stop string was found)


def check_stop(
    seq: Sequence,
    params: SamplingParams,
    eos_token_id: int | None,
    max_model_len: int,
    output_text: str,
    new_text_len: int,
    grammar_terminated: bool = False,
) -> StopDecision | None:
    """Decide after `seq` got its newest token and `new_text_len` characters of text.
    `grammar_terminated`: its structured-output constraint is complete (only EOS could
    follow), which stops it even before min_tokens, since nothing else can be sampled."""
    num_output_tokens = seq.num_output_tokens
    by_token = token_stop(seq, params, eos_token_id)
    if by_token is not None:
        return by_token
    if num_output_tokens > params.min_tokens:
        # vLLM's rule: the first min_tokens tokens' text is never searched on its own (a
        # stop string may still end in a later token and begin in it).
        found = find_stop_string(output_text, new_text_len, params)
        if found is not None:
            return found
    if grammar_terminated:
        return StopDecision(SequenceStatus.FINISHED_STOPPED)
    if params.max_tokens is not None and num_output_tokens >= params.max_tokens:
        return StopDecision(SequenceStatus.FINISHED_LENGTH)
    if seq.num_tokens >= max_model_len:
        return StopDecision(SequenceStatus.FINISHED_LENGTH)
    return None


def token_stop(
    seq: Sequence, params: SamplingParams, eos_token_id: int | None
) -> StopDecision | None:
    """The stop `seq`'s newest token makes by its id (EOS, a stop token id; none before
    min_tokens). Its text is then left out of the output unless include_stop_str_in_output,
    as vLLM's detokenizer leaves it out (output_processor.py)."""
    if seq.num_output_tokens < params.min_tokens:
        return None
    token = seq.last_token_id
    if not params.ignore_eos and token == eos_token_id:
        return StopDecision(SequenceStatus.FINISHED_STOPPED)
    if token in params.stop_token_ids:
        return StopDecision(SequenceStatus.FINISHED_STOPPED, stop_reason=token)
    return None


def find_stop_string(text: str, new_text_len: int, params: SamplingParams) -> StopDecision | None:
    """The earliest stop string that ends in the new text (so the text kept never holds
    one); only the tail that could hold one is searched, so the cost does not grow with
    the output."""
    if not params.stop or new_text_len == 0:
        return None
    found = []
    for stop in params.stop:
        start = max(0, len(text) - new_text_len - len(stop) + 1)
        index = text.find(stop, start)
        if index != -1:
            found.append((index, stop))
    if not found:
        return None
    index, stop = min(found, key=lambda f: f[0])
    end = index + len(stop) if params.include_stop_str_in_output else index
    return StopDecision(SequenceStatus.FINISHED_STOPPED, stop, end)
