/* What the kernels built once per instruction set share (gguf_mm.c, skinny_gemm.c,
 * paged_attention.c): a table of their builds, best first, each entry starting with an
 * isa_entry. ISA_TABLE(prefix, table) defines prefix_isa_count / _name / _supported
 * (declared in ops.h) and a static best_isa(), the first build the CPU supports, asked once.
 */
#ifndef PAGEDLLM_ISA_TABLE_H
#define PAGEDLLM_ISA_TABLE_H

typedef struct {
  const char *name;
  int (*supported)(void);
} isa_entry;

static inline int isa_always(void) { return 1; }

#if defined(__x86_64__) && defined(__GNUC__)
/* AVX-512 F/BW/CD/DQ/VL and all of x86-64-v3 (every AVX-512 CPU since Skylake-X, Zen 4). */
static inline int isa_x86_64_v4(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("x86-64-v4");
}

/* x86-64-v4 and AVX-512 BF16's dot products (Cooper Lake, Sapphire Rapids on; Zen 4 on). */
static inline int isa_x86_64_v4_bf16(void) {
  return isa_x86_64_v4() && __builtin_cpu_supports("avx512bf16");
}

/* AVX2, FMA, F16C, BMI1/2 (Haswell, Zen 1 on). */
static inline int isa_x86_64_v3(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("x86-64-v3");
}
#endif

/* The entries of a kernel built by vecn.h at each width, best first: fn##_avx512 (16
 * lanes), fn##_avx2 (8) on x86-64, and fn##_portable (4) everywhere. */
#if defined(__x86_64__) && defined(__GNUC__)
#define VECTOR_BUILDS(fn)                                                       \
  {{"avx512", isa_x86_64_v4}, fn##_avx512}, {{"avx2", isa_x86_64_v3}, fn##_avx2}, \
      {{"portable", isa_always}, fn##_portable}
#else
#define VECTOR_BUILDS(fn) {{"portable", isa_always}, fn##_portable}
#endif

#define ISA_TABLE(prefix, table)                                                          \
  int prefix##_isa_count(void) { return (int)(sizeof table / sizeof table[0]); }           \
                                                                                          \
  const char *prefix##_isa_name(int isa) { return table[isa].isa.name; }                  \
                                                                                          \
  int prefix##_isa_supported(int isa) {                                                   \
    return isa >= 0 && isa < prefix##_isa_count() && table[isa].isa.supported();          \
  }                                                                                       \
                                                                                          \
  /* Threads that race here all store the same value. */                                  \
  static int best_isa(void) {                                                             \
    static int best = -1;                                                                 \
    int isa = __atomic_load_n(&best, __ATOMIC_RELAXED);                                   \
    if (isa < 0) {                                                                        \
      isa = 0;                                                                            \
      while (!table[isa].isa.supported()) isa++;                                          \
      __atomic_store_n(&best, isa, __ATOMIC_RELAXED);                                     \
    }                                                                                     \
    return isa;                                                                           \
  }

#endif
