/* bfloat16 matmul on AMX tiles: y [M, N] = x [M, K] @ w [N, K]^T (+ b), bf16 in and out.
 *
 * The weight is packed once at load into the tiles' layout (amx_pack_bf16): for each block
 * of 16 output columns and each 32 of K, one 1 KB tile whose row r holds, for the 16
 * columns, their elements 2r and 2r + 1 (the pairs TDPBF16PS multiplies). x's rows load as
 * tiles in place. Each step multiplies 2 x tiles (32 rows) by 2 weight tiles (32 columns)
 * into 4 float32 accumulator tiles (2 + 2 + 4 of the 8 tile registers); the sums are
 * rounded to bfloat16 once, after the last K step.
 *
 * Every output element is its row's dot product taken in the same K order by the same
 * instruction whatever M is and whichever tile holds the row (a last block of fewer rows
 * loads shorter tiles), so a row's result does not depend on the rows batched with it:
 * batch-invariant at every batch size. Threads split the columns; rows go ROW_CHUNK at a time
 * (their x stays in L2) past each pair of weight tiles. Its speed against
 * skinny_gemm_bf16 and F.linear: BENCHMARKS.md (`pagedllm bench linear --dtype bfloat16`).
 *
 * Only the tile code is compiled for AMX (a target pragma, whatever the build's flags) and
 * entered only where amx_gemm_supported() (the CPU has the tiles and Linux granted their
 * state); packing is plain C that any CPU runs. Other compilers and architectures get stubs
 * that report AMX unsupported.
 */
#include "amx.h"
#include "ops.h"

#ifdef PAGEDLLM_AMX
#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "bf16.h"
#include "prefetch.h"

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define TILE_BYTES 1024 /* 16 rows of 64 bytes */
#define ROW_CHUNK 256 /* rows of x multiplied by each weight tile pair in turn */

int amx_gemm_supported(void) {
  static int supported = -1;
  if (supported < 0) {
    unsigned a, b, c, d;
    const int leaf7 = __get_cpuid_count(7, 0, &a, &b, &c, &d);
    const int tiles = leaf7 && (d >> 24) & 1, bf16 = leaf7 && (d >> 22) & 1;
    __builtin_cpu_init();
    supported = tiles && bf16 && __builtin_cpu_supports("avx512bw") &&
                syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  }
  return supported;
}

void amx_pack_bf16(uint16_t *packed, const uint16_t *w, int64_t N, int64_t K) {
  for (int64_t nb = 0; nb < N / 16; nb++)
    for (int64_t kb = 0; kb < K / 32; kb++) {
      uint16_t *tile = packed + (nb * (K / 32) + kb) * (TILE_BYTES / 2);
      for (int64_t r = 0; r < 16; r++)
        for (int64_t n = 0; n < 16; n++)
          for (int64_t e = 0; e < 2; e++)
            tile[r * 32 + n * 2 + e] = w[(nb * 16 + n) * K + kb * 32 + 2 * r + e];
    }
}

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl")

/* y rows [0, rows) x columns [0, cols) = c (float32 [32, 32]) + b, rounded to bfloat16. */
static void store_block(uint16_t *y, int64_t N, const float *c, const uint16_t *b, int rows,
                        int cols) {
  vec16 bias[2] = {splat16(0.0f), splat16(0.0f)};
  for (int j = 0; j < cols / 16; j++)
    if (b != NULL) bias[j] = load16_bf16(b + 16 * j);
  for (int r = 0; r < rows; r++)
    for (int j = 0; j < cols / 16; j++)
      store16_bf16(y + r * N + 16 * j, load16(c + r * 32 + 16 * j) + bias[j]);
}

/* The output block of x rows [0, rows0 + rows1) (rows1 > 0 only when rows0 = 16) and the
 * 16 (pair = 0) or 32 columns of weight tiles w0, w1 (K / 32 tiles each). */
