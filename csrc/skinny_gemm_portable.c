/* skinny_gemm for any CPU: 4-lane vectors (SSE2 on x86-64), tiles of 4 x rows by 1 weight row. */
#define VEC_LANES 4
#define ISA(name) name##_portable
#include "skinny_gemm_kernel.h"
