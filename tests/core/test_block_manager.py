"""BlockManager: ref counts, the prefix-cache hash chain (vLLM/nano-vllm), LRU eviction and
copy-on-write, checked against hand-computed block layouts."""

from array import array

import pytest
import xxhash

from pagedllm.core.block_manager import BlockManager, hash_block
from pagedllm.core.sequence import Sequence
from pagedllm.lora.registry import LoadedAdapter
from pagedllm.lora.request import LoRARequest


def new_seq(seq_id: int, token_ids: list[int], block_size: int = 4) -> Sequence:
    return Sequence(seq_id, token_ids, block_size)


def admit_and_compute(bm: BlockManager, seq: Sequence) -> None:
    """Allocate, then pretend the model computed every token (a whole prefill)."""
    bm.allocate(seq)
    seq.num_computed_tokens = seq.num_tokens
    bm.mark_computed(seq)


def test_hash_block_is_xxhash64_of_parent_then_tokens() -> None:
    tokens = [1, 2, 3, 4]
    assert hash_block(None, tokens) == xxhash.xxh64_intdigest(array("q", tokens).tobytes())
    parent = hash_block(None, tokens)
    expected = xxhash.xxh64_intdigest(parent.to_bytes(8, "little") + array("q", tokens).tobytes())
    assert hash_block(parent, tokens) == expected != parent


def test_a_salted_block_0_hashes_the_salt_as_its_parent() -> None:
    """vLLM's cache_salt: mixed into block 0's hash only; the chain carries it on."""
    tokens = [1, 2, 3, 4]
    salt_parent = xxhash.xxh64_intdigest(b"salt-a")
    assert hash_block(None, tokens, "salt-a") == hash_block(salt_parent, tokens)
    assert len({hash_block(None, tokens, s) for s in (None, "salt-a", "salt-b")}) == 3


def salted_hashes(token_ids: list[int], salt: str | None) -> list[int]:
    bm = BlockManager(num_blocks=10, block_size=4)
    seq = Sequence(0, token_ids, 4, cache_salt=salt)
    bm.num_prefix_hit_tokens(seq)  # fills seq.block_hashes
    return seq.block_hashes


def test_every_block_hash_depends_on_the_salt() -> None:
    tokens = list(range(12))
    plain, a, b = (salted_hashes(tokens, s) for s in (None, "a", "b"))
    assert salted_hashes(tokens, "a") == a
    assert all(len({x, y, z}) == 3 for x, y, z in zip(plain, a, b, strict=True))
    assert a[1] == hash_block(a[0], tokens[4:8])


@pytest.mark.parametrize("first, second, hits", [("a", "a", 8), ("a", "b", 0), (None, "a", 0)])
def test_salted_prefixes_are_shared_by_the_same_salt_only(
    first: str | None, second: str | None, hits: int
) -> None:
    bm = BlockManager(num_blocks=10, block_size=4)
    admit_and_compute(bm, Sequence(0, list(range(12)), 4, cache_salt=first))
    later = Sequence(1, list(range(12)), 4, cache_salt=second)
    bm.allocate(later)
    assert later.num_cached_tokens == later.num_computed_tokens == hits
    assert (bm.prefix_cache_queries, bm.prefix_cache_hits) == (24, hits)


def test_a_lora_block_0_hashes_the_salt_and_adapter_key_under_another_seed() -> None:
    """Reference: xxhash64 (seed 1) of JSON [salt, adapter key] as block 0's parent."""
    tokens = [1, 2, 3, 4]
    parent = xxhash.xxh64_intdigest(b'["s", "key-a"]', seed=1)
    assert hash_block(None, tokens, "s", "key-a") == hash_block(parent, tokens)
    hashes = {
        hash_block(None, tokens, salt, key)
        for salt in (None, "s", "key-a", '[null, "key-a"]')
        for key in (None, "key-a", "key-b")
    }
    assert len(hashes) == 12  # no salt alone stands for an adapter's chain


def adapter(key: str, lora_int_id: int = 1, path: str = "/a") -> LoadedAdapter:
    return LoadedAdapter(LoRARequest(f"lora{lora_int_id}", lora_int_id, path), key, {})


def lora_hashes(token_ids: list[int], lora: LoadedAdapter | None, salt: str | None) -> list[int]:
    bm = BlockManager(num_blocks=10, block_size=4)
    seq = Sequence(0, token_ids, 4, cache_salt=salt, lora=lora)
    bm.num_prefix_hit_tokens(seq)  # fills seq.block_hashes
    return seq.block_hashes


