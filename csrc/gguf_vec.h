/* The GGUF kernels' vectors, in GCC's portable vector extension: 8-lane (32-byte) ones, and
 * step-wide ones holding STEP 32-element blocks (STEP, 1 or 2, set by the including file:
 * one AVX2 register or one AVX-512 register per step). */
#ifndef PAGEDLLM_GGUF_VEC_H
#define PAGEDLLM_GGUF_VEC_H

#include <stdint.h>
#include <string.h>

#ifndef STEP
#error "define STEP, the 32-element blocks per vector step, before including gguf_vec.h"
#endif

#define INLINE static inline __attribute__((always_inline))

typedef uint8_t u8x16 __attribute__((vector_size(16)));
typedef uint8_t u8x32 __attribute__((vector_size(32)));
typedef int32_t i32x8 __attribute__((vector_size(32)));
typedef float f32x8 __attribute__((vector_size(32)));

typedef uint8_t cvec __attribute__((vector_size(32 * STEP)));  /* weight codes */
typedef int8_t svec __attribute__((vector_size(32 * STEP)));   /* activations */
typedef int32_t ivec __attribute__((vector_size(32 * STEP)));  /* 8 lanes per block */
typedef uint32_t uvec __attribute__((vector_size(32 * STEP)));
typedef float fvec __attribute__((vector_size(32 * STEP)));

/* The value of `type` stored at p, which need not be aligned. */
#define LOAD(type, p)              \
  ({                               \
    type loaded_;                  \
    memcpy(&loaded_, (p), sizeof loaded_); \
    loaded_;                       \
  })

#define STORE(p, v)                \
  do {                             \
    __typeof__(v) stored_ = (v);   \
    memcpy((p), &stored_, sizeof stored_); \
  } while (0)

#endif
