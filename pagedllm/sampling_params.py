"""Sampling parameters of one request, with vLLM's fields, defaults and checks.

Every value is checked at construction, so a bad request fails where it enters with a
ValueError (or TypeError) naming the field, the value and what is allowed. Checks that
need the model (token ids inside the vocabulary, the logprobs cap) run in `verify`, which
the engine calls when the request is added.
"""

import copy
import json
import logging
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Any, Protocol

from pagedllm.value_checks import (
    as_float,
    as_int,
    as_int_list,
    as_logit_bias,
    as_str_list,
    as_truncate_prompt_tokens,
    check_ids_in_vocab,
    check_text,
    fail,
)

logger = logging.getLogger(__name__)  # pagedllm.logger is a unit of this layer's row

_SAMPLING_EPS = 1e-5
_MIN_TEMPERATURE = 1e-2
"""vLLM's floor for a positive temperature: float32 logits divided by less lose the
distribution (its logprobs drift by float32's error times 1 / T)."""
DEFAULT_MAX_N = 128  # OpenAI's cap on n; LLM(max_n=...) / --max-n change it
MAX_N_SOURCE = "(set by LLM(max_n=...) / --max-n)"


class RequestOutputKind(Enum):
    """What each RequestOutput of a request carries."""

    CUMULATIVE = 0  # everything generated so far
    DELTA = 1  # only what is new since the last output
    FINAL_ONLY = 2  # one output, when the request finishes


class SamplingType(IntEnum):
    GREEDY = 0
    RANDOM = 1
    RANDOM_SEED = 2


@dataclass
class StructuredOutputsParams:
    """One constraint on a request's output text (vLLM's fields): a JSON schema (`json`, a
    dict or its JSON text), a `regex`, a `choice` of strings, a Lark or llama.cpp GBNF
    `grammar`, or any JSON object (`json_object=True`). `whitespace_pattern` (a regex)
    sets the whitespace JSON may hold between tokens; without it JSON is compact, with
    `, ` and `: ` as separators.

    vLLM's backend options are accepted where pagedllm's one backend (llguidance) already
    does what they ask: `disable_fallback` (there is no other backend to fall back to),
    `disable_any_whitespace` (JSON is compact unless `whitespace_pattern`) and
    `disable_additional_properties` (object schemas take only their declared keys unless
    they say otherwise). `structural_tag` is refused: it is not implemented.

    The fields' shapes are checked here; the schema, regex or grammar itself when the
    engine compiles it (a ValueError naming it when the request is added).
    """

    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    whitespace_pattern: str | None = None
    disable_fallback: bool = False
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    structural_tag: str | None = None

    def __post_init__(self) -> None:
        if self.structural_tag is not None:
            raise ValueError(
                "structured_outputs.structural_tag is not supported by pagedllm; use json, "
                "regex, choice or grammar"
            )
        for name in ("disable_fallback", "disable_any_whitespace", "disable_additional_properties"):
            if not isinstance(getattr(self, name), bool):
                fail(f"structured_outputs.{name}", getattr(self, name), "a bool")
        kinds = [name for name in _CONSTRAINT_KINDS if getattr(self, name) not in (None, False)]
        if len(kinds) != 1:
            fail("structured_outputs", kinds, f"exactly one of {list(_CONSTRAINT_KINDS)} set")
        self._check_json()
        self._check_texts()
        if self.choice is not None:
            if not isinstance(self.choice, list | tuple) or not self.choice:
                fail("structured_outputs.choice", self.choice, "a non-empty list of str")
            self.choice = as_str_list("structured_outputs.choice", self.choice, strip=False)
        if self.json_object is not None and not isinstance(self.json_object, bool):
            fail("structured_outputs.json_object", self.json_object, "a bool or None")

    def _check_texts(self) -> None:
        """regex, grammar and whitespace_pattern: non-empty valid Unicode when set; a
        whitespace_pattern only for JSON."""
        for name in ("regex", "grammar", "whitespace_pattern"):
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, str) or not value:
                fail(f"structured_outputs.{name}", value, "a non-empty str or None")
            check_text(f"structured_outputs.{name}", value)
        if self.whitespace_pattern is not None and self.kind not in ("json", "json_object"):
            name, value = "structured_outputs.whitespace_pattern", self.whitespace_pattern
            fail(name, value, f"None with {self.kind} (it applies to JSON only)")

    def _check_json(self) -> None:
        """A schema: a dict, or the JSON text of one; valid Unicode either way."""
        if self.json is None:
            return
        if isinstance(self.json, str):
            text = self.json
            try:
                schema = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"structured_outputs.json is not valid JSON: {e}") from None
        elif isinstance(self.json, dict):
            schema = self.json
            try:
                text = json.dumps(schema, ensure_ascii=False)
            except (TypeError, ValueError) as e:
                raise TypeError(f"structured_outputs.json is not JSON-serializable: {e}") from None
        else:
            raise TypeError(f"structured_outputs.json must be a dict or a str, got {self.json!r}")
        if not isinstance(schema, dict):
            fail("structured_outputs.json", self.json, "a JSON object (a schema)")
        check_text("structured_outputs.json", text)

    @property
    def kind(self) -> str:
        """The name of the constraint set: json, regex, choice, grammar or json_object."""
        return next(name for name in _CONSTRAINT_KINDS if getattr(self, name) not in (None, False))


