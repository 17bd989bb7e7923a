/* RMSNorm and LayerNorm, alone and fused with the residual add, a few passes over each row
 * in registers, on float32 or bfloat16 tensors.
 *
 * torch spends ~10 small ops per norm (square, mean, add, rsqrt, two muls, dtype casts); at
 * decode sizes each costs more in dispatch than in arithmetic, twice per layer. In bfloat16
 * the kernels round where torch's definition (_torch_ops.rms_norm, layer_norm) rounds:
 * x + residual, RMSNorm's x * rsqrt(...) before the weight, and the result.
 */
#include "bf16.h"
#include "ops.h"

/* out_row = row * rsqrt(mean(row^2) + eps) * weight, rows of n. */
INLINE void norm_row(void *out_row, const void *row, const void *weight, float eps, int64_t n,
                     int bf16) {
  vec16 acc = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) acc += load16_as(row, i, bf16) * load16_as(row, i, bf16);
  float sum = hsum16(acc);
  for (; i < n; i++) sum += load1_as(row, i, bf16) * load1_as(row, i, bf16);
  float inv_rms = 1.0f / __builtin_sqrtf(sum / (float)n + eps);
  for (i = 0; i + 16 <= n; i += 16) {
    vec16 normed = load16_as(row, i, bf16) * inv_rms;
    if (bf16) normed = round16_bf16(normed);
    store16_as(out_row, i, normed * load16_as(weight, i, bf16), bf16);
  }
  for (; i < n; i++) {
    float normed = load1_as(row, i, bf16) * inv_rms;
    if (bf16) normed = round_bf16(normed);
    store1_as(out_row, i, normed * load1_as(weight, i, bf16), bf16);
  }
}

/* out_row = (row - mean) * rsqrt(var + eps) * weight + bias, var the mean of (row - mean)^2
 * (two passes, as torch's F.layer_norm: no cancellation when the mean is large), rounded
 * once to bfloat16 when bf16, as torch rounds its float32 result. */
INLINE void layer_norm_row(void *out_row, const void *row, const void *weight, const void *bias,
                           float eps, int64_t n, int bf16) {
  vec16 acc = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) acc += load16_as(row, i, bf16);
  float sum = hsum16(acc);
  for (; i < n; i++) sum += load1_as(row, i, bf16);
  const float mean = sum / (float)n;
  vec16 squares = {0};
  for (i = 0; i + 16 <= n; i += 16) {
    const vec16 d = load16_as(row, i, bf16) - mean;
    squares += d * d;
  }
  float var = hsum16(squares);
  for (; i < n; i++) {
    const float d = load1_as(row, i, bf16) - mean;
    var += d * d;
  }
  const float rstd = 1.0f / __builtin_sqrtf(var / (float)n + eps);
  for (i = 0; i + 16 <= n; i += 16) {
    const vec16 normed = (load16_as(row, i, bf16) - mean) * rstd;
    store16_as(out_row, i, normed * load16_as(weight, i, bf16) + load16_as(bias, i, bf16), bf16);
  }
  for (; i < n; i++) {
    const float normed = (load1_as(row, i, bf16) - mean) * rstd;
    store1_as(out_row, i, normed * load1_as(weight, i, bf16) + load1_as(bias, i, bf16), bf16);
  }
}

/* Row r of sum = x + residual, all [rows, n]. */
INLINE void add_row(void *sum, const void *x, const void *residual, int64_t n, int64_t r,
                    int bf16) {
  const int64_t end = (r + 1) * n;
  int64_t i = r * n;
  for (; i + 16 <= end; i += 16)
    store16_as(sum, i, load16_as(x, i, bf16) + load16_as(residual, i, bf16), bf16);
  for (; i < end; i++) store1_as(sum, i, load1_as(x, i, bf16) + load1_as(residual, i, bf16), bf16);
}

/* Rows [first, last) of out; x's row r starts at element (r / group) * group_stride +
 * (r % group) * n. */
