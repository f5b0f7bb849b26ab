/*
 * permutation_obj.c — _core.Permutation: the keyed Feistel bijection the
 * shuffle uses (tf_perm).
 */
#include "binding.h"

typedef struct {
    PyObject_HEAD
    tf_perm p;
} tfpy_Permutation;

static PyObject *Permutation_new(PyTypeObject *tp, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"n", "key", NULL};
    unsigned long long n, key = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "K|K:Permutation", kwlist, &n, &key)) return NULL;
    tfpy_Permutation *self = (tfpy_Permutation *)tp->tp_alloc(tp, 0);
    if (!self) return NULL;
    int rc = tf_perm_init(&self->p, n, key);
    if (rc < 0) {
        Py_DECREF(self);
        return tfpy_raise(tfpy_state_of_type(tp), rc, NULL);
    }
    return (PyObject *)self;
}

static uint64_t perm_fwd(const void *p, uint64_t i) { return tf_perm_apply(p, i); }
static uint64_t perm_inv(const void *p, uint64_t i) { return tf_perm_inverse(p, i); }

static PyObject *Permutation_apply(tfpy_Permutation *self, PyObject *arg) { return tfpy_map_u64(arg, perm_fwd, &self->p, self->p.n); }
static PyObject *Permutation_inverse(tfpy_Permutation *self, PyObject *arg) { return tfpy_map_u64(arg, perm_inv, &self->p, self->p.n); }
static PyObject *Permutation_len(tfpy_Permutation *self, void *c) { return PyLong_FromUnsignedLongLong(self->p.n); }

PyDoc_STRVAR(Permutation_doc, "Permutation(n, key=0)\n--\n\nThe keyed Feistel bijection on [0, n) used by the shuffle.");

TFPY_TYPE_SPEC(Permutation, tfpy_Permutation, Py_TPFLAGS_DEFAULT,
               {Py_tp_doc, (void *)Permutation_doc}, {Py_tp_new, Permutation_new}, {Py_tp_dealloc, tfpy_free_instance},
               {Py_tp_methods, TFPY_METHODS(
                   {"apply", (PyCFunction)Permutation_apply, METH_O, "apply($self, i, /)\n--\n\nReturns int | ndarray. The image of i (scalar or uint64 array)."},
                   {"inverse", (PyCFunction)Permutation_inverse, METH_O, "inverse($self, j, /)\n--\n\nReturns int | ndarray. The preimage of j."})},
               {Py_tp_getset, TFPY_GETSET(
                   {"n", (getter)Permutation_len, NULL, "size of the domain", NULL})});