_CONSTRAINT_KINDS = ("json", "regex", "choice", "grammar", "json_object")


@dataclass
class ReasoningTokens:
    """Where an answer's reasoning part is, as token ids, so that `structured_outputs`
    constrain only what follows it (the server sets this from its `--reasoning-parser`).

    `in_reasoning`: the answer starts inside the reasoning part (the model thinks first, or
    the prompt opened it); otherwise `start_token_id` (when set) may open one as the
    answer's first token, and any other first token is the constrained answer's. The
    reasoning part ends where the output holds `end_token_ids` (e.g. `</think>`'s).
    Before that a completion is free: no mask, its grammar does not advance, EOS may end it.
    """

    end_token_ids: list[int]
    in_reasoning: bool = True
    start_token_id: int | None = None

    def __post_init__(self) -> None:
        ids = as_int_list("reasoning_tokens.end_token_ids", self.end_token_ids)
        if not ids:
            fail("reasoning_tokens.end_token_ids", ids, "a non-empty list of token ids")
        self.end_token_ids = ids
        if not isinstance(self.in_reasoning, bool):
            raise TypeError(
                f"reasoning_tokens.in_reasoning must be a bool, got {self.in_reasoning!r}"
            )
        if self.start_token_id is not None:
            self.start_token_id = as_int(
                "reasoning_tokens.start_token_id", self.start_token_id, "a token id or None"
            )


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


