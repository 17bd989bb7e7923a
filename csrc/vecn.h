/* Float vectors of VEC_LANES lanes (4, 8 or 16) in GCC's portable vector extension.
 *
 * A kernel compiled once per instruction set sets VEC_LANES to its register width (16 for
 * AVX-512, 8 for AVX2, 4 for SSE2) before including this. Wider vectors than the registers
 * work for arithmetic, but GCC lowers their compares and shuffles one lane at a time through
 * the stack: decode attention's AVX2 build with 16-lane vectors runs at a third of the
 * AVX-512 build's speed. Shuffle masks are written as formulas of the lane index
 * (EACH_LANE), so each helper is one definition for every width.
 */
#ifndef PAGEDLLM_VECN_H
#define PAGEDLLM_VECN_H

#include <stdint.h>
#include <string.h>

#if VEC_LANES != 4 && VEC_LANES != 8 && VEC_LANES != 16
#error "define VEC_LANES (4, 8 or 16) before including vecn.h"
#endif

#define INLINE static inline __attribute__((always_inline))
#define SHUFFLE __builtin_shufflevector

typedef float vecn __attribute__((vector_size(4 * VEC_LANES)));
typedef int32_t ivecn __attribute__((vector_size(4 * VEC_LANES)));
typedef uint32_t uvecn __attribute__((vector_size(4 * VEC_LANES)));

/* EACH_LANE(F, b): F(0, b), F(1, b), ..., F(VEC_LANES - 1, b), e.g. a shuffle's lane indices. */
#define LANES_4(F, b) F(0, b), F(1, b), F(2, b), F(3, b)
#define LANES_8(F, b) LANES_4(F, b), F(4, b), F(5, b), F(6, b), F(7, b)
#define LANES_16(F, b) \
  LANES_8(F, b), F(8, b), F(9, b), F(10, b), F(11, b), F(12, b), F(13, b), F(14, b), F(15, b)
#define LANES_OF(n) LANES_##n
#define LANES_WIDTH(n) LANES_OF(n)
#define EACH_LANE LANES_WIDTH(VEC_LANES)

#define LANE_INDEX(j, b) (j)
#define XOR_LANE(j, b) ((j) ^ (b)) /* swaps blocks of b lanes */
/* Of two vectors x, y (lanes 0 .. 2n - 1 of x ++ y), blocks of b lanes: the even blocks
 * (PAIR_LO) or the odd ones (PAIR_HI). */
#define PAIR_LO(j, b) ((j) / (b) * 2 * (b) + (j) % (b))
#define PAIR_HI(j, b) (PAIR_LO(j, b) + (b))

INLINE vecn loadn(const float *p) {
  vecn v;
  memcpy(&v, p, sizeof v);
  return v;
}

INLINE void storen(float *p, vecn v) { memcpy(p, &v, sizeof v); }

INLINE vecn splatn(float a) { return (vecn){0} + a; }

/* *p in every lane, read straight into the vector (splatn's `0 + a` would cost an add). */
#define LANE_VALUE(j, a) (a)
INLINE vecn broadcastn(const float *p) { return (vecn){EACH_LANE(LANE_VALUE, *p)}; }

/* A bfloat16 is the top half of a float32's bits: widening one is exact (a shift); narrowing
 * rounds to nearest even and gives torch's quiet NaN 0x7fc0 for any NaN, as c10::BFloat16
 * does, so a kernel's bf16 output equals torch's rounding of the same float32 value
 * (to_bf16_bitsn narrows a vector). */
typedef uint16_t bf16xn __attribute__((vector_size(2 * VEC_LANES)));

INLINE vecn loadn_bf16(const uint16_t *p) {
  bf16xn h;
  memcpy(&h, p, sizeof h);
  return (vecn)(__builtin_convertvector(h, uvecn) << 16);
}

