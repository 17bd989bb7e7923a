/* Float32 prefill attention on AVX2 + FMA (x86-64-v3): 8-lane vectors. */
#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC target("arch=x86-64-v3")
#define VEC_LANES 8
#define ISA(name) name##_avx2
#include "prefill_attention_f32_kernel.h"
#endif
