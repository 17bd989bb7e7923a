/* Causal attention of one sequence's prefill chunk on bf16 dot products, bf16 cache and
 * queries: on AMX tiles, or on AVX-512 BF16's vdpbf16ps where there are no tiles.
 *
 * Queries q [n, H, D] at positions seq_len - n .. seq_len - 1 attend to the keys and values
 * of positions 0 .. their own in the paged cache [num_blocks, block_size, KV, D] (written
 * there first). Each kv head's keys and values are first copied out of their blocks into
 * the tiles' layouts (keys: per 16 tokens and 32 of D, the tile whose row r holds each
 * token's elements 2r and 2r + 1; values: per 32 tokens and 16 of D, the tile whose row r
 * holds tokens 2r and 2r + 1 of each column). A tile row is 64 bytes, one AVX-512 vector:
 * a key row is pair p of 16 tokens, a value row a pair of tokens of 16 columns, so vdpbf16ps
 * with one query's (or weight's) pair broadcast does a tile product's work for one row.
 * Then each task, 16 query rows of one head:
 *   S = q k^T * scale (float32), the causal mask, softmax in float32 (exact: all scores are
 *   at hand, no running rescale), P = e^(S - max) rounded to bf16 (as flash attention does
 *   for its second product), O = P v, out = O / sum(e^(S - max)).
 * A row's result depends on its own query and the sequence's keys and values only, not on
 * the chunk it came in or the other rows of its block (the last block is zero-padded).
 *
 * Replaces torch's sdpa for the prefill chunks of a bf16 model on these CPUs; see
 * pagedllm/_custom_ops.py, prefill_attention, for the measured speed.
 */
#include "amx.h"
#include "isa_table.h"
#include "ops.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4,avx512bf16")

#include "bf16.h"

/* The two products of a task on one instruction set (see score_rows and sum_values below),
 * and what each thread does before its first task and after its last. */
typedef struct {
  void (*begin)(void);
  void (*score_rows)(const uint16_t *qt, const uint16_t *keys, int64_t kv16, int64_t D,
                     float *s, int64_t ls);
  void (*sum_values)(const uint16_t *p, int64_t lp, const uint16_t *values, int64_t kv32,
                     int64_t D, float *o);
  void (*end)(void);
} Products;

/* The row of token t of kv head h in the paged cache. */
static inline const uint16_t *cache_row(const uint16_t *cache, const int32_t *block_table,
                                        int64_t t, int64_t h, int64_t KV, int64_t D,
                                        int64_t block_size) {
  const int64_t slot = (int64_t)block_table[t / block_size] * block_size + t % block_size;
  return cache + (slot * KV + h) * D;
}

/* The rows of tokens t0 .. t0 + n - 1 of kv head h (NULL past L, where the tiles hold zeros). */
static void token_rows(const uint16_t **rows, const uint16_t *cache, const int32_t *block_table,
                       int64_t t0, int64_t n, int64_t L, int64_t h, int64_t KV, int64_t D,
                       int64_t block_size) {
  for (int64_t i = 0; i < n; i++)
    rows[i] = t0 + i < L ? cache_row(cache, block_table, t0 + i, h, KV, D, block_size) : NULL;
}

/* A 16 x 16 matrix of 32-bit elements, one row a vector, transposed in place. */
static inline void transpose16x16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; i++) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; i++) {
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 4; j++) {
      t[8 * i + j] = _mm512_shuffle_i32x4(r[8 * i + j], r[8 * i + 4 + j], 0x88);
      t[8 * i + 4 + j] = _mm512_shuffle_i32x4(r[8 * i + j], r[8 * i + 4 + j], 0xdd);
    }
  for (int j = 0; j < 8; j++) {
    r[j] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0x88);
    r[8 + j] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0xdd);
  }
}

