/* RMSNorm, alone and fused with the residual add, in one pass over each row.
 *
 * torch spends ~10 small ops per norm (square, mean, add, rsqrt, two muls, dtype casts); at
 * decode sizes each costs more in dispatch than in arithmetic, twice per layer.
 */
#include "ops.h"
#include "vec.h"

/* out = x * rsqrt(mean(x^2) + eps) * weight for one row of n. */
INLINE void norm_row(const float *x, const float *weight, float eps, int64_t n, float *out) {
  vec16 acc = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) acc += load16(x + i) * load16(x + i);
  float sum = hsum16(acc);
  for (; i < n; i++) sum += x[i] * x[i];
  float inv_rms = 1.0f / __builtin_sqrtf(sum / (float)n + eps);
  for (i = 0; i + 16 <= n; i += 16)
    store16(out + i, load16(x + i) * inv_rms * load16(weight + i));
  for (; i < n; i++) out[i] = x[i] * inv_rms * weight[i];
}

CPU_DISPATCH
static void rms_norm_rows(float *out, const float *x, const float *weight, float eps,
                          int64_t n, int64_t first, int64_t last) {
  for (int64_t r = first; r < last; r++) norm_row(x + r * n, weight, eps, n, out + r * n);
}

CPU_DISPATCH
static void fused_add_rms_norm_rows(float *out, float *residual_out, const float *x,
                                    const float *residual, const float *weight, float eps,
                                    int64_t n, int64_t first, int64_t last) {
  for (int64_t r = first; r < last; r++) {
    float *sum = residual_out + r * n;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
      store16(sum + i, load16(x + r * n + i) + load16(residual + r * n + i));
    for (; i < n; i++) sum[i] = x[r * n + i] + residual[r * n + i];
    norm_row(sum, weight, eps, n, out + r * n);
  }
}

/* Rows per task: enough work that a thread is worth waking. */
#define ROWS_PER_TASK(n) (1 + 16384 / (n))

void rms_norm(float *out, const float *x, const float *weight, float eps, int64_t rows,
              int64_t n, int num_threads) {
  const int64_t step = ROWS_PER_TASK(n);
#pragma omp parallel for schedule(static) num_threads(num_threads) if (rows > step)
  for (int64_t r = 0; r < rows; r += step)
    rms_norm_rows(out, x, weight, eps, n, r, r + step < rows ? r + step : rows);
}

void fused_add_rms_norm(float *out, float *residual_out, const float *x, const float *residual,
                        const float *weight, float eps, int64_t rows, int64_t n,
                        int num_threads) {
  const int64_t step = ROWS_PER_TASK(n);
#pragma omp parallel for schedule(static) num_threads(num_threads) if (rows > step)
  for (int64_t r = 0; r < rows; r += step)
    fused_add_rms_norm_rows(out, residual_out, x, residual, weight, eps, n, r,
                            r + step < rows ? r + step : rows);
}
