/* 16-lane float vectors (vecn.h's at 16 lanes) for kernels compiled once per target by
 * CPU_DISPATCH (AVX-512, AVX2+FMA, baseline): the loader picks the best for the running CPU;
 * the static inline helpers below are inlined into each copy. Their AVX2 and baseline copies
 * get slow compares and shuffles (see vecn.h); a kernel where those matter is built per
 * instruction set at its register width instead (paged_attention.c).
 */
#ifndef PAGEDLLM_VEC_H
#define PAGEDLLM_VEC_H

#if defined(VEC_LANES) && VEC_LANES != 16
#error "vec.h is the 16-lane vecn.h; a file built at other widths includes vecn.h only"
#endif
#define VEC_LANES 16
#include "vecn.h"

typedef vecn vec16;
typedef ivecn ivec16;
typedef uvecn uvec16;

#if defined(__x86_64__) && defined(__linux__) && !defined(PAGEDLLM_NO_DISPATCH)
#define CPU_DISPATCH __attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
#else
#define CPU_DISPATCH
#endif

INLINE vec16 load16(const float *p) { return loadn(p); }

INLINE void store16(float *p, vec16 v) { storen(p, v); }

INLINE vec16 splat16(float a) { return splatn(a); }

INLINE float hsum16(vec16 v) { return hsumn(v); }

INLINE float hmax16(vec16 v) { return hmaxn(v); }

INLINE vec16 transpose_sum16(const vec16 v[16]) { return transpose_sumn(v); }

INLINE vec16 select16(ivec16 mask, vec16 a, vec16 b) { return selectn(mask, a, b); }

INLINE ivec16 lanes_below(int64_t n) { return lanes_below_n(n); }

INLINE vec16 max16(vec16 a, vec16 b) { return maxn(a, b); }

INLINE vec16 min16(vec16 a, vec16 b) { return minn(a, b); }

INLINE vec16 exp16(vec16 x) { return expn(x); }

/* A vector whose lanes sum to sum_i a[i] * b[i], i < n. */
INLINE vec16 dot_lanes(const float *a, const float *b, int64_t n) {
  vec16 acc = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) acc += load16(a + i) * load16(b + i);
  for (; i < n; i++) acc[0] += a[i] * b[i];
  return acc;
}

#endif
