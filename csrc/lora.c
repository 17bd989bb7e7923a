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
