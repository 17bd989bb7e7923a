/* SiluAndMul and GeluAndMul: out [T, I] = act(x[:, :I]) * x[:, I:] for x [T, 2I], one pass,
 * on float32 or bfloat16. In bfloat16 act(gate) is rounded before the product, as torch's
 * F.silu or F.gelu on a bfloat16 tensor rounds it (_torch_ops.silu_and_mul, gelu_and_mul).
 * And GELU alone, elementwise (the activation of non-gated MLPs: StarCoder 2's).
 *
 * exp16 may differ from torch's exp in the last float bit, which can move that rounding by one
 * bfloat16 step. exp16 clamps its input to [-87, 88], so where the true value underflows
 * (silu below -88, gelu below about -10 (tanh form) or -13 (erf form)) the result is ~1e-37
 * where torch's is -0. GELU is written without cancellation: where gelu(gate) is small, torch's
 * float32 0.5 x (1 + tanh or erf) loses its low bits (up to ~1e-6 absolute), these do not. */
#include "bf16.h"
#include "ops.h"

/* The activations, each applied to 16 lanes of gates. */
enum activation { ACT_SILU, ACT_GELU_ERF, ACT_GELU_TANH };

/* gelu, tanh form: 0.5 x (1 + tanh(y)) = x / (1 + e^(-2y)), y = sqrt(2 / pi) (x + 0.044715 x^3)
 * (the identity 1 + tanh y = 2 / (1 + e^(-2y))). */
INLINE vec16 gelu_tanh16(vec16 x) {
  const vec16 y = 0.7978845608f * (x + 0.044715f * (x * x * x));
  return x / (1.0f + exp16(-2.0f * y));
}

/* erfc(z) with relative error ~1e-7 for z >= 0 (Numerical Recipes' erfcc, a Chebyshev fit of
 * t e^(-z^2 + P(t)), t = 1 / (1 + z / 2)); erfc(-z) = 2 - erfc(z). Below its float32 rounding
 * the error grows as erfc's conditioning, 2 z^2 times z's own rounding. */
INLINE vec16 erfc16(vec16 z) {
  const vec16 a = (vec16)((ivec16)z & 0x7fffffff);
  const vec16 t = 1.0f / (1.0f + 0.5f * a);
  vec16 p = t * 0.17087277f - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  const vec16 r = t * exp16(t * p - 1.26551223f - a * a);
  return select16(z < 0.0f, 2.0f - r, r);
}

/* gelu, erf form: 0.5 x (1 + erf(x / sqrt 2)) = 0.5 x erfc(-x / sqrt 2). */
INLINE vec16 gelu_erf16(vec16 x) { return 0.5f * x * erfc16(x * -0.70710678f); }

INLINE vec16 activate16(vec16 gate, int act) {
  if (act == ACT_GELU_ERF) return gelu_erf16(gate);
  if (act == ACT_GELU_TANH) return gelu_tanh16(gate);
  return gate / (1.0f + exp16(-gate));
}

/* Row t: out[t] = act(x[t, :d]) * x[t, d:]. */
INLINE void act_and_mul_row(void *out, const void *x, int64_t d, int64_t t, int bf16, int act) {
  const void *gates = element_at(x, 2 * t * d, bf16);
  const void *ups = element_at(x, (2 * t + 1) * d, bf16);
  void *out_row = element_at(out, t * d, bf16);
  int64_t i = 0;
  for (; i + 16 <= d; i += 16) {
    vec16 a = activate16(load16_as(gates, i, bf16), act);
    if (bf16) a = round16_bf16(a);
    store16_as(out_row, i, a * load16_as(ups, i, bf16), bf16);
  }
  if (i < d) {
    float tail[16] = {0};
    for (int64_t j = i; j < d; j++) tail[j - i] = load1_as(gates, j, bf16);
    vec16 a = activate16(load16(tail), act);
    store16(tail, bf16 ? round16_bf16(a) : a);
    for (int64_t j = i; j < d; j++)
      store1_as(out_row, j, tail[j - i] * load1_as(ups, j, bf16), bf16);
  }
}

/* One row, with bf16 and act constants in each call so each copy is specialized. */
CPU_DISPATCH
static void act_and_mul_token(void *out, const void *x, int bf16, int act, int64_t d,
                              int64_t t) {
#define ROW(act) \
  (bf16 ? act_and_mul_row(out, x, d, t, 1, act) : act_and_mul_row(out, x, d, t, 0, act))
  if (act == ACT_GELU_ERF)
    ROW(ACT_GELU_ERF);
  else if (act == ACT_GELU_TANH)
    ROW(ACT_GELU_TANH);
  else
    ROW(ACT_SILU);
#undef ROW
}

static void act_and_mul(void *out, const void *x, int bf16, int act, int64_t num_tokens,
                        int64_t d, int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_tokens * d > 65536)
  for (int64_t t = 0; t < num_tokens; t++) act_and_mul_token(out, x, bf16, act, d, t);
}

void silu_and_mul(void *out, const void *x, int bf16, int64_t num_tokens, int64_t d,
                  int num_threads) {
  act_and_mul(out, x, bf16, ACT_SILU, num_tokens, d, num_threads);
}

void gelu_and_mul(void *out, const void *x, int bf16, int tanh_form, int64_t num_tokens,
                  int64_t d, int num_threads) {
  act_and_mul(out, x, bf16, tanh_form ? ACT_GELU_TANH : ACT_GELU_ERF, num_tokens, d,
              num_threads);
}

/* Elements [begin, end) of out = act(x). */
INLINE void act_range(void *out, const void *x, int64_t begin, int64_t end, int bf16, int act) {
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) store16_as(out, i, activate16(load16_as(x, i, bf16), act), bf16);
  if (i < end) {
    float tail[16] = {0};
    for (int64_t j = i; j < end; j++) tail[j - i] = load1_as(x, j, bf16);
    store16(tail, activate16(load16(tail), act));
    for (int64_t j = i; j < end; j++) store1_as(out, j, tail[j - i], bf16);
  }
}

/* One chunk, with bf16 and act constants in each call so each copy is specialized. */
CPU_DISPATCH
static void gelu_chunk(void *out, const void *x, int bf16, int tanh_form, int64_t begin,
                       int64_t end) {
#define RANGE(act) \
  (bf16 ? act_range(out, x, begin, end, 1, act) : act_range(out, x, begin, end, 0, act))
  if (tanh_form)
    RANGE(ACT_GELU_TANH);
  else
    RANGE(ACT_GELU_ERF);
#undef RANGE
}

/* Chunks of 16K elements: a decode step's rows take one thread, no parallel region. */
#define CHUNK 16384

void gelu(void *out, const void *x, int bf16, int tanh_form, int64_t n, int num_threads) {
  if (n <= CHUNK) {
    gelu_chunk(out, x, bf16, tanh_form, 0, n);
    return;
  }
#pragma omp parallel for schedule(static) num_threads(num_threads)
  for (int64_t c = 0; c < (n + CHUNK - 1) / CHUNK; c++)
    gelu_chunk(out, x, bf16, tanh_form, c * CHUNK, c * CHUNK + CHUNK < n ? c * CHUNK + CHUNK : n);
}
