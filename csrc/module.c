/* pagedllm._C: Python bindings of the kernels in ops.h.
 *
 * Arguments are raw data pointers and sizes as Python ints, and floats; the wrappers in
 * pagedllm/_cpu_kernels.py check dtypes, devices, layouts and shapes and take the sizes from
 * the tensors. Index values (cache slots, block ids, sequence lengths, positions) are checked
 * here, with the GIL held, before the kernel reads through them: a bad one raises ValueError
 * rather than touching memory outside the tensors. The GIL is released while a kernel runs.
 * Threads come from OpenMP: the same libgomp (soname libgomp.so.1) torch loads, so these
 * kernels and torch's ops share one thread pool.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "gguf.h"
#include "ops.h"

#define MAX_ARGS 20

/* Parses args by fmt: 'i' an int (pointers too) into ints[], 'f' a float into floats[], in
 * order. Returns 0, or -1 with a Python error set. */
static int parse(const char *name, const char *fmt, PyObject *const *args, Py_ssize_t nargs,
                 int64_t *ints, double *floats) {
  Py_ssize_t expected = (Py_ssize_t)strlen(fmt);
  if (nargs != expected) {
    PyErr_Format(PyExc_TypeError, "%s takes %zd arguments, got %zd", name, expected, nargs);
    return -1;
  }
  for (Py_ssize_t i = 0; i < nargs; i++) {
    if (fmt[i] == 'i') {
      *ints = PyLong_AsLongLong(args[i]);
      if (*ints++ == -1 && PyErr_Occurred()) return -1;
    } else {
      *floats = PyFloat_AsDouble(args[i]);
      if (*floats++ == -1.0 && PyErr_Occurred()) return -1;
    }
  }
  return 0;
}

#define PTR(v) ((void *)(intptr_t)(v))

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

/* 0 when isa is -1 (the best) or the index of one of a kernel's instruction sets (count,
 * supported) that this CPU supports, else -1 with a ValueError naming op. */
