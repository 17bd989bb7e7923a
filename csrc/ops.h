/* The kernels of pagedllm._C; csrc/module.c binds them to Python. All tensors are
 * contiguous float32 (block tables and lengths int32) on the CPU, unless a kernel says
 * otherwise (bfloat16 tensors are passed as uint16_t). */
#ifndef PAGEDLLM_OPS_H
#define PAGEDLLM_OPS_H

#include <stdint.h>

/* The values of the bindings' flag arguments (module.c), mirrored by the enums of
 * pagedllm/_cpu_kernels/flags.py; pagedllm._C's flags() returns them, and Python refuses to
 * load the extension when they differ. The kernels below take the flags they need as ints
 * (bf16: 1 for bfloat16), which the bindings derive from these. */
enum float_type { FLOAT_FLOAT32 = 0, FLOAT_BFLOAT16 = 1 };      /* a tensor's element type */
enum weight_layout { WEIGHT_PLAIN = 0, WEIGHT_PACKED = 1 };     /* skinny_gemm's packed */
enum rotary_style { ROTARY_GPTJ = 0, ROTARY_NEOX = 1 };         /* rotary_embedding's is_neox */
enum gelu_approximate { GELU_NONE = 0, GELU_TANH = 1 };        /* gelu(_and_mul)'s form */
enum { ISA_BEST = -1 }; /* an isa argument: the best build this CPU runs */

/* y [M, N] = x [M, K] @ w [N, K]^T (+ b [N]); b may be NULL (skinny_gemm.c). Each build sums
 * every output in one order for any M, so a row's result does not depend on the rows beside
 * it. isa: an index of skinny_gemm_isa_name that skinny_gemm_isa_supported, or -1 for the
 * best. packed: w in the order that build reads (skinny_gemm_reads_packed), for N and K
 * multiples of its sizes: float32 panels [N / SKINNY_PANEL_ROWS, K, SKINNY_PANEL_ROWS] (each
 * k's values of a panel's weight rows side by side; K % 8 == 0) in the avx2 build. Returns 0,
 * or -2 for a packed weight the build does not read. */
#define SKINNY_PANEL_ROWS 16
int skinny_gemm(const float *x, const float *w, const float *b, float *y, int64_t M, int64_t N,
                int64_t K, int packed, int isa, int num_threads);
int skinny_gemm_isa_count(void);
const char *skinny_gemm_isa_name(int isa);
int skinny_gemm_isa_supported(int isa);

/* skinny_gemm on bfloat16 x, w, b and y, in float32 inside (skinny_gemm.c too; same isa).
 * packed: w in the order [N / SKINNY_PACK_ROWS, K / SKINNY_PACK_K, SKINNY_PACK_ROWS,
 * SKINNY_PACK_K] (each step's values of a tile's weight rows side by side), which the
 * avx512_bf16 build reads. Returns 0, -1 when its scratch memory cannot be allocated, or -2
 * as skinny_gemm. */
#define SKINNY_PACK_ROWS 4
#define SKINNY_PACK_K 32
int skinny_gemm_bf16(const uint16_t *x, const uint16_t *w, const uint16_t *b, uint16_t *y,
                     int64_t M, int64_t N, int64_t K, int packed, int isa, int num_threads);
/* Whether that build (an index, or -1 for the best) reads packed float32 (bf16 = 0) or
 * bfloat16 (bf16 = 1) weights. */
int skinny_gemm_reads_packed(int isa, int bf16);

/* bfloat16 matmul on AMX tiles (amx_gemm.c): y [M, N] = x [M, K] @ w^T (+ b [N]) for a
 * weight w [N, K] that amx_pack_bf16 packed (N % 16 == 0, K % 32 == 0), float32 sums.
 * amx_gemm_supported: whether this CPU and kernel can run it (else amx_gemm_bf16 returns -1
 * and does nothing). */
int amx_gemm_supported(void);
void amx_pack_bf16(uint16_t *packed, const uint16_t *w, int64_t N, int64_t K);
int amx_gemm_bf16(const uint16_t *x, const uint16_t *packed, const uint16_t *b, uint16_t *y,
                  int64_t M, int64_t N, int64_t K, int num_threads);