def test_every_block_hash_depends_on_the_adapters_weights() -> None:
    tokens, a, b = list(range(12)), adapter("key-a"), adapter("key-b", 2, "/b")
    chains = [lora_hashes(tokens, lora, salt) for lora in (None, a, b) for salt in (None, "s")]
    assert all(len(set(blocks)) == 6 for blocks in zip(*chains, strict=True))
    # The weights' key, not the name, id or folder, keys the KV.
    assert lora_hashes(tokens, adapter("key-a", 3, "/elsewhere"), None) == chains[2]
    assert lora_hashes(tokens, adapter("key-a-changed", 1, "/a"), None) != chains[2]


@pytest.mark.parametrize(
    "first, second, hits",
    [("key-a", "key-a", 8), ("key-a", "key-b", 0), (None, "key-a", 0), ("key-a", None, 0)],
)
def test_lora_prefixes_are_shared_by_the_same_adapter_only(
    first: str | None, second: str | None, hits: int
) -> None:
    def lora(key: str | None, lora_int_id: int) -> LoadedAdapter | None:
        return None if key is None else adapter(key, lora_int_id)

    bm = BlockManager(num_blocks=10, block_size=4)
    admit_and_compute(bm, Sequence(0, list(range(12)), 4, lora=lora(first, 1)))
    later = Sequence(1, list(range(12)), 4, lora=lora(second, 2))
    bm.allocate(later)
    assert later.num_cached_tokens == hits


def test_allocate_free_accounting() -> None:
    bm = BlockManager(num_blocks=10, block_size=4)
    seq = new_seq(0, list(range(10)))
    assert bm.can_allocate(seq)
    bm.allocate(seq)
    assert len(seq.block_table) == 3 and len(set(seq.block_table)) == 3
    assert bm.num_free_blocks == 7 and bm.usage == pytest.approx(0.3)
    bm.check_invariants([seq])
    bm.free(seq)
    assert seq.block_table == [] and seq.num_computed_tokens == 0
    assert bm.num_free_blocks == 10 and bm.usage == 0.0
    bm.check_invariants([])


def test_can_allocate_false_when_short_of_blocks() -> None:
    bm = BlockManager(num_blocks=3, block_size=4)
    a = new_seq(0, list(range(8)))
    bm.allocate(a)
    assert not bm.can_allocate(new_seq(1, list(range(100, 109))))  # needs 3, 1 free
    assert bm.can_allocate(new_seq(2, list(range(100, 104))))


def test_same_prefix_different_suffix_shares_full_blocks() -> None:
    bm = BlockManager(num_blocks=10, block_size=4)
    a = new_seq(0, list(range(12)))
    admit_and_compute(bm, a)
    b = new_seq(1, list(range(8)) + [99, 98, 97])
    bm.allocate(b)
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] not in a.block_table
    assert b.num_computed_tokens == b.num_cached_tokens == 8
    assert [bm.blocks[i].ref_count for i in a.block_table] == [2, 2, 1]
    assert (bm.prefix_cache_queries, bm.prefix_cache_hits) == (12 + 11, 8)
    bm.check_invariants([a, b])


def test_different_first_block_shares_nothing() -> None:
    """The hash chains the parent, so equal later blocks after a different start miss."""
    bm = BlockManager(num_blocks=10, block_size=4)
    a = new_seq(0, list(range(12)))
    admit_and_compute(bm, a)
    b = new_seq(1, [50, 51, 52, 53] + list(range(4, 12)))
    bm.allocate(b)
    assert b.num_computed_tokens == 0 and not set(a.block_table) & set(b.block_table)


def test_blocks_are_findable_only_after_mark_computed() -> None:
    bm = BlockManager(num_blocks=10, block_size=4)
    a = new_seq(0, list(range(9)))
    bm.allocate(a)
    b = new_seq(1, list(range(9)))
    assert bm.num_prefix_hit_tokens(b) == 0  # a is allocated but nothing is written yet
    a.num_computed_tokens = 6  # a chunk: block 0 full and computed, block 1 half
    bm.mark_computed(a)
    assert bm.num_prefix_hit_tokens(b) == 4
    a.num_computed_tokens = 9
    bm.mark_computed(a)
    assert bm.num_prefix_hit_tokens(b) == 8
    bm.check_invariants([a])


