/* SiluAndMul: out [T, I] = silu(x[:, :I]) * x[:, I:] for x [T, 2I], one pass, on float32 or
 * bfloat16. In bfloat16 silu(gate) is rounded before the product, as torch's F.silu on a
 * bfloat16 tensor rounds it (_torch_ops.silu_and_mul); exp16 may differ from torch's exp in
 * the last float bit, which can move that rounding by one bfloat16 step, and below -88, where
 * exp16 clamps, silu is ~-1e-36 where torch's is -0. */
#include "bf16.h"
#include "ops.h"

/* Row t: out[t] = silu(x[t, :d]) * x[t, d:]. */
INLINE void silu_and_mul_row(void *out, const void *x, int64_t d, int64_t t, int bf16) {
  const void *gates = element_at(x, 2 * t * d, bf16);
  const void *ups = element_at(x, (2 * t + 1) * d, bf16);
  void *out_row = element_at(out, t * d, bf16);
  int64_t i = 0;
  for (; i + 16 <= d; i += 16) {
    vec16 gate = load16_as(gates, i, bf16);
    vec16 silu = gate / (1.0f + exp16(-gate));
    if (bf16) silu = round16_bf16(silu);
    store16_as(out_row, i, silu * load16_as(ups, i, bf16), bf16);
  }
  if (i < d) {
    float tail[16] = {0};
    for (int64_t j = i; j < d; j++) tail[j - i] = load1_as(gates, j, bf16);
    vec16 gate = load16(tail);
    vec16 silu = gate / (1.0f + exp16(-gate));
    store16(tail, bf16 ? round16_bf16(silu) : silu);
    for (int64_t j = i; j < d; j++)
      store1_as(out_row, j, tail[j - i] * load1_as(ups, j, bf16), bf16);
  }
}

CPU_DISPATCH
static void silu_and_mul_token(void *out, const void *x, int bf16, int64_t d, int64_t t) {
  if (bf16)
    silu_and_mul_row(out, x, d, t, 1);
  else
    silu_and_mul_row(out, x, d, t, 0);
}

void silu_and_mul(void *out, const void *x, int bf16, int64_t num_tokens, int64_t d,
                  int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_tokens * d > 65536)
  for (int64_t t = 0; t < num_tokens; t++) silu_and_mul_token(out, x, bf16, d, t);
}
