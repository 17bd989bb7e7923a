/* Element conversion between float32 and bfloat16 (rounding like torch, NaN included). */
#include <string.h>

#include "bf16.h"
#include "ops.h"

CPU_DISPATCH
void convert(void *dst, int dst_bf16, const void *src, int src_bf16, int64_t n) {
  int64_t i = 0;
  if (dst_bf16 == src_bf16) {
    memcpy(dst, src, (size_t)n * (src_bf16 ? sizeof(uint16_t) : sizeof(float)));
  } else if (dst_bf16) {
    for (; i + 16 <= n; i += 16) store16_bf16((uint16_t *)dst + i, load16((const float *)src + i));
    for (; i < n; i++) ((uint16_t *)dst)[i] = float_to_bf16(((const float *)src)[i]);
  } else {
    for (; i + 16 <= n; i += 16) store16((float *)dst + i, load16_bf16((const uint16_t *)src + i));
    for (; i < n; i++) ((float *)dst)[i] = bf16_to_float(((const uint16_t *)src)[i]);
  }
}
