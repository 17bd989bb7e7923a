/* What gguf_mm.c passes the per-instruction-set builds of the quantized matmul
 * (gguf_mm_kernel.h): the quantized x rows, the packed weight (gguf_packed.h) and y. */
#ifndef PAGEDLLM_GGUF_MM_H
#define PAGEDLLM_GGUF_MM_H

#include <stdint.h>

#include "gguf_packed.h"

typedef struct {
  const int8_t *q;      /* [M, K]: x quantized, blocks of 32 */
  const float *d;       /* [M, K / 32]: the blocks' scales da */
  const float *ds;      /* [M, K / 32]: da * sum(q) */
  const int32_t *sum16; /* [M, K / 32, 2]: sum(q) over each half block */
  const uint8_t *w;     /* packed groups */
  const void *bias;     /* [N], y's dtype, or NULL */
  void *y;              /* [M, N], float32 or bfloat16 (y_bf16) */
  int64_t M, N, K;
  gguf_sections sec;
  int qtype, y_bf16;
} gguf_mm_args;

/* y for the column groups [g0, g1) and every row. */
typedef void (*gguf_mm_fn)(const gguf_mm_args *a, int64_t g0, int64_t g1);

void gguf_mm_groups_avx512_vnni(const gguf_mm_args *a, int64_t g0, int64_t g1);
void gguf_mm_groups_avx2(const gguf_mm_args *a, int64_t g0, int64_t g1);
void gguf_mm_groups_portable(const gguf_mm_args *a, int64_t g0, int64_t g1);

#endif
