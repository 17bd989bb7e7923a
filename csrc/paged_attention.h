/* The per-instruction-set builds of decode attention (paged_attention_kernel.h) and what
 * paged_attention.c passes them: paged_decode_attention's arguments (ops.h) and where to
 * prefetch. */
#ifndef PAGEDLLM_PAGED_ATTENTION_H
#define PAGEDLLM_PAGED_ATTENTION_H

#include <stdint.h>

typedef struct {
  float *out;
  const float *q;
  const void *k_cache, *v_cache;
  int kv_bf16;
  const int32_t *block_tables, *seq_lens;
  int64_t B, H, KV, D, block_size, max_blocks;
  float scale;
  int64_t sliding_window; /* a query sees its last this many keys; 0: all */
  float soft_cap;         /* scores capped at +-soft_cap by tanh; 0: not */
  int into_l1; /* prefetch the next chunk's rows into L1 (else L2) */
  int num_threads;
} paged_attention_args;

typedef int (*paged_attention_fn)(const paged_attention_args *a);

int paged_attention_run_avx512(const paged_attention_args *a);
int paged_attention_run_avx2(const paged_attention_args *a);
int paged_attention_run_portable(const paged_attention_args *a);

#endif
