/*
 * columns_obj.c — the binding of views: Dataset.select / selection /
 * document_id, and metadata column files (tf_columns) held in a capsule by
 * python/tokenfeed/sources/_views.py. Work over many documents (a filter, a match)
 * runs with the GIL released.
 */
#include "binding.h"

#include <string.h>

#define COLS_CAPSULE "tokenfeed.columns"

PyObject *tfpy_dataset_select(tfpy_Dataset *self, PyObject *arg) {
    tf_module_state *st = tfpy_state((PyObject *)self);
    PyArrayObject *a = (PyArrayObject *)PyArray_FROMANY(arg, NPY_UINT64, 1, 1, NPY_ARRAY_IN_ARRAY);
    if (!a) return NULL;
    const uint64_t *ids = PyArray_DATA(a);
    uint64_t n = (uint64_t)PyArray_DIM(a, 0);
    tf_dataset *v = NULL;
    int rc;
    char msg[1024];
    TFPY_NOGIL_CALL(rc, msg, tf_dataset_select(self->ds, ids, n, &v));
    Py_DECREF(a);
    if (rc < 0) return tfpy_raise_input(st, rc, msg);
    PyTypeObject *tp = Py_TYPE(self);
    tfpy_Dataset *o;
    TFPY_NEW_OWNER(o, tp, ds, v, tf_dataset_free);
    if (!o) return NULL;
    Py_INCREF(self->paths);
    o->paths = self->paths;
    Py_INCREF(self);
    o->parent = (PyObject *)self;
    return (PyObject *)o;
}

PyObject *tfpy_dataset_selection(tfpy_Dataset *self, PyObject *unused) {
    (void)unused;
    uint64_t d, t;
    if (tf_dataset_selection(self->ds, &d, &t) != 1) Py_RETURN_NONE;
    return Py_BuildValue("(KK)", (unsigned long long)d, (unsigned long long)t);
}

static uint64_t doc_id_of(const void *ctx, uint64_t i) {
    uint64_t id = 0;
    tf_dataset_document_id(ctx, i, &id);
    return id;
}

PyObject *tfpy_dataset_document_id(tfpy_Dataset *self, PyObject *arg) {
    uint64_t n;
    tf_dataset_selection(self->ds, &n, NULL);
    return tfpy_map_u64(arg, doc_id_of, self->ds, n);
}

/* ---- column files ---------------------------------------------------------- */

static void cols_destroy(PyObject *cap) {
    tf_columns *c = PyCapsule_GetPointer(cap, COLS_CAPSULE);
    tf_columns_free(c);
}

static tf_columns *cols_of(PyObject *cap) { return PyCapsule_GetPointer(cap, COLS_CAPSULE); }

/* "O&" converter of a columns capsule into its tf_columns. */
static int cols_arg(PyObject *cap, void *out) { return (*(tf_columns **)out = cols_of(cap)) != NULL; }

static tf_module_state *mod_state(PyObject *m) { return PyModule_GetState(m); }

static PyObject *columns_open(PyObject *m, PyObject *arg) {
    PyObject *b = NULL;
    if (!PyUnicode_FSConverter(arg, &b)) return NULL;
    tf_columns *c = NULL;
    int rc;
    char msg[1024];
    TFPY_NOGIL_CALL(rc, msg, tf_columns_open(PyBytes_AS_STRING(b), &c));
    Py_DECREF(b);
    if (rc < 0) return tfpy_raise(mod_state(m), rc, msg);
    PyObject *cap = PyCapsule_New(c, COLS_CAPSULE, cols_destroy);
    if (!cap) tf_columns_free(c);
    return cap;
}

static PyObject *columns_from_bytes(PyObject *m, PyObject *arg) {
    /* the bytes object stays alive as the capsule's context */
    if (!PyBytes_Check(arg)) return PyErr_Format(PyExc_TypeError, "columns_from_bytes: bytes expected");
    tf_columns *c = NULL;
    int rc = tf_columns_from_memory(PyBytes_AS_STRING(arg), (size_t)PyBytes_GET_SIZE(arg), &c);
    if (rc < 0) return tfpy_raise(mod_state(m), rc, tf_last_error());
    PyObject *cap = PyCapsule_New(c, COLS_CAPSULE, cols_destroy);
    if (!cap) {
        tf_columns_free(c);
        return NULL;
    }
    Py_INCREF(arg);
    if (PyCapsule_SetContext(cap, arg) < 0) {
        Py_DECREF(arg);
        Py_DECREF(cap);
        return NULL;
    }
    return cap;
}

static PyObject *columns_info(PyObject *m, PyObject *cap) {
    (void)m;
    tf_columns *c = cols_of(cap);
    if (!c) return NULL;
    size_t n = tf_columns_count(c);
    PyObject *cols = PyList_New((Py_ssize_t)n);
    if (!cols) return NULL;
    for (size_t i = 0; i < n; i++) {
        const char *name;
        tf_column_type t;
        tf_columns_get(c, i, &name, &t);
        PyObject *e = Py_BuildValue("(ss)", name, tf_column_type_name(t));
        if (!e) {
            Py_DECREF(cols);
            return NULL;
        }
        PyList_SET_ITEM(cols, (Py_ssize_t)i, e);
    }
    return Py_BuildValue("{s:K,s:K,s:N}", "num_documents", (unsigned long long)tf_columns_num_documents(c),
                         "dataset_fingerprint", (unsigned long long)tf_columns_dataset_fingerprint(c), "columns",
                         cols);
}

