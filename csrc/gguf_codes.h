/* GGUF weight blocks as integer codes and float scales, a vector step (STEP blocks of 32) at
 * a time; part of gguf_dot.h, which lists the primitives it uses. Layouts: gguf.h. */

/* Per int32 lane of a step: the block of the step it lies in, and its lane in that block. */
INLINE uvec lane_block(void) {
  uvec v;
  for (int i = 0; i < STEP_LANES; i++) v[i] = (uint32_t)(i / LANES);
  return v;
}

INLINE uvec lane_in_block(void) {
  uvec v;
  for (int i = 0; i < STEP_LANES; i++) v[i] = (uint32_t)(i % LANES);
  return v;
}

/* v shifted left, then right, by counts per lane that are the same in all of a block's
 * lanes: with one block per step, a shift by one count (which every vector unit has). */
INLINE uvec shift_lanes(uvec v, uvec left, uvec right) {
#if STEP == 1
  return (v << left[0]) >> right[0];
#else
  return (v << left) >> right;
#endif
}

/* Each byte's bits moved from bit from[lane] to bit `to`, then masked: shifts of whole
 * dwords, whose bits crossing into a neighbouring byte the mask drops. */
INLINE cvec move_bits(cvec v, uvec from, uint32_t to, uint8_t mask) {
  const uvec left = (to - from) & (uvec)(from < to), right = (from - to) & (uvec)(from > to);
  return (cvec)shift_lanes((uvec)v, left, right) & mask;
}

INLINE int is_k_quant(int qt) { return qt == GGUF_Q4_K || qt == GGUF_Q5_K || qt == GGUF_Q6_K; }

INLINE int has_min(int qt) {
  return qt == GGUF_Q4_1 || qt == GGUF_Q5_1 || qt == GGUF_Q4_K || qt == GGUF_Q5_K;
}

/* log2 of the offset subtracted from the unsigned codes (Q4_0: 8, Q5_0: 16, Q6_K: 32);
 * 0 for the types with a min and for Q8_0, whose codes are signed. */
INLINE int offset_shift(int qt) {
  return qt == GGUF_Q4_0 ? 3 : qt == GGUF_Q5_0 ? 4 : qt == GGUF_Q6_K ? 5 : 0;
}

/* Q4_K/Q5_K's 12 packed bytes -> 6-bit scales and mins of the 8 sub-blocks: bytes 0-3 and
 * 4-7 hold scales and mins 0-3 in their low 6 bits; bytes 8-11 the low 4 bits of scales
 * (low nibble) and mins (high nibble) 4-7, whose top 2 bits are the top bits of bytes 0-7.
 * Worked on four bytes at a time in 32-bit words. */
INLINE void k_scale_min(const uint8_t *s, f32x8 *scale, f32x8 *min) {
  const uint32_t sc = LOAD(uint32_t, s), mn = LOAD(uint32_t, s + 4), low = LOAD(uint32_t, s + 8);
  const uint32_t words[4] = {sc & 0x3F3F3F3F, (low & 0x0F0F0F0F) | ((sc >> 2) & 0x30303030),
                             mn & 0x3F3F3F3F, ((low >> 4) & 0x0F0F0F0F) | ((mn >> 2) & 0x30303030)};
  uint64_t bytes[2];
  memcpy(bytes, words, sizeof bytes);
  *scale = bytes_to_f32x8(bytes[0]);
  *min = bytes_to_f32x8(bytes[1]);
}

/* The weight scales of a group's blocks (n valid): block j's values are scale[j] * code
 * (minus the offset) + min[j]. Q6_K has no min and 16 scales, one per 16 elements: the first
 * 8 go to scale, the others to min. */
INLINE void group_scales(int qt, const uint8_t *g, int n, f32x8 *scale, f32x8 *min) {
  *min = (f32x8){0};
  switch (qt) {
    case GGUF_Q4_0:
    case GGUF_Q4_1:
    case GGUF_Q5_0:
    case GGUF_Q5_1:
    case GGUF_Q8_0:
      f16x8_pairs(g, gguf_block_bytes(qt), n, scale, has_min(qt) ? min : NULL);
      return;
    case GGUF_Q4_K:
    case GGUF_Q5_K:
      k_scale_min(g + 4, scale, min);
      *scale *= f16(g);
      *min *= -f16(g + 2);
      return;
    default: {
      const float d = f16(g + 208);
      *scale = d * int8s_to_f32x8(LOAD(uint64_t, g + 192));
      *min = d * int8s_to_f32x8(LOAD(uint64_t, g + 200));
    }
  }
}

/* Q5_0/Q5_1: the step's blocks' 32-bit qh (at p + i * stride), block i's at bit 32 i. */
INLINE uint64_t fifth_bit_words(const uint8_t *p, int64_t stride) {
  uint64_t bits = 0;
  for (int i = 0; i < STEP; i++) bits |= (uint64_t)LOAD(uint32_t, p + i * stride) << (32 * i);
  return bits;
}

/* Blocks j .. j + STEP - 1 of a group as unsigned codes (Q8_0: its int8 bytes). */
INLINE cvec step_codes(int qt, const uint8_t *g, int j) {
  const int64_t ts = gguf_block_bytes(qt);
  const uint8_t *b = g + j * ts;
  const uvec sub = (uint32_t)j + lane_block();
  switch (qt) {
    case GGUF_Q4_0: return nibbles(b + 2, ts);
    case GGUF_Q4_1: return nibbles(b + 4, ts);
    case GGUF_Q5_0: return nibbles(b + 6, ts) | fifth_bits(fifth_bit_words(b + 2, ts));
    case GGUF_Q5_1: return nibbles(b + 8, ts) | fifth_bits(fifth_bit_words(b + 4, ts));
    case GGUF_Q8_0: return load_blocks(b + 2, ts);
    case GGUF_Q4_K:
    case GGUF_Q5_K: {
      /* sub-blocks 2i and 2i + 1: the low and high nibbles of the same 32 bytes of qs */
      const uint8_t *qs = g + (qt == GGUF_Q4_K ? 16 : 48) + 32 * (j / 2);
      const cvec low = (cvec)shift_lanes((uvec)repeat32(qs), (uvec){0}, sub % 2 * 4) & 0x0F;
      if (qt == GGUF_Q4_K) return low;
      return low | move_bits(repeat32(g + 16), sub, 4, 0x10); /* bit j of qh[i] */
    }
    default: {
      /* Q6_K: half h of the super block holds sub-blocks 4h + k, k < 4: low 4 bits from
       * nibble k / 2 of ql[64h + 32 (k % 2) + i], top 2 from bits 2k of qh[32h + i]. */
      const int h = j / 4, k = j % 4;
      const cvec ql = LOAD(cvec, g + 64 * h + 32 * (k % 2));
      return ((cvec)((uvec)ql >> (k / 2 * 4)) & 0x0F) |
             move_bits(repeat32(g + 128 + 32 * h), 2 * (sub - 4 * h), 4, 0x30);
    }
  }
}
