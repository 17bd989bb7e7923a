"""Beam search as vLLM's `LLM.beam_search` runs it, over the engine's ordinary requests.

Each step asks the engine for one token of every live beam with its 2 x beam_width most
likely candidates (their logprobs, raw as `logprobs_mode` gives them); every candidate
extends its beam, and a prompt keeps the `beam_width` best of all its extensions, ranked by
`get_beam_search_score`. A candidate that is the EOS token (unless `ignore_eos`) ends its
beam; at the end, the finished and the live beams together give the `beam_width` best.
The prefix cache keeps each step's prefill to the tokens a beam has not shared before;
a prompt's `cache_salt` goes on every one of its steps' requests, so its beams share blocks
only with prompts of the same salt.
`BeamSearch` holds the search between steps; `beam_search` drives it for `LLM.beam_search`
and `beam_search_async` for the server's `use_beam_search`
(entrypoints/openai/serving_beam_search.py).
"""

from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field

from pagedllm.outputs import Logprob, RequestOutput
from pagedllm.sampling_params import MAX_N_SOURCE, BeamSearchParams, SamplingParams
from pagedllm.value_checks import fail


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
AsyncGenerate = Callable[[list[dict], SamplingParams], Awaitable[list[RequestOutput]]]


class BeamSearch:
    """The search's state between engine steps, shared by the offline driver
    (`beam_search`) and the server's (`beam_search_async`): `requests()` gives the step's
    one-token requests (`step_params`), `advance` takes their outputs, `best()` the end."""

    def __init__(
        self,
        prompts: Sequence[list[int]],
        params: BeamSearchParams,
        eos_token_ids: Collection[int],
        max_model_len: int,
        cache_salts: Sequence[str | None] | None = None,
    ) -> None:
        """`prompts`: token ids; any of `eos_token_ids` (the tokenizer's EOS and the
        generation config's) ends a beam; none grows past `max_model_len`. `cache_salts`:
        each prompt's cache_salt (None: unsalted), carried by its steps' requests."""
        self.params, self.max_model_len = params, max_model_len
        salts = [None] * len(prompts) if cache_salts is None else cache_salts
        self.salts = [{} if salt is None else {"cache_salt": salt} for salt in salts]
        self.step_params = SamplingParams(
            n=1, max_tokens=1, temperature=params.temperature, logprobs=2 * params.beam_width
        )
        self.eos = _ids(eos_token_ids)
        self.key = create_sort_beams_key_function(self.eos, params.length_penalty)
        self.live = [[BeamSearchSequence(tokens=list(p))] for p in prompts]
        self.done: list[list[BeamSearchSequence]] = [[] for _ in prompts]
        self.steps_left = params.max_tokens

    def requests(self) -> list[dict]:
        """The next step's token prompts, one per live beam (prompt by prompt); none when
        the search is over. A beam at max_model_len can grow no more: it is finished."""
        if self.steps_left == 0:
            return []
        for i, beams in enumerate(self.live):
            full = [b for b in beams if len(b.tokens) >= self.max_model_len]
            self.done[i] += [_finished(b, "length") for b in full]
            self.live[i] = [b for b in beams if len(b.tokens) < self.max_model_len]
        return [
            {"prompt_token_ids": b.tokens} | self.salts[i]
            for i, beams in enumerate(self.live)
            for b in beams
        ]

    def advance(self, outputs: Sequence[RequestOutput]) -> None:
        """Grow every live beam by its candidates (the outputs of `requests()`, in order)
        and keep each prompt's `beam_width` best; an EOS candidate finishes its beam."""
        outputs = iter(outputs)
        for i, beams in enumerate(self.live):
            grown = []
            for beam in beams:
                candidates = next(outputs).outputs[0].logprobs[0]
                for token_id, logprob in candidates.items():
                    child = BeamSearchSequence(
                        tokens=[*beam.tokens, token_id],
                        logprobs=[*beam.logprobs, candidates],
                        cum_logprob=beam.cum_logprob + logprob.logprob,
                    )
                    if token_id in self.eos and not self.params.ignore_eos:
                        self.done[i].append(_finished(child, "stop"))
                    else:
                        grown.append(child)
            self.live[i] = sorted(grown, key=self.key, reverse=True)[: self.params.beam_width]
        self.steps_left -= 1

    def best(self) -> list[BeamSearchOutput]:
        """Each prompt's `beam_width` best of its finished and live beams, best first."""
        results = []
        for beams, finished in zip(self.live, self.done):
            ranked = finished + [_finished(b, "length") for b in beams]
            ranked = sorted(ranked, key=self.key, reverse=True)
            results.append(BeamSearchOutput(sequences=ranked[: self.params.beam_width]))
        return results


def beam_search(
    generate: Generate,
    prompts: Sequence[list[int]],
    params: BeamSearchParams,
    eos_token_ids: Collection[int],
    max_model_len: int,
    decode: Callable[[list[int]], str],
    cache_salts: Sequence[str | None] | None = None,
) -> list[BeamSearchOutput]:
    """Each prompt's (token ids') best `params.beam_width` sequences (`BeamSearch`);
    `generate` runs token prompts through the engine, `decode` gives a sequence's text."""
    search = BeamSearch(prompts, params, eos_token_ids, max_model_len, cache_salts)
    while requests := search.requests():
        search.advance(generate(requests, search.step_params))
    results = search.best()
    for beam in (beam for result in results for beam in result.sequences):
        beam.text = decode(beam.tokens)
    return results


async def beam_search_async(
    generate: AsyncGenerate,
    prompt: list[int],
    params: BeamSearchParams,
    eos_token_ids: Collection[int],
    max_model_len: int,
    cache_salt: str | None = None,
) -> BeamSearchOutput:
    """One prompt's best sequences, as `beam_search` finds them (no text), where
    `generate` awaits the engine's outputs."""
    search = BeamSearch([prompt], params, eos_token_ids, max_model_len, [cache_salt])
    while requests := search.requests():
        search.advance(await generate(requests, search.step_params))
    (result,) = search.best()
    return result


def check_beam_width(params: BeamSearchParams, max_logprobs: int, max_n: int) -> None:
    """A search keeps `beam_width` sequences a prompt, as a request keeps `n`: no more than
    the engine's `max_n`; and each step asks for 2 x beam_width candidate logprobs: no more
    than its `max_logprobs` (-1: no cap)."""
    if params.beam_width > max_n:
        fail("beam_width", params.beam_width, f"at most max_n={max_n} {MAX_N_SOURCE}")
    if max_logprobs != -1 and 2 * params.beam_width > max_logprobs:
        raise ValueError(
            f"beam_width {params.beam_width} asks for {2 * params.beam_width} candidate "
            f"logprobs a step, more than max_logprobs={max_logprobs}: raise max_logprobs"
        )


def _finished(beam: BeamSearchSequence, reason: str) -> BeamSearchSequence:
    beam.finish_reason = reason
    return beam


def _ids(eos: int | Collection[int] | None) -> frozenset[int]:
    return frozenset() if eos is None else frozenset([eos] if isinstance(eos, int) else eos)
