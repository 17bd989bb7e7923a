/* pagedllm._C: Python bindings of the kernels in ops.h.
 *
 * Each binding's arguments are declared once, in order, by an X-macro: ARG(kind, C type,
 * name), kind p a data pointer, i an int (sizes, strides, the flags of ops.h's enums), f a
 * float. The declaration gives the binding its named C variables, parses its Python
 * arguments into them (a TypeError names the argument of the wrong type), and makes its
 * signature string ("x:p weight:p ... num_threads:i"), which signatures() returns per
 * binding: pagedllm/_cpu_kernels/__init__.py compares it with the Python declaration of the
 * kernel when it loads this module and refuses to load on any difference. A binding takes its
 * kernel's arguments in the kernel's order, then the sizes only its checks read.
 *
 * The wrappers in pagedllm/_cpu_kernels/ check dtypes, devices, layouts and shapes and take
 * the sizes from the tensors. Index values (cache slots, block ids, sequence lengths,
 * positions) are checked here, with the GIL held, before the kernel reads through them: a
 * bad one raises ValueError rather than touching memory outside the tensors. The GIL is
 * released while a kernel runs. Threads come from OpenMP: the same libgomp (soname
 * libgomp.so.1) torch loads, so these kernels and torch's ops share one thread pool.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "gguf.h"
#include "ops.h"

/* One Python argument as a binding's kind (i: any int, __index__ included; p: an int
 * address; f: anything float() takes): 0, or -1 with an error set, a TypeError naming the
 * argument for one of the wrong type. */
static int parse_failed(const char *op, const char *name, const char *kind, PyObject *arg) {
  if (PyErr_ExceptionMatches(PyExc_TypeError)) {
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError, "%s: %s must be %s, got %s", op, name, kind,
                 Py_TYPE(arg)->tp_name);
  }
  return -1;
}

static int parse_i(const char *op, const char *name, PyObject *arg, int64_t *out) {
  *out = PyLong_AsLongLong(arg);
  return *out == -1 && PyErr_Occurred() ? parse_failed(op, name, "an int", arg) : 0;
}

static int parse_p(const char *op, const char *name, PyObject *arg, void **out) {
  int64_t address = PyLong_AsLongLong(arg);
  if (address == -1 && PyErr_Occurred()) return parse_failed(op, name, "an address (int)", arg);
  *out = (void *)(intptr_t)address;
  return 0;
}

static int parse_f(const char *op, const char *name, PyObject *arg, double *out) {
  *out = PyFloat_AsDouble(arg);
  return *out == -1.0 && PyErr_Occurred() ? parse_failed(op, name, "a float", arg) : 0;
}

typedef void *parsed_p;
typedef int64_t parsed_i;
typedef double parsed_f;

