/* Rotary position embedding of the query and key heads of each token.
 *
 * The inputs may be column slices of one fused qkv row (row strides q_stride, k_stride); the
 * outputs are contiguous [T, heads * head_size]. The first rot_dim lanes of every head
 * rotate, the rest are copied. cos_sin_cache [max_pos, rot_dim] holds the cosines, then the
 * sines, of position * inv_freq.
 */
#include "ops.h"
#include "vec.h"

/* NeoX style pairs lane i with lane i + half; GPT-J style pairs lanes 2i and 2i + 1. */
INLINE void rotate_head(float *out, const float *x, const float *cos, const float *sin,
                        int64_t half, int64_t head_size, int is_neox) {
  int64_t i = 0;
  if (!is_neox) {
    for (; i < half; i++) {
      float a = x[2 * i], b = x[2 * i + 1];
      out[2 * i] = a * cos[i] - b * sin[i];
      out[2 * i + 1] = b * cos[i] + a * sin[i];
    }
  } else {
    for (; i + 16 <= half; i += 16) {
      vec16 a = load16(x + i), b = load16(x + half + i);
      vec16 c = load16(cos + i), s = load16(sin + i);
      store16(out + i, a * c - b * s);
      store16(out + half + i, b * c + a * s);
    }
    for (; i < half; i++) {
      float a = x[i], b = x[half + i];
      out[i] = a * cos[i] - b * sin[i];
      out[half + i] = b * cos[i] + a * sin[i];
    }
  }
  memcpy(out + 2 * half, x + 2 * half, (size_t)(head_size - 2 * half) * sizeof(float));
}

/* heads of one token: x (strided source) -> out (contiguous). */
CPU_DISPATCH
static void rotate_heads(float *out, const float *x, const float *cos_sin, int64_t num_heads,
                         int64_t head_size, int64_t rot_dim, int is_neox) {
  const int64_t half = rot_dim / 2;
  for (int64_t h = 0; h < num_heads; h++)
    rotate_head(out + h * head_size, x + h * head_size, cos_sin, cos_sin + half, half,
                head_size, is_neox);
}

void rotary_embedding(const int64_t *positions, const float *query, const float *key,
                      float *query_out, float *key_out, int64_t q_stride, int64_t k_stride,
                      int64_t num_tokens, int64_t num_heads, int64_t num_kv_heads,
                      int64_t head_size, int64_t rot_dim, const float *cos_sin_cache,
                      int is_neox, int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_tokens > 16)
  for (int64_t t = 0; t < num_tokens; t++) {
    const float *cos_sin = cos_sin_cache + positions[t] * rot_dim;
    rotate_heads(query_out + t * num_heads * head_size, query + t * q_stride, cos_sin,
                 num_heads, head_size, rot_dim, is_neox);
    rotate_heads(key_out + t * num_kv_heads * head_size, key + t * k_stride, cos_sin,
                 num_kv_heads, head_size, rot_dim, is_neox);
  }
}
