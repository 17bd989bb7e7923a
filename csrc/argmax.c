/* Greedy sampling's argmax over float32 or bfloat16 logits rows.
 *
 * torch's CPU argmax walks a row element by element; here a vector pass finds the row's
 * maximum and a second its first index, 4.5-5x faster. Results are torch.argmax's: the first
 * index of the largest value, and the first NaN's index where the row holds one. bfloat16
 * rows are read widened (exact), so their result is that of the row converted to float32,
 * without the conversion's copy.
 */
#include "bf16.h"
#include "ops.h"

INLINE int64_t argmax_row(const void *x, int64_t n, int bf16) {
  vec16 best = splat16(-__builtin_inff());
  ivec16 nan = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const vec16 v = load16_as(x, i, bf16);
    nan |= v != v;
    best = max16(best, v);
  }
  float m = hmax16(best);
  int any_nan = 0;
  for (int l = 0; l < 16; l++) any_nan |= nan[l] != 0;
  for (; i < n; i++) {
    const float v = load1_as(x, i, bf16);
    any_nan |= v != v;
    if (v > m) m = v;
  }
  i = 0;
  if (!any_nan) { /* skip the 16-element chunks without m, a vector compare each */
    const vec16 mv = splat16(m);
    for (; i + 16 <= n; i += 16) {
      const ivec16 eq = load16_as(x, i, bf16) == mv;
      int hit = 0;
      for (int l = 0; l < 16; l++) hit |= eq[l];
      if (hit) break;
    }
  }
  for (; i < n; i++) {
    const float v = load1_as(x, i, bf16);
    if (any_nan ? v != v : v == m) return i;
  }
  return 0; /* n == 0 */
}

CPU_DISPATCH
static int64_t argmax_row_any(const void *x, int64_t n, int bf16) {
  return bf16 ? argmax_row(x, n, 1) : argmax_row(x, n, 0);
}

void argmax(int64_t *out, const void *x, int bf16, int64_t rows, int64_t n, int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads) if (rows > 1)
  for (int64_t r = 0; r < rows; r++) out[r] = argmax_row_any(element_at(x, r * n, bf16), n, bf16);
}