/* keys of kv head h, tokens [0, L): [L16 / 16][D / 32] tiles, tile (tb, kb) row r = for
 * each of its 16 tokens the pair of elements 32 kb + 2r, + 1; tokens >= L are zero. So
 * token block tb's D / 2 rows (pairs 0 .. D / 2 - 1) lie one after another. Each tile is
 * the 16 tokens' 16 pairs (one vector a token), transposed. */
static void pack_keys(uint16_t *packed, const uint16_t *cache, const int32_t *block_table,
                      int64_t L, int64_t L16, int64_t h, int64_t KV, int64_t D,
                      int64_t block_size) {
  const uint16_t *rows[16];
  for (int64_t tb = 0; tb < L16 / 16; tb++) {
    token_rows(rows, cache, block_table, tb * 16, 16, L, h, KV, D, block_size);
    for (int64_t kb = 0; kb < D / 32; kb++) {
      __m512i r[16];
      for (int i = 0; i < 16; i++)
        r[i] = rows[i] ? _mm512_loadu_si512(rows[i] + 32 * kb) : _mm512_setzero_si512();
      transpose16x16(r);
      uint16_t *tile = packed + (tb * (D / 32) + kb) * 512;
      for (int i = 0; i < 16; i++) _mm512_storeu_si512(tile + 32 * i, r[i]);
    }
  }
}

/* values of kv head h, tokens [0, L): [L32 / 32][D / 16] tiles, tile (tb, db) row r = for
 * each of its 16 columns the values of tokens 32 tb + 2r and + 1; tokens >= L are zero.
 * A row is the two tokens' 16 values interleaved. */
static void pack_values(uint16_t *packed, const uint16_t *cache, const int32_t *block_table,
                        int64_t L, int64_t L32, int64_t h, int64_t KV, int64_t D,
                        int64_t block_size) {
  static const uint16_t interleave[32] = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,
                                          37, 6, 38, 7, 39, 8,  40, 9,  41, 10, 42,
                                          11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  const __m512i order = _mm512_loadu_si512(interleave);
  const uint16_t *rows[32];
  for (int64_t tb = 0; tb < L32 / 32; tb++) {
    token_rows(rows, cache, block_table, tb * 32, 32, L, h, KV, D, block_size);
    for (int64_t r = 0; r < 16; r++)
      for (int64_t db = 0; db < D / 16; db++) {
        const uint16_t *a = rows[2 * r], *b = rows[2 * r + 1];
        const __m256i va = a ? _mm256_loadu_si256((const void *)(a + 16 * db))
                             : _mm256_setzero_si256();
        const __m256i vb = b ? _mm256_loadu_si256((const void *)(b + 16 * db))
                             : _mm256_setzero_si256();
        const __m512i pairs = _mm512_permutex2var_epi16(_mm512_castsi256_si512(va), order,
                                                         _mm512_castsi256_si512(vb));
        _mm512_storeu_si512(packed + ((tb * (D / 16) + db) * 16 + r) * 32, pairs);
      }
  }
}

/* A tile row (64 bytes: 32 bf16) as a vector. */
static inline __m512bh load_pairs(const uint16_t *p) {
  return (__m512bh)_mm512_loadu_si512(p);
}

/* A pair of bf16 (32 bits at p) in every lane. */
static inline __m512bh splat_pair(const uint16_t *p) {
  uint32_t pair;
  memcpy(&pair, p, sizeof pair);
  return (__m512bh)_mm512_set1_epi32((int)pair);
}

/* Scores of 16 query rows (qt: [16, D] bf16, rows D apart) against keys [0, kv_len), kv_len
 * rounded up to 16: s [16, ls] float32. Per 16 keys, each of their D / 2 pair rows is read
 * once for the 16 queries' accumulators. */
