/* Rotary position embedding of the query and key heads of each token, float32 or bfloat16.
 *
 * The inputs may be column slices of one fused qkv row (row strides q_stride, k_stride); the
 * outputs are contiguous [T, heads * head_size]. The first rot_dim lanes of every head
 * rotate, the rest are copied. cos_sin_cache [max_pos, rot_dim], float32, holds the cosines,
 * then the sines, of position * inv_freq. bfloat16 lanes rotate in float32 and are rounded
 * once, as torch's definition computes them (_torch_ops.rotary_embedding).
 */
#include "bf16.h"
#include "ops.h"

/* x * y rounded to float32 on its own in bfloat16, as torch rounds each product (the
 * reference); -ffp-contract=fast would fuse it into the add that follows (an FMA, one
 * rounding), as the float32 path keeps doing. The empty asm hides the product from that. */
#define PRODUCT(x, y, bf16)                                   \
  ((bf16) ? ({                                                \
    __typeof__((x) * (y)) product_ = (x) * (y);               \
    __asm__("" : "+m"(product_));                             \
    product_;                                                 \
  })                                                          \
          : (x) * (y))

/* NeoX style pairs lane i with lane i + half; GPT-J style pairs lanes 2i and 2i + 1. */
INLINE void rotate_head(void *out, const void *x, const float *cos, const float *sin,
                        int64_t half, int64_t head_size, int is_neox, int bf16) {
  int64_t i = 0;
  if (!is_neox) {
    for (; i < half; i++) {
      float a = load1_as(x, 2 * i, bf16), b = load1_as(x, 2 * i + 1, bf16);
      store1_as(out, 2 * i, PRODUCT(a, cos[i], bf16) - PRODUCT(b, sin[i], bf16), bf16);
      store1_as(out, 2 * i + 1, PRODUCT(b, cos[i], bf16) + PRODUCT(a, sin[i], bf16), bf16);
    }
  } else {
    for (; i + 16 <= half; i += 16) {
      vec16 a = load16_as(x, i, bf16), b = load16_as(x, half + i, bf16);
      vec16 c = load16(cos + i), s = load16(sin + i);
      store16_as(out, i, PRODUCT(a, c, bf16) - PRODUCT(b, s, bf16), bf16);
      store16_as(out, half + i, PRODUCT(b, c, bf16) + PRODUCT(a, s, bf16), bf16);
    }
    for (; i < half; i++) {
      float a = load1_as(x, i, bf16), b = load1_as(x, half + i, bf16);
      store1_as(out, i, PRODUCT(a, cos[i], bf16) - PRODUCT(b, sin[i], bf16), bf16);
      store1_as(out, half + i, PRODUCT(b, cos[i], bf16) + PRODUCT(a, sin[i], bf16), bf16);
    }
  }
  memcpy(element_at(out, 2 * half, bf16), element_at(x, 2 * half, bf16),
         (size_t)(head_size - 2 * half) * (bf16 ? 2 : 4));
}

/* heads of one token: x (strided source) -> out (contiguous). */
INLINE void rotate_heads(void *out, const void *x, const float *cos_sin, int64_t num_heads,
                         int64_t head_size, int64_t rot_dim, int is_neox, int bf16) {
  const int64_t half = rot_dim / 2;
  for (int64_t h = 0; h < num_heads; h++)
    rotate_head(element_at(out, h * head_size, bf16), element_at(x, h * head_size, bf16),
                cos_sin, cos_sin + half, half, head_size, is_neox, bf16);
}

CPU_DISPATCH
static void rotate_token_heads(void *out, const void *x, int bf16, const float *cos_sin,
                               int64_t num_heads, int64_t head_size, int64_t rot_dim,
                               int is_neox) {
  if (bf16)
    rotate_heads(out, x, cos_sin, num_heads, head_size, rot_dim, is_neox, 1);
  else
    rotate_heads(out, x, cos_sin, num_heads, head_size, rot_dim, is_neox, 0);
}

void rotary_embedding(const int64_t *positions, const void *query, const void *key,
                      void *query_out, void *key_out, int bf16, int64_t q_stride,
                      int64_t k_stride, int64_t num_tokens, int64_t num_heads,
                      int64_t num_kv_heads, int64_t head_size, int64_t rot_dim,
                      const float *cos_sin_cache, int is_neox, int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_tokens > 16)
  for (int64_t t = 0; t < num_tokens; t++) {
    const float *cos_sin = cos_sin_cache + positions[t] * rot_dim;
    rotate_token_heads(element_at(query_out, t * num_heads * head_size, bf16),
                       element_at(query, t * q_stride, bf16), bf16, cos_sin, num_heads,
                       head_size, rot_dim, is_neox);
    rotate_token_heads(element_at(key_out, t * num_kv_heads * head_size, bf16),
                       element_at(key, t * k_stride, bf16), bf16, cos_sin, num_kv_heads,
                       head_size, rot_dim, is_neox);
  }
}