/* The expansions of an argument declaration ARG(kind, type, name). */
#define DECLARE_ARG(kind, type, name) type name;
#define COUNT_ARG(kind, type, name) +1
#define SIGNATURE_ARG(kind, type, name) " " #name ":" #kind
#define PARSE_ARG(kind, type, name)                                           \
  {                                                                           \
    parsed_##kind parsed;                                                     \
    if (parse_##kind(op, #name, py_args[arg++], &parsed) < 0) return NULL;    \
    name = (type)parsed;                                                      \
  }

/* A binding's signature string, "name:kind" per argument, space-separated. */
#define SIGNATURE(ARGS) ((ARGS(SIGNATURE_ARG)) + 1)

/* 0 when every values[i] lies in [lowest, end), else -1 with a ValueError naming the first
 * that does not. */
static int check_indices(const char *op, const char *name, const int64_t *values, int64_t n,
                         int64_t lowest, int64_t end) {
  for (int64_t i = 0; i < n; i++) {
    if (values[i] < lowest || values[i] >= end) {
      PyErr_Format(PyExc_ValueError, "%s: %s[%lld] = %lld is outside [%lld, %lld)", op, name,
                   (long long)i, (long long)values[i], (long long)lowest, (long long)end);
      return -1;
    }
  }
  return 0;
}

/* 0 when isa is ISA_BEST or the index of one of a kernel's instruction sets (count,
 * supported) that this CPU supports, else -1 with a ValueError naming op. */
static int check_isa(const char *op, int64_t isa, int (*count)(void), int (*supported)(int)) {
  if (isa == ISA_BEST || (isa >= 0 && isa < count() && supported((int)isa))) return 0;
  PyErr_Format(PyExc_ValueError, "%s: isa %lld is not one this CPU supports", op,
               (long long)isa);
  return -1;
}

/* ((name, supported), ...) of a kernel's instruction sets, best first; the index of one is
 * its isa argument. */
static PyObject *isa_table(int (*count)(void), const char *(*name)(int), int (*supported)(int)) {
  PyObject *isas = PyTuple_New(count());
  for (int i = 0; isas && i < count(); i++) {
    PyObject *item = Py_BuildValue("(sO)", name(i), supported(i) ? Py_True : Py_False);
    if (!item) {
      Py_DECREF(isas);
      return NULL;
    }
    PyTuple_SET_ITEM(isas, i, item);
  }
  return isas;
}

/* 0 when every sequence length lies in [1, max_blocks * block_size] and every block id the
 * kernel will read (the first ceil(seq_len / block_size) of a row) lies in [0, num_blocks). */
static int check_block_tables(const int32_t *block_tables, const int32_t *seq_lens, int64_t B,
                              int64_t max_blocks, int64_t block_size, int64_t num_blocks) {
  const char *op = "paged_decode_attention";
  for (int64_t b = 0; b < B; b++) {
    if (seq_lens[b] < 1 || seq_lens[b] > max_blocks * block_size) {
      PyErr_Format(PyExc_ValueError, "%s: seq_lens[%lld] = %d is outside [1, %lld] (max_blocks "
                   "%lld x block_size %lld)", op, (long long)b, seq_lens[b],
                   (long long)(max_blocks * block_size), (long long)max_blocks,
                   (long long)block_size);
      return -1;
    }
    for (int64_t i = 0; i < (seq_lens[b] + block_size - 1) / block_size; i++) {
      int32_t id = block_tables[b * max_blocks + i];
      if (id < 0 || id >= num_blocks) {
        PyErr_Format(PyExc_ValueError, "%s: block_tables[%lld, %lld] = %d is outside [0, %lld)",
                     op, (long long)b, (long long)i, id, (long long)num_blocks);
        return -1;
      }
    }
  }
  return 0;
}

/* A RuntimeError for a kernel that returned rc (not 0, not -1: out of memory), a case its
 * binding's checks should have turned away first. */
static PyObject *kernel_refused(const char *name, int rc) {
  PyErr_Format(PyExc_RuntimeError, "%s: the kernel refused its arguments (code %d)", name, rc);
  return NULL;
}

/* py_<name>, the binding of the arguments ARGS declares: parse them into variables of their
 * names, run `check` (0, or -1 with an error set) with the GIL, then `call` without it: rc -1
 * is out of memory, any other non-zero rc a kernel_refused. */
#define BINDING(name, ARGS, check, call)                                                    \
  static PyObject *py_##name(PyObject *self, PyObject *const *py_args, Py_ssize_t nargs) {  \
    static const char op[] = #name;                                                         \
    const Py_ssize_t expected = 0 ARGS(COUNT_ARG);                                          \
    ARGS(DECLARE_ARG)                                                                       \
    Py_ssize_t arg = 0;                                                                     \
    int rc = 0;                                                                             \
    if (nargs != expected) {                                                                \
      PyErr_Format(PyExc_TypeError, "%s takes %zd arguments (%s), got %zd", op, expected,   \
                   SIGNATURE(ARGS), nargs);                                                 \
      return NULL;                                                                          \
    }                                                                                       \
    ARGS(PARSE_ARG)                                                                         \
    if ((check) < 0) return NULL;                                                           \
    Py_BEGIN_ALLOW_THREADS                                                                  \
    call;                                                                                   \
    Py_END_ALLOW_THREADS                                                                    \
    if (rc == -1) return PyErr_NoMemory();                                                  \
    if (rc != 0) return kernel_refused(op, rc);                                             \
    Py_RETURN_NONE;                                                                         \
  }

/* 0 unless a packed weight goes to a build that does not read one for its dtype, or its N
 * or K is not a multiple of the packed tiles' sizes: -1 with a ValueError. */
