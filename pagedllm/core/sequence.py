"""A request's tokens and its place in the paged KV cache.

A Sequence is plain bookkeeping: the scheduler moves it between queues, the block manager
fills its block table, the engine appends sampled tokens. `sampling_params` is carried
but never read here.
"""

import enum
import itertools


class SequenceStatus(enum.Enum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH = enum.auto()
    FINISHED_ABORTED = enum.auto()

    def __init__(self, value: int) -> None:
        # An attribute, not a property: the engine asks it of every row several times a step.
        self.is_finished = self.name.startswith("FINISHED_")

    @property
    def finish_reason(self) -> str | None:
        """The OpenAI/vLLM finish reason: "stop", "length", "abort", or None while unfinished."""
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    SequenceStatus.FINISHED_STOPPED: "stop",
    SequenceStatus.FINISHED_LENGTH: "length",
    SequenceStatus.FINISHED_ABORTED: "abort",
}


_seq_ids = itertools.count()


def new_seq_id() -> int:
    """A sequence id unique in this process (a request's n completions each need one)."""
    return next(_seq_ids)


class Sequence:
    """Prompt plus generated tokens, and how much of them has KV in the cache.

    Tokens [0, num_computed_tokens) have their KV in the blocks of `block_table`
    (prefix-cache hits included); the rest still has to go through the model.
    `block_hashes[i]` is the prefix-cache hash of full block i, filled lazily by the
    block manager; token ids only grow, so a hash never goes stale. `block_table` only
    grows at its end in place; any other change (reallocation, copy on write) gives it a
    new list, which is how the model runner's HostBlockTables tells what changed.

    Between a step's scheduling and its update, its new tokens count in
    `num_in_flight_tokens`, and the token it will sample (if its chunk reaches the end) in
    `num_output_placeholders`: under async scheduling the next step is scheduled before
    that token is known (core/scheduler.py).

    `priority` (lower first) and `arrival_time` order the scheduler's queues under its
    "priority" policy; `cache_salt` is mixed into the hash of block 0, so only sequences
    with the same salt (or none) share prefix-cache blocks (core/block_manager.py), as is
    the content key of its LoRA adapter (`lora`, lora/registry.py LoadedAdapter; None: the
    base model).
    `spec_token_ids`: draft tokens proposed to follow `token_ids` (speculative decoding),
    which the next schedule takes into the sequence's step for the model to verify.
    """

    def __init__(
        self,
        seq_id: int,
        token_ids: list[int],
        block_size: int,
        sampling_params: object | None = None,
        request_id: str | None = None,
        arrival_time: float = 0.0,
        priority: int = 0,
        cache_salt: str | None = None,
        lora: object | None = None,
    ) -> None:
        if len(token_ids) == 0:
            raise ValueError("a prompt must hold at least 1 token, got 0")
        assert block_size > 0
        self.seq_id = seq_id
        self.request_id = str(seq_id) if request_id is None else request_id
        self.status = SequenceStatus.WAITING
        self.token_ids = list(token_ids)
        # The prompt and the tokens past it as lists of their own, the second growing in
        # place (as vLLM's request keeps them): the sampler's rows and logits processors
        # take them every step, which slices of token_ids would copy every step.
        self.prompt_token_ids = list(token_ids)
        self.output_token_ids: list[int] = []
        self.block_size = block_size
        self.sampling_params = sampling_params
        self.arrival_time = arrival_time
        self.priority = priority
        self.cache_salt = cache_salt
        self.lora = lora
        self.num_computed_tokens = 0
        self.num_in_flight_tokens = 0
        self.num_output_placeholders = 0
        self.num_cached_tokens = 0
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []
        self.spec_token_ids: list[int] = []
        self.num_preemptions = 0
        self.skip_prefix_cache = False
        self.first_scheduled_time: float | None = None  # time.monotonic(), for metrics

    @property
    def lora_request(self) -> object | None:
        """The LoRARequest that named its adapter (None: the base model)."""
        return None if self.lora is None else self.lora.request

    @property
    def lora_key(self) -> str | None:
        """Its adapter's content key, what the scheduler, the prefix cache and the slots
        go by."""
        return None if self.lora is None else self.lora.key

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_scheduled_tokens(self) -> int:
        """Tokens computed or being computed: where the next scheduled chunk starts."""
        return self.num_computed_tokens + self.num_in_flight_tokens

    @property
    def num_tokens_with_placeholders(self) -> int:
        """num_tokens plus the tokens steps in flight will sample."""
        return len(self.token_ids) + self.num_output_placeholders

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_blocks(self) -> int:
        """Blocks needed to hold num_tokens."""
        return -(-self.num_tokens // self.block_size)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def last_token_id(self) -> int:
        return self.token_ids[-1]

    @property
    def is_prefill(self) -> bool:
        """True while more than one token lacks KV; a decode step computes exactly one."""
        return self.num_tokens - self.num_computed_tokens > 1

    def block_token_ids(self, i: int) -> list[int]:
        return self.token_ids[i * self.block_size : (i + 1) * self.block_size]

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
        self.output_token_ids.append(token_id)

    def __repr__(self) -> str:
        return (
            f"Sequence(seq_id={self.seq_id}, status={self.status.name}, "
            f"num_tokens={self.num_tokens}, num_computed_tokens={self.num_computed_tokens}, "
            f"block_table={self.block_table})"
        )