/* Causal attention of one sequence's prefill chunk in float32 (prefill_attention_f32.c):
 * out, q [n, H, D] float32, queries at positions seq_len - n .. seq_len - 1, against the keys
 * and values of positions up to each one's own in k_cache, v_cache [num_blocks, block_size,
 * KV, D] (bfloat16 when kv_bf16, else float32) through block_table; sliding_window > 0: only
 * the last that many of them; soft_cap > 0: each score s capped as soft_cap * tanh(s /
 * soft_cap). Row i is the bits paged_decode_attention gives its query as a sequence of
 * seq_len - n + i + 1 tokens with the same options (same isa). isa: an index of
 * prefill_attention_f32_isa_name that prefill_attention_f32_isa_supported, or -1 for the
 * best. Returns 0, or -1 when its scratch memory cannot be allocated. */
int prefill_attention_f32(float *out, const float *q, const void *k_cache, const void *v_cache,
                          int kv_bf16, const int32_t *block_table, int64_t n, int64_t seq_len,
                          int64_t H, int64_t KV, int64_t D, int64_t block_size, float scale,
                          int64_t sliding_window, float soft_cap, int isa, int num_threads);
int prefill_attention_f32_isa_count(void);
const char *prefill_attention_f32_isa_name(int isa);
int prefill_attention_f32_isa_supported(int isa);

/* One new query token per sequence against its paged keys and values:
 * out, q [B, H, D]; k_cache, v_cache [num_blocks, block_size, KV, D];
 * block_tables [B, max_blocks]; seq_lens [B] (>= 1). Query head h reads kv head h / (H / KV).
 * The caches hold bfloat16 when kv_bf16, else float32. sliding_window > 0: a query sees only
 * its sequence's last that many keys (and reads no others); soft_cap > 0: each score s is
 * capped as soft_cap * tanh(s / soft_cap). isa: an index of paged_attention_isa_name that
 * paged_attention_isa_supported, or -1 for the best. Returns 0, or -1 when its scratch memory
 * cannot be allocated (paged_attention.c). */
int paged_decode_attention(float *out, const float *q, const void *k_cache, const void *v_cache,
                           int kv_bf16, const int32_t *block_tables, const int32_t *seq_lens,
                           int64_t B, int64_t H, int64_t KV, int64_t D, int64_t block_size,
                           int64_t max_blocks, float scale, int64_t sliding_window,
                           float soft_cap, int isa, int num_threads);
int paged_attention_isa_count(void);
const char *paged_attention_isa_name(int isa);
int paged_attention_isa_supported(int isa);

/* k_cache, v_cache [num_slots, row_size] at slot_mapping[t] = key, value row t (row strides
 * key_stride, value_stride): the new tokens' keys and values stored for later steps. key and
 * value are bfloat16 when kv_bf16, the caches when cache_bf16, else float32 (converted). A
 * slot of -1 marks a padding token, which is skipped (vLLM's PAD_SLOT_ID). */
void reshape_and_cache(const void *key, const void *value, int kv_bf16, void *k_cache,
                       void *v_cache, int cache_bf16, const int64_t *slot_mapping,
                       int64_t num_tokens, int64_t key_stride, int64_t value_stride,
                       int64_t row_size);

/* dst [n] = src [n], each bfloat16 when its flag is set, else float32 (convert.c). */
void convert(void *dst, int dst_bf16, const void *src, int src_bf16, int64_t n);

/* out [rows] = torch.argmax of each row of x [rows, n] (float32, or bfloat16 if bf16): the
 * first index of its largest value, or of its first NaN (argmax.c). */
void argmax(int64_t *out, const void *x, int bf16, int64_t rows, int64_t n, int num_threads);

/* out [rows, n] = x * rsqrt(mean(x^2) + eps) * weight [n], row by row. x, weight and out are
 * bfloat16 when bf16 (x * rsqrt(...) rounded to bfloat16 before the weight), else float32.
 * x's rows come in groups of `group` adjacent rows, group_stride elements apart (per-head
 * rows of a column slice of a fused qkv: group = heads, group_stride = the qkv width). */
void rms_norm(void *out, const void *x, const void *weight, int bf16, float eps, int64_t rows,
              int64_t n, int64_t group, int64_t group_stride, int num_threads);

/* residual_out = x + residual; out = rms_norm(residual_out); all [rows, n], bfloat16 when
 * bf16 (residual_out rounded first), else float32. */
void fused_add_rms_norm(void *out, void *residual_out, const void *x, const void *residual,
                        const void *weight, int bf16, float eps, int64_t rows, int64_t n,
                        int num_threads);

/* out [rows, n] = (x - mean) * rsqrt(var + eps) * weight [n] + bias [n] row by row (torch's
 * F.layer_norm), of x, or, when residual is not NULL, of residual_out = x + residual (the
 * fused residual add; residual_out is written). All bfloat16 when bf16 (x + residual and the
 * result each rounded once), else float32. */
