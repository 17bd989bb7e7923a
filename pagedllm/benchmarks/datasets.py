"""Random-token requests: prompt and output lengths drawn uniformly from ranges, seeded.

Random token ids carry no meaning, so every backend does the same work whatever its
tokenizer, and no two prompts share a prefix (prefix caching cannot skip any prefill).
"""

import random
from dataclasses import dataclass

# Ids below this are often special tokens (BOS, EOS, chat markers); prompts avoid them.
_FIRST_TOKEN_ID = 16


@dataclass(frozen=True)
class BenchRequest:
    prompt_token_ids: list[int]
    output_len: int

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


def parse_len_range(text: str, name: str) -> tuple[int, int]:
    """'32:512' -> (32, 512) inclusive; '128' -> (128, 128)."""
    parts = text.split(":")
    try:
        low, high = (int(parts[0]), int(parts[-1])) if len(parts) <= 2 else (0, -1)
    except ValueError:
        low, high = 0, -1
    if len(parts) > 2 or not 1 <= low <= high:
        raise ValueError(f"{name} {text!r} must be N or LOW:HIGH with 1 <= LOW <= HIGH")
    return low, high


def random_requests(
    num_prompts: int,
    input_len: tuple[int, int],
    output_len: tuple[int, int],
    vocab_size: int,
    seed: int = 0,
) -> list[BenchRequest]:
    """`num_prompts` requests; the same arguments always give the same requests."""
    if num_prompts < 1:
        raise ValueError(f"num_prompts {num_prompts} must be >= 1")
    low_id = _FIRST_TOKEN_ID if vocab_size > 2 * _FIRST_TOKEN_ID else 0
    rng = random.Random(seed)
    requests = []
    for _ in range(num_prompts):
        prompt_len = rng.randint(*input_len)
        prompt = [rng.randrange(low_id, vocab_size) for _ in range(prompt_len)]
        requests.append(BenchRequest(prompt, rng.randint(*output_len)))
    return requests


def max_total_len(requests: list[BenchRequest]) -> int:
    return max(r.prompt_len + r.output_len for r in requests)
