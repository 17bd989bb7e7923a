/* What AMX code (amx_gemm.c) needs: PAGEDLLM_AMX, set where the compiler can build tile code
 * (GCC 11+ on x86-64 Linux; elsewhere amx_gemm.c is a stub that reports AMX unsupported), and
 * the tile configuration (compiled for AMX whatever the build's flags, like the kernels' tile
 * code). */
#ifndef PAGEDLLM_AMX_H
#define PAGEDLLM_AMX_H

#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__) && \
    __GNUC__ >= 11
#define PAGEDLLM_AMX 1
#endif

#ifdef PAGEDLLM_AMX
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#pragma GCC push_options
#pragma GCC target("amx-tile")

/* Loads the tile configuration (ldtilecfg's 64-byte operand, palette 1): 64-byte rows in
 * every register; tiles 0, 1 and 4 of rows0 rows, 2, 3 and 5 of rows1 (0: unusable), 6 and
 * 7 of 16. amx_gemm.c: accumulators (x rows 0-15 | 16-31) x (columns 0-15 | 16-31) in 0-3,
 * x rows in 4 and 5, weight tiles in 6 and 7. */
static inline void configure_tiles(int rows0, int rows1) {
  struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
  } c;
  memset(&c, 0, sizeof c);
  c.palette = 1;
  const int rows[8] = {rows0, rows0, rows1, rows1, rows0, rows1, 16, 16};
  for (int i = 0; i < 8; i++) {
    c.rows[i] = (uint8_t)rows[i];
    c.colsb[i] = rows[i] ? 64 : 0;
  }
  _tile_loadconfig(&c);
}

#pragma GCC pop_options
#endif

#endif