static void score_rows_avx512(const uint16_t *qt, const uint16_t *keys, int64_t kv16,
                              int64_t D, float *s, int64_t ls) {
  for (int64_t tb = 0; tb < kv16 / 16; tb++) {
    const uint16_t *k = keys + tb * 16 * D;
    __m512 acc[16];
    for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t p = 0; p < D / 2; p++) {
      const __m512bh pairs = load_pairs(k + p * 32);
      for (int i = 0; i < 16; i++)
        acc[i] = _mm512_dpbf16_ps(acc[i], splat_pair(qt + i * D + 2 * p), pairs);
    }
    for (int i = 0; i < 16; i++) _mm512_storeu_ps(s + i * ls + tb * 16, acc[i]);
  }
}

/* o [16, D] float32 = p [16, kv32] (bf16, rows lp apart) @ values [0, kv32): 4 query rows
 * by 64 columns of accumulators at a time, each value row read once for the 4 rows. */
static void sum_values_avx512(const uint16_t *p, int64_t lp, const uint16_t *values,
                              int64_t kv32, int64_t D, float *o) {
  const int64_t dbs = D / 16;
  for (int64_t i0 = 0; i0 < 16; i0 += 4)
    for (int64_t d0 = 0; d0 < dbs; d0 += 4) {
      const int64_t cols = dbs - d0 < 4 ? dbs - d0 : 4;
      __m512 acc[4][4];
      for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = _mm512_setzero_ps();
      for (int64_t tb = 0; tb < kv32 / 32; tb++)
        for (int64_t r = 0; r < 16; r++) {
          const uint16_t *v = values + ((tb * dbs + d0) * 16 + r) * 32;
          for (int i = 0; i < 4; i++) {
            const __m512bh weights = splat_pair(p + (i0 + i) * lp + tb * 32 + 2 * r);
            for (int j = 0; j < cols; j++)
              acc[i][j] = _mm512_dpbf16_ps(acc[i][j], weights, load_pairs(v + j * 512));
          }
        }
      for (int i = 0; i < 4; i++)
        for (int j = 0; j < cols; j++)
          _mm512_storeu_ps(o + (i0 + i) * D + (d0 + j) * 16, acc[i][j]);
    }
}

static void nothing(void) {}

static const Products AVX512_BF16 = {nothing, score_rows_avx512, sum_values_avx512, nothing};

#ifdef PAGEDLLM_AMX
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16") /* added to the file's target */

/* score_rows_avx512's product on tiles, 4 key tiles (64 keys) at a time. */
static void score_rows_amx(const uint16_t *qt, const uint16_t *keys, int64_t kv16, int64_t D,
                           float *s, int64_t ls) {
  const int64_t kbs = D / 32;
  for (int64_t t0 = 0; t0 < kv16; t0 += 64) {
    const int64_t tiles = (kv16 - t0) / 16 < 4 ? (kv16 - t0) / 16 : 4;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t kb = 0; kb < kbs; kb++) {
      _tile_loadd(4, qt + kb * 32, D * 2);
      const uint16_t *k = keys + ((t0 / 16) * kbs + kb) * 512;
#define SCORE(j)                                     \
  if (j < tiles) {                                   \
    _tile_loadd(6, k + (j) * kbs * 512, 64);         \
    _tile_dpbf16ps(j, 4, 6);                         \
  }
      SCORE(0) SCORE(1) SCORE(2) SCORE(3)
#undef SCORE
    }
    _tile_stored(0, s + t0, ls * 4);
    if (tiles > 1) _tile_stored(1, s + t0 + 16, ls * 4);
    if (tiles > 2) _tile_stored(2, s + t0 + 32, ls * 4);
    if (tiles > 3) _tile_stored(3, s + t0 + 48, ls * 4);
  }
}