CPU_DISPATCH
static void rms_norm_rows(void *out, const void *x, const void *weight, int bf16, float eps,
                          int64_t n, int64_t group, int64_t group_stride, int64_t first,
                          int64_t last) {
  for (int64_t r = first; r < last; r++) {
    const int64_t at = r / group * group_stride + r % group * n;
    if (bf16)
      norm_row(element_at(out, r * n, 1), element_at(x, at, 1), weight, eps, n, 1);
    else
      norm_row(element_at(out, r * n, 0), element_at(x, at, 0), weight, eps, n, 0);
  }
}

CPU_DISPATCH
static void fused_add_rms_norm_rows(void *out, void *residual_out, const void *x,
                                    const void *residual, const void *weight, int bf16,
                                    float eps, int64_t n, int64_t first, int64_t last) {
  for (int64_t r = first; r < last; r++) {
    if (bf16) {
      add_row(residual_out, x, residual, n, r, 1);
      norm_row(element_at(out, r * n, 1), element_at(residual_out, r * n, 1), weight, eps, n, 1);
    } else {
      add_row(residual_out, x, residual, n, r, 0);
      norm_row(element_at(out, r * n, 0), element_at(residual_out, r * n, 0), weight, eps, n, 0);
    }
  }
}

CPU_DISPATCH
static void layer_norm_rows(void *out, void *residual_out, const void *x, const void *residual,
                            const void *weight, const void *bias, int bf16, float eps, int64_t n,
                            int64_t first, int64_t last) {
  for (int64_t r = first; r < last; r++) {
    if (bf16) {
      const void *row = element_at(x, r * n, 1);
      if (residual) {
        add_row(residual_out, x, residual, n, r, 1);
        row = element_at(residual_out, r * n, 1);
      }
      layer_norm_row(element_at(out, r * n, 1), row, weight, bias, eps, n, 1);
    } else {
      const void *row = element_at(x, r * n, 0);
      if (residual) {
        add_row(residual_out, x, residual, n, r, 0);
        row = element_at(residual_out, r * n, 0);
      }
      layer_norm_row(element_at(out, r * n, 0), row, weight, bias, eps, n, 0);
    }
  }
}

/* Rows per task: enough work that a thread is worth waking. */
#define ROWS_PER_TASK(n) (1 + 16384 / (n))

void rms_norm(void *out, const void *x, const void *weight, int bf16, float eps, int64_t rows,
              int64_t n, int64_t group, int64_t group_stride, int num_threads) {
  const int64_t step = ROWS_PER_TASK(n);
#pragma omp parallel for schedule(static) num_threads(num_threads) if (rows > step)
  for (int64_t r = 0; r < rows; r += step)
    rms_norm_rows(out, x, weight, bf16, eps, n, group, group_stride, r,
                  r + step < rows ? r + step : rows);
}

void fused_add_rms_norm(void *out, void *residual_out, const void *x, const void *residual,
                        const void *weight, int bf16, float eps, int64_t rows, int64_t n,
                        int num_threads) {
  const int64_t step = ROWS_PER_TASK(n);
#pragma omp parallel for schedule(static) num_threads(num_threads) if (rows > step)
  for (int64_t r = 0; r < rows; r += step)
    fused_add_rms_norm_rows(out, residual_out, x, residual, weight, bf16, eps, n, r,
                            r + step < rows ? r + step : rows);
}

void layer_norm(void *out, void *residual_out, const void *x, const void *residual,
                const void *weight, const void *bias, int bf16, float eps, int64_t rows,
                int64_t n, int num_threads) {
  const int64_t step = ROWS_PER_TASK(n);
#pragma omp parallel for schedule(static) num_threads(num_threads) if (rows > step)
  for (int64_t r = 0; r < rows; r += step)
    layer_norm_rows(out, residual_out, x, residual, weight, bias, bf16, eps, n, r,
                    r + step < rows ? r + step : rows);
}