static int check_packed(const char *op, int bf16, int64_t layout, int64_t isa, int64_t N,
                        int64_t K) {
  if (layout == WEIGHT_PLAIN) return 0;
  const char *reader = bf16 ? "avx512_bf16" : "avx2";
  if (!skinny_gemm_reads_packed((int)isa, bf16)) {
    if (isa == ISA_BEST)
      PyErr_Format(PyExc_ValueError, "%s: this CPU's best build does not read packed weights "
                   "(only the %s build does)", op, reader);
    else
      PyErr_Format(PyExc_ValueError, "%s: build '%s' does not read packed weights (only the %s "
                   "build does)", op, skinny_gemm_isa_name((int)isa), reader);
    return -1;
  }
  const int64_t rows = bf16 ? SKINNY_PACK_ROWS : SKINNY_PANEL_ROWS, ks = bf16 ? SKINNY_PACK_K : 8;
  if (N % rows == 0 && K % ks == 0) return 0;
  PyErr_Format(PyExc_ValueError, "%s: packed weights need N %% %d == 0 and K %% %d == 0, got N "
               "%lld, K %lld", op, (int)rows, (int)ks, (long long)N, (long long)K);
  return -1;
}

/* check_isa, then check_packed, for skinny_gemm (bf16 = 0) or skinny_gemm_bf16 (bf16 = 1). */
static int check_skinny(const char *op, int bf16, int64_t layout, int64_t isa, int64_t N,
                        int64_t K) {
  if (check_isa(op, isa, skinny_gemm_isa_count, skinny_gemm_isa_supported) < 0) return -1;
  return check_packed(op, bf16, layout, isa, N, K);
}

#define SKINNY_GEMM_ARGS(ARG)                                                              \
  ARG(p, const float *, x) ARG(p, const float *, weight) ARG(p, const float *, bias)       \
  ARG(p, float *, y) ARG(i, int64_t, M) ARG(i, int64_t, N) ARG(i, int64_t, K)              \
  ARG(i, int, layout) ARG(i, int, isa) ARG(i, int, num_threads)
BINDING(skinny_gemm, SKINNY_GEMM_ARGS, check_skinny(op, 0, layout, isa, N, K),
        rc = skinny_gemm(x, weight, bias, y, M, N, K, layout == WEIGHT_PACKED, isa,
                         num_threads))

#define SKINNY_GEMM_BF16_ARGS(ARG)                                                         \
  ARG(p, const uint16_t *, x) ARG(p, const uint16_t *, weight)                            \
  ARG(p, const uint16_t *, bias) ARG(p, uint16_t *, y) ARG(i, int64_t, M)                 \
  ARG(i, int64_t, N) ARG(i, int64_t, K) ARG(i, int, layout) ARG(i, int, isa)              \
  ARG(i, int, num_threads)
BINDING(skinny_gemm_bf16, SKINNY_GEMM_BF16_ARGS, check_skinny(op, 1, layout, isa, N, K),
        rc = skinny_gemm_bf16(x, weight, bias, y, M, N, K, layout == WEIGHT_PACKED, isa,
                              num_threads))

/* 0 when the CPU runs the AMX kernels, else -1 with a RuntimeError naming op. */
static int check_amx(const char *op) {
  if (amx_gemm_supported()) return 0;
  PyErr_Format(PyExc_RuntimeError, "%s: this CPU has no AMX bf16 tiles", op);
  return -1;
}

#define AMX_GEMM_BF16_ARGS(ARG)                                                            \
  ARG(p, const uint16_t *, x) ARG(p, const uint16_t *, packed)                            \
  ARG(p, const uint16_t *, bias) ARG(p, uint16_t *, y) ARG(i, int64_t, M)                 \
  ARG(i, int64_t, N) ARG(i, int64_t, K) ARG(i, int, num_threads)
BINDING(amx_gemm_bf16, AMX_GEMM_BF16_ARGS, check_amx(op),
        rc = amx_gemm_bf16(x, packed, bias, y, M, N, K, num_threads))

#define AMX_PACK_BF16_ARGS(ARG)                                                            \
  ARG(p, uint16_t *, packed) ARG(p, const uint16_t *, weight) ARG(i, int64_t, N)          \
  ARG(i, int64_t, K)
BINDING(amx_pack_bf16, AMX_PACK_BF16_ARGS, 0, amx_pack_bf16(packed, weight, N, K))

/* 0 when the first ceil(seq_len / block_size) block ids of one sequence's table lie in
 * [0, num_blocks) and 1 <= n <= seq_len <= max_blocks * block_size, else -1 with a ValueError
 * naming op. */
