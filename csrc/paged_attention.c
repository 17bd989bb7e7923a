/* Decode attention straight from the paged KV cache.
 *
 * Each query head scores every cached key of its sequence in place (found through the block
 * table, never copied into a padded batch), takes a softmax and sums the values. The torch
 * reference (attention_backends/torch_sdpa.py) gathers all keys into a [B, max_seq_len]
 * copy first, which dominated large decode steps. Keys and values are read as whole token
 * rows [KV, D], in order, a vector's width of tokens at a time (16 on AVX-512) for all heads
 * of a task, in three passes as vLLM's CPU paged attention: every head's scores over the
 * keys, their softmax, then the values weighted by it. An online softmax (one pass over keys
 * and values, the output rescaled chunk by chunk) spent more on each chunk's horizontal max,
 * exponentials and rescaling than on its rows, and on AVX2 the 3 heads' 24 running output
 * vectors did not fit the 16 registers: the three passes are 1.15-1.4x faster from 1 to 256
 * sequences, float32 or bf16 cache (`pagedllm bench latency --batch-size 1`, or 256,
 * re-measures it).
 *
 * Head sizes that are multiples of 32 (all common ones; 16 on AVX2) take the grouped path:
 * the query heads of one kv head (up to HEAD_GROUP at a time) share each key row, widened
 * once, and the next chunk's rows are prefetched a token at a time rather than in one burst
 * (whose prefetches stalled on the line fill buffers). On the default model's shapes (9
 * heads, 3 kv heads, D 64, bf16 cache, 32 sequences of 400 tokens) that was 1.65x the
 * per-head path (0.97 vs 1.6 ms per layer). Other head sizes score a head at a time.
 *
 * A sequence longer than PARTITION_TOKENS is attended in partitions, each a task with its own
 * softmax, merged at the end (vLLM's paged attention v2): at batch 1 the default
 * model's 3 kv heads were 3 tasks for 2 threads, one thread idle a third of the time.
 *
 * Under a sliding window a query's keys, and so its partitions, start at its window's first
 * key: no earlier row is read, so a windowed decode costs its window, not its context. A logit
 * soft cap passes each head's scores through cap_scores before their softmax; with neither,
 * nothing runs that did not before.
 *
 * A query's arithmetic (attention_row.h) is shared with prefill attention
 * (prefill_attention_f32.c), so a token's output is the same bits as a decode or as a row of a
 * prefill chunk.
 *
 * The kernel (paged_attention_kernel.h) is built once per instruction set at its register
 * width, 16 lanes on AVX-512, 8 on AVX2, 4 elsewhere, and this file picks the best the CPU
 * has, or the one the caller names (the tests run each). With 16-lane vectors everywhere,
 * GCC's AVX2 copy runs at a third of the AVX-512 copy's speed (it lowers 16-lane shuffles a
 * lane at a time, vecn.h).
 */
#include <unistd.h>

#include "isa_table.h"
#include "ops.h"
#include "paged_attention.h"

/* Whether the next chunk's key and value rows are prefetched into L1 (else into L2): only
 * where L1 holds them beside the chunk being read (~24 KB for the default model) with room
 * to spare. Per layer at 256 sequences of ~300 tokens, into L1 is 7-10% faster than into L2
 * with a 48 KiB L1; with a 32 KiB L1, into L2 is 1.4-1.6x faster, L1 evicting rows before
 * their use (`pagedllm bench latency --batch-size 256 --input-len 300` re-measures it). */
static int prefetch_into_l1(void) {
  static int known = -1; /* sysconf once; threads that race here all store the same value */
  int into_l1 = __atomic_load_n(&known, __ATOMIC_RELAXED);
  if (into_l1 < 0) {
    into_l1 = sysconf(_SC_LEVEL1_DCACHE_SIZE) >= 48 * 1024;
    __atomic_store_n(&known, into_l1, __ATOMIC_RELAXED);
  }
  return into_l1;
}

static const struct {
  isa_entry isa;
  paged_attention_fn run;
} ISAS[] = {VECTOR_BUILDS(paged_attention_run)};

ISA_TABLE(paged_attention, ISAS)

int paged_decode_attention(float *out, const float *q, const void *k_cache, const void *v_cache,
                           int kv_bf16, const int32_t *block_tables, const int32_t *seq_lens,
                           int64_t B, int64_t H, int64_t KV, int64_t D, int64_t block_size,
                           int64_t max_blocks, float scale, int64_t sliding_window,
                           float soft_cap, int isa, int num_threads) {
  const paged_attention_args a = {out, q, k_cache, v_cache, kv_bf16, block_tables, seq_lens,
                                  B, H, KV, D, block_size, max_blocks, scale, sliding_window,
                                  soft_cap, prefetch_into_l1(), num_threads};
  return ISAS[isa < 0 ? best_isa() : isa].run(&a);
}

void reshape_and_cache(const void *key, const void *value, int kv_bf16, void *k_cache,
                       void *v_cache, int cache_bf16, const int64_t *slot_mapping,
                       int64_t num_tokens, int64_t key_stride, int64_t value_stride,
                       int64_t row_size) {
  const int64_t in = kv_bf16 ? 2 : 4, out = cache_bf16 ? 2 : 4; /* element bytes */
  for (int64_t t = 0; t < num_tokens; t++) {
    if (slot_mapping[t] < 0) continue; /* a padding token */
    const int64_t slot = slot_mapping[t] * row_size * out;
    convert((char *)k_cache + slot, cache_bf16, (const char *)key + t * key_stride * in, kv_bf16,
            row_size);
    convert((char *)v_cache + slot, cache_bf16, (const char *)value + t * value_stride * in,
            kv_bf16, row_size);
  }
}
