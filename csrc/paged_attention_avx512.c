/* Decode attention on AVX-512 (x86-64-v4): 16-lane vectors, chunks of 16 tokens. */
#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC target("arch=x86-64-v4")
#define VEC_LANES 16
#define ISA(name) name##_avx512
#include "paged_attention_kernel.h"
#endif
