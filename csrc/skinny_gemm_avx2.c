/* skinny_gemm on AVX2 + FMA (x86-64-v3): 8-lane vectors, tiles of 4 x rows by 2 weight rows. */
#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC target("arch=x86-64-v3")
#define VEC_LANES 8
#define SKINNY_PANEL /* float32 on transposed panels (skinny_gemm_panel.h) */
#define ISA(name) name##_avx2
#include "skinny_gemm_kernel.h"
#endif
