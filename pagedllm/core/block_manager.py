"""Paged KV blocks: ref counts, an LRU free queue, and the prefix-cache hash chain.

A physical block holds the KV of `block_size` consecutive tokens of one or more
sequences. Prefix caching (as in vLLM and nano-vllm): the hash of full block i is
xxhash64(hash of block i-1, token ids of block i), so equal hashes mean equal prefixes;
a request's `cache_salt` stands in for block 0's parent, so salted chains are shared only
by requests with the same salt (vLLM's prefix-cache isolation).
A block is registered under its hash only once its KV is computed (`mark_computed`), so
a lookup never finds a block that is still being written.

Freed blocks keep their hash and KV and stay findable until evicted: free blocks form an
LRU queue, and a fresh block is taken from its front (evicting its hash). A sequence's
blocks are freed tail first, so its later blocks are evicted before its shared prefix;
blocks without a registered hash hold nothing reusable and go to the front at once.

Forking (n > 1 sampling) shares all of the parent's blocks. A block is copied on write:
`append_slots` gives a sequence its own copy of any shared block it is about to write and
returns the (src, dst) pairs the model runner must copy before the forward pass.
"""

import json
from array import array
from collections import OrderedDict
from dataclasses import dataclass

import xxhash

from pagedllm.core.sequence import Sequence

# The seed of a LoRA request's block-0 key, apart from a cache_salt's (seed 0).
_LORA_SEED = 1