void layer_norm(void *out, void *residual_out, const void *x, const void *residual,
                const void *weight, const void *bias, int bf16, float eps, int64_t rows,
                int64_t n, int num_threads);

/* query_out [T, H * D], key_out [T, KV * D] = query, key rows (strides q_stride, k_stride)
 * rotated by their positions (see pos_encoding.c); the four bfloat16 when bf16, else float32;
 * cos_sin_cache float32. */
void rotary_embedding(const int64_t *positions, const void *query, const void *key,
                      void *query_out, void *key_out, int bf16, int64_t q_stride,
                      int64_t k_stride, int64_t num_tokens, int64_t num_heads,
                      int64_t num_kv_heads, int64_t head_size, int64_t rot_dim,
                      const float *cos_sin_cache, int is_neox, int num_threads);

/* out [T, d] = silu(x[:, :d]) * x[:, d:] for x [T, 2d]; bfloat16 when bf16 (silu rounded to
 * bfloat16 before the product), else float32. */
void silu_and_mul(void *out, const void *x, int bf16, int64_t num_tokens, int64_t d,
                  int num_threads);

/* out [T, d] = gelu(x[:, :d]) * x[:, d:] for x [T, 2d], gelu's tanh form when tanh_form, else
 * its erf form; bfloat16 when bf16 (gelu rounded to bfloat16 before the product), else
 * float32 (activation.c). */
void gelu_and_mul(void *out, const void *x, int bf16, int tanh_form, int64_t num_tokens,
                  int64_t d, int num_threads);

/* out [n] = gelu(x [n]), the tanh form when tanh_form, else the erf form, over contiguous
 * elements; bfloat16 when bf16 (rounded once), else float32 (activation.c). */
void gelu(void *out, const void *x, int bf16, int tanh_form, int64_t n, int num_threads);

/* out [T, n] = y + delta on the rows t whose row_slots[t] == slot, y elsewhere; bfloat16 when
 * bf16 (each sum rounded once), else float32 (lora.c). */
void lora_masked_add(void *out, const void *y, const void *delta, const int32_t *row_slots,
                     int64_t slot, int bf16, int64_t rows, int64_t n, int num_threads);

/* out [n] = x * alpha, and out [n] = a + b, over contiguous elements; bfloat16 when bf16
 * (each result rounded once from float32), else float32 (elementwise.c). */
void scale(void *out, const void *x, float alpha, int bf16, int64_t n, int num_threads);
void add(void *out, const void *a, const void *b, int bf16, int64_t n, int num_threads);

/* Bytes of a GGUF weight [N, K] of qtype packed for gguf_mm (gguf_packed.h). */
int64_t gguf_packed_bytes(int qtype, int64_t N, int64_t K);

/* packed (gguf_packed_bytes) = the GGUF blocks w [N, K / block_size * type_size] of qtype,
 * K whole blocks (gguf_pack.c). */
void gguf_pack(const uint8_t *w, uint8_t *packed, int qtype, int64_t N, int64_t K,
               int num_threads);

/* out [n, K] = rows rows[0 .. n) (each < N) of a packed weight as float32, bit-equal to
 * gguf.quants.dequantize of its blocks. */
void gguf_unpack_rows(const uint8_t *packed, float *out, int qtype, int64_t K,
                      const int64_t *rows, int64_t n, int num_threads);

/* y [M, N] = x [M, K] @ W^T (+ b [N]) for a packed weight W of qtype; x, b and y bfloat16
 * when bf16, else float32. Each x row is quantized to 8-bit blocks of 32 first, and each
 * row's result is the same bits whatever M (gguf_mm.c). isa: an index below
 * gguf_isa_count() that gguf_isa_supported(), or -1 for the best. Returns 0, or -1 when its
 * scratch memory cannot be allocated. */
int gguf_mm(const void *x, const uint8_t *packed, const void *b, void *y, int bf16, int qtype,
            int64_t M, int64_t N, int64_t K, int isa, int num_threads);

/* The instruction sets gguf_mm can run, best first: their number, names, and whether the
 * running CPU has each. */
int gguf_isa_count(void);
const char *gguf_isa_name(int isa);
int gguf_isa_supported(int isa);

/* out [rows, K] = the GGUF blocks w [rows, K / block_size * type_size] of qtype, as float32,
 * bit-equal to gguf.quants.dequantize (gguf_dequant.c). */
void gguf_dequantize(const uint8_t *w, float *out, int qtype, int64_t rows, int64_t K,
                     int num_threads);

#endif