def test_last_token_is_never_served_from_cache() -> None:
    bm = BlockManager(num_blocks=10, block_size=4)
    a = new_seq(0, list(range(8)))
    admit_and_compute(bm, a)
    bm.free(a)
    same = new_seq(1, list(range(8)))
    bm.allocate(same)
    assert same.num_computed_tokens == 4  # both blocks hit; the last one is given up
    longer = new_seq(2, list(range(9)))
    bm.allocate(longer)
    assert longer.num_computed_tokens == 8
    one_block = new_seq(3, list(range(4)))
    bm.allocate(one_block)
    assert one_block.num_computed_tokens == 0
    bm.check_invariants([same, longer, one_block])


def test_cached_free_block_is_reused_after_request_finished() -> None:
    bm = BlockManager(num_blocks=4, block_size=4)
    a = new_seq(0, list(range(10)))
    admit_and_compute(bm, a)
    first_blocks = a.block_table[:2]
    bm.free(a)
    assert bm.num_free_blocks == 4
    b = new_seq(1, list(range(10)))
    assert bm.can_allocate(b)
    bm.allocate(b)
    assert b.block_table[:2] == first_blocks and b.num_cached_tokens == 8
    assert bm.num_free_blocks == 1  # the revived cached blocks left the free queue
    assert bm.prefix_cache_hit_rate == pytest.approx(8 / 20)
    bm.check_invariants([b])


def test_lru_evicts_least_recently_freed_cached_block_first() -> None:
    bm = BlockManager(num_blocks=6, block_size=2)
    prompts = {name: [base, base + 1, base + 2] for name, base in (("a", 10), ("b", 20), ("c", 30))}
    seqs = [new_seq(i, p, block_size=2) for i, p in enumerate(prompts.values())]
    for seq in seqs:
        admit_and_compute(bm, seq)
    for seq in seqs:  # freed a, b, c: a's full block is the least recent
        bm.free(seq)
    filler = new_seq(9, list(range(100, 107)), block_size=2)
    bm.allocate(filler)  # 4 fresh blocks: 3 uncached partial blocks, then a's cached one
    hits = {name: bm.num_prefix_hit_tokens(new_seq(5, p, 2)) for name, p in prompts.items()}
    assert hits == {"a": 0, "b": 2, "c": 2}
    bm.check_invariants([filler])


def test_a_freed_sequence_loses_its_tail_blocks_first() -> None:
    bm = BlockManager(num_blocks=3, block_size=2)
    a = new_seq(0, [1, 2, 3, 4, 5], block_size=2)
    admit_and_compute(bm, a)
    bm.free(a)
    bm.allocate(new_seq(1, [9], block_size=2))  # evicts the partial block, then a's tail
    bm.allocate(new_seq(2, [8], block_size=2))
    assert bm.num_prefix_hit_tokens(new_seq(3, [1, 2, 3, 4, 5], block_size=2)) == 2


def test_identical_prompts_computed_in_same_step_register_once() -> None:
    bm = BlockManager(num_blocks=6, block_size=4)
    a, b = new_seq(0, list(range(6))), new_seq(1, list(range(6)))
    bm.allocate(a)
    bm.allocate(b)
    for seq in (a, b):
        seq.num_computed_tokens = 6
        bm.mark_computed(seq)
    assert bm.hash_to_block_id == {a.block_hashes[0]: a.block_table[0]}
    bm.check_invariants([a, b])
    bm.free(b)
    bm.free(a)
    assert bm.num_free_blocks == 6
    assert bm.num_prefix_hit_tokens(new_seq(2, list(range(6)))) == 4
    bm.check_invariants([])


def test_append_slots_grows_table_at_block_boundaries() -> None:
    bm = BlockManager(num_blocks=3, block_size=4)
    seq = new_seq(0, list(range(4)))
    admit_and_compute(bm, seq)
    seq.append_token(4)
    assert bm.can_append(seq) and bm.append_slots(seq) == []
    assert len(seq.block_table) == 2
    seq.num_computed_tokens = 5
    seq.append_token(5)
    bm.append_slots(seq)
    assert len(seq.block_table) == 2  # slot 5 lies in block 1
    assert bm.can_append(seq, num_new_tokens=7) and not bm.can_append(seq, num_new_tokens=8)
    bm.check_invariants([seq])


