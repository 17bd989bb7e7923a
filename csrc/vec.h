/* 16-lane float vectors in GCC's portable vector extension, and per-CPU dispatch.
 *
 * Kernels marked CPU_DISPATCH are compiled once per target (AVX-512, AVX2+FMA, baseline)
 * and the loader picks the best for the running CPU; the static inline helpers below are
 * inlined into each copy.
 */
#ifndef PAGEDLLM_VEC_H
#define PAGEDLLM_VEC_H

#include <stdint.h>
#include <string.h>

typedef float vec16 __attribute__((vector_size(64)));
typedef int32_t ivec16 __attribute__((vector_size(64)));

#if defined(__x86_64__) && defined(__linux__) && !defined(PAGEDLLM_NO_DISPATCH)
#define CPU_DISPATCH __attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
#else
#define CPU_DISPATCH
#endif

#define INLINE static inline __attribute__((always_inline))

INLINE vec16 load16(const float *p) {
  vec16 v;
  memcpy(&v, p, sizeof v);
  return v;
}

INLINE void store16(float *p, vec16 v) { memcpy(p, &v, sizeof v); }

INLINE vec16 splat16(float a) { return (vec16){0} + a; }

#define SHUFFLE __builtin_shufflevector

INLINE float hsum16(vec16 v) {
  v += SHUFFLE(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  v += SHUFFLE(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
  v += SHUFFLE(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
  v += SHUFFLE(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
  return v[0];
}

/* Lane j of the result is hsum16(v[j]): sixteen horizontal sums in 15 pairwise steps, each
 * halving the lanes that hold a partial sum of one input. */
INLINE vec16 transpose_sum16(const vec16 v[16]) {
  vec16 a[8], b[4], c[2];
  for (int i = 0; i < 8; i++)
    a[i] = SHUFFLE(v[2 * i], v[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22,
                   23) +
           SHUFFLE(v[2 * i], v[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29,
                   30, 31);
  for (int i = 0; i < 4; i++)
    b[i] = SHUFFLE(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26,
                   27) +
           SHUFFLE(a[2 * i], a[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30,
                   31);
  for (int i = 0; i < 2; i++)
    c[i] = SHUFFLE(b[2 * i], b[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28,
                   29) +
           SHUFFLE(b[2 * i], b[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30,
                   31);
  return SHUFFLE(c[0], c[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         SHUFFLE(c[0], c[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

/* Lane i of a where mask lane i is set (all ones), else of b. */
INLINE vec16 select16(ivec16 mask, vec16 a, vec16 b) {
  return (vec16)(((ivec16)a & mask) | ((ivec16)b & ~mask));
}

/* A mask of lanes 0 .. n - 1. */
INLINE ivec16 lanes_below(int64_t n) {
  const ivec16 lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  return lane < (int32_t)n;
}

INLINE vec16 max16(vec16 a, vec16 b) { return select16(a > b, a, b); }

/* A vector whose lanes sum to sum_i a[i] * b[i], i < n. */
INLINE vec16 dot_lanes(const float *a, const float *b, int64_t n) {
  vec16 acc = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) acc += load16(a + i) * load16(b + i);
  for (; i < n; i++) acc[0] += a[i] * b[i];
  return acc;
}

INLINE float hmax16(vec16 v) {
  v = max16(v, SHUFFLE(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));
  v = max16(v, SHUFFLE(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11));
  v = max16(v, SHUFFLE(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13));
  v = max16(v, SHUFFLE(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14));
  return v[0];
}

INLINE vec16 min16(vec16 a, vec16 b) { return select16(a < b, a, b); }

/* e^x with relative error < 1e-7 for x in [-87, 88]; inputs outside are clamped to it (no
 * denormals, no infinities). Cody-Waite range reduction x = n ln2 + r, |r| <= ln2 / 2, then a
 * degree-7 Taylor polynomial for e^r and 2^n from the exponent bits. */
INLINE vec16 exp16(vec16 x) {
  x = max16(x, splat16(-87.0f));
  x = min16(x, splat16(88.0f));
  const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
  vec16 n = (x * 1.44269504f + magic) - magic;
  vec16 r = x - n * 0.693145752f - n * 1.42860677e-6f;
  vec16 p = r * (1.0f / 5040) + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  ivec16 bits = (__builtin_convertvector(n, ivec16) + 127) << 23;
  return p * (vec16)bits;
}

#endif
