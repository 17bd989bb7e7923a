/* The per-instruction-set builds of float32 prefill attention
 * (prefill_attention_f32_kernel.h) and their arguments: prefill_attention_f32's (ops.h). */
#ifndef PAGEDLLM_PREFILL_ATTENTION_F32_H
#define PAGEDLLM_PREFILL_ATTENTION_F32_H

#include <stdint.h>

typedef struct {
  float *out;
  const float *q;
  const void *k_cache, *v_cache;
  int kv_bf16;
  const int32_t *block_table;
  int64_t n, seq_len, H, KV, D, block_size;
  float scale;
  int64_t sliding_window; /* a query sees its last this many keys; 0: all */
  float soft_cap;         /* scores capped at +-soft_cap by tanh; 0: not */
  int num_threads;
} prefill_attention_f32_args;

typedef int (*prefill_attention_f32_fn)(const prefill_attention_f32_args *a);

int prefill_attention_f32_run_avx512(const prefill_attention_f32_args *a);
int prefill_attention_f32_run_avx2(const prefill_attention_f32_args *a);
int prefill_attention_f32_run_portable(const prefill_attention_f32_args *a);

#endif
