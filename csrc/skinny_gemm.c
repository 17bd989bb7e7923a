/* The unquantized linear's matmul on the CPU: y [M, N] = x [M, K] @ w [N, K]^T (+ b), float32
 * (skinny_gemm) or bfloat16 in and out with float32 products and sums (skinny_gemm_bf16), for
 * every row count, so that a row's result never depends on the rows beside it (each build
 * sums every output in one order whatever M is; pagedllm/_custom_ops/linear.py).
 *
 * With few input rows the product is bound by reading w; this kernel reads it at over twice
 * the speed of ATen's MKL sgemv, and stock torch's bf16 matmul reads bf16 weights slowly too.
 * With more rows, register tiles of x rows by weight rows, each loaded vector feeding four
 * FMAs (skinny_gemm_tile.h), blocks of x rows kept in L2 (skinny_gemm_kernel.h), run level
 * with MKL's and oneDNN's GEMMs or ahead; `pagedllm bench linear` compares them. The kernel
 * is built once per instruction set at its register width and tile shape, and once more for
 * AVX-512 BF16, whose dot products multiply bf16 x and weights as they are; this file picks
 * the best the CPU has, or the one the caller names. The AVX2 build multiplies float32 as
 * outer products on transposed panels of the weights (skinny_gemm_panel.h), which it also
 * reads packed.
 */
#include "isa_table.h"
#include "ops.h"

typedef int (*skinny_gemm_fn)(const void *x, const void *w, const void *b, void *y, int64_t M,
                              int64_t N, int64_t K, int bf16, int packed, int num_threads);

int skinny_gemm_run_avx512_bf16(const void *x, const void *w, const void *b, void *y, int64_t M,
                                int64_t N, int64_t K, int bf16, int packed, int num_threads);
int skinny_gemm_run_avx512(const void *x, const void *w, const void *b, void *y, int64_t M,
                           int64_t N, int64_t K, int bf16, int packed, int num_threads);
int skinny_gemm_run_avx2(const void *x, const void *w, const void *b, void *y, int64_t M,
                         int64_t N, int64_t K, int bf16, int packed, int num_threads);
int skinny_gemm_run_portable(const void *x, const void *w, const void *b, void *y, int64_t M,
                             int64_t N, int64_t K, int bf16, int packed, int num_threads);

static const struct {
  isa_entry isa;
  skinny_gemm_fn run;
  int reads_packed[2]; /* a packed weight of float32 [0] or bf16 [1] (see ops.h) */
} ISAS[] = {
#if defined(__x86_64__) && defined(__GNUC__)
    {{"avx512_bf16", isa_x86_64_v4_bf16}, skinny_gemm_run_avx512_bf16, {0, 1}},
    {{"avx512", isa_x86_64_v4}, skinny_gemm_run_avx512, {0, 0}},
    {{"avx2", isa_x86_64_v3}, skinny_gemm_run_avx2, {1, 0}},
#endif
    {{"portable", isa_always}, skinny_gemm_run_portable, {0, 0}}};

ISA_TABLE(skinny_gemm, ISAS)

int skinny_gemm_reads_packed(int isa, int bf16) {
  return ISAS[isa < 0 ? best_isa() : isa].reads_packed[bf16 != 0];
}

int skinny_gemm(const float *x, const float *w, const float *b, float *y, int64_t M, int64_t N,
                int64_t K, int packed, int isa, int num_threads) {
  return ISAS[isa < 0 ? best_isa() : isa].run(x, w, b, y, M, N, K, 0, packed, num_threads);
}

int skinny_gemm_bf16(const uint16_t *x, const uint16_t *w, const uint16_t *b, uint16_t *y,
                     int64_t M, int64_t N, int64_t K, int packed, int isa, int num_threads) {
  return ISAS[isa < 0 ? best_isa() : isa].run(x, w, b, y, M, N, K, 1, packed, num_threads);
}
