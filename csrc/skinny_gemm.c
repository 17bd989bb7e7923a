/* fp32 matmul for the few rows of a decode step: y [M, N] = x [M, K] @ w [N, K]^T (+ b).
 *
 * With few input rows the product is bound by reading w; ATen's MKL sgemv reads it at about
 * 11 GB/s on the 2-core development machine, this loop at 25-30 GB/s. With more rows (up to
 * a few hundred, a decode batch) MKL's GEMM is still far from its peak there, while register
 * tiles of x rows by weight rows, each loaded vector feeding four FMAs, were 1.1-2x faster
 * than MKL on AVX-512 (pagedllm/_custom_ops.py's SKINNY_GEMM_MAX_ROWS says up to how many
 * rows, per build). The kernel (skinny_gemm_kernel.h) is built once per instruction set at its
 * register width and tile shape; this file picks the best the CPU has, or the one the caller
 * names.
 */
#include "isa_table.h"
#include "ops.h"

typedef void (*skinny_gemm_fn)(const float *x, const float *w, const float *b, float *y,
                               int64_t M, int64_t N, int64_t K, int num_threads);

void skinny_gemm_run_avx512(const float *x, const float *w, const float *b, float *y, int64_t M,
                            int64_t N, int64_t K, int num_threads);
void skinny_gemm_run_avx2(const float *x, const float *w, const float *b, float *y, int64_t M,
                          int64_t N, int64_t K, int num_threads);
void skinny_gemm_run_portable(const float *x, const float *w, const float *b, float *y,
                              int64_t M, int64_t N, int64_t K, int num_threads);

static const struct {
  isa_entry isa;
  skinny_gemm_fn run;
} ISAS[] = {VECTOR_BUILDS(skinny_gemm_run)};

ISA_TABLE(skinny_gemm, ISAS)

void skinny_gemm(const float *x, const float *w, const float *b, float *y, int64_t M, int64_t N,
                 int64_t K, int isa, int num_threads) {
  ISAS[isa < 0 ? best_isa() : isa].run(x, w, b, y, M, N, K, num_threads);
}
