/* pagedllm._C: Python bindings of the kernels in ops.h.
 *
 * Arguments are raw data pointers and sizes as Python ints (and floats); the wrappers in
 * pagedllm/_custom_ops.py check dtypes, devices and layouts before calling. The GIL is
 * released while a kernel runs. Threads come from OpenMP: the same libgomp (soname
 * libgomp.so.1) torch loads, so these kernels and torch's ops share one thread pool.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "ops.h"

/* args[i] as int64 for i < n; returns 0, or -1 with a Python error set. */
static int int_args(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t n, int64_t *out) {
  if (nargs < n) {
    PyErr_Format(PyExc_TypeError, "expected at least %zd arguments, got %zd", n, nargs);
    return -1;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    out[i] = PyLong_AsLongLong(args[i]);
    if (out[i] == -1 && PyErr_Occurred()) return -1;
  }
  return 0;
}

#define PTR(v) ((void *)(intptr_t)(v))

/* gemv(x, w, b or 0, y, M, N, K, num_threads) */
static PyObject *py_gemv(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  int64_t a[8];
  if (nargs != 8 || int_args(args, nargs, 8, a) < 0) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "gemv takes 8 arguments");
    return NULL;
  }
  Py_BEGIN_ALLOW_THREADS
  gemv(PTR(a[0]), PTR(a[1]), PTR(a[2]), PTR(a[3]), a[4], a[5], a[6], (int)a[7]);
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

/* paged_decode_attention(out, q, k_cache, v_cache, block_tables, seq_lens,
 *                        B, H, KV, D, block_size, max_blocks, num_threads, scale) */
static PyObject *py_paged_decode_attention(PyObject *self, PyObject *const *args,
                                           Py_ssize_t nargs) {
  int64_t a[13];
  if (nargs != 14 || int_args(args, nargs, 13, a) < 0) {
    if (!PyErr_Occurred())
      PyErr_SetString(PyExc_TypeError, "paged_decode_attention takes 14 arguments");
    return NULL;
  }
  double scale = PyFloat_AsDouble(args[13]);
  if (scale == -1.0 && PyErr_Occurred()) return NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = paged_decode_attention(PTR(a[0]), PTR(a[1]), PTR(a[2]), PTR(a[3]), PTR(a[4]), PTR(a[5]),
                              a[6], a[7], a[8], a[9], a[10], a[11], (float)scale, (int)a[12]);
  Py_END_ALLOW_THREADS
  if (rc != 0) return PyErr_NoMemory();
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"gemv", (PyCFunction)(void (*)(void))py_gemv, METH_FASTCALL,
     "gemv(x, w, b, y, M, N, K, num_threads): y = x @ w.T (+ b), raw float32 pointers."},
    {"paged_decode_attention", (PyCFunction)(void (*)(void))py_paged_decode_attention,
     METH_FASTCALL,
     "paged_decode_attention(out, q, k_cache, v_cache, block_tables, seq_lens, B, H, KV, D, "
     "block_size, max_blocks, num_threads, scale): one query token per sequence."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", NULL, -1, methods};

PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&module); }
