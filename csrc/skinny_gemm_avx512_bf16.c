/* skinny_gemm on AVX-512 with BF16 dot products: float32 as the avx512 build, bf16 x and
 * weights multiplied as they are by vdpbf16ps (skinny_gemm_dpbf16.h). */
#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC target("arch=x86-64-v4,avx512bf16")
#define VEC_LANES 16
#define ISA(name) name##_avx512_bf16
#define SKINNY_DPBF16
#include "skinny_gemm_kernel.h"
#endif
