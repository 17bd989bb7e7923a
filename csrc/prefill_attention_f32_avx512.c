/* Float32 prefill attention on AVX-512 (x86-64-v4): 16-lane vectors. */
#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC target("arch=x86-64-v4")
#define VEC_LANES 16
#define ISA(name) name##_avx512
#include "prefill_attention_f32_kernel.h"
#endif