def hash_block(
    parent_hash: int | None,
    token_ids: list[int],
    cache_salt: str | None = None,
    lora_key: str | None = None,
) -> int:
    """xxhash64 of the parent's hash (8 bytes little-endian, absent for block 0) and the
    block's token ids as int64. A salted block 0 (vLLM's cache_salt) takes the xxhash64 of
    the salt's UTF-8 bytes as its parent, so the chain carries the salt to every block; a
    LoRA request's block 0, that of [salt, adapter's content key] as JSON under another
    seed, so no salt alone can stand for an adapter's chain (whose KV the adapter computed)."""
    if lora_key is not None:
        assert parent_hash is None, "only block 0 is salted"
        key = json.dumps([cache_salt, lora_key]).encode()
        parent_hash = xxhash.xxh64_intdigest(key, seed=_LORA_SEED)
    elif cache_salt is not None:
        assert parent_hash is None, "only block 0 is salted"
        parent_hash = xxhash.xxh64_intdigest(cache_salt.encode())
    prefix = b"" if parent_hash is None else parent_hash.to_bytes(8, "little")
    return xxhash.xxh64_intdigest(prefix + array("q", token_ids).tobytes())


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None  # set only while registered in hash_to_block_id


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_block_ids: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.hash_to_block_id: dict[int, int] = {}
        self._num_registered_blocks: dict[int, int] = {}  # seq_id -> blocks hashed so far
        self.prefix_cache_queries = 0  # tokens looked up at admission
        self.prefix_cache_hits = 0  # tokens found in the cache at admission

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced by some sequence."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    @property
    def prefix_cache_hit_rate(self) -> float:
        return (
            self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0
        )

    # Prefix cache lookup and registration.

    def _update_block_hashes(self, seq: Sequence) -> list[int]:
        """Extend seq.block_hashes to cover every full block of seq."""
        hashes = seq.block_hashes
        for i in range(len(hashes), seq.num_tokens // self.block_size):
            if hashes:
                block_hash = hash_block(hashes[-1], seq.block_token_ids(i))
            else:
                tokens = seq.block_token_ids(i)
                block_hash = hash_block(None, tokens, seq.cache_salt, seq.lora_key)
            hashes.append(block_hash)
        return hashes

    def _cached_prefix(self, seq: Sequence) -> list[int]:
        """Block ids of the longest cached chain from seq's start. The last token is never
        counted as cached, since the model must run on it to produce logits. A sequence
        with skip_prefix_cache (it wants logits of every prompt token) reads no cache."""
        if not self.enable_prefix_caching or seq.skip_prefix_cache:
            return []
        hits = []
        for block_hash in self._update_block_hashes(seq):
            block_id = self.hash_to_block_id.get(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        if len(hits) * self.block_size == seq.num_tokens:
            hits.pop()
        return hits

    def num_prefix_hit_tokens(self, seq: Sequence) -> int:
        """Tokens `allocate(seq)` would find in the cache now."""
        return len(self._cached_prefix(seq)) * self.block_size

    def mark_computed(self, seq: Sequence) -> None:
        """Register the full blocks of [0, seq.num_computed_tokens) that are not yet
        registered. If an equal block is already registered (two equal prompts computed in
        the same step), the first stays registered and this one stays private."""
        if not self.enable_prefix_caching:
            return
        start = self._num_registered_blocks[seq.seq_id]
        end = seq.num_computed_tokens // self.block_size
        if end <= start:  # no block filled up since the last call (most decode steps)
            return
        hashes = self._update_block_hashes(seq)
        for i in range(start, end):
            block = self.blocks[seq.block_table[i]]
            if hashes[i] not in self.hash_to_block_id:
                assert block.block_hash is None
                block.block_hash = hashes[i]
                self.hash_to_block_id[hashes[i]] = block.block_id
        self._num_registered_blocks[seq.seq_id] = end

    def reset_prefix_cache(self) -> None:
        """Forget every registered hash; blocks in use keep their KV but are not shared."""
        self.hash_to_block_id.clear()
        for block in self.blocks:
            block.block_hash = None

    # Block pool.

    def _take_free_block(self) -> int:
        """The least recently freed block, its old hash evicted, with ref count 1."""
        block_id, _ = self.free_block_ids.popitem(last=False)
        block = self.blocks[block_id]
        assert block.ref_count == 0
        if block.block_hash is not None:
            assert self.hash_to_block_id[block.block_hash] == block_id
            del self.hash_to_block_id[block.block_hash]
            block.block_hash = None
        block.ref_count = 1
        return block_id

    def _ref(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.free_block_ids[block_id]
        block.ref_count += 1

    def _unref(self, block_id: int) -> None:
        block = self.blocks[block_id]
        assert block.ref_count > 0, f"block {block_id} freed twice"
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free_block_ids[block_id] = None
            if block.block_hash is None:
                self.free_block_ids.move_to_end(block_id, last=False)

    # Sequence-level operations.

    def can_allocate(self, seq: Sequence) -> bool:
        hits = self._cached_prefix(seq)
        num_revived = sum(self.blocks[b].ref_count == 0 for b in hits)
        return seq.num_blocks - len(hits) + num_revived <= self.num_free_blocks

    def allocate(self, seq: Sequence) -> None:
        """Give a waiting sequence blocks for all its tokens, reusing its cached prefix.

        Sets num_computed_tokens and num_cached_tokens to the tokens found in the cache.
        """
        assert not seq.block_table and seq.num_computed_tokens == 0
        hits = self._cached_prefix(seq)
        for block_id in hits:
            self._ref(block_id)
        fresh = [self._take_free_block() for _ in range(seq.num_blocks - len(hits))]
        seq.block_table = hits + fresh
        seq.num_computed_tokens = seq.num_cached_tokens = len(hits) * self.block_size
        self._num_registered_blocks[seq.seq_id] = len(hits)
        if self.enable_prefix_caching:
            self.prefix_cache_queries += seq.num_tokens
            self.prefix_cache_hits += seq.num_cached_tokens

    def _num_missing_blocks(self, seq: Sequence, num_new_tokens: int) -> int:
        end = seq.num_computed_tokens + num_new_tokens
        return max(0, -(-end // self.block_size) - len(seq.block_table))

    def _shared_blocks_to_write(self, seq: Sequence, num_new_tokens: int) -> list[int]:
        """Indices into seq.block_table of shared blocks that the new tokens write into."""
        first = seq.num_computed_tokens // self.block_size
        last = (seq.num_computed_tokens + num_new_tokens - 1) // self.block_size
        last = min(last, len(seq.block_table) - 1)
        table = seq.block_table
        return [i for i in range(first, last + 1) if self.blocks[table[i]].ref_count > 1]

    def appends_in_place(self, seq: Sequence, num_new_tokens: int = 1) -> bool:
        """Whether seq's new tokens land in blocks it already holds alone, so that
        `append_slots` would do nothing: a decode step's usual case, checked without
        building the lists `can_append` and `append_slots` do (the scheduler asks it for
        every running sequence every step)."""
        start, block_size, table = seq.num_computed_tokens, self.block_size, seq.block_table
        end = start + num_new_tokens
        if end > len(table) * block_size:
            return False
        blocks = self.blocks
        for i in range(start // block_size, (end - 1) // block_size + 1):
            if blocks[table[i]].ref_count > 1:
                return False
        return True

    def can_append(self, seq: Sequence, num_new_tokens: int = 1) -> bool:
        needed = self._num_missing_blocks(seq, num_new_tokens)
        needed += len(self._shared_blocks_to_write(seq, num_new_tokens))
        return needed <= self.num_free_blocks

    def append_slots(self, seq: Sequence, num_new_tokens: int = 1) -> list[tuple[int, int]]:
        """Make seq's block table hold tokens [0, num_computed_tokens + num_new_tokens) in
        blocks that seq alone writes. Returns (src_block, dst_block) copies the runner must
        do before the forward pass (copy-on-write after a fork)."""
        copies = []
        shared = self._shared_blocks_to_write(seq, num_new_tokens)
        if shared:  # a new list, not an edit: see Sequence.block_table
            seq.block_table = list(seq.block_table)
        for i in shared:
            src = seq.block_table[i]
            dst = self._take_free_block()
            self._unref(src)
            seq.block_table[i] = dst
            copies.append((src, dst))
        for _ in range(self._num_missing_blocks(seq, num_new_tokens)):
            seq.block_table.append(self._take_free_block())
        return copies

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Let child share all of parent's blocks and computed tokens."""
        assert not child.block_table and child.token_ids == parent.token_ids
        for block_id in parent.block_table:
            self._ref(block_id)
        child.block_table = list(parent.block_table)
        child.block_hashes = list(parent.block_hashes)
        child.num_computed_tokens = parent.num_computed_tokens
        self._num_registered_blocks[child.seq_id] = self._num_registered_blocks[parent.seq_id]

    def free(self, seq: Sequence) -> None:
        """Release seq's blocks, tail first so that its shared prefix is evicted last."""
        for block_id in reversed(seq.block_table):
            self._unref(block_id)
        seq.block_table = []
        seq.num_computed_tokens = 0
        self._num_registered_blocks.pop(seq.seq_id, None)

    def check_invariants(self, live_seqs: list[Sequence]) -> None:
        """Assert that ref counts equal the uses in live_seqs' block tables, that the free
        queue holds exactly the unreferenced blocks, and that the hash map and the blocks'
        hashes agree. For tests and debugging; O(num_blocks)."""
        uses = [0] * self.num_blocks
        for seq in live_seqs:
            for block_id in seq.block_table:
                uses[block_id] += 1
        assert uses == [b.ref_count for b in self.blocks], "ref counts disagree with tables"
        unreferenced = {b.block_id for b in self.blocks if b.ref_count == 0}
        assert set(self.free_block_ids) == unreferenced, "free queue is not the free blocks"
        registered = {b.block_hash: b.block_id for b in self.blocks if b.block_hash is not None}
        assert registered == self.hash_to_block_id, "hash map disagrees with block hashes"
