/* Decode attention for one instruction set: included by paged_attention_avx512.c, _avx2.c and
 * _portable.c after their target pragma, with VEC_LANES (the register width in floats) and
 * ISA(name) (the instruction set's suffix) defined. paged_attention.c picks one at run time.
 */
#include <omp.h>
#include <stdlib.h>

#include "paged_attention.h"
#include "vecn.h"

#define MAX_HEAD_SIZE 256 /* head sizes up to this keep their output row in registers */
#define VEC_MAX (MAX_HEAD_SIZE / VEC_LANES)
#define WIDEN_ELEMENTS (2 * VEC_LANES) /* cache elements one KV_WIDEN2N reads */
#define HEAD_GROUP 4 /* query heads of one kv head that share each widened key and value row */

/* A head's running softmax over the chunks seen so far: max score and sum of e^(s - max). */
typedef struct {
  float max, sum;
} RunningSoftmax;

/* Folds one chunk's scores (lanes >= n: -FLT_MAX) into state: probs[i] = e^(scores[i] - max)
 * for the new running max; returns the factor that rescales what was summed before. */
INLINE float softmax_update(vecn scores, int64_t n, RunningSoftmax *state, float *probs) {
  const float chunk_max = hmaxn(scores);
  const float max = chunk_max > state->max ? chunk_max : state->max;
  const float correction = expn(splatn(state->max - max))[0];
  const vecn p = selectn(lanes_below_n(n), expn(scores - max), splatn(0.0f));
  storen(probs, p);
  state->sum = state->sum * correction + hsumn(p);
  state->max = max;
  return correction;
}

/* KV_WIDEN2N(p, lo, hi): 2 * VEC_LANES cache elements from p as two float32 vectors, in the
 * lane order KV_ELEMENT_OF gives (lane -> element of the 2 * VEC_LANES). A float32 cache keeps
 * its order; a bf16 cache is widened by two bit operations on 32-bit lanes (even elements are
 * the low halves, odd ones the high), so queries and outputs are put in that order instead. */
#define KV_T float
#define KV_LOADN loadn
#define KV_LOAD1(p) (*(p))
#define KV_WIDEN2N(p, lo, hi) (lo = loadn(p), hi = loadn((p) + VEC_LANES))
#define KV_ELEMENT_OF(lane) (lane)
#define KV_NAME(name) name##_f32
#include "paged_attention_kv.h"
#undef KV_T
#undef KV_LOADN
#undef KV_LOAD1
#undef KV_WIDEN2N
#undef KV_ELEMENT_OF
#undef KV_NAME

INLINE void widen2n_bf16(const uint16_t *p, vecn *lo, vecn *hi) {
  uvecn u;
  memcpy(&u, p, sizeof u);
  *lo = (vecn)(u << 16);
  *hi = (vecn)(u & 0xffff0000u);
}

#define KV_T uint16_t
#define KV_LOADN loadn_bf16
#define KV_LOAD1(p) bf16_to_float(*(p))
#define KV_WIDEN2N(p, lo, hi) widen2n_bf16(p, &(lo), &(hi))
#define KV_ELEMENT_OF(lane) ((lane) < VEC_LANES ? 2 * (lane) : 2 * ((lane) - VEC_LANES) + 1)
#define KV_NAME(name) name##_bf16
#include "paged_attention_kv.h"

int ISA(paged_attention_run)(const paged_attention_args *a) {
  return a->kv_bf16 ? run_bf16(a) : run_f32(a);
}
