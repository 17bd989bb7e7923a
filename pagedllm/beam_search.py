"""Beam search as vLLM's `LLM.beam_search` runs it, over the engine's ordinary requests.

Each step asks the engine for one token of every live beam with its 2 x beam_width most
likely candidates (their logprobs, raw as `logprobs_mode` gives them); every candidate
extends its beam, and a prompt keeps the `beam_width` best of all its extensions, ranked by
`get_beam_search_score`. A candidate that is the EOS token (unless `ignore_eos`) ends its
beam; at the end, the finished and the live beams together give the `beam_width` best.
The prefix cache keeps each step's prefill to the tokens a beam has not shared before.
"""

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from pagedllm.outputs import Logprob, RequestOutput
from pagedllm.sampling_params import BeamSearchParams, SamplingParams


@dataclass
class BeamSearchSequence:
    """One beam: `tokens` include the prompt's; `logprobs` has each new token's candidates
    (the step's whole dict, as vLLM's); `text` is filled when the search returns it."""

    tokens: list[int]
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class BeamSearchOutput:
    """A prompt's best sequences, best first."""

    sequences: list[BeamSearchSequence]


def get_beam_search_score(
    tokens: list[int],
    cum_logprob: float,
    eos_token_id: int | Collection[int] | None,
    length_penalty: float = 1.0,
) -> float:
    """vLLM's rank of a beam: its cumulative logprob over its length (the prompt's tokens
    included, a final EOS not) to the power `length_penalty`."""
    eos = _ids(eos_token_id)
    length = len(tokens) - (1 if tokens and tokens[-1] in eos else 0)
    return cum_logprob / (length**length_penalty)


def create_sort_beams_key_function(
    eos_token_id: int | Collection[int] | None, length_penalty: float
) -> Callable[[BeamSearchSequence], float]:
    return lambda beam: get_beam_search_score(
        beam.tokens, beam.cum_logprob, eos_token_id, length_penalty
    )


Generate = Callable[[list[dict], SamplingParams], list[RequestOutput]]


def beam_search(
    generate: Generate,
    prompts: Sequence[list[int]],
    params: BeamSearchParams,
    eos_token_ids: Collection[int],
    max_model_len: int,
    decode: Callable[[list[int]], str],
) -> list[BeamSearchOutput]:
    """Each prompt's (token ids') best `params.beam_width` sequences; `generate` runs
    token prompts through the engine, `decode` gives a sequence's text. Any of
    `eos_token_ids` (the tokenizer's EOS and the generation config's) ends a beam."""
    step = SamplingParams(
        n=1, max_tokens=1, temperature=params.temperature, logprobs=2 * params.beam_width
    )
    eos = _ids(eos_token_ids)
    key = create_sort_beams_key_function(eos, params.length_penalty)
    live = [[BeamSearchSequence(tokens=list(p))] for p in prompts]
    done: list[list[BeamSearchSequence]] = [[] for _ in prompts]
    for _ in range(params.max_tokens):
        for i, beams in enumerate(live):  # a beam at max_model_len can grow no more
            done[i] += [_finished(b, "length") for b in beams if len(b.tokens) >= max_model_len]
            live[i] = [b for b in beams if len(b.tokens) < max_model_len]
        flat = [beam for beams in live for beam in beams]
        if not flat:
            break
        outputs = iter(generate([{"prompt_token_ids": b.tokens} for b in flat], step))
        for i, beams in enumerate(live):
            grown = []
            for beam in beams:
                candidates = next(outputs).outputs[0].logprobs[0]
                for token_id, logprob in candidates.items():
                    child = BeamSearchSequence(
                        tokens=[*beam.tokens, token_id],
                        logprobs=[*beam.logprobs, candidates],
                        cum_logprob=beam.cum_logprob + logprob.logprob,
                    )
                    if token_id in eos and not params.ignore_eos:
                        done[i].append(_finished(child, "stop"))
                    else:
                        grown.append(child)
            live[i] = sorted(grown, key=key, reverse=True)[: params.beam_width]
    results = []
    for beams, finished in zip(live, done):
        best = sorted(finished + [_finished(b, "length") for b in beams], key=key, reverse=True)
        for beam in best[: params.beam_width]:
            beam.text = decode(beam.tokens)
        results.append(BeamSearchOutput(sequences=best[: params.beam_width]))
    return results


def _finished(beam: BeamSearchSequence, reason: str) -> BeamSearchSequence:
    beam.finish_reason = reason
    return beam


def _ids(eos: int | Collection[int] | None) -> frozenset[int]:
    return frozenset() if eos is None else frozenset([eos] if isinstance(eos, int) else eos)