static int check_prefill(const char *op, const int32_t *block_table, int64_t n, int64_t seq_len,
                         int64_t max_blocks, int64_t block_size, int64_t num_blocks) {
  if (n < 1 || seq_len < n || seq_len > max_blocks * block_size) {
    PyErr_Format(PyExc_ValueError, "%s: need 1 <= queries (%lld) <= seq_len (%lld) <= "
                 "max_blocks x block_size (%lld)", op, (long long)n, (long long)seq_len,
                 (long long)(max_blocks * block_size));
    return -1;
  }
  for (int64_t i = 0; i < (seq_len + block_size - 1) / block_size; i++) {
    if (block_table[i] < 0 || block_table[i] >= num_blocks) {
      PyErr_Format(PyExc_ValueError, "%s: block_table[%lld] = %d is outside [0, %lld)", op,
                   (long long)i, block_table[i], (long long)num_blocks);
      return -1;
    }
  }
  return 0;
}

#define PREFILL_ATTENTION_F32_ARGS(ARG)                                                    \
  ARG(p, float *, out) ARG(p, const float *, query) ARG(p, const void *, k_cache)         \
  ARG(p, const void *, v_cache) ARG(i, int, cache_dtype)                                  \
  ARG(p, const int32_t *, block_table) ARG(i, int64_t, n) ARG(i, int64_t, seq_len)        \
  ARG(i, int64_t, H) ARG(i, int64_t, KV) ARG(i, int64_t, D) ARG(i, int64_t, block_size)   \
  ARG(f, float, scale) ARG(i, int64_t, sliding_window) ARG(f, float, logits_soft_cap)     \
  ARG(i, int, isa) ARG(i, int, num_threads) ARG(i, int64_t, max_blocks)                   \
  ARG(i, int64_t, num_blocks)
BINDING(prefill_attention_f32, PREFILL_ATTENTION_F32_ARGS,
        (check_prefill(op, block_table, n, seq_len, max_blocks, block_size, num_blocks) < 0 ||
         check_isa(op, isa, prefill_attention_f32_isa_count,
                   prefill_attention_f32_isa_supported) < 0)
            ? -1
            : 0,
        rc = prefill_attention_f32(out, query, k_cache, v_cache, cache_dtype == FLOAT_BFLOAT16,
                                   block_table, n, seq_len, H, KV, D, block_size, scale,
                                   sliding_window, logits_soft_cap, isa, num_threads))

#define PAGED_DECODE_ATTENTION_ARGS(ARG)                                                   \
  ARG(p, float *, out) ARG(p, const float *, query) ARG(p, const void *, k_cache)         \
  ARG(p, const void *, v_cache) ARG(i, int, cache_dtype)                                  \
  ARG(p, const int32_t *, block_tables) ARG(p, const int32_t *, seq_lens)                 \
  ARG(i, int64_t, B) ARG(i, int64_t, H) ARG(i, int64_t, KV) ARG(i, int64_t, D)            \
  ARG(i, int64_t, block_size) ARG(i, int64_t, max_blocks) ARG(f, float, scale)            \
  ARG(i, int64_t, sliding_window) ARG(f, float, logits_soft_cap) ARG(i, int, isa)         \
  ARG(i, int, num_threads) ARG(i, int64_t, num_blocks)
BINDING(paged_decode_attention, PAGED_DECODE_ATTENTION_ARGS,
        (check_block_tables(block_tables, seq_lens, B, max_blocks, block_size, num_blocks) < 0 ||
         check_isa(op, isa, paged_attention_isa_count, paged_attention_isa_supported) < 0)
            ? -1
            : 0,
        rc = paged_decode_attention(out, query, k_cache, v_cache, cache_dtype == FLOAT_BFLOAT16,
                                    block_tables, seq_lens, B, H, KV, D, block_size, max_blocks,
                                    scale, sliding_window, logits_soft_cap, isa, num_threads))

#define RESHAPE_AND_CACHE_ARGS(ARG)                                                        \
  ARG(p, const void *, key) ARG(p, const void *, value) ARG(i, int, kv_dtype)             \
  ARG(p, void *, k_cache) ARG(p, void *, v_cache) ARG(i, int, cache_dtype)                \
  ARG(p, const int64_t *, slot_mapping) ARG(i, int64_t, num_tokens)                       \
  ARG(i, int64_t, key_stride) ARG(i, int64_t, value_stride) ARG(i, int64_t, row_size)     \
  ARG(i, int64_t, num_slots)