/* sum_values_avx512's product on tiles, 4 column tiles at a time. */
static void sum_values_amx(const uint16_t *p, int64_t lp, const uint16_t *values, int64_t kv32,
                           int64_t D, float *o) {
  const int64_t dbs = D / 16;
  for (int64_t d0 = 0; d0 < dbs; d0 += 4) {
    const int64_t tiles = dbs - d0 < 4 ? dbs - d0 : 4;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t tb = 0; tb < kv32 / 32; tb++) {
      _tile_loadd(4, p + tb * 32, lp * 2);
      const uint16_t *v = values + (tb * dbs + d0) * 512;
#define VALUE(j)                                 \
  if (j < tiles) {                               \
    _tile_loadd(6, v + (j) * 512, 64);           \
    _tile_dpbf16ps(j, 4, 6);                     \
  }
      VALUE(0) VALUE(1) VALUE(2) VALUE(3)
#undef VALUE
    }
    _tile_stored(0, o + d0 * 16, D * 4);
    if (tiles > 1) _tile_stored(1, o + d0 * 16 + 16, D * 4);
    if (tiles > 2) _tile_stored(2, o + d0 * 16 + 32, D * 4);
    if (tiles > 3) _tile_stored(3, o + d0 * 16 + 48, D * 4);
  }
}

static void begin_amx(void) { configure_tiles(16, 16); /* every tile 16 rows of 64 bytes */ }

static void end_amx(void) { _tile_release(); }

static const Products AMX = {begin_amx, score_rows_amx, sum_values_amx, end_amx};

#pragma GCC pop_options
#endif

/* Row i of s (query position pos0 + i) -> p (bf16, e^(s * scale - max), zero past its last
 * visible key and up to kv32); returns 1 / the float32 sum of e^(s * scale - max). */
static float softmax_row(const float *s, uint16_t *p, int64_t visible, int64_t kv32,
                         float scale) {
  vec16 vmax = splat16(-__FLT_MAX__);
  for (int64_t t = 0; t < visible; t += 16)
    vmax = max16(vmax, select16(lanes_below(visible - t), load16(s + t) * scale,
                                splat16(-__FLT_MAX__)));
  const vec16 m = splat16(hmax16(vmax));
  vec16 sum = splat16(0.0f);
  for (int64_t t = 0; t < kv32; t += 16) {
    vec16 e = splat16(0.0f);
    if (t < visible)
      e = select16(lanes_below(visible - t), exp16(load16(s + t) * scale - m), e);
    sum += e;
    store16_bf16(p + t, e);
  }
  return 1.0f / hsum16(sum);
}

/* One task: query rows [r0, r0 + 16) (clipped to n) of head h. scratch: see run. */
static void attend_rows(const Products *x, uint16_t *out, const uint16_t *q,
                        const uint16_t *keys, const uint16_t *values, int64_t n,
                        int64_t seq_len, int64_t H, int64_t D, int64_t r0, int64_t h,
                        float scale, float *s, uint16_t *p, uint16_t *qt, float *o,
                        int64_t ls) {
  const int64_t rows = n - r0 < 16 ? n - r0 : 16, ctx = seq_len - n;
  const int64_t kv_len = ctx + r0 + rows, kv16 = (kv_len + 15) / 16 * 16;
  const int64_t kv32 = (kv_len + 31) / 32 * 32;
  for (int64_t i = 0; i < 16; i++) /* the 16 rows, zero past the chunk's end */
    if (i < rows)
      memcpy(qt + i * D, q + ((r0 + i) * H + h) * D, (size_t)D * sizeof(uint16_t));
    else
      memset(qt + i * D, 0, (size_t)D * sizeof(uint16_t));
  x->score_rows(qt, keys, kv16, D, s, ls);
  float inv[16];
  for (int64_t i = 0; i < 16; i++)
    inv[i] = softmax_row(s + i * ls, p + i * ls, i < rows ? ctx + r0 + i + 1 : 1, kv32, scale);
  x->sum_values(p, ls, values, kv32, D, o);
  for (int64_t i = 0; i < rows; i++)
    for (int64_t d = 0; d < D; d += 16)
      store16_bf16(out + ((r0 + i) * H + h) * D + d, load16(o + i * D + d) * inv[i]);
}

