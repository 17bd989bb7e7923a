/* Decode attention for any CPU: 4-lane vectors (SSE2 on x86-64), chunks of 4 tokens. */
#define VEC_LANES 4
#define ISA(name) name##_portable
#include "paged_attention_kernel.h"
