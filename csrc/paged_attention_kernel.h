/* Decode attention for one instruction set: a guarded header, included once by each of
 * paged_attention_avx512.c, _avx2.c and _portable.c after its target pragma, with VEC_LANES
 * (the register width in floats: 4, 8 or 16) and ISA(name) (name with the build's suffix)
 * defined first. It defines ISA(paged_attention_run), which paged_attention.c picks at run
 * time, from paged_attention_kv.inc built once per KV-cache element type.
 */
#ifndef PAGEDLLM_PAGED_ATTENTION_KERNEL_H
#define PAGEDLLM_PAGED_ATTENTION_KERNEL_H

#if !defined(VEC_LANES) || !defined(ISA)
#error "define VEC_LANES and ISA(name) before including paged_attention_kernel.h"
#endif

#include <omp.h>
#include <stdlib.h>

#include "paged_attention.h"
#include "vecn.h"
#include "attention_row.h"

#define HEAD_GROUP 4 /* query heads of one kv head that share each widened key and value row */

/* scores (VEC_LANES of them) for the chunk's n <= VEC_LANES key rows (store_scores);
 * partial[i]: a vector whose lanes are key i's lane sums. */
INLINE void chunk_scores(float *scores, vecn partial[VEC_LANES], int64_t n, float scale) {
  for (int64_t i = n; i < VEC_LANES; i++) partial[i] = splatn(0.0f);
  store_scores(scores, transpose_sumn(partial), n, scale);
}

/* The scratch floats a task of `heads` query heads needs: their queries, outputs and scores. */
INLINE int64_t attend_scratch_floats(int64_t heads, int64_t D) {
  return heads * (2 * D + PARTITION_TOKENS);
}

/* Where each sequence's tasks and partial results start, [B + 1] each: first_task[b]
 * (tasks_per_seq tasks per partition of the keys its query sees), first_slot[b] (one slot per
 * partition of a sequence of several, so first_slot[b + 1] - first_slot[b] is 0 for a
 * sequence attended whole; a slot holds every head's unnormalized output, [H, D] in
 * partial_out, and its softmax state, [H] in partial_state). */
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
    const int64_t parts = partitions(visible_keys(a->seq_lens[b], a->sliding_window));
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

/* Each KV-cache element type's build of paged_attention_kv.inc (run_f32, run_bf16): KV_BF16
 * says which it is (for widen2n_as and widened_element, attention_row.h). */
#define KV_T float
#define KV_LOADN loadn
#define KV_LOAD1(p) (*(p))
#define KV_BF16 0
#define KV_NAME(name) name##_f32
#include "paged_attention_kv.inc"

#define KV_T uint16_t
#define KV_LOADN loadn_bf16
#define KV_LOAD1(p) bf16_to_float(*(p))
#define KV_BF16 1
#define KV_NAME(name) name##_bf16
#include "paged_attention_kv.inc"

int ISA(paged_attention_run)(const paged_attention_args *a) {
  return a->kv_bf16 ? run_bf16(a) : run_f32(a);
}

#endif
