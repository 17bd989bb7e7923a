"""Drafter: after each step, the draft tokens of the sequences that speculate next step
(speculative decoding, config.SpeculativeConfig; vLLM's proposal after a step's output).

A sequence drafts when it decodes (all its tokens but the last computed) and its request
samples each token from that position's logits alone, so that the rows verifying its
drafts (engine/step_plan.py) give the distribution a step without drafts would: no
penalties, bad words, min_tokens still counting, structured outputs, logprobs or seed
(a seeded request's tokens would depend on how many drafts its batch let it verify);
custom logits processors are refused at start-up (config.EngineConfig). Drafts never run
past max_tokens or max_model_len.
"""

from pagedllm.config import SpeculativeConfig
from pagedllm.core.scheduler import SchedulerOutput
from pagedllm.core.sequence import Sequence
from pagedllm.engine.pooling_request import PoolingRequest
from pagedllm.engine.request import Request
from pagedllm.sampling_params import SamplingParams, SamplingType
from pagedllm.spec_decode.ngram_proposer import NgramProposer


class Drafter:
    def __init__(self, config: SpeculativeConfig, max_model_len: int) -> None:
        self.proposer = NgramProposer(config)
        self.max_model_len = max_model_len

    def propose(self, out: SchedulerOutput, requests: dict[str, Request | PoolingRequest]) -> None:
        """Set `spec_token_ids` of each sequence of the processed step `out` that drafts."""
        for s in out.scheduled:
            seq = s.seq
            if seq.is_finished or seq.num_computed_tokens != seq.num_tokens - 1:
                continue
            request = requests.get(seq.request_id)
            if isinstance(request, Request):
                seq.spec_token_ids = self.drafts(seq, request.params)

    def drafts(self, seq: Sequence, params: SamplingParams) -> list[int]:
        """seq's draft tokens for its next step ([] when it does not draft)."""
        if not samples_positionwise(params) or seq.num_output_tokens < params.min_tokens:
            return []
        # A step appends at most drafts + 1 tokens, within both limits.
        room = self.max_model_len - seq.num_tokens - 1
        if params.max_tokens is not None:
            room = min(room, params.max_tokens - seq.num_output_tokens - 1)
        if room < 1:
            return []
        return self.proposer.propose(seq, seq.token_ids, room)


def samples_positionwise(params: SamplingParams) -> bool:
    """Whether a row's token depends on its position's logits and params alone (not on
    the tokens before it, nor on a generator's state), so that draft rows may verify it."""
    return (
        params.sampling_type is not SamplingType.RANDOM_SEED
        and params.logprobs is None
        and params.presence_penalty == 0
        and params.frequency_penalty == 0
        and params.repetition_penalty == 1
        and not params.bad_words
        and params.structured_outputs is None
    )