static int check_isa(const char *op, int64_t isa, int (*count)(void), int (*supported)(int)) {
  if (isa == -1 || (isa >= 0 && isa < count() && supported((int)isa))) return 0;
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

/* The body of a binding: parse into a[] and f[], run `check` (0, or -1 with an error set)
 * with the GIL, then `call` without it: rc -1 is out of memory, any other non-zero rc a
 * kernel_refused. */
#define BINDING(name, fmt, check, call)                                             \
  static PyObject *py_##name(PyObject *self, PyObject *const *args, Py_ssize_t n) { \
    int64_t a[MAX_ARGS];                                                            \
    double f[MAX_ARGS];                                                             \
    int rc = 0;                                                                     \
    if (parse(#name, fmt, args, n, a, f) < 0) return NULL;                          \
    if ((check) < 0) return NULL;                                                   \
    Py_BEGIN_ALLOW_THREADS                                                          \
    call;                                                                           \
    Py_END_ALLOW_THREADS                                                            \
    if (rc == -1) return PyErr_NoMemory();                                          \
    if (rc != 0) return kernel_refused(#name, rc);                                  \
    Py_RETURN_NONE;                                                                 \
  }

/* 0 unless a packed weight (packed != 0) goes to a build that does not read one for its
 * dtype, or its N or K is not a multiple of the packed tiles' sizes: -1 with a ValueError. */
static int check_packed(const char *op, int bf16, int64_t packed, int64_t isa, int64_t N,
                        int64_t K) {
  if (!packed) return 0;
  const char *reader = bf16 ? "avx512_bf16" : "avx2";
  if (!skinny_gemm_reads_packed((int)isa, bf16)) {
    if (isa < 0)
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
static int check_skinny(const char *op, int bf16, const int64_t *a) {
  if (check_isa(op, a[8], skinny_gemm_isa_count, skinny_gemm_isa_supported) < 0) return -1;
  return check_packed(op, bf16, a[7], a[8], a[5], a[6]);
}

BINDING(skinny_gemm, "iiiiiiiiii", check_skinny("skinny_gemm", 0, a),
        rc = skinny_gemm(PTR(a[0]), PTR(a[1]), PTR(a[2]), PTR(a[3]), a[4], a[5], a[6], (int)a[7],
                         (int)a[8], (int)a[9]))

BINDING(skinny_gemm_bf16, "iiiiiiiiii", check_skinny("skinny_gemm_bf16", 1, a),
        rc = skinny_gemm_bf16(PTR(a[0]), PTR(a[1]), PTR(a[2]), PTR(a[3]), a[4], a[5], a[6],
                              (int)a[7], (int)a[8], (int)a[9]))

/* 0 when the CPU runs the AMX kernels, else -1 with a RuntimeError naming op. */
static int check_amx(const char *op) {
  if (amx_gemm_supported()) return 0;
  PyErr_Format(PyExc_RuntimeError, "%s: this CPU has no AMX bf16 tiles", op);
  return -1;
}

BINDING(amx_gemm_bf16, "iiiiiiii", check_amx("amx_gemm_bf16"),
        amx_gemm_bf16(PTR(a[0]), PTR(a[1]), PTR(a[2]), PTR(a[3]), a[4], a[5], a[6], (int)a[7]))

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

BINDING(prefill_attention_f32, "iiiiiiiiiiiiiiiif",
        (check_prefill("prefill_attention_f32", PTR(a[5]), a[6], a[7], a[12], a[11], a[13]) < 0 ||
         check_isa("prefill_attention_f32", a[14], prefill_attention_f32_isa_count,
                   prefill_attention_f32_isa_supported) < 0)
            ? -1
            : 0,
        rc = prefill_attention_f32(PTR(a[0]), PTR(a[1]), PTR(a[2]), PTR(a[3]), (int)a[4],
                                   PTR(a[5]), a[6], a[7], a[8], a[9], a[10], a[11], (float)f[0],
                                   (int)a[14], (int)a[15]))

BINDING(amx_pack_bf16, "iiii", 0, amx_pack_bf16(PTR(a[0]), PTR(a[1]), a[2], a[3]))

BINDING(paged_decode_attention, "iiiiiiiiiiiiiiiif",
        (check_block_tables(PTR(a[5]), PTR(a[6]), a[7], a[12], a[11], a[13]) < 0 ||
         check_isa("paged_decode_attention", a[14], paged_attention_isa_count,
                   paged_attention_isa_supported) < 0)
            ? -1
            : 0,
        rc = paged_decode_attention(PTR(a[0]), PTR(a[1]), PTR(a[2]), PTR(a[3]), (int)a[4],
                                    PTR(a[5]), PTR(a[6]), a[7], a[8], a[9], a[10], a[11], a[12],
                                    (float)f[0], (int)a[14], (int)a[15]))

BINDING(reshape_and_cache, "iiiiiiiiiiii",
        check_indices("reshape_and_cache", "slot_mapping", PTR(a[6]), a[7], -1, a[11]),
        reshape_and_cache(PTR(a[0]), PTR(a[1]), (int)a[2], PTR(a[3]), PTR(a[4]), (int)a[5],
                          PTR(a[6]), a[7], a[8], a[9], a[10]))

BINDING(rms_norm, "iiiiiiiiif", 0,
        rms_norm(PTR(a[0]), PTR(a[1]), PTR(a[2]), (int)a[3], (float)f[0], a[4], a[5], a[6], a[7],
                 (int)a[8]))

BINDING(fused_add_rms_norm, "iiiiiiiiif", 0,
        fused_add_rms_norm(PTR(a[0]), PTR(a[1]), PTR(a[2]), PTR(a[3]), PTR(a[4]), (int)a[5],
                           (float)f[0], a[6], a[7], (int)a[8]))

BINDING(rotary_embedding, "iiiiiiiiiiiiiiiii",
        check_indices("rotary_embedding", "positions", PTR(a[0]), a[8], 0, a[14]),
        rotary_embedding(PTR(a[0]), PTR(a[1]), PTR(a[2]), PTR(a[3]), PTR(a[4]), (int)a[5], a[6],
                         a[7], a[8], a[9], a[10], a[11], a[12], PTR(a[13]), (int)a[15],
                         (int)a[16]))

BINDING(convert, "iiiii", 0, convert(PTR(a[0]), (int)a[1], PTR(a[2]), (int)a[3], a[4]))

BINDING(argmax, "iiiiii", 0, argmax(PTR(a[0]), PTR(a[1]), (int)a[2], a[3], a[4], (int)a[5]))

BINDING(silu_and_mul, "iiiiii", 0,
        silu_and_mul(PTR(a[0]), PTR(a[1]), (int)a[2], a[3], a[4], (int)a[5]))

BINDING(gguf_mm, "iiiiiiiiiii",
        check_isa("gguf_mm", a[9], gguf_isa_count, gguf_isa_supported),
        rc = gguf_mm(PTR(a[0]), PTR(a[1]), PTR(a[2]), PTR(a[3]), (int)a[4], (int)a[5], a[6], a[7],
                     a[8], (int)a[9], (int)a[10]))

BINDING(gguf_pack, "iiiiii", 0, gguf_pack(PTR(a[0]), PTR(a[1]), (int)a[2], a[3], a[4], (int)a[5]))

BINDING(gguf_unpack_rows, "iiiiiiii",
        check_indices("gguf_unpack_rows", "rows", PTR(a[5]), a[6], 0, a[3]),
        gguf_unpack_rows(PTR(a[0]), PTR(a[1]), (int)a[2], a[4], PTR(a[5]), a[6], (int)a[7]))

static PyObject *py_gguf_packed_bytes(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  int64_t a[3];
  double f[1];
  if (parse("gguf_packed_bytes", "iii", args, n, a, f) < 0) return NULL;
  return PyLong_FromLongLong(gguf_packed_bytes((int)a[0], a[1], a[2]));
}

BINDING(gguf_dequantize, "iiiiii", 0,
        gguf_dequantize(PTR(a[0]), PTR(a[1]), (int)a[2], a[3], a[4], (int)a[5]))

static PyObject *py_gguf_isas(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  return isa_table(gguf_isa_count, gguf_isa_name, gguf_isa_supported);
}

static PyObject *py_skinny_gemm_isas(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  return isa_table(skinny_gemm_isa_count, skinny_gemm_isa_name, skinny_gemm_isa_supported);
}

static PyObject *py_skinny_gemm_reads_packed(PyObject *self, PyObject *const *args,
                                             Py_ssize_t n) {
  int64_t a[MAX_ARGS];
  double f[MAX_ARGS];
  if (parse("skinny_gemm_reads_packed", "ii", args, n, a, f) < 0) return NULL;
  if (check_isa("skinny_gemm_reads_packed", a[0], skinny_gemm_isa_count,
                skinny_gemm_isa_supported) < 0)
    return NULL;
  return PyBool_FromLong(skinny_gemm_reads_packed((int)a[0], (int)a[1]));
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

static PyMethodDef methods[] = {
    METHOD(gguf_isas, "gguf_isas() -> ((name, supported), ...), best first"),
    METHOD(gguf_mm, "gguf_mm(x, packed, b, y, bf16, qtype, M, N, K, isa, num_threads)"),
    METHOD(gguf_pack, "gguf_pack(w, packed, qtype, N, K, num_threads)"),
    METHOD(gguf_unpack_rows, "gguf_unpack_rows(packed, out, qtype, N, K, rows, n, num_threads)"),
    METHOD(gguf_packed_bytes, "gguf_packed_bytes(qtype, N, K) -> int"),
    METHOD(gguf_dequantize, "gguf_dequantize(w, out, qtype, rows, K, num_threads)"),
    METHOD(amx_gemm_supported, "amx_gemm_supported() -> bool"),
    METHOD(amx_gemm_bf16, "amx_gemm_bf16(x, packed_w, b, y, M, N, K, num_threads), bfloat16"),
    METHOD(prefill_attention_f32,
           "prefill_attention_f32(out, q, k_cache, v_cache, kv_bf16, block_table, n, seq_len, H, "
           "KV, D, block_size, max_blocks, num_blocks, isa, num_threads, scale), float32"),
    METHOD(prefill_attention_f32_isas,
           "prefill_attention_f32_isas() -> ((name, supported), ...), best first"),
    METHOD(amx_pack_bf16, "amx_pack_bf16(packed_w, w, N, K), bfloat16"),
    METHOD(skinny_gemm, "skinny_gemm(x, w, b, y, M, N, K, packed, isa, num_threads)"),
    METHOD(skinny_gemm_isas, "skinny_gemm_isas() -> ((name, supported), ...), best first"),
    METHOD(skinny_gemm_reads_packed,
           "skinny_gemm_reads_packed(isa, bf16) -> bool: whether that build reads packed "
           "weights of that dtype"),
    METHOD(skinny_gemm_bf16,
           "skinny_gemm_bf16(x, w, b, y, M, N, K, packed, isa, num_threads), bf16"),
    METHOD(paged_decode_attention,
           "paged_decode_attention(out, q, k_cache, v_cache, kv_bf16, block_tables, seq_lens, B, "
           "H, KV, D, block_size, max_blocks, num_blocks, isa, num_threads, scale)"),
    METHOD(paged_attention_isas,
           "paged_attention_isas() -> ((name, supported), ...), best first"),
    METHOD(reshape_and_cache,
           "reshape_and_cache(key, value, kv_bf16, k_cache, v_cache, cache_bf16, slot_mapping, "
           "num_tokens, key_stride, value_stride, row_size, num_slots)"),
    METHOD(rms_norm,
           "rms_norm(out, x, weight, bf16, rows, n, group, group_stride, num_threads, eps)"),
    METHOD(fused_add_rms_norm,
           "fused_add_rms_norm(out, residual_out, x, residual, weight, bf16, rows, n, "
           "num_threads, eps)"),
    METHOD(rotary_embedding,
           "rotary_embedding(positions, query, key, query_out, key_out, bf16, q_stride, "
           "k_stride, num_tokens, num_heads, num_kv_heads, head_size, rot_dim, cos_sin_cache, "
           "num_positions, is_neox, num_threads)"),
    METHOD(silu_and_mul, "silu_and_mul(out, x, bf16, num_tokens, d, num_threads)"),
    METHOD(convert, "convert(dst, dst_bf16, src, src_bf16, n)"),
    METHOD(argmax, "argmax(out, x, bf16, rows, n, num_threads)"),
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", NULL, -1, methods};

PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&module); }
