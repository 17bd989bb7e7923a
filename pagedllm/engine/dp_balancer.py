"""Which data-parallel replica takes a request: the least loaded (outstanding requests), or
the replica that recently served the same first KV block, while it is not much busier.

A replica's prefix cache holds the blocks of prompts it ran, so a prompt whose first block
(a system prompt, a few-shot header, a conversation's earlier turns) was seen before runs
its prefill from cache only on that replica. The balancer remembers, for the key of each
recent prompt's first full block (`prefix_key`: its first token ids, or for a text prompt
the characters such a block covers on average), the replica it went to; a later prompt with that key
goes there too unless that replica has `affinity_slack` more requests outstanding than the
least loaded one. Ties among the least loaded rotate, so even one request at a time
spreads over the replicas.
"""

from collections import OrderedDict
from collections.abc import Sequence

DEFAULT_AFFINITY_SLACK = 8
MAX_REMEMBERED_PREFIXES = 65536
# A text prompt stands for its first KV block with its first block_size * CHARS_PER_TOKEN
# characters, the text that block covers on average: 4 characters a token is BPE
# tokenizers' mean over English prose and code (OpenAI's rule of thumb). A longer prefix
# would split prompts that share their first block but differ soon after it (a missed
# prefix-cache hit); a shorter one would group prompts that share less than a block (steered
# together for no hit, within `affinity_slack`). Neither changes an answer: the key only
# steers routing, and each replica's own cache decides what it reuses.
CHARS_PER_TOKEN = 4


class DPLoadBalancer:
    def __init__(self, num_engines: int, affinity_slack: int = DEFAULT_AFFINITY_SLACK) -> None:
        if num_engines < 1:
            raise ValueError(f"num_engines {num_engines} must be >= 1")
        self.outstanding = [0] * num_engines
        self.affinity_slack = affinity_slack
        self._owner: OrderedDict[int, int] = OrderedDict()  # prefix hash -> replica
        self._next = 0  # where the search for the least loaded starts (rotating ties)

    def choose(self, prefix_key: int | None) -> int:
        """The replica for a request whose first block hashes to `prefix_key` (None: no
        full block); counted as outstanding until `finished`."""
        n = len(self.outstanding)
        order = [(self._next + i) % n for i in range(n)]
        least = min(order, key=self.outstanding.__getitem__)
        self._next = (least + 1) % n
        engine = least
        owner = None if prefix_key is None else self._owner.get(prefix_key)
        if owner is not None and self.outstanding[owner] - self.outstanding[least] <= (
            self.affinity_slack
        ):
            engine = owner
        if prefix_key is not None:
            self._owner[prefix_key] = engine
            self._owner.move_to_end(prefix_key)
            if len(self._owner) > MAX_REMEMBERED_PREFIXES:
                self._owner.popitem(last=False)
        self.outstanding[engine] += 1
        return engine

    def finished(self, engine: int) -> None:
        self.outstanding[engine] -= 1


def prefix_key(prompt: object, block_size: int) -> int | None:
    """The key of the prompt's first KV block, from what the request carries (never a
    tokenizer: the replica tokenizes the prompt once): the hash of its first `block_size`
    token ids where it has them (token prompts; the server's chat, completion and
    embedding requests, tokenized before they are routed), else of its text's first
    `block_size * CHARS_PER_TOKEN` characters. None when the prompt is shorter than that
    (no full block) or is not a prompt (the engine replica that gets it reports why). A
    prompt's `cache_salt` is part of the key, as it is of the block's hash."""
    tokens: Sequence[int] | None = None
    text = salt = None
    if isinstance(prompt, dict):
        tokens, text = prompt.get("prompt_token_ids"), prompt.get("prompt")
        salt = prompt.get("cache_salt")
    elif isinstance(prompt, str):
        text = prompt
    elif isinstance(prompt, list | tuple):
        tokens = prompt
    key = None
    if tokens is not None:
        key = _tokens_key(tokens, block_size)
    elif isinstance(text, str) and len(text) >= block_size * CHARS_PER_TOKEN:
        key = hash(text[: block_size * CHARS_PER_TOKEN])
    if key is None or salt is None:
        return key
    try:
        return hash((salt, key))
    except TypeError:  # a bad salt: the replica refuses the request
        return None


def _tokens_key(tokens: Sequence[int], block_size: int) -> int | None:
    if len(tokens) < block_size:
        return None
    try:
        return hash(tuple(int(t) for t in tokens[:block_size]))
    except (TypeError, ValueError):
        return None
