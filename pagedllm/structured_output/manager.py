"""StructuredOutputManager: compiles each distinct constraint once, gives every completion
its own matcher, and builds the step's token bitmask for the constrained rows.

The engine calls `submit` when a request is added: the constraint is checked there (a bad
schema fails the add, in about a millisecond) and compiled on the manager's own thread, so
no step waits for it (the request waits instead, as vLLM's WAITING_FOR_FSM). Once per step
it calls `grammar_bitmask` with the matchers of the rows that sample under a constraint;
free rows, and constrained ones still in their reasoning part, never reach it.
The llguidance tokenizer (half a second to build from the HF tokenizer) is built on that
thread with the first constrained request, so engines that never see one do not pay for it.
The bitmask is filled through llguidance.numpy on the tensor's shared memory: importing
llguidance.torch imports torch.compile's stack (2.2 s, half of `import pagedllm`).
"""

import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

import llguidance.hf
import torch
from llguidance import LLExecutor, LLMatcher, LLTokenizer
from llguidance.numpy import fill_next_token_bitmask_par
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from pagedllm.sampling_params import ReasoningTokens, StructuredOutputsParams
from pagedllm.structured_output.grammar_text import check_grammar, grammar_text, invalid_grammar
from pagedllm.structured_output.matcher import GrammarMatcher

_MAX_CACHED_GRAMMARS = 256


class StructuredOutputManager:
    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase | None,
        eos_token_ids: list[int],
        max_cached_grammars: int = _MAX_CACHED_GRAMMARS,
    ) -> None:
        """`eos_token_ids`: the ids that may end an answer where its grammar accepts (the
        model's EOS first; empty: the tokenizer's)."""
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.max_cached_grammars = max_cached_grammars
        self._ll_tokenizer: LLTokenizer | None = None
        self._executor: LLExecutor | None = None
        self._compiled: OrderedDict[str, LLMatcher] = OrderedDict()  # grammar text -> start
        self._lock = threading.Lock()  # the compile thread vs direct callers of new_matchers
        self._compile_thread: ThreadPoolExecutor | None = None

    @property
    def ll_tokenizer(self) -> LLTokenizer:
        """The model's tokenizer as llguidance sees it, with the engine's EOS ids as its end.
        Once built it is read without the lock, so a step never waits on a compile."""
        if self._ll_tokenizer is not None:
            return self._ll_tokenizer
        with self._lock:
            if self._ll_tokenizer is None:
                self._check_tokenizer()
                self._ll_tokenizer = llguidance.hf.from_tokenizer(
                    self.tokenizer, eos_token=self.eos_token_ids or None
                )
            return self._ll_tokenizer

    def _check_tokenizer(self) -> None:
        if self.tokenizer is None:
            raise ValueError("structured_outputs need a tokenizer (skip_tokenizer_init is set)")
        if not isinstance(self.tokenizer, PreTrainedTokenizerFast):
            raise ValueError(
                "structured_outputs need the model's fast (HF tokenizers) tokenizer, "
                f"got {type(self.tokenizer).__name__}"
            )

    @property
    def bitmask_words(self) -> int:
        """32-bit words per row of the bitmask: one bit per token of the tokenizer."""
        return (self.ll_tokenizer.vocab_size + 31) // 32

    def submit(
        self, params: StructuredOutputsParams, n: int, reasoning: ReasoningTokens | None = None
    ) -> "Future[list[GrammarMatcher]]":
        """Check `params`' constraint now (ValueError naming the schema, regex or grammar;
        no tokenizer needed) and compile it on the compile thread: the future holds what
        `new_matchers` returns, or its error."""
        self._check_tokenizer()
        text = check_grammar(params)
        if self._compile_thread is None:
            self._compile_thread = ThreadPoolExecutor(1, thread_name_prefix="pagedllm-grammar")
        return self._compile_thread.submit(self._matchers, text, params.kind, n, reasoning)

    def new_matchers(
        self, params: StructuredOutputsParams, n: int, reasoning: ReasoningTokens | None = None
    ) -> list[GrammarMatcher]:
        """n matchers at the start of `params`' grammar, one per completion, applying after
        the `reasoning` part when given. ValueError naming the schema, regex or grammar
        when it does not compile."""
        return self._matchers(grammar_text(params), params.kind, n, reasoning)

    def _matchers(
        self, text: str, kind: str, n: int, reasoning: ReasoningTokens | None
    ) -> list[GrammarMatcher]:
        start = self._compile(text, kind)
        return [GrammarMatcher(start.deep_copy(), reasoning) for _ in range(n)]

    def _compile(self, text: str, kind: str) -> LLMatcher:
        """The compiled grammar `text`, from the cache when seen."""
        tokenizer = self.ll_tokenizer
        with self._lock:
            start = self._compiled.get(text)
            if start is not None:
                self._compiled.move_to_end(text)
                return start
            start = LLMatcher(tokenizer, text, log_level=0)
            if start.is_error():
                raise invalid_grammar("structured_outputs", kind, start.get_error())
            self._compiled[text] = start
            while len(self._compiled) > self.max_cached_grammars:
                self._compiled.popitem(last=False)
            return start

    def shutdown(self) -> None:
        """Stop the compile thread; compiles not yet started are cancelled."""
        if self._compile_thread is not None:
            self._compile_thread.shutdown(wait=False, cancel_futures=True)

    def grammar_bitmask(self, matchers: list[GrammarMatcher]) -> torch.Tensor:
        """[len(matchers), bitmask_words] int32 on the CPU: bit t % 32 of word t // 32 of
        row i is set where matchers[i] allows token t next (its grammar's tokens, plus the
        token that may open a reasoning part before the first token). The rows are filled
        in parallel on llguidance's threads, which run without the GIL."""
        if self._executor is None:
            self._executor = LLExecutor()
        bitmask = torch.empty(len(matchers), self.bitmask_words, dtype=torch.int32)
        pairs = [(m.ll_matcher, i) for i, m in enumerate(matchers)]
        fill_next_token_bitmask_par(self._executor, pairs, bitmask.numpy())
        for i, m in enumerate(matchers):
            if m.open_token_id is not None:
                _allow(bitmask[i], m.open_token_id)
        return bitmask


def _allow(row: torch.Tensor, token: int) -> None:
    """Set token's bit in a bitmask row [W] int32 (bit 31 is the sign bit)."""
    bit = 1 << (token % 32)
    row[token // 32] |= bit - (1 << 32) if bit >= 1 << 31 else bit