BINDING(reshape_and_cache, RESHAPE_AND_CACHE_ARGS,
        check_indices(op, "slot_mapping", slot_mapping, num_tokens, -1, num_slots),
        reshape_and_cache(key, value, kv_dtype == FLOAT_BFLOAT16, k_cache, v_cache,
                          cache_dtype == FLOAT_BFLOAT16, slot_mapping, num_tokens, key_stride,
                          value_stride, row_size))

#define RMS_NORM_ARGS(ARG)                                                                 \
  ARG(p, void *, out) ARG(p, const void *, x) ARG(p, const void *, weight)                \
  ARG(i, int, dtype) ARG(f, float, eps) ARG(i, int64_t, rows) ARG(i, int64_t, n)          \
  ARG(i, int64_t, group) ARG(i, int64_t, group_stride) ARG(i, int, num_threads)
BINDING(rms_norm, RMS_NORM_ARGS, 0,
        rms_norm(out, x, weight, dtype == FLOAT_BFLOAT16, eps, rows, n, group, group_stride,
                 num_threads))

#define FUSED_ADD_RMS_NORM_ARGS(ARG)                                                       \
  ARG(p, void *, out) ARG(p, void *, residual_out) ARG(p, const void *, x)                \
  ARG(p, const void *, residual) ARG(p, const void *, weight) ARG(i, int, dtype)          \
  ARG(f, float, eps) ARG(i, int64_t, rows) ARG(i, int64_t, n) ARG(i, int, num_threads)
BINDING(fused_add_rms_norm, FUSED_ADD_RMS_NORM_ARGS, 0,
        fused_add_rms_norm(out, residual_out, x, residual, weight, dtype == FLOAT_BFLOAT16, eps,
                           rows, n, num_threads))

#define LAYER_NORM_ARGS(ARG)                                                               \
  ARG(p, void *, out) ARG(p, const void *, x) ARG(p, const void *, weight)                \
  ARG(p, const void *, bias) ARG(i, int, dtype) ARG(f, float, eps) ARG(i, int64_t, rows)  \
  ARG(i, int64_t, n) ARG(i, int, num_threads)
BINDING(layer_norm, LAYER_NORM_ARGS, 0,
        layer_norm(out, NULL, x, NULL, weight, bias, dtype == FLOAT_BFLOAT16, eps, rows, n,
                   num_threads))

#define FUSED_ADD_LAYER_NORM_ARGS(ARG)                                                     \
  ARG(p, void *, out) ARG(p, void *, residual_out) ARG(p, const void *, x)                \
  ARG(p, const void *, residual) ARG(p, const void *, weight) ARG(p, const void *, bias)  \
  ARG(i, int, dtype) ARG(f, float, eps) ARG(i, int64_t, rows) ARG(i, int64_t, n)          \
  ARG(i, int, num_threads)
BINDING(fused_add_layer_norm, FUSED_ADD_LAYER_NORM_ARGS, 0,
        layer_norm(out, residual_out, x, residual, weight, bias, dtype == FLOAT_BFLOAT16, eps,
                   rows, n, num_threads))

#define ROTARY_EMBEDDING_ARGS(ARG)                                                         \
  ARG(p, const int64_t *, positions) ARG(p, const void *, query) ARG(p, const void *, key) \
  ARG(p, void *, query_out) ARG(p, void *, key_out) ARG(i, int, dtype)                    \
  ARG(i, int64_t, q_stride) ARG(i, int64_t, k_stride) ARG(i, int64_t, num_tokens)         \
  ARG(i, int64_t, num_heads) ARG(i, int64_t, num_kv_heads) ARG(i, int64_t, head_size)     \
  ARG(i, int64_t, rot_dim) ARG(p, const float *, cos_sin_cache) ARG(i, int, style)        \
  ARG(i, int, num_threads) ARG(i, int64_t, num_positions)
BINDING(rotary_embedding, ROTARY_EMBEDDING_ARGS,
        check_indices(op, "positions", positions, num_tokens, 0, num_positions),
        rotary_embedding(positions, query, key, query_out, key_out, dtype == FLOAT_BFLOAT16,
                         q_stride, k_stride, num_tokens, num_heads, num_kv_heads, head_size,
                         rot_dim, cos_sin_cache, style == ROTARY_NEOX, num_threads))

#define CONVERT_ARGS(ARG)                                                                  \
  ARG(p, void *, out) ARG(i, int, out_dtype) ARG(p, const void *, x) ARG(i, int, dtype)   \
  ARG(i, int64_t, n)
BINDING(convert, CONVERT_ARGS, 0,
        convert(out, out_dtype == FLOAT_BFLOAT16, x, dtype == FLOAT_BFLOAT16, n))

