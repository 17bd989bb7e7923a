/* skinny_gemm on AVX-512 (x86-64-v4): 16-lane vectors, tiles of 4 x rows by 4 weight rows. */
#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC target("arch=x86-64-v4")
#define VEC_LANES 16
#define ISA(name) name##_avx512
#include "skinny_gemm_kernel.h"
#endif
