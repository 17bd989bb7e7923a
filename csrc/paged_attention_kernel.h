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

/* A head's softmax over its tokens (or one partition's): max score and sum of e^(s - max). */
typedef struct {
  float max, sum;
} SoftmaxState;

/* probs[t] = e^(scores[t] - max) in place over the L scores (padded to whole vectors with
 * -FLT_MAX, which add nothing); returns the max and the sum. */
INLINE SoftmaxState softmax_scores(float *scores, int64_t L) {
  vecn max = splatn(-__FLT_MAX__), sum = splatn(0.0f);
  for (int64_t t = 0; t < L; t += VEC_LANES) max = maxn(max, loadn(scores + t));
  const float m = hmaxn(max);
  for (int64_t t = 0; t < L; t += VEC_LANES) {
    const int64_t n = L - t < VEC_LANES ? L - t : VEC_LANES;
    const vecn p = selectn(lanes_below_n(n), expn(loadn(scores + t) - m), splatn(0.0f));
    storen(scores + t, p);
    sum += p;
  }
  return (SoftmaxState){m, hsumn(sum)};
}

/* scores (VEC_LANES of them) = scale * q . k_i for the chunk's n <= VEC_LANES key rows;
 * lanes >= n are -FLT_MAX. partial[i]: a vector whose lanes sum to q . k_i. */
INLINE void chunk_scores(float *scores, vecn partial[VEC_LANES], int64_t n, float scale) {
  for (int64_t i = n; i < VEC_LANES; i++) partial[i] = splatn(0.0f);
  storen(scores, selectn(lanes_below_n(n), transpose_sumn(partial) * scale,
                         splatn(-__FLT_MAX__)));
}

/* A sequence longer than this is attended in tasks of this many tokens (a multiple of every
 * VEC_LANES) whose partial results are merged, so that one long sequence is spread over the
 * threads (as vLLM's paged attention v2). A sequence's split depends on its length alone, so
 * its result does not depend on the batch around it or on the thread count. */
#define PARTITION_TOKENS 512

/* The scratch floats a task of `heads` query heads needs: their queries, outputs and scores. */
INLINE int64_t attend_scratch_floats(int64_t heads, int64_t D) {
  return heads * (2 * D + PARTITION_TOKENS);
}

INLINE int64_t partitions(int64_t seq_len) {
  return (seq_len + PARTITION_TOKENS - 1) / PARTITION_TOKENS;
}

/* Where each sequence's tasks and partial results start, [B + 1] each: first_task[b]
 * (tasks_per_seq tasks per partition), first_slot[b] (one slot per partition of a sequence of
 * several, so first_slot[b + 1] - first_slot[b] is 0 for a sequence attended whole; a slot
 * holds every head's unnormalized output, [H, D] in partial_out, and its softmax state, [H]
 * in partial_state). */
typedef struct {
  int64_t *first_task, *first_slot;
  float *partial_out;
  SoftmaxState *partial_state;
} Partitions;

static void free_partitions(Partitions *p) {
  free(p->first_task);
  free(p->first_slot);
  free(p->partial_out);
  free(p->partial_state);
}

/* Returns 0, or -1 (nothing allocated) when memory runs out. */
static int plan_partitions(Partitions *p, const paged_attention_args *a, int64_t tasks_per_seq) {
  *p = (Partitions){malloc((size_t)(a->B + 1) * sizeof(int64_t)),
                    malloc((size_t)(a->B + 1) * sizeof(int64_t)), NULL, NULL};
  if (p->first_task == NULL || p->first_slot == NULL) {
    free_partitions(p);
    return -1;
  }
  p->first_task[0] = p->first_slot[0] = 0;
  for (int64_t b = 0; b < a->B; b++) {
    const int64_t parts = partitions(a->seq_lens[b]);
    p->first_task[b + 1] = p->first_task[b] + parts * tasks_per_seq;
    p->first_slot[b + 1] = p->first_slot[b] + (parts > 1 ? parts : 0);
  }
  const int64_t slots = p->first_slot[a->B];
  if (slots == 0) return 0;
  p->partial_out = malloc((size_t)(slots * a->H * a->D) * sizeof(float));
  p->partial_state = malloc((size_t)(slots * a->H) * sizeof(SoftmaxState));
  if (p->partial_out == NULL || p->partial_state == NULL) {
    free_partitions(p);
    return -1;
  }
  return 0;
}

/* The sequence b whose tasks [first_task[b], first_task[b + 1]) hold task. */
INLINE int64_t task_sequence(const int64_t *first_task, int64_t B, int64_t task) {
  int64_t lo = 0, hi = B - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (first_task[mid] <= task)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

/* The factor that finishes a head's output: 1 / its softmax sum; or, where the task is one
 * partition of a longer sequence (saved: its slot's states), 1, the output left unnormalized
 * and the state kept in saved[h] for merge_head. */
INLINE float finish_head(const SoftmaxState *state, SoftmaxState *saved, int64_t h) {
  if (saved == NULL) return 1.0f / state->sum;
  saved[h] = *state;
  return 1.0f;
}

/* out [D] of one head from its sequence's parts: unnormalized outputs part_out (out_stride
 * apart) and their softmax states part_state (state_stride apart), each rescaled to the
 * largest max, summed, and divided by the rescaled sums' total. */
INLINE void merge_head(float *out, const float *part_out, const SoftmaxState *part_state,
                       int64_t parts, int64_t out_stride, int64_t state_stride, int64_t D) {
  float max = -__FLT_MAX__, sum = 0.0f;
  for (int64_t p = 0; p < parts; p++)
    if (part_state[p * state_stride].max > max) max = part_state[p * state_stride].max;
  for (int64_t d = 0; d < D; d++) out[d] = 0.0f;
  for (int64_t p = 0; p < parts; p++) {
    const SoftmaxState *s = &part_state[p * state_stride];
    const float rescale = expn(splatn(s->max - max))[0];
    sum += s->sum * rescale;
    for (int64_t d = 0; d < D; d++) out[d] += rescale * part_out[p * out_stride + d];
  }
  const float inv = 1.0f / sum;
  for (int64_t d = 0; d < D; d++) out[d] *= inv;
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
