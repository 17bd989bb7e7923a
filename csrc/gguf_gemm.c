/* y [M, N] = x [M, K] @ dequant(w)^T (+ bias) on GGUF blocks, for the few rows of a decode step.
 *
 * x is quantized to 8-bit blocks of 32 once per call (q8_act, one scratch allocation); then
 * each thread takes a contiguous range of weight rows and streams it once per 4 x rows through
 * the kernels of the best instruction set the CPU has, or of the one the caller names.
 */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "isa_table.h"
#include "ops.h"

#if defined(__x86_64__) && defined(__GNUC__)
static int has_avx512_vnni(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

static int has_avx2(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
}
#endif

static const struct {
  isa_entry isa;
  gguf_quantize_fn quantize;
  gguf_rows_fn rows;
} ISAS[] = {
#if defined(__x86_64__) && defined(__GNUC__)
    {{"avx512_vnni", has_avx512_vnni}, gguf_quantize_rows_avx512_vnni, gguf_dot_rows_avx512_vnni},
    {{"avx2", has_avx2}, gguf_quantize_rows_avx2, gguf_dot_rows_avx2},
#endif
    {{"portable", isa_always}, gguf_quantize_rows_portable, gguf_dot_rows_portable},
};

ISA_TABLE(gguf, ISAS)

/* q8_act for M rows of K in one allocation (*buffer, to free), its pads zeroed. */
static int alloc_act(q8_act *a, void **buffer, int64_t M, int64_t K) {
  const int64_t q_stride = (K + 63) / 64 * 64, nb8 = (K / QK + 7) / 8 * 8;
  const size_t q = (size_t)(M * q_stride), scales = (size_t)(M * nb8) * sizeof(float);
  const size_t size = q + 2 * scales + (size_t)(M * nb8 * LANES) * sizeof(int32_t);
  char *p = aligned_alloc(64, (size + 64) / 64 * 64);
  if (!p) return -1;
  memset(p + q, 0, size - q);
  *a = (q8_act){(int8_t *)p, (float *)(p + q), (float *)(p + q + scales),
                (int32_t *)(p + q + 2 * scales), K, q_stride, nb8};
  *buffer = p;
  return 0;
}

int gguf_gemm(const float *x, const uint8_t *w, const float *bias, float *y, int qtype, int64_t M,
              int64_t N, int64_t K, int isa, int num_threads) {
  const int i = isa < 0 ? best_isa() : isa;
  q8_act a;
  void *buffer;
  if (alloc_act(&a, &buffer, M, K) < 0) return -1;
  const int64_t row_bytes = K / gguf_block_elems(qtype) * gguf_block_bytes(qtype);
  const gguf_problem p = {&a, w, bias, y, M, N, row_bytes, qtype};
  /* below ~64 KiB of weight bytes times x rows, a second thread costs more than it saves */
#pragma omp parallel num_threads(num_threads) if (N * p.row_bytes * M >= 65536)
  {
    const int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
    ISAS[i].quantize(x, &a, M * t / T, M * (t + 1) / T);
#pragma omp barrier
    ISAS[i].rows(&p, N * t / T, N * (t + 1) / T);
  }
  free(buffer);
  return 0;
}