#define ARGMAX_ARGS(ARG)                                                                   \
  ARG(p, int64_t *, out) ARG(p, const void *, x) ARG(i, int, dtype) ARG(i, int64_t, rows) \
  ARG(i, int64_t, n) ARG(i, int, num_threads)
BINDING(argmax, ARGMAX_ARGS, 0,
        argmax(out, x, dtype == FLOAT_BFLOAT16, rows, n, num_threads))

#define SILU_AND_MUL_ARGS(ARG)                                                             \
  ARG(p, void *, out) ARG(p, const void *, x) ARG(i, int, dtype)                          \
  ARG(i, int64_t, num_tokens) ARG(i, int64_t, d) ARG(i, int, num_threads)
BINDING(silu_and_mul, SILU_AND_MUL_ARGS, 0,
        silu_and_mul(out, x, dtype == FLOAT_BFLOAT16, num_tokens, d, num_threads))

#define GELU_AND_MUL_ARGS(ARG)                                                             \
  ARG(p, void *, out) ARG(p, const void *, x) ARG(i, int, dtype) ARG(i, int, approximate) \
  ARG(i, int64_t, num_tokens) ARG(i, int64_t, d) ARG(i, int, num_threads)
BINDING(gelu_and_mul, GELU_AND_MUL_ARGS, 0,
        gelu_and_mul(out, x, dtype == FLOAT_BFLOAT16, approximate == GELU_TANH, num_tokens, d,
                     num_threads))

#define GELU_ARGS(ARG)                                                                     \
  ARG(p, void *, out) ARG(p, const void *, x) ARG(i, int, dtype) ARG(i, int, approximate) \
  ARG(i, int64_t, n) ARG(i, int, num_threads)
BINDING(gelu, GELU_ARGS, 0,
        gelu(out, x, dtype == FLOAT_BFLOAT16, approximate == GELU_TANH, n, num_threads))

#define LORA_MASKED_ADD_ARGS(ARG)                                                          \
  ARG(p, void *, out) ARG(p, const void *, y) ARG(p, const void *, delta)                 \
  ARG(p, const int32_t *, row_slots) ARG(i, int64_t, slot) ARG(i, int, dtype)             \
  ARG(i, int64_t, rows) ARG(i, int64_t, n) ARG(i, int, num_threads)
BINDING(lora_masked_add, LORA_MASKED_ADD_ARGS, 0,
        lora_masked_add(out, y, delta, row_slots, slot, dtype == FLOAT_BFLOAT16, rows, n,
                        num_threads))

#define SCALE_ARGS(ARG)                                                                    \
  ARG(p, void *, out) ARG(p, const void *, x) ARG(f, float, alpha) ARG(i, int, dtype)     \
  ARG(i, int64_t, n) ARG(i, int, num_threads)
BINDING(scale, SCALE_ARGS, 0, scale(out, x, alpha, dtype == FLOAT_BFLOAT16, n, num_threads))

#define ADD_ARGS(ARG)                                                                      \
  ARG(p, void *, out) ARG(p, const void *, a) ARG(p, const void *, b) ARG(i, int, dtype)  \
  ARG(i, int64_t, n) ARG(i, int, num_threads)
BINDING(add, ADD_ARGS, 0, add(out, a, b, dtype == FLOAT_BFLOAT16, n, num_threads))

#define GGUF_MM_ARGS(ARG)                                                                  \
  ARG(p, const void *, x) ARG(p, const uint8_t *, packed) ARG(p, const void *, bias)      \
  ARG(p, void *, y) ARG(i, int, dtype) ARG(i, int, qtype) ARG(i, int64_t, M)              \
  ARG(i, int64_t, N) ARG(i, int64_t, K) ARG(i, int, isa) ARG(i, int, num_threads)
BINDING(gguf_mm, GGUF_MM_ARGS, check_isa(op, isa, gguf_isa_count, gguf_isa_supported),
        rc = gguf_mm(x, packed, bias, y, dtype == FLOAT_BFLOAT16, qtype, M, N, K, isa,
                     num_threads))

#define GGUF_PACK_ARGS(ARG)                                                                \
  ARG(p, const uint8_t *, qweight) ARG(p, uint8_t *, out) ARG(i, int, qtype)              \
  ARG(i, int64_t, N) ARG(i, int64_t, K) ARG(i, int, num_threads)
