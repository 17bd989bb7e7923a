/* Software prefetch for kernels that stream weights once per step (decode matmuls).
 *
 * With work between the loads (widening, dequantizing, FMAs), the hardware prefetchers alone
 * keep too few lines in flight for a core to read DRAM at full speed: one core streaming 100
 * MB of Q4_1 ran at 7 GB/s without, 13 with; bf16 weights on 2 threads 13-16 GB/s without,
 * 20-27 with, a plain read of the same bytes 23-27. So the kernels ask for the bytes
 * WEIGHT_PREFETCH past those they are reading, as they go.
 */
#ifndef PAGEDLLM_PREFETCH_H
#define PAGEDLLM_PREFETCH_H

#include <stdint.h>

#define WEIGHT_PREFETCH 8192

/* Asks for the cache lines of [p + WEIGHT_PREFETCH, p + WEIGHT_PREFETCH + bytes). */
static inline __attribute__((always_inline)) void prefetch_ahead(const void *p, int64_t bytes) {
  for (int64_t line = 0; line < bytes; line += 64)
    __builtin_prefetch((const char *)p + WEIGHT_PREFETCH + line);
}

#endif
