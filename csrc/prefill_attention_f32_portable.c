/* Float32 prefill attention for any CPU: 4-lane vectors (SSE2 on x86-64). */
#define VEC_LANES 4
#define ISA(name) name##_portable
#include "prefill_attention_f32_kernel.h"
