/* y [M, N] = x [M, K] @ W^T (+ bias) on a GGUF weight packed by gguf_pack, for any row count.
 *
 * Each x row is quantized to 8-bit blocks of 32 once per call (one scratch allocation); then
 * each thread takes a contiguous range of the weight's column groups and multiplies it with
 * every row through the kernels of the best instruction set the CPU has, or of the one the
 * caller names. The arithmetic (gguf_packed.h) gives each row the same bits whatever the
 * other rows, the row count, the thread count or the instruction set.
 */
#pragma GCC optimize("fp-contract=off") /* the quantizer's x * (1 / d) is rounded alone */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "gguf_mm.h"
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
  gguf_mm_fn groups;
} ISAS[] = {
#if defined(__x86_64__) && defined(__GNUC__)
    {{"avx512_vnni", has_avx512_vnni}, gguf_mm_groups_avx512_vnni},
    {{"avx2", has_avx2}, gguf_mm_groups_avx2},
#endif
    {{"portable", isa_always}, gguf_mm_groups_portable},
};

ISA_TABLE(gguf, ISAS)

/* Block b of one x row, 32 values from x (bf16 or float32): q = round-half-even(x * (1 /
 * da)), da = amax / 127 (1 / da = 0 when amax = 0); returns da and the sums of q over each
 * half block in sum16. Adding and subtracting 1.5 * 2^23 rounds a float of magnitude below
 * 2^22 to an integer, half to even. */
CPU_DISPATCH
static float quantize_block(const void *x, int64_t at, int bf16, int8_t *q, int32_t *sum16) {
  vec16 v[2], amax = splat16(0.0f);
  for (int h = 0; h < 2; h++) {
    v[h] = load16_as(x, at + 16 * h, bf16);
    amax = max16(amax, select16((ivec16)(v[h] < 0), -v[h], v[h]));
  }
  const float d = hmax16(amax) / 127.0f, inv = d != 0.0f ? 1.0f / d : 0.0f;
  const float magic = 12582912.0f;
  for (int h = 0; h < 2; h++) {
    const vec16 scaled = v[h] * inv;
    const ivec16 codes = __builtin_convertvector((scaled + magic) - magic, ivec16);
    int32_t sum = 0;
    for (int i = 0; i < 16; i++) {
      q[16 * h + i] = (int8_t)codes[i];
      sum += codes[i];
    }
    sum16[h] = sum;
  }
  return d;
}

/* x's rows [m0, m1) into the args' q, d, ds and sum16. */
static void quantize_rows(const gguf_mm_args *a, const void *x, int bf16, int64_t m0,
                          int64_t m1) {
  const int64_t blocks = a->K / 32;
  for (int64_t m = m0; m < m1; m++)
    for (int64_t b = 0; b < blocks; b++) {
      const int64_t i = m * blocks + b;
      int32_t *sum16 = (int32_t *)a->sum16 + 2 * i;
      const float d = quantize_block(x, m * a->K + 32 * b, bf16, (int8_t *)a->q + 32 * i, sum16);
      ((float *)a->d)[i] = d;
      ((float *)a->ds)[i] = d * (float)(sum16[0] + sum16[1]);
    }
}

int gguf_mm(const void *x, const uint8_t *packed, const void *bias, void *y, int bf16, int qtype,
            int64_t M, int64_t N, int64_t K, int isa, int num_threads) {
  const int64_t blocks = M * (K / 32);
  char *scratch = malloc((size_t)(M * K + blocks * (2 * sizeof(float) + 2 * sizeof(int32_t))));
  if (scratch == NULL) return -1;
  const float *d = (const float *)(scratch + M * K), *ds = d + blocks;
  const gguf_mm_args a = {(const int8_t *)scratch, d, ds, (const int32_t *)(ds + blocks),
                          packed, bias, y, M, N, K, gguf_layout(qtype, K), qtype, bf16};
  const gguf_mm_fn groups = ISAS[isa < 0 ? best_isa() : isa].groups;
  const int64_t G = gguf_groups(N);
  /* below ~64 KiB of weight bytes times x rows, a second thread costs more than it saves */
#pragma omp parallel num_threads(num_threads) if (G * a.sec.group_bytes * M >= 65536)
  {
    const int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
    quantize_rows(&a, x, bf16, M * t / T, M * (t + 1) / T);
#pragma omp barrier
    groups(&a, G * t / T, G * (t + 1) / T);
  }
  free(scratch);
  return 0;
}
