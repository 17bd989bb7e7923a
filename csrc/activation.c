/* SiluAndMul: out [T, I] = silu(x[:, :I]) * x[:, I:] for x [T, 2I], one pass. */
#include "ops.h"
#include "vec.h"

CPU_DISPATCH
static void silu_and_mul_row(float *out, const float *x, int64_t d) {
  int64_t i = 0;
  for (; i + 16 <= d; i += 16) {
    vec16 gate = load16(x + i);
    store16(out + i, gate / (1.0f + exp16(-gate)) * load16(x + d + i));
  }
  if (i < d) {
    float tail[16] = {0};
    memcpy(tail, x + i, (size_t)(d - i) * sizeof(float));
    vec16 gate = load16(tail);
    store16(tail, gate / (1.0f + exp16(-gate)));
    for (int64_t j = i; j < d; j++) out[j] = tail[j - i] * x[d + j];
  }
}

void silu_and_mul(float *out, const float *x, int64_t num_tokens, int64_t d, int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_tokens * d > 65536)
  for (int64_t t = 0; t < num_tokens; t++) silu_and_mul_row(out + t * d, x + 2 * t * d, d);
}
