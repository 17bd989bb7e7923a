"""DPLoadBalancer and prefix_key: least outstanding first (ties rotating), a known first
block back to its replica unless that one is much busier."""

from pagedllm.engine.dp_balancer import CHARS_PER_TOKEN, DPLoadBalancer, prefix_key

BLOCK = [1] * 16


def test_least_loaded_with_rotating_ties() -> None:
    balancer = DPLoadBalancer(3)
    assert [balancer.choose(None) for _ in range(3)] == [0, 1, 2]
    balancer.finished(1)
    assert balancer.choose(None) == 1  # the only replica with one request less
    for engine in range(3):
        balancer.finished(engine)
    assert balancer.outstanding == [0, 0, 0]
    assert [balancer.choose(None) for _ in range(3)] == [2, 0, 1]


def test_a_known_prefix_goes_back_to_its_replica_unless_much_busier() -> None:
    balancer = DPLoadBalancer(2, affinity_slack=2)
    first = balancer.choose(7)
    balancer.finished(first)
    others = [balancer.choose(None) for _ in range(2)]
    assert others == [1 - first, first]
    for engine in others:
        balancer.finished(engine)
    # Without the prefix the rotation would pick the other replica now.
    assert balancer.choose(7) == first
    for _ in range(2):
        balancer.choose(7)
    assert balancer.outstanding[first] == 3  # up to slack 2 more than the other's 0
    assert balancer.choose(7) == 1 - first  # 3 more than the other: the least loaded
    assert balancer.choose(7) == 1 - first  # ... which now owns the prefix


def test_prefix_key_is_of_the_first_full_block() -> None:
    key = prefix_key(BLOCK + [3], 16)
    assert key is not None
    assert prefix_key({"prompt_token_ids": BLOCK + [2]}, 16) == key
    assert prefix_key({"prompt_token_ids": BLOCK + [2], "prompt": "other text"}, 16) == key
    assert prefix_key({"prompt_token_ids": BLOCK[:15]}, 16) is None
    assert prefix_key({"prompt_token_ids": ["x"] * 16}, 16) is None
    assert prefix_key(3, 16) is None


def test_the_cache_salt_is_part_of_the_prefix_key() -> None:
    """Salted prompts share cached blocks with their own salt only (core/block_manager.py),
    so they are routed by prompt and salt."""
    plain = prefix_key({"prompt_token_ids": BLOCK}, 16)
    keys = [prefix_key({"prompt_token_ids": BLOCK, "cache_salt": s}, 16) for s in "aab"]
    assert keys[0] == keys[1] and len({plain, keys[0], keys[2]}) == 3
    assert prefix_key({"prompt_token_ids": BLOCK[:15], "cache_salt": "a"}, 16) is None
    assert prefix_key({"prompt_token_ids": BLOCK, "cache_salt": ["a"]}, 16) is None


def test_text_prefix_key_is_of_the_text_a_first_block_covers() -> None:
    """A text prompt's key is its first block_size * CHARS_PER_TOKEN characters."""
    reach = 16 * CHARS_PER_TOKEN
    shared = "s" * reach
    key = prefix_key(shared + " one question", 16)
    assert key is not None
    assert prefix_key({"prompt": shared + " another"}, 16) == key
    assert prefix_key(shared[:-1] + "t and more", 16) != key
    assert prefix_key(shared[:-1], 16) is None  # shorter than a block's text
