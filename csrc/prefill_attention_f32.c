/* Causal attention of one sequence's prefill chunk in float32, read from the paged cache
 * (float32 or bf16): the builds of prefill_attention_f32_kernel.h, one per instruction set at
 * its register width (16 lanes on AVX-512, 8 on AVX2, 4 elsewhere), the best the CPU has
 * picked at the first call, or the one the caller names (the tests run each). Each build's
 * rows are the bits of the same build of decode attention (paged_attention.c), their shared
 * arithmetic in attention_row.h.
 *
 * Replaces torch's sdpa for the prefill chunks of float32 and bf16 models: sdpa's bits are
 * not decode attention's, and its CPU kernels run the default model's shapes at 25-85
 * GFLOP/s (BENCHMARKS.md says what this one costs).
 */
#include "isa_table.h"
#include "ops.h"
#include "prefill_attention_f32.h"

static const struct {
  isa_entry isa;
  prefill_attention_f32_fn run;
} ISAS[] = {VECTOR_BUILDS(prefill_attention_f32_run)};

ISA_TABLE(prefill_attention_f32, ISAS)

int prefill_attention_f32(float *out, const float *q, const void *k_cache, const void *v_cache,
                          int kv_bf16, const int32_t *block_table, int64_t n, int64_t seq_len,
                          int64_t H, int64_t KV, int64_t D, int64_t block_size, float scale,
                          int64_t sliding_window, float soft_cap, int isa, int num_threads) {
  const prefill_attention_f32_args a = {out, q,  k_cache, v_cache, kv_bf16, block_table,
                                        n,   seq_len, H, KV, D, block_size, scale,
                                        sliding_window, soft_cap, num_threads};
  return ISAS[isa < 0 ? best_isa() : isa].run(&a);
}
