/* The arithmetic of one query row's attention, shared by decode attention
 * (paged_attention_kv.inc) and prefill attention (prefill_attention_f32_kernel.h), so that a
 * token's output is the same bits whichever kernel computes it: as the one new token of a
 * decode step, or as any row of a prefill chunk after any cached context (a prefix-cache hit
 * recomputes a prompt's last token alone; chunked prefill ends chunks anywhere; a preempted
 * sequence recomputes its generated tokens as a prefill). A guarded header, included once per
 * instruction set with that build's VEC_LANES defined (vecn.h): the bits depend on the build,
 * never on the batch, the chunk or the thread count.
 *
 * For a query at position L - 1 (it sees keys 0 .. L - 1, or under a sliding window of W
 * keys only its last W, window_start() .. L - 1):
 * - partitions: PARTITION_TOKENS keys at a time from its first visible key, each with its own
 *   softmax, merged by merge_head when there are several (partitions() of visible_keys());
 * - a score, q . k * scale: VEC_LANES lane sums, each an FMA chain from zero over the head's
 *   vectors, summed by transpose_sumn's tree (lane l + lane l + VEC_LANES / 2, then l + 1/4,
 *   ..., a butterfly), times scale. A widened head (widened_head()) runs two chains, over the
 *   even and the odd vectors of its elements in widened_element order, and adds them per lane;
 *   any other head runs one chain in element order, its elements past the last whole vector
 *   continuing lane 0's chain (store_scores masks and stores a chunk's scores); with a logit
 *   soft cap c, then c * tanhn(score / c) over the partition's scores (cap_scores);
 * - weights: softmax_scores over the partition's scores, in chunks of VEC_LANES from its
 *   first key;
 * - output: per element, an FMA chain from zero over the partition's keys in order of weight
 *   x value; times 1 / the weights' sum (finish_head), or merged with the other partitions.
 * Decode attention computes each score along a key row; prefill attention computes the same
 * chains and tree across a block of VEC_LANES keys copied out transposed, so that one load of
 * a key vector serves several query rows. FMAs are explicit (fman), so that contraction
 * (-ffp-contract=fast) never fuses a product the other kernel rounds.
 */
#ifndef PAGEDLLM_ATTENTION_ROW_H
#define PAGEDLLM_ATTENTION_ROW_H

#include <stdlib.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "vecn.h"

#define MAX_HEAD_SIZE 256 /* head sizes up to this keep their output row in registers */
#define VEC_MAX (MAX_HEAD_SIZE / VEC_LANES)
#define WIDEN_ELEMENTS (2 * VEC_LANES) /* cache elements one widen2n_as reads */

/* a * b + c, rounded once where the instruction set has FMA (else twice). */
INLINE vecn fman(vecn a, vecn b, vecn c) {
#if VEC_LANES == 16 && defined(__AVX512F__)
  return _mm512_fmadd_ps(a, b, c);
#elif VEC_LANES == 8 && defined(__FMA__)
  return _mm256_fmadd_ps(a, b, c);
#elif VEC_LANES == 4 && defined(__FMA__)
  return _mm_fmadd_ps(a, b, c);
#else
  return a * b + c;
#endif
}

/* fman on one float: the same rounding as each lane of fman. */
INLINE float fma1(float a, float b, float c) { return fman(splatn(a), splatn(b), splatn(c))[0]; }

/* Whether a head of D elements takes the widened recipe: two chains per lane sum, its rows
 * widened a pair of vectors at a time and kept in registers. */
INLINE int widened_head(int64_t D) { return D % WIDEN_ELEMENTS == 0 && D <= MAX_HEAD_SIZE; }

/* The element of a cache row that position e of its widened vectors holds. A float32 cache
 * keeps its order; a bf16 cache is widened by two bit operations on 32-bit lanes (even
 * elements are the low halves, odd ones the high), so each 2 * VEC_LANES elements come as
 * their even ones, then their odd ones. */
INLINE int64_t widened_element(int64_t e, int kv_bf16) {
  const int64_t lane = e % WIDEN_ELEMENTS;
  if (!kv_bf16) return e;
  return e - lane + (lane < VEC_LANES ? 2 * lane : 2 * (lane - VEC_LANES) + 1);
}

/* 2 * VEC_LANES cache elements from p (float32, or bf16 where kv_bf16) as two float32
 * vectors, in widened_element order. */
INLINE void widen2n_as(const void *p, int kv_bf16, vecn *lo, vecn *hi) {
  if (kv_bf16) {
    uvecn u;
    memcpy(&u, p, sizeof u);
    *lo = (vecn)(u << 16);
    *hi = (vecn)(u & 0xffff0000u);
  } else {
    *lo = loadn(p);
    *hi = loadn((const float *)p + VEC_LANES);
  }
}