@dataclass
class SamplingParams:
    """How to pick each new token of a request and when to stop.

    After construction `stop` and `stop_token_ids` are lists, `top_k` is 0 when off (-1 is
    accepted as off too), and a greedy request (temperature < 1e-5) has top_p 1, top_k 0
    and min_p 0, since they cannot change an argmax.
    """

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    truncate_prompt_tokens: int | None = None  # keep the prompt's last N tokens; -1: max_model_len
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    extra_args: dict[str, Any] | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    structured_outputs: StructuredOutputsParams | None = None
    reasoning_tokens: ReasoningTokens | None = None  # structured_outputs start after them
    # Filled by the engine: `update_from_tokenizer` and `update_from_generation_config`.
    bad_words_token_ids: list[list[int]] | None = field(default=None, init=False, repr=False)
    _all_stop_token_ids: set[int] = field(default_factory=set, init=False, repr=False)

    def __post_init__(self) -> None:
        self._check_numbers()
        self._check_lengths()
        self._check_token_fields()
        self._check_flags()
        if self.temperature < _SAMPLING_EPS:
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0
        self._all_stop_token_ids = set(self.stop_token_ids)

    def _check_numbers(self) -> None:
        self.n = as_int("n", self.n, "an int >= 1")
        if self.n < 1:
            fail("n", self.n, "at least 1")
        for name in ("presence_penalty", "frequency_penalty"):
            value = as_float(name, getattr(self, name), "a number in [-2, 2]")
            if not -2.0 <= value <= 2.0:
                fail(name, value, "in [-2, 2]")
            setattr(self, name, value)
        self.repetition_penalty = as_float("repetition_penalty", self.repetition_penalty, "> 0")
        if self.repetition_penalty <= 0:
            fail("repetition_penalty", self.repetition_penalty, "> 0")
        self.temperature = as_float("temperature", self.temperature, "a finite number >= 0")
        if self.temperature < 0:
            fail("temperature", self.temperature, ">= 0")
        if 0 < self.temperature < _MIN_TEMPERATURE:
            logger.warning(
                "temperature %s is below %s and is raised to it, as vLLM does (use 0 for "
                "greedy sampling)",
                self.temperature,
                _MIN_TEMPERATURE,
            )
            self.temperature = _MIN_TEMPERATURE
        self.top_p = as_float("top_p", self.top_p, "a number in (0, 1]")
        if not 0.0 < self.top_p <= 1.0:
            fail("top_p", self.top_p, "in (0, 1]")
        self.top_k = as_int("top_k", self.top_k, "an int")
        if self.top_k < -1:
            fail("top_k", self.top_k, "0 or -1 (off) or at least 1")
        self.top_k = max(self.top_k, 0)
        self.min_p = as_float("min_p", self.min_p, "a number in [0, 1]")
        if not 0.0 <= self.min_p <= 1.0:
            fail("min_p", self.min_p, "in [0, 1]")
        if self.seed is not None:
            self.seed = as_int("seed", self.seed, "an int or None")
            if self.seed == -1:  # vLLM's spelling of "no seed"
                self.seed = None

    def _check_lengths(self) -> None:
        if self.max_tokens is not None:
            self.max_tokens = as_int("max_tokens", self.max_tokens, "an int >= 1 or None")
            if self.max_tokens < 1:
                fail("max_tokens", self.max_tokens, "at least 1 (or None)")
        self.min_tokens = as_int("min_tokens", self.min_tokens, "an int >= 0")
        if self.min_tokens < 0:
            fail("min_tokens", self.min_tokens, ">= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            fail("min_tokens", self.min_tokens, f"<= max_tokens={self.max_tokens}")
        self.truncate_prompt_tokens = as_truncate_prompt_tokens(self.truncate_prompt_tokens)
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if isinstance(value, bool):  # an int to vLLM: True asks for 1
                value = int(value)
                setattr(self, name, value)
            if value is not None and as_int(name, value, "an int >= 0 or -1 or None") < -1:
                fail(name, value, ">= 0, or -1 for the whole vocabulary")

    def _check_token_fields(self) -> None:
        self.stop = [] if self.stop is None else as_str_list("stop", self.stop, strip=False)
        ids = self.stop_token_ids
        self.stop_token_ids = [] if ids is None else as_int_list("stop_token_ids", ids)
        if self.logit_bias is not None:
            self.logit_bias = as_logit_bias(self.logit_bias)
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = as_int_list("allowed_token_ids", self.allowed_token_ids)
            if not self.allowed_token_ids:
                fail("allowed_token_ids", self.allowed_token_ids, "a non-empty list or None")
        if self.bad_words is not None:
            self.bad_words = as_str_list("bad_words", self.bad_words, strip=True)

    def _check_flags(self) -> None:
        flags = ("ignore_eos", "detokenize", "skip_special_tokens")
        flags += ("spaces_between_special_tokens", "include_stop_str_in_output")
        for name in flags:
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.stop and not self.detokenize:  # vLLM's rule: stop strings are found in text
            fail("stop", self.stop, "empty when detokenize=False (stop strings are found in text)")
        if self.extra_args is not None and not isinstance(self.extra_args, dict):
            raise TypeError(f"extra_args must be a dict or None, got {type(self.extra_args)}")
        if not isinstance(self.output_kind, RequestOutputKind):
            raise TypeError(f"output_kind must be a RequestOutputKind, got {self.output_kind!r}")
        so = self.structured_outputs
        if so is not None and not isinstance(so, StructuredOutputsParams):
            raise TypeError(f"structured_outputs must be a StructuredOutputsParams, got {so!r}")
        rt = self.reasoning_tokens
        if rt is not None and not isinstance(rt, ReasoningTokens):
            raise TypeError(f"reasoning_tokens must be a ReasoningTokens or None, got {rt!r}")

    def verify(self, vocab_size: int, max_logprobs: int, max_n: int = DEFAULT_MAX_N) -> None:
        """Checks that need the engine: token ids in [0, vocab_size), logprobs within the
        cap, n within max_n.

        `max_logprobs` -1 means no cap; `logprobs` -1 asks for the whole vocabulary, so it
        counts as `vocab_size` against the cap (as in vLLM).
        """
        if self.n > max_n:
            fail("n", self.n, f"at most max_n={max_n} {MAX_N_SOURCE}")
        check_ids_in_vocab("stop_token_ids", self.stop_token_ids, vocab_size)
        check_ids_in_vocab("logit_bias keys", list(self.logit_bias or ()), vocab_size)
        check_ids_in_vocab("allowed_token_ids", self.allowed_token_ids or [], vocab_size)
        if self.reasoning_tokens is not None:
            start = self.reasoning_tokens.start_token_id
            ids = self.reasoning_tokens.end_token_ids + ([] if start is None else [start])
            check_ids_in_vocab("reasoning_tokens", ids, vocab_size)
        for word in self.bad_words_token_ids or []:
            check_ids_in_vocab("bad_words token ids", word, vocab_size)
        cap = vocab_size if max_logprobs == -1 else max_logprobs
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            count = vocab_size if value == -1 else value
            if count is not None and count > cap:
                fail(name, value, f"<= max_logprobs={cap} (-1 counts as the vocab size)")

    def update_from_tokenizer(self, tokenizer: Tokenizer) -> None:
        """Fill `bad_words_token_ids`: each bad word tokenized as is, and with a leading
        space when that yields a different first token and as many tokens (vLLM's rule), so
        the word is banned both at the start of the text and after a space."""
        if not self.bad_words:
            return
        self.bad_words_token_ids = []
        for word in self.bad_words:
            plain = tokenizer.encode(word.lstrip(), add_special_tokens=False)
            spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
            self.bad_words_token_ids.append(list(plain))
            if spaced[0] != plain[0] and len(spaced) == len(plain):
                self.bad_words_token_ids.append(list(spaced))

    def update_from_generation_config(
        self, generation_config: dict[str, Any], model_eos_token_id: int | None = None
    ) -> None:
        """Record the model's EOS ids, so min_tokens can ban them; extra EOS ids from the
        generation config also stop the request unless ignore_eos (as in vLLM)."""
        if model_eos_token_id is not None:
            self._all_stop_token_ids.add(model_eos_token_id)
        eos_ids = generation_config.get("eos_token_id")
        if eos_ids is None:
            return
        eos_ids = {eos_ids} if isinstance(eos_ids, int) else set(eos_ids)
        eos_ids.discard(model_eos_token_id)
        if eos_ids:
            self._all_stop_token_ids.update(eos_ids)
            if not self.ignore_eos:
                self.stop_token_ids = sorted(eos_ids.union(self.stop_token_ids))

    @property
    def all_stop_token_ids(self) -> set[int]:
        """stop_token_ids plus the EOS ids the engine recorded: what min_tokens bans."""
        return self._all_stop_token_ids

    @property
    def sampling_type(self) -> SamplingType:
        if self.temperature < _SAMPLING_EPS:
            return SamplingType.GREEDY
        return SamplingType.RANDOM if self.seed is None else SamplingType.RANDOM_SEED

    @property
    def output_text_buffer_length(self) -> int:
        """Characters the detokenizer holds back so a stop string is never half-emitted."""
        if not self.stop or self.include_stop_str_in_output:
            return 0
        return max(len(s) for s in self.stop) - 1

    def clone(self) -> "SamplingParams":
        return copy.deepcopy(self)


# The fields a client sets as they are: the OpenAI server's request bodies and the CLI's
# flags are derived from these (names, types, defaults). The rest (max_tokens, logprobs,
# prompt_logprobs, output_kind, detokenize, extra_args) each front end sets itself.
REQUEST_FIELDS = (
    "n",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "min_tokens",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "include_stop_str_in_output",
    "logit_bias",
    "allowed_token_ids",
    "bad_words",
    "truncate_prompt_tokens",
)


@dataclass
class BeamSearchParams:
    """vLLM's parameters of `LLM.beam_search`: keep the `beam_width` best sequences by
    cumulative logprob over `length` ** `length_penalty` (beam_search.py) for up to
    `max_tokens` new tokens; `temperature` > 0 samples each beam's next token (its
    candidates are still its most likely ones, as vLLM's)."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        for name in ("beam_width", "max_tokens"):
            if as_int(name, getattr(self, name), "an int >= 1") < 1:
                fail(name, getattr(self, name), "at least 1")
        self.temperature = as_float("temperature", self.temperature, "a finite number >= 0")
        if self.temperature < 0:
            fail("temperature", self.temperature, ">= 0")
        self.length_penalty = as_float("length_penalty", self.length_penalty, "a number")
        for name in ("ignore_eos", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")


def truncated_prompt(token_ids: list[int], keep: int | None, max_model_len: int) -> list[int]:
    """vLLM's truncate_prompt_tokens: the prompt's last `keep` ids (-1: max_model_len's worth;
    None: all of them); a `keep` over max_model_len is refused, as vLLM refuses it."""
    size = truncation_size(keep, max_model_len)
    return token_ids if size is None else token_ids[-size:]


def truncation_size(keep: int | None, max_model_len: int) -> int | None:
    """How many tokens vLLM's truncate_prompt_tokens keeps (-1: max_model_len; None: no
    cut); a `keep` over max_model_len is refused, as vLLM refuses it."""
    if keep is None:
        return None
    if keep > max_model_len:
        raise ValueError(
            f"truncate_prompt_tokens value ({keep}) is greater than max_model_len "
            f"({max_model_len}). Please request a smaller truncation size."
        )
    return max_model_len if keep == -1 else keep