INLINE float bf16_to_float(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

INLINE uint16_t float_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* Element i of an array of float32 (bf16 = 0) or bfloat16 (bf16 = 1) elements, read or
 * written as float32 (rounded to nearest even when stored as bfloat16). Kernels that take
 * either call these with a constant bf16, so each copy keeps one branch. */
INLINE int64_t element_size(int bf16) { return bf16 ? 2 : 4; }

INLINE void *element_at(const void *p, int64_t i, int bf16) {
  return (char *)p + i * element_size(bf16);
}

INLINE vecn loadn_as(const void *p, int64_t i, int bf16) {
  return bf16 ? loadn_bf16(element_at(p, i, 1)) : loadn(element_at(p, i, 0));
}

INLINE float load1_as(const void *p, int64_t i, int bf16) {
  return bf16 ? bf16_to_float(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

INLINE void store1_as(void *p, int64_t i, float v, int bf16) {
  if (bf16)
    ((uint16_t *)p)[i] = float_to_bf16(v);
  else
    ((float *)p)[i] = v;
}

/* Lane i of a where mask lane i is set (all ones), else of b. */
INLINE vecn selectn(ivecn mask, vecn a, vecn b) {
  return (vecn)(((ivecn)a & mask) | ((ivecn)b & ~mask));
}

/* Each lane of v as the bits of a bfloat16 (in the low half of a 32-bit lane), rounded as
 * float_to_bf16 rounds. */
INLINE uvecn to_bf16_bitsn(vecn v) {
  const uvecn u = (uvecn)v;
  const uvecn rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const ivecn nan = (ivecn)((u & 0x7fffffffu) > 0x7f800000u);
  return (uvecn)selectn(nan, (vecn)((uvecn){0} + 0x7fc0u), (vecn)rounded);
}

/* v rounded to bfloat16, as VEC_LANES bfloat16 values (to store). */
INLINE bf16xn to_bf16n(vecn v) { return __builtin_convertvector(to_bf16_bitsn(v), bf16xn); }

/* A mask of lanes 0 .. n - 1. */
INLINE ivecn lanes_below_n(int64_t n) {
  const ivecn lane = {EACH_LANE(LANE_INDEX, 0)};
  return lane < (int32_t)n;
}

INLINE vecn maxn(vecn a, vecn b) { return selectn(a > b, a, b); }

INLINE vecn minn(vecn a, vecn b) { return selectn(a < b, a, b); }

/* Every lane of v becomes op over all its lanes (op: a function or macro of two vectors), by
 * swapping halves, then quarters, ...; a swap of blocks as wide as the vector (b %
 * VEC_LANES == 0) is the identity and skipped. */
#define REDUCE_LANES(v, op)                                                  \
  do {                                                                      \
    if (VEC_LANES > 8) v = op(v, SHUFFLE(v, v, EACH_LANE(XOR_LANE, 8 % VEC_LANES))); \
    if (VEC_LANES > 4) v = op(v, SHUFFLE(v, v, EACH_LANE(XOR_LANE, 4 % VEC_LANES))); \
    v = op(v, SHUFFLE(v, v, EACH_LANE(XOR_LANE, 2)));                           \
    v = op(v, SHUFFLE(v, v, EACH_LANE(XOR_LANE, 1)));                           \
  } while (0)

#define ADD_VECTORS(a, b) ((a) + (b))

INLINE float hsumn(vecn v) {
  REDUCE_LANES(v, ADD_VECTORS);
  return v[0];
}

INLINE float hmaxn(vecn v) {
  REDUCE_LANES(v, maxn);
  return v[0];
}

/* Lane j of the result is hsumn(v[j]): VEC_LANES horizontal sums in VEC_LANES - 1 pairwise
 * steps, each halving the lanes that hold a partial sum of one input. */
INLINE vecn transpose_sumn(const vecn v[VEC_LANES]) {
  vecn a[VEC_LANES];
  memcpy(a, v, sizeof a);
#define PAIR_STEP(b)                                                                   \
  for (int i = 0; i < (b); i++)                                                        \
    a[i] = SHUFFLE(a[2 * i], a[2 * i + 1], EACH_LANE(PAIR_LO, b)) +                        \
           SHUFFLE(a[2 * i], a[2 * i + 1], EACH_LANE(PAIR_HI, b));
#if VEC_LANES == 16
  PAIR_STEP(8)
#endif
#if VEC_LANES >= 8
  PAIR_STEP(4)
#endif
  PAIR_STEP(2)
  PAIR_STEP(1)
#undef PAIR_STEP
  return a[0];
}

/* v[i][j] <-> v[j][i]: a VEC_LANES x VEC_LANES transpose in log2(VEC_LANES) rounds; round s
 * swaps the off-diagonal s x s blocks of every 2s x 2s block with one pair of shuffles per
 * two rows. */
#define TRANSPOSE_LO(j, s) (((j) & (s)) ? (j) - (s) + VEC_LANES : (j))
#define TRANSPOSE_HI(j, s) (((j) & (s)) ? (j) + VEC_LANES : (j) + (s))
INLINE void transposen(vecn v[VEC_LANES]) {
#define TRANSPOSE_ROUND(s)                                             \
  for (int i = 0; i < VEC_LANES; i++) {                                \
    if (i & (s)) continue;                                             \
    const vecn lo = SHUFFLE(v[i], v[i | (s)], EACH_LANE(TRANSPOSE_LO, s)); \
    v[i | (s)] = SHUFFLE(v[i], v[i | (s)], EACH_LANE(TRANSPOSE_HI, s));    \
    v[i] = lo;                                                         \
  }
  TRANSPOSE_ROUND(1)
  TRANSPOSE_ROUND(2)
#if VEC_LANES >= 8
  TRANSPOSE_ROUND(4)
#endif
#if VEC_LANES == 16
  TRANSPOSE_ROUND(8)
#endif
#undef TRANSPOSE_ROUND
}

/* e^x with relative error < 1e-7 for x in [-87, 88]; inputs outside are clamped to it (no
 * denormals, no infinities). Cody-Waite range reduction x = n ln2 + r, |r| <= ln2 / 2, then a
 * degree-7 Taylor polynomial for e^r and 2^n from the exponent bits. */
INLINE vecn expn(vecn x) {
  x = maxn(x, splatn(-87.0f));
  x = minn(x, splatn(88.0f));
  const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
  vecn n = (x * 1.44269504f + magic) - magic;
  vecn r = x - n * 0.693145752f - n * 1.42860677e-6f;
  vecn p = r * (1.0f / 5040) + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  ivecn bits = (__builtin_convertvector(n, ivecn) + 127) << 23;
  return p * (vecn)bits;
}

#endif