static PyObject *new_mask(tf_columns *c) {
    npy_intp dims[1] = {(npy_intp)tf_columns_num_documents(c)};
    return PyArray_ZEROS(1, dims, NPY_BOOL, 0);
}

static PyObject *columns_eval(PyObject *m, PyObject *args) {
    tf_columns *c;
    const char *where;
    if (!PyArg_ParseTuple(args, "O&s:columns_eval", cols_arg, &c, &where)) return NULL;
    PyObject *mask = new_mask(c);
    if (!mask) return NULL;
    int rc;
    char msg[1024];
    TFPY_NOGIL_CALL(rc, msg, tf_columns_eval(c, where, PyArray_DATA((PyArrayObject *)mask)));
    if (rc < 0) {
        Py_DECREF(mask);
        return tfpy_raise_input(mod_state(m), rc, msg);
    }
    return mask;
}

static PyObject *columns_match(PyObject *m, PyObject *args) {
    tf_columns *c;
    PyObject *values;
    const char *column;
    if (!PyArg_ParseTuple(args, "O&sO:columns_match", cols_arg, &c, &column, &values)) return NULL;
    PyObject *seq = PySequence_Fast(values, "columns_match: values must be a sequence of str");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    const char **v = PyMem_Calloc((size_t)(n ? n : 1), sizeof *v);
    PyObject *mask = NULL;
    if (!v) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyUnicode_Check(o)) {
            PyErr_Format(PyExc_TypeError, "columns_match: value %zd is %s, expected str", i, Py_TYPE(o)->tp_name);
            goto done;
        }
        v[i] = PyUnicode_AsUTF8(o);
        if (!v[i]) goto done;
    }
    mask = new_mask(c);
    if (!mask) goto done;
    int rc;
    char msg[1024];
    TFPY_NOGIL_CALL(rc, msg, tf_columns_match(c, column, v, (size_t)n, PyArray_DATA((PyArrayObject *)mask)));
    if (rc < 0) {
        Py_CLEAR(mask);
        tfpy_raise_input(mod_state(m), rc, msg);
    }
done:
    PyMem_Free(v);
    Py_DECREF(seq);
    return mask;
}

static PyObject *columns_values(PyObject *m, PyObject *args) {
    tf_columns *c;
    PyObject *ids;
    const char *column;
    if (!PyArg_ParseTuple(args, "O&sO:columns_values", cols_arg, &c, &column, &ids)) return NULL;
    PyArrayObject *a = (PyArrayObject *)PyArray_FROMANY(ids, NPY_UINT64, 1, 1, NPY_ARRAY_IN_ARRAY);
    if (!a) return NULL;
    npy_intp n = PyArray_DIM(a, 0);
    const uint64_t *d = PyArray_DATA(a);
    PyObject *out = PyList_New(n);
    for (npy_intp i = 0; out && i < n; i++) {
        tf_column_value v;
        int rc = tf_columns_value(c, column, d[i], &v);
        if (rc < 0) {
            Py_CLEAR(out);
            tfpy_raise_input(mod_state(m), rc, tf_last_error());
            break;
        }
        PyObject *o;
        if (v.is_null) o = Py_NewRef(Py_None);
        else if (v.type == TF_COLUMN_INT64) o = PyLong_FromLongLong(v.i);
        else if (v.type == TF_COLUMN_FLOAT64) o = PyFloat_FromDouble(v.f);
        else o = PyUnicode_DecodeUTF8(v.s, (Py_ssize_t)v.len, "replace");
        if (!o) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, o);
    }
    Py_DECREF(a);
    return out;
}

static PyObject *hash64(PyObject *m, PyObject *args) {
    (void)m;
    Py_buffer b;
    unsigned long long seed = 0;
    if (!PyArg_ParseTuple(args, "y*|K:hash64", &b, &seed)) return NULL;
    uint64_t h;
    Py_BEGIN_ALLOW_THREADS
    h = tf_hash64(b.buf, (size_t)b.len, seed);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLongLong(h);
}

PyMethodDef tfpy_columns_functions[] = {
    {"columns_open", columns_open, METH_O, "columns_open(path, /)\n--\n\nReturns a capsule. A metadata column file, mapped; header and directory checked."},
    {"columns_from_bytes", columns_from_bytes, METH_O, "columns_from_bytes(data, /)\n--\n\nReturns a capsule. The same over bytes in memory."},
    {"columns_info", columns_info, METH_O, "columns_info(columns, /)\n--\n\nReturns dict: num_documents, dataset_fingerprint, columns [(name, type)]."},
    {"columns_eval", columns_eval, METH_VARARGS, "columns_eval(columns, where, /)\n--\n\nReturns ndarray[bool]. The documents satisfying the filter where."},
    {"columns_match", columns_match, METH_VARARGS, "columns_match(columns, column, values, /)\n--\n\nReturns ndarray[bool]. The documents whose value of column is one of values."},
    {"columns_values", columns_values, METH_VARARGS, "columns_values(columns, column, ids, /)\n--\n\nReturns list. The values of column for documents ids (None: missing)."},
    {"hash64", hash64, METH_VARARGS, "hash64(data, seed=0, /)\n--\n\nReturns int. XXH64 of data, the checksum of column files."},
    {NULL, NULL, 0, NULL},
};
