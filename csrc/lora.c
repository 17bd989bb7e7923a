/* A LoRA slot's delta added to the rows that use the slot (lora/layers.py): out[t] = y[t] +
 * delta[t] where row_slots[t] == slot, else y[t] as it is. In bfloat16 each sum is taken in
 * float32 and rounded once, as torch adds two bfloat16 tensors, so a row's bits are those of
 * `y + delta` whichever other rows and slots share the step. */
#include <string.h>

#include "bf16.h"
#include "ops.h"

INLINE void add_row(void *out, const void *y, const void *delta, int64_t n, int bf16) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    store16_as(out, i, load16_as(y, i, bf16) + load16_as(delta, i, bf16), bf16);
  for (; i < n; i++) store1_as(out, i, load1_as(y, i, bf16) + load1_as(delta, i, bf16), bf16);
}

/* Rows [begin, end) of the masked add, built for each instruction set (CPU_DISPATCH). */
CPU_DISPATCH
static void masked_add_rows(void *out, const void *y, const void *delta,
                            const int32_t *row_slots, int64_t slot, int bf16, int64_t begin,
                            int64_t end, int64_t n) {
  for (int64_t t = begin; t < end; t++) {
    void *out_row = element_at(out, t * n, bf16);
    const void *y_row = element_at(y, t * n, bf16);
    if (row_slots[t] != slot)
      memcpy(out_row, y_row, n * (bf16 ? 2 : 4));
    else if (bf16)
      add_row(out_row, y_row, element_at(delta, t * n, 1), n, 1);
    else
      add_row(out_row, y_row, element_at(delta, t * n, 0), n, 0);
  }
}

void lora_masked_add(void *out, const void *y, const void *delta, const int32_t *row_slots,
                     int64_t slot, int bf16, int64_t rows, int64_t n, int num_threads) {
  if (rows * n <= 65536) { /* a decode step's rows: one thread, no parallel region */
    masked_add_rows(out, y, delta, row_slots, slot, bf16, 0, rows, n);
    return;
  }
#pragma omp parallel for schedule(static) num_threads(num_threads)
  for (int64_t t = 0; t < rows; t++)
    masked_add_rows(out, y, delta, row_slots, slot, bf16, t, t + 1, n);
}

/* a [n] . x [n], a and x of the tensors' dtype (bf16 or float32), summed in float32. */
INLINE float dot_as(const void *a, const void *x, int64_t n, int bf16) {
  vec16 acc = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) acc += load16_as(a, i, bf16) * load16_as(x, i, bf16);
  float sum = hsum16(acc);
  for (; i < n; i++) sum += load1_as(a, i, bf16) * load1_as(x, i, bf16);
  return sum;
}

INLINE float rounded(float v, int bf16) { return bf16 ? round_bf16(v) : v; }

/* acc [n] += c * b [n] (b of the tensors' dtype), in float32. */
INLINE void axpy_as(float *acc, float c, const void *b, int64_t n, int bf16) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) store16_as(acc, i, load16_as(acc, i, 0) + c * load16_as(b, i, bf16), 0);
  for (; i < n; i++) acc[i] += c * load1_as(b, i, bf16);
}

/* Rows [begin, end) of lora_apply (CPU_DISPATCH): a row's shrink into t (rounded to the
 * dtype, as the first matmul's output), then each sub-matrix's rows of the delta as the sum
 * over its rank columns of t[r] times B's row r (B transposed, so each term is one pass over
 * contiguous outputs), rounded as the second matmul's output and added to y (rounded once). */
CPU_DISPATCH
static void lora_apply_rows(void *out, const void *y, const void *x, const void *lora_a,
                            const void *lora_bt, const int32_t *row_slots,
                            const int64_t *bounds, int64_t num_subs, int64_t rank, int bf16,
                            int64_t begin, int64_t end, int64_t k, int64_t n) {
  const int64_t width = num_subs * rank;
  float t[width];
  float acc[n];
  for (int64_t row = begin; row < end; row++) {
    void *out_row = element_at(out, row * n, bf16);
    const void *y_row = element_at(y, row * n, bf16);
    const int32_t slot = row_slots[row];
    if (slot < 0) {
      memcpy(out_row, y_row, n * (bf16 ? 2 : 4));
      continue;
    }
    const void *x_row = element_at(x, row * k, bf16);
    for (int64_t w = 0; w < width; w++) {
      const void *a_row = element_at(lora_a, (slot * width + w) * k, bf16);
      t[w] = rounded(dot_as(a_row, x_row, k, bf16), bf16);
    }
    memset(acc, 0, n * sizeof(float));
    for (int64_t sub = 0; sub < num_subs; sub++) {
      const int64_t first = bounds[sub], rows_of_sub = bounds[sub + 1] - bounds[sub];
      for (int64_t r = sub * rank; r < (sub + 1) * rank; r++) {
        if (t[r] == 0.0f) continue; /* an unused rank column (or a zero product) */
        const void *bt_row = element_at(lora_bt, (slot * width + r) * n + first, bf16);
        axpy_as(acc + first, t[r], bt_row, rows_of_sub, bf16);
      }
    }
    int64_t o = 0;
    for (; o + 16 <= n; o += 16) {
      vec16 delta = load16_as(acc, o, 0);
      if (bf16) delta = round16_bf16(delta);
      store16_as(out_row, o, load16_as(y_row, o, bf16) + delta, bf16);
    }
    for (; o < n; o++)
      store1_as(out_row, o, load1_as(y_row, o, bf16) + rounded(acc[o], bf16), bf16);
  }
}

void lora_apply(void *out, const void *y, const void *x, const void *lora_a, const void *lora_bt,
                const int32_t *row_slots, const int64_t *bounds, int64_t num_subs, int64_t rank,
                int bf16, int64_t rows, int64_t k, int64_t n, int num_threads) {
  if (rows <= 16) { /* a decode step's rows: one thread, no parallel region */
    lora_apply_rows(out, y, x, lora_a, lora_bt, row_slots, bounds, num_subs, rank, bf16, 0,
                    rows, k, n);
    return;
  }
#pragma omp parallel for schedule(static) num_threads(num_threads)
  for (int64_t row = 0; row < rows; row++)
    lora_apply_rows(out, y, x, lora_a, lora_bt, row_slots, bounds, num_subs, rank, bf16, row,
                    row + 1, k, n);
}