/* A sequence longer than this is attended in tasks of this many tokens (a multiple of every
 * VEC_LANES) whose partial results are merged, so that one long sequence is spread over the
 * threads (as vLLM's paged attention v2). A query's split depends on its length alone, so
 * its result does not depend on the batch or the chunk around it, or on the thread count. */
#define PARTITION_TOKENS 512

INLINE int64_t partitions(int64_t seq_len) {
  return (seq_len + PARTITION_TOKENS - 1) / PARTITION_TOKENS;
}

/* The keys a query at position len - 1 sees: all len, or its last `window` under a sliding
 * window (window > 0, as Mistral's and Gemma's local layers). */
INLINE int64_t visible_keys(int64_t len, int64_t window) {
  return window > 0 && len > window ? window : len;
}

/* The first key a query at position len - 1 sees. */
INLINE int64_t window_start(int64_t len, int64_t window) {
  return len - visible_keys(len, window);
}

/* scores[0, VEC_LANES) = lane_sums * scale for the chunk's first n keys (lane i: key i's
 * lane sums, summed), -FLT_MAX past them. */
INLINE void store_scores(float *scores, vecn lane_sums, int64_t n, float scale) {
  storen(scores, selectn(lanes_below_n(n), lane_sums * scale, splatn(-__FLT_MAX__)));
}

/* tanh of each lane, relative error < 4e-7: Eigen's rational approximation (odd degree 13
 * over even degree 6) on [-9, 9], past which tanh is +-1 in float32; explicit FMAs, so that
 * every kernel of a build rounds it alike. */
INLINE vecn tanhn(vecn x) {
  x = minn(maxn(x, splatn(-9.0f)), splatn(9.0f));
  const vecn x2 = x * x;
  vecn p = fman(x2, splatn(-2.76076847742355e-16f), splatn(2.00018790482477e-13f));
  p = fman(x2, p, splatn(-8.60467152213735e-11f));
  p = fman(x2, p, splatn(5.12229709037114e-08f));
  p = fman(x2, p, splatn(1.48572235717979e-05f));
  p = fman(x2, p, splatn(6.37261928875436e-04f));
  p = fman(x2, p, splatn(4.89352455891786e-03f));
  vecn q = fman(x2, splatn(1.19825839466702e-06f), splatn(1.18534705686654e-04f));
  q = fman(x2, q, splatn(2.26843463243900e-03f));
  q = fman(x2, q, splatn(4.89352518554385e-03f));
  return x * p / q;
}

/* scores[t] = cap * tanh(scores[t] / cap) for t < n (Gemma 2's logit soft cap), in place;
 * the padding past n keeps its -FLT_MAX. */
INLINE void cap_scores(float *scores, int64_t n, float cap) {
  for (int64_t t = 0; t < n; t += VEC_LANES) {
    const vecn s = loadn(scores + t);
    storen(scores + t, selectn(lanes_below_n(n - t), splatn(cap) * tanhn(s / cap), s));
  }
}

/* A query's softmax over its tokens (or one partition's): max score and sum of e^(s - max). */
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

/* The factor that finishes a query's output: 1 / its softmax sum; or, where it is one
 * partition of a longer query (saved: that partition's state), 1, the output left
 * unnormalized and the state kept in *saved for merge_head. */
INLINE float finish_head(const SoftmaxState *state, SoftmaxState *saved) {
  if (saved == NULL) return 1.0f / state->sum;
  *saved = *state;
  return 1.0f;
}

/* out [D] of one query from its partitions: unnormalized outputs part_out (out_stride apart)
 * and their softmax states part_state (state_stride apart), each rescaled to the largest
 * max, summed, and divided by the rescaled sums' total. */
INLINE void merge_head(float *out, const float *part_out, const SoftmaxState *part_state,
                       int64_t parts, int64_t out_stride, int64_t state_stride, int64_t D) {
  float max = -__FLT_MAX__, sum = 0.0f;
  for (int64_t p = 0; p < parts; p++)
    if (part_state[p * state_stride].max > max) max = part_state[p * state_stride].max;
  for (int64_t d = 0; d < D; d++) out[d] = 0.0f;
  for (int64_t p = 0; p < parts; p++) {
    const SoftmaxState *s = &part_state[p * state_stride];
    const float rescale = expn(splatn(s->max - max))[0];
    const float *o = part_out + p * out_stride;
    sum = fma1(s->sum, rescale, sum);
    int64_t d = 0;
    for (; d + VEC_LANES <= D; d += VEC_LANES)
      storen(out + d, fman(splatn(rescale), loadn(o + d), loadn(out + d)));
    for (; d < D; d++) out[d] = fma1(rescale, o[d], out[d]);
  }
  const float inv = 1.0f / sum;
  for (int64_t d = 0; d < D; d++) out[d] *= inv;
}

#endif