static void multiply_block(const uint16_t *x, const uint16_t *w0, const uint16_t *w1,
                           uint16_t *y, const uint16_t *b, int64_t N, int64_t K, int rows0,
                           int rows1, int pair) {
  float c[32 * 32] __attribute__((aligned(64)));
  const int64_t steps = K / 32, stride = K * 2;
  const int stream = rows0 + rows1 <= 16; /* few rows: bound by reading the weight */
  _tile_zero(0);
  _tile_zero(1);
  if (rows1) { /* tiles 2, 3 and 5 are configured (to 0 rows: unusable) only with rows1 */
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t kb = 0; kb < steps; kb++) {
    const uint16_t *a = x + kb * 32;
    const uint16_t *t0 = w0 + kb * (TILE_BYTES / 2), *t1 = w1 + kb * (TILE_BYTES / 2);
    if (stream) {
      prefetch_ahead(t0, TILE_BYTES);
      if (pair) prefetch_ahead(t1, TILE_BYTES);
    }
    _tile_loadd(4, a, stride);
    _tile_loadd(6, t0, 64);
    _tile_dpbf16ps(0, 4, 6);
    if (pair) {
      _tile_loadd(7, t1, 64);
      _tile_dpbf16ps(1, 4, 7);
    }
    if (rows1) {
      _tile_loadd(5, a + 16 * K, stride);
      _tile_dpbf16ps(2, 5, 6);
      if (pair) _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c, 128);
  if (pair) _tile_stored(1, c + 16, 128);
  if (rows1) {
    _tile_stored(2, c + 16 * 32, 128);
    if (pair) _tile_stored(3, c + 16 * 32 + 16, 128);
  }
  store_block(y, N, c, b, rows0 + rows1, pair ? 32 : 16);
}

/* Output rows [m0, m1), whole blocks of 32 (or one block of fewer, m1 - m0 < 32: one tile
 * configuration per call), for this thread's column pairs [p0, p1), ROW_CHUNK rows at a
 * time: the chunk's x stays in L2 while each pair's weight tiles go over its rows. */
static void multiply_rows(const uint16_t *x, const uint16_t *packed, const uint16_t *b,
                          uint16_t *y, int64_t m0, int64_t m1, int64_t p0, int64_t p1,
                          int64_t blocks, int64_t N, int64_t K) {
  const int64_t tile_elems = K / 32 * (TILE_BYTES / 2);
  const int rows = m1 - m0 < 32 ? (int)(m1 - m0) : 32;
  const int rows0 = rows < 16 ? rows : 16, rows1 = rows - rows0;
  configure_tiles(rows0, rows1);
  for (int64_t chunk = m0; chunk < m1; chunk += ROW_CHUNK) {
    const int64_t chunk_end = chunk + ROW_CHUNK < m1 ? chunk + ROW_CHUNK : m1;
    for (int64_t p = p0; p < p1; p++) {
      const uint16_t *w0 = packed + 2 * p * tile_elems;
      for (int64_t m = chunk; m < chunk_end; m += 32)
        multiply_block(x + m * K, w0, w0 + tile_elems, y + m * N + 32 * p,
                       b == NULL ? NULL : b + 32 * p, N, K, rows0, rows1, 2 * p + 1 < blocks);
    }
  }
}

static __attribute__((noinline)) void run_tiles(const uint16_t *x, const uint16_t *packed,
                                                const uint16_t *b, uint16_t *y, int64_t M,
                                                int64_t N, int64_t K, int num_threads) {
  const int64_t blocks = N / 16, pairs = (blocks + 1) / 2, whole = M / 32 * 32;
#pragma omp parallel num_threads(num_threads)
  {
    const int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
    const int64_t p0 = pairs * t / T, p1 = pairs * (t + 1) / T;
    if (p0 < p1) {
      if (whole > 0) multiply_rows(x, packed, b, y, 0, whole, p0, p1, blocks, N, K);
      if (whole < M) multiply_rows(x, packed, b, y, whole, M, p0, p1, blocks, N, K);
      _tile_release();
    }
  }
}

#pragma GCC pop_options

int amx_gemm_bf16(const uint16_t *x, const uint16_t *packed, const uint16_t *b, uint16_t *y,
                  int64_t M, int64_t N, int64_t K, int num_threads) {
  if (!amx_gemm_supported()) return -1;
  run_tiles(x, packed, b, y, M, N, K, num_threads);
  return 0;
}

#else

int amx_gemm_supported(void) { return 0; }

void amx_pack_bf16(uint16_t *packed, const uint16_t *w, int64_t N, int64_t K) {
  (void)packed, (void)w, (void)N, (void)K;
}

int amx_gemm_bf16(const uint16_t *x, const uint16_t *packed, const uint16_t *b, uint16_t *y,
                  int64_t M, int64_t N, int64_t K, int num_threads) {
  (void)x, (void)packed, (void)b, (void)y, (void)M, (void)N, (void)K, (void)num_threads;
  return -1;
}

#endif