BINDING(gguf_pack, GGUF_PACK_ARGS, 0, gguf_pack(qweight, out, qtype, N, K, num_threads))

#define GGUF_UNPACK_ROWS_ARGS(ARG)                                                         \
  ARG(p, const uint8_t *, packed) ARG(p, float *, out) ARG(i, int, qtype)                 \
  ARG(i, int64_t, K) ARG(p, const int64_t *, rows) ARG(i, int64_t, n)                     \
  ARG(i, int, num_threads) ARG(i, int64_t, N)
BINDING(gguf_unpack_rows, GGUF_UNPACK_ROWS_ARGS, check_indices(op, "rows", rows, n, 0, N),
        gguf_unpack_rows(packed, out, qtype, K, rows, n, num_threads))

#define GGUF_DEQUANTIZE_ARGS(ARG)                                                          \
  ARG(p, const uint8_t *, qweight) ARG(p, float *, out) ARG(i, int, qtype)                \
  ARG(i, int64_t, rows) ARG(i, int64_t, K) ARG(i, int, num_threads)
BINDING(gguf_dequantize, GGUF_DEQUANTIZE_ARGS, 0,
        gguf_dequantize(qweight, out, qtype, rows, K, num_threads))

/* Every binding: X(name, ARGS). */
#define BINDINGS(X)                                           \
  X(skinny_gemm, SKINNY_GEMM_ARGS)                            \
  X(skinny_gemm_bf16, SKINNY_GEMM_BF16_ARGS)                  \
  X(amx_gemm_bf16, AMX_GEMM_BF16_ARGS)                        \
  X(amx_pack_bf16, AMX_PACK_BF16_ARGS)                        \
  X(prefill_attention_f32, PREFILL_ATTENTION_F32_ARGS)        \
  X(paged_decode_attention, PAGED_DECODE_ATTENTION_ARGS)      \
  X(reshape_and_cache, RESHAPE_AND_CACHE_ARGS)                \
  X(rms_norm, RMS_NORM_ARGS)                                  \
  X(fused_add_rms_norm, FUSED_ADD_RMS_NORM_ARGS)              \
  X(layer_norm, LAYER_NORM_ARGS)                              \
  X(fused_add_layer_norm, FUSED_ADD_LAYER_NORM_ARGS)          \
  X(rotary_embedding, ROTARY_EMBEDDING_ARGS)                  \
  X(convert, CONVERT_ARGS)                                    \
  X(argmax, ARGMAX_ARGS)                                      \
  X(silu_and_mul, SILU_AND_MUL_ARGS)                          \
  X(gelu_and_mul, GELU_AND_MUL_ARGS)                          \
  X(gelu, GELU_ARGS)                                          \
  X(lora_masked_add, LORA_MASKED_ADD_ARGS)                    \
  X(scale, SCALE_ARGS)                                        \
  X(add, ADD_ARGS)                                            \
  X(gguf_mm, GGUF_MM_ARGS)                                    \
  X(gguf_pack, GGUF_PACK_ARGS)                                \
  X(gguf_unpack_rows, GGUF_UNPACK_ROWS_ARGS)                  \
  X(gguf_dequantize, GGUF_DEQUANTIZE_ARGS)

