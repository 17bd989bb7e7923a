/* pagedllm._C: Python bindings of the kernels in ops.h.
 *
 * Arguments are raw data pointers and sizes as Python ints, and floats; the wrappers in
 * pagedllm/_custom_ops.py check dtypes, devices and layouts before calling. The GIL is
 * released while a kernel runs. Threads come from OpenMP: the same libgomp (soname
 * libgomp.so.1) torch loads, so these kernels and torch's ops share one thread pool.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "ops.h"

#define MAX_ARGS 16

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

/* The body of a binding: parse into a[] and f[], run `call` without the GIL. */
#define BINDING(name, fmt, call)                                                    \
  static PyObject *py_##name(PyObject *self, PyObject *const *args, Py_ssize_t n) { \
    int64_t a[MAX_ARGS];                                                            \
    double f[MAX_ARGS];                                                             \
    int rc = 0;                                                                     \
    if (parse(#name, fmt, args, n, a, f) < 0) return NULL;                          \
    Py_BEGIN_ALLOW_THREADS                                                          \
    call;                                                                           \
    Py_END_ALLOW_THREADS                                                            \
    if (rc != 0) return PyErr_NoMemory();                                           \
    Py_RETURN_NONE;                                                                 \
  }

BINDING(skinny_gemm, "iiiiiiii",
        skinny_gemm(PTR(a[0]), PTR(a[1]), PTR(a[2]), PTR(a[3]), a[4], a[5], a[6], (int)a[7]))

BINDING(paged_decode_attention, "iiiiiiiiiiiiif",
        rc = paged_decode_attention(PTR(a[0]), PTR(a[1]), PTR(a[2]), PTR(a[3]), PTR(a[4]),
                                    PTR(a[5]), a[6], a[7], a[8], a[9], a[10], a[11],
                                    (float)f[0], (int)a[12]))

BINDING(reshape_and_cache, "iiiiiiiii",
        reshape_and_cache(PTR(a[0]), PTR(a[1]), PTR(a[2]), PTR(a[3]), PTR(a[4]), a[5], a[6], a[7],
                          a[8]))

BINDING(rms_norm, "iiiiiif",
        rms_norm(PTR(a[0]), PTR(a[1]), PTR(a[2]), (float)f[0], a[3], a[4], (int)a[5]))

BINDING(fused_add_rms_norm, "iiiiiiiif",
        fused_add_rms_norm(PTR(a[0]), PTR(a[1]), PTR(a[2]), PTR(a[3]), PTR(a[4]), (float)f[0],
                           a[5], a[6], (int)a[7]))

BINDING(rotary_embedding, "iiiiiiiiiiiiiii",
        rotary_embedding(PTR(a[0]), PTR(a[1]), PTR(a[2]), PTR(a[3]), PTR(a[4]), a[5], a[6], a[7],
                         a[8], a[9], a[10], a[11], PTR(a[12]), (int)a[13], (int)a[14]))

BINDING(silu_and_mul, "iiiii", silu_and_mul(PTR(a[0]), PTR(a[1]), a[2], a[3], (int)a[4]))

int cpu_has_avx512(void) {
#if defined(__x86_64__) && defined(__GNUC__)
  return __builtin_cpu_supports("avx512f");
#else
  return 0;
#endif
}

static PyObject *py_cpu_has_avx512(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  return PyBool_FromLong(cpu_has_avx512());
}

#define METHOD(name, doc) {#name, (PyCFunction)(void (*)(void))py_##name, METH_FASTCALL, doc}

static PyMethodDef methods[] = {
    METHOD(cpu_has_avx512, "cpu_has_avx512() -> bool"),
    METHOD(skinny_gemm, "skinny_gemm(x, w, b, y, M, N, K, num_threads)"),
    METHOD(paged_decode_attention,
           "paged_decode_attention(out, q, k_cache, v_cache, block_tables, seq_lens, B, H, KV, "
           "D, block_size, max_blocks, num_threads, scale)"),
    METHOD(reshape_and_cache,
           "reshape_and_cache(key, value, k_cache, v_cache, slot_mapping, num_tokens, "
           "key_stride, value_stride, row_size)"),
    METHOD(rms_norm, "rms_norm(out, x, weight, rows, n, num_threads, eps)"),
    METHOD(fused_add_rms_norm,
           "fused_add_rms_norm(out, residual_out, x, residual, weight, rows, n, num_threads, "
           "eps)"),
    METHOD(rotary_embedding,
           "rotary_embedding(positions, query, key, query_out, key_out, q_stride, k_stride, "
           "num_tokens, num_heads, num_kv_heads, head_size, rot_dim, cos_sin_cache, is_neox, "
           "num_threads)"),
    METHOD(silu_and_mul, "silu_and_mul(out, x, num_tokens, d, num_threads)"),
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", NULL, -1, methods};

PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&module); }