def test_fork_shares_blocks_and_copies_shared_block_on_write() -> None:
    bm = BlockManager(num_blocks=6, block_size=4)
    parent = new_seq(0, list(range(6)))
    admit_and_compute(bm, parent)
    child = new_seq(1, list(range(6)))
    bm.fork(parent, child)
    assert child.block_table == parent.block_table and child.num_computed_tokens == 6
    assert [bm.blocks[i].ref_count for i in parent.block_table] == [2, 2]
    shared_tail = parent.block_table[1]
    parent.append_token(100)
    child.append_token(200)
    copies = bm.append_slots(parent)
    assert copies == [(shared_tail, parent.block_table[1])] and parent.block_table[1] != shared_tail
    assert bm.append_slots(child) == [] and child.block_table[1] == shared_tail
    assert parent.block_table[0] == child.block_table[0]  # the full block stays shared
    bm.check_invariants([parent, child])
    bm.free(parent)
    bm.free(child)
    assert bm.num_free_blocks == 6
    bm.check_invariants([])


def test_can_append_counts_copy_on_write_blocks() -> None:
    bm = BlockManager(num_blocks=3, block_size=4)
    parent = new_seq(0, list(range(6)))
    admit_and_compute(bm, parent)
    bm.fork(parent, new_seq(1, list(range(6))))
    for token in (6, 7, 8):
        parent.append_token(token)
    assert bm.num_free_blocks == 1
    assert bm.can_append(parent, 2)  # copy of the shared tail only
    assert not bm.can_append(parent, 3)  # copy of the tail plus a new block


def test_appends_in_place_exactly_when_append_slots_would_do_nothing() -> None:
    """The scheduler's fast path agrees with append_slots on every case: a slot in an own
    block, a new block needed, a shared block to copy, several tokens across blocks."""
    bm = BlockManager(num_blocks=8, block_size=4)
    parent = new_seq(0, list(range(6)))
    admit_and_compute(bm, parent)
    parent.append_token(6)
    assert bm.appends_in_place(parent)  # slot 6 lies in block 1, parent's alone
    assert not bm.appends_in_place(parent, 3)  # slots 6..8: block 2 is missing
    child = new_seq(1, list(range(7)))
    bm.fork(parent, child)
    assert not bm.appends_in_place(parent) and not bm.appends_in_place(child)  # shared tail
    for seq in (parent, child):
        for n in (1, 2, 3):
            snapshot = (list(seq.block_table), [b.ref_count for b in bm.blocks])
            nothing_to_do = not bm._num_missing_blocks(seq, n)
            nothing_to_do = nothing_to_do and not bm._shared_blocks_to_write(seq, n)
            assert bm.appends_in_place(seq, n) == nothing_to_do
            assert snapshot == (list(seq.block_table), [b.ref_count for b in bm.blocks])
    assert bm.append_slots(parent) != [] and bm.appends_in_place(parent)  # now its own copy
    bm.check_invariants([parent, child])


def test_mark_computed_registers_each_block_once_it_fills() -> None:
    bm = BlockManager(num_blocks=4, block_size=4)
    seq = new_seq(0, list(range(3)))
    admit_and_compute(bm, seq)
    assert not bm.hash_to_block_id  # no full block yet
    for token in range(3, 9):
        seq.append_token(token)
        bm.append_slots(seq)
        seq.num_computed_tokens = seq.num_tokens - 1  # the new token is the next step's
        bm.mark_computed(seq)
        assert len(bm.hash_to_block_id) == (seq.num_tokens - 1) // 4
    assert bm.num_prefix_hit_tokens(new_seq(1, list(range(9)))) == 8
    bm.check_invariants([seq])


def test_prefix_caching_disabled_never_hits() -> None:
    bm = BlockManager(num_blocks=6, block_size=4, enable_prefix_caching=False)
    a = new_seq(0, list(range(9)))
    admit_and_compute(bm, a)
    b = new_seq(1, list(range(9)))
    bm.allocate(b)
    assert b.num_computed_tokens == 0 and bm.hash_to_block_id == {}
    assert bm.prefix_cache_queries == bm.prefix_cache_hits == 0


def test_reset_prefix_cache_forgets_every_block() -> None:
    bm = BlockManager(num_blocks=6, block_size=4)
    a = new_seq(0, list(range(9)))
    admit_and_compute(bm, a)
    bm.reset_prefix_cache()
    assert bm.num_prefix_hit_tokens(new_seq(1, list(range(9)))) == 0
    bm.check_invariants([a])


@pytest.mark.parametrize("num_blocks, block_size", [(0, 4), (4, 0)])
def test_bad_sizes_raise(num_blocks: int, block_size: int) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        BlockManager(num_blocks, block_size)
