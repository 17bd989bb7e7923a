/* Elementwise x * alpha and a + b over contiguous float32 or bfloat16 tensors: the residual
 * scales and adds of Granite and OLMo 2 (models/granite.py, models/olmo2.py) as launches a
 * captured decode step replays. Each result is computed in float32 and, in bfloat16, rounded
 * once, as torch computes a bfloat16 tensor times a Python scalar or the sum of two bfloat16
 * tensors, so the bits are torch's. */
#include "bf16.h"
#include "ops.h"

/* Elements [begin, end), built for each instruction set (CPU_DISPATCH). */
CPU_DISPATCH
static void scale_range(void *out, const void *x, float alpha, int bf16, int64_t begin,
                        int64_t end) {
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) store16_as(out, i, load16_as(x, i, bf16) * alpha, bf16);
  for (; i < end; i++) store1_as(out, i, load1_as(x, i, bf16) * alpha, bf16);
}

CPU_DISPATCH
static void add_range(void *out, const void *a, const void *b, int bf16, int64_t begin,
                      int64_t end) {
  int64_t i = begin;
  for (; i + 16 <= end; i += 16)
    store16_as(out, i, load16_as(a, i, bf16) + load16_as(b, i, bf16), bf16);
  for (; i < end; i++) store1_as(out, i, load1_as(a, i, bf16) + load1_as(b, i, bf16), bf16);
}

/* Chunks of 16K elements: a decode step's rows take one thread, no parallel region. */
#define CHUNK 16384

void scale(void *out, const void *x, float alpha, int bf16, int64_t n, int num_threads) {
  if (n <= CHUNK) {
    scale_range(out, x, alpha, bf16, 0, n);
    return;
  }
#pragma omp parallel for schedule(static) num_threads(num_threads)
  for (int64_t c = 0; c < (n + CHUNK - 1) / CHUNK; c++)
    scale_range(out, x, alpha, bf16, c * CHUNK, c * CHUNK + CHUNK < n ? c * CHUNK + CHUNK : n);
}

void add(void *out, const void *a, const void *b, int bf16, int64_t n, int num_threads) {
  if (n <= CHUNK) {
    add_range(out, a, b, bf16, 0, n);
    return;
  }
#pragma omp parallel for schedule(static) num_threads(num_threads)
  for (int64_t c = 0; c < (n + CHUNK - 1) / CHUNK; c++)
    add_range(out, a, b, bf16, c * CHUNK, c * CHUNK + CHUNK < n ? c * CHUNK + CHUNK : n);
}
