/* gguf_mm_kernel.h in plain C, for any CPU: 16 columns per vector, a tile of one row, the
 * primitives as loops over arrays (the fused multiply-add by fmaf, so that every build gives
 * the same bits). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "fp16.h"

#define INLINE static inline __attribute__((always_inline))
#define VCOLS 16
#define TILE_R 1
#define TILE_C 1
#define Q8_SIGNED_DOT 0
#define ISA(name) name##_portable

typedef int32_t ivec __attribute__((vector_size(64)));
typedef float fvec __attribute__((vector_size(64)));
typedef uint8_t bvec __attribute__((vector_size(64)));

INLINE ivec dot4(ivec acc, bvec u, int32_t a4) {
  uint8_t ub[64];
  int8_t ab[4];
  int32_t lanes[VCOLS];
  memcpy(ub, &u, sizeof ub);
  memcpy(ab, &a4, sizeof ab);
  memcpy(lanes, &acc, sizeof lanes);
  for (int l = 0; l < VCOLS; l++)
    for (int i = 0; i < 4; i++) lanes[l] += ub[4 * l + i] * ab[i];
  memcpy(&acc, lanes, sizeof lanes);
  return acc;
}

INLINE ivec dot4_q8(ivec acc, bvec u, int32_t a4) { return dot4(acc, u, a4); }

INLINE bvec load_codes(const uint8_t *p) {
  bvec v;
  memcpy(&v, p, sizeof v);
  return v;
}

INLINE bvec fifth_bits(const uint8_t *p) {
  uint8_t v[64];
  for (int i = 0; i < 64; i++) v[i] = (uint8_t)(((p[i / 8] >> (i % 8)) & 1) << 4);
  return load_codes(v);
}

INLINE fvec load_f16(const uint8_t *p) {
  float v[VCOLS];
  for (int i = 0; i < VCOLS; i++) v[i] = load_fp16(p + 2 * i);
  fvec r;
  memcpy(&r, v, sizeof r);
  return r;
}

INLINE fvec load_u8(const uint8_t *p) {
  fvec r;
  for (int i = 0; i < VCOLS; i++) r[i] = (float)p[i];
  return r;
}

INLINE fvec load_i8(const uint8_t *p) {
  fvec r;
  for (int i = 0; i < VCOLS; i++) r[i] = (float)(int8_t)p[i];
  return r;
}

INLINE fvec to_float(ivec v) { return __builtin_convertvector(v, fvec); }

INLINE fvec fmadd(fvec a, fvec b, fvec c) {
  float x[VCOLS], y[VCOLS], z[VCOLS];
  memcpy(x, &a, sizeof x);
  memcpy(y, &b, sizeof y);
  memcpy(z, &c, sizeof z);
  for (int i = 0; i < VCOLS; i++) z[i] = fmaf(x[i], y[i], z[i]);
  memcpy(&c, z, sizeof z);
  return c;
}

#include "gguf_mm_kernel.h"