/* Adds name: its signature to a dict, or returns NULL from the caller on failure. */
#define ADD_SIGNATURE(name, ARGS)                                                  \
  if (add_string(dict, #name, SIGNATURE(ARGS)) < 0) return NULL;

static int add_string(PyObject *dict, const char *key, const char *value) {
  PyObject *item = PyUnicode_FromString(value);
  int rc = item ? PyDict_SetItemString(dict, key, item) : -1;
  Py_XDECREF(item);
  return rc;
}

static PyObject *py_signatures(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  PyObject *dict = PyDict_New();
  if (!dict) return NULL;
  BINDINGS(ADD_SIGNATURE)
  return dict;
}

/* Every flag value ops.h and gguf.h name, for the check against their Python enums. */
#define FLAGS(X)                                                                           \
  X(GELU_NONE) X(GELU_TANH)                                                                \
  X(FLOAT_FLOAT32) X(FLOAT_BFLOAT16) X(WEIGHT_PLAIN) X(WEIGHT_PACKED) X(ROTARY_GPTJ)      \
  X(ROTARY_NEOX) X(ISA_BEST) X(GGUF_Q4_0) X(GGUF_Q4_1) X(GGUF_Q5_0) X(GGUF_Q5_1)          \
  X(GGUF_Q8_0) X(GGUF_Q4_K) X(GGUF_Q5_K) X(GGUF_Q6_K)

static int add_int(PyObject *dict, const char *key, long value) {
  PyObject *item = PyLong_FromLong(value);
  int rc = item ? PyDict_SetItemString(dict, key, item) : -1;
  Py_XDECREF(item);
  return rc;
}

#define ADD_FLAG(name) \
  if (add_int(dict, #name, name) < 0) return NULL;

static PyObject *py_flags(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  PyObject *dict = PyDict_New();
  if (!dict) return NULL;
  FLAGS(ADD_FLAG)
  return dict;
}

static PyObject *py_gguf_packed_bytes(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  const char *op = "gguf_packed_bytes";
  int64_t qtype, N, K;
  if (n != 3) {
    PyErr_Format(PyExc_TypeError, "%s takes 3 arguments (qtype, N, K), got %zd", op, n);
    return NULL;
  }
  if (parse_i(op, "qtype", args[0], &qtype) < 0 || parse_i(op, "N", args[1], &N) < 0 ||
      parse_i(op, "K", args[2], &K) < 0)
    return NULL;
  return PyLong_FromLongLong(gguf_packed_bytes((int)qtype, N, K));
}

static PyObject *py_gguf_isas(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  return isa_table(gguf_isa_count, gguf_isa_name, gguf_isa_supported);
}

static PyObject *py_skinny_gemm_isas(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  return isa_table(skinny_gemm_isa_count, skinny_gemm_isa_name, skinny_gemm_isa_supported);
}

static PyObject *py_skinny_gemm_reads_packed(PyObject *self, PyObject *const *args,
                                             Py_ssize_t n) {
  const char *op = "skinny_gemm_reads_packed";
  int64_t isa, dtype;
  if (n != 2) {
    PyErr_Format(PyExc_TypeError, "%s takes 2 arguments (isa, dtype), got %zd", op, n);
    return NULL;
  }
  if (parse_i(op, "isa", args[0], &isa) < 0 || parse_i(op, "dtype", args[1], &dtype) < 0 ||
      check_isa(op, isa, skinny_gemm_isa_count, skinny_gemm_isa_supported) < 0)
    return NULL;
  return PyBool_FromLong(skinny_gemm_reads_packed((int)isa, dtype == FLOAT_BFLOAT16));
}

static PyObject *py_paged_attention_isas(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  return isa_table(paged_attention_isa_count, paged_attention_isa_name,
                   paged_attention_isa_supported);
}

static PyObject *py_prefill_attention_f32_isas(PyObject *self, PyObject *const *args,
                                               Py_ssize_t n) {
  return isa_table(prefill_attention_f32_isa_count, prefill_attention_f32_isa_name,
                   prefill_attention_f32_isa_supported);
}

static PyObject *py_amx_gemm_supported(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  return PyBool_FromLong(amx_gemm_supported());
}

#define METHOD(name, doc) {#name, (PyCFunction)(void (*)(void))py_##name, METH_FASTCALL, doc}
#define BINDING_METHOD(name, ARGS) METHOD(name, #name ":" ARGS(SIGNATURE_ARG)),

static PyMethodDef methods[] = {
    BINDINGS(BINDING_METHOD)
    METHOD(signatures, "signatures() -> {binding: 'name:kind ...'}, kind p, i or f"),
    METHOD(flags, "flags() -> {name: value} of the flag values ops.h and gguf.h name"),
    METHOD(gguf_isas, "gguf_isas() -> ((name, supported), ...), best first"),
    METHOD(gguf_packed_bytes, "gguf_packed_bytes(qtype, N, K) -> int"),
    METHOD(amx_gemm_supported, "amx_gemm_supported() -> bool"),
    METHOD(prefill_attention_f32_isas,
           "prefill_attention_f32_isas() -> ((name, supported), ...), best first"),
    METHOD(skinny_gemm_isas, "skinny_gemm_isas() -> ((name, supported), ...), best first"),
    METHOD(skinny_gemm_reads_packed,
           "skinny_gemm_reads_packed(isa, dtype) -> bool: whether that build reads packed "
           "weights of that dtype (FLOAT_FLOAT32 or FLOAT_BFLOAT16)"),
    METHOD(paged_attention_isas,
           "paged_attention_isas() -> ((name, supported), ...), best first"),
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", NULL, -1, methods};

PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&module); }
