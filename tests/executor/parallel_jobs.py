"""The job the parallel executors' tests run against one rank: prompts of mixed lengths,
some sharing a 32-token prefix (so prefix caching serves blocks), and the comparison."""

SHARED = list(range(10, 42))


def mixed_prompts() -> list[dict]:
    lengths = (1, 9, 23, 40)
    return [{"prompt_token_ids": SHARED[: n // 2] + list(range(50, 50 + n))} for n in lengths] + [
        {"prompt_token_ids": SHARED + [7, 8, 9]},
        {"prompt_token_ids": SHARED + [11, 12]},
    ]


def assert_same(expected: list, got: list, tolerance: float = 0.0) -> None:
    """Identical tokens in every completion; each sampled token's logprob within
    `tolerance`."""
    for want, have in zip(expected, got, strict=True):
        for a, b in zip(want.outputs, have.outputs, strict=True):
            assert a.token_ids == b.token_ids
            for lp_a, lp_b, token in zip(a.logprobs, b.logprobs, a.token_ids, strict=True):
                assert abs(lp_a[token].logprob - lp_b[token].logprob) <= tolerance