static int run(const Products *x, uint16_t *out, const uint16_t *q, const uint16_t *k_cache,
               const uint16_t *v_cache, const int32_t *block_table, int64_t n, int64_t seq_len,
               int64_t H, int64_t KV, int64_t D, int64_t block_size, float scale,
               int num_threads) {
  /* ls: the keys rounded up to 32, the row length of the scores and of P */
  const int64_t ls = (seq_len + 31) / 32 * 32, G = H / KV, blocks = (n + 15) / 16;
  const int64_t kv_elems = ls * D; /* one kv head's packed keys, or values */
  uint16_t *packed = malloc((size_t)(2 * KV * kv_elems) * sizeof(uint16_t));
  const size_t per_thread = 16 * ls * sizeof(float) + 16 * ls * sizeof(uint16_t) +
                            16 * D * sizeof(uint16_t) + 16 * D * sizeof(float) + 64;
  char *scratch = malloc(num_threads * per_thread);
  if (packed == NULL || scratch == NULL) {
    free(packed);
    free(scratch);
    return -1;
  }
#pragma omp parallel num_threads(num_threads)
  {
#pragma omp for schedule(static)
    for (int64_t job = 0; job < 2 * KV; job++) {
      uint16_t *dst = packed + job * kv_elems;
      if (job < KV)
        pack_keys(dst, k_cache, block_table, seq_len, ls, job, KV, D, block_size);
      else
        pack_values(dst, v_cache, block_table, seq_len, ls, job - KV, KV, D, block_size);
    }
    x->begin();
    char *mine = scratch + omp_get_thread_num() * per_thread;
    float *s = (float *)mine;
    uint16_t *p = (uint16_t *)(s + 16 * ls);
    uint16_t *qt = p + 16 * ls;
    float *o = (float *)(((uintptr_t)(qt + 16 * D) + 63) & ~(uintptr_t)63);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < blocks * H; task++) {
      const int64_t r0 = (blocks - 1 - task / H) * 16, h = task % H; /* longest rows first */
      attend_rows(x, out, q, packed + (h / G) * kv_elems, packed + (KV + h / G) * kv_elems, n,
                  seq_len, H, D, r0, h, scale, s, p, qt, o, ls);
    }
    x->end();
  }
  free(packed);
  free(scratch);
  return 0;
}

#pragma GCC pop_options

static const struct {
  isa_entry isa;
  const Products *products;
} ISAS[] = {
#ifdef PAGEDLLM_AMX
    {{"amx", amx_gemm_supported}, &AMX},
#endif
    {{"avx512_bf16", isa_x86_64_v4_bf16}, &AVX512_BF16}};

ISA_TABLE(prefill_attention_bf16, ISAS)

int prefill_attention_bf16(uint16_t *out, const uint16_t *q, const uint16_t *k_cache,
                           const uint16_t *v_cache, const int32_t *block_table, int64_t n,
                           int64_t seq_len, int64_t H, int64_t KV, int64_t D, int64_t block_size,
                           float scale, int isa, int num_threads) {
  return run(ISAS[isa < 0 ? best_isa() : isa].products, out, q, k_cache, v_cache, block_table,
             n, seq_len, H, KV, D, block_size, scale, num_threads);
}

#else

int prefill_attention_bf16_isa_count(void) { return 0; }

const char *prefill_attention_bf16_isa_name(int isa) { return (void)isa, ""; }

int prefill_attention_bf16_isa_supported(int isa) { return (void)isa, 0; }

int prefill_attention_bf16(uint16_t *out, const uint16_t *q, const uint16_t *k_cache,
                           const uint16_t *v_cache, const int32_t *block_table, int64_t n,
                           int64_t seq_len, int64_t H, int64_t KV, int64_t D, int64_t block_size,
                           float scale, int isa, int num_threads) {
  (void)out, (void)q, (void)k_cache, (void)v_cache, (void)block_table, (void)n, (void)seq_len;
  (void)H, (void)KV, (void)D, (void)block_size, (void)scale, (void)isa, (void)num_threads;
  return -1;
}

#endif
