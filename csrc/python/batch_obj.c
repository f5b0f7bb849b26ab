/*
 * batch_obj.c — _core.Batch: the owner of one batch's buffers (tf_batch).
 * Every NumPy array handed out for a batch has the Batch as its base object,
 * so the buffers go back to the engine's pool only when the last array (or
 * tensor sharing its memory) is gone.
 */
#include "binding.h"

typedef struct {
    PyObject_HEAD
    tf_batch *b;
} tfpy_Batch;

static void Batch_dealloc(tfpy_Batch *self) {
    tf_batch_release(self->b);
    tfpy_free_instance((PyObject *)self);
}

PyDoc_STRVAR(Batch_doc, "Owner of one batch's buffers; they return to the loader when the last array is gone.");

TFPY_TYPE_SPEC(Batch, tfpy_Batch, Py_TPFLAGS_DEFAULT,
               {Py_tp_doc, (void *)Batch_doc}, {Py_tp_dealloc, Batch_dealloc});

/* An nd-dimensional view into the batch's buffer with the Batch as base. */
static PyObject *view(PyObject *owner, void *data, int typenum, int nd, npy_intp *dims, npy_intp *strides) {
    PyObject *arr = PyArray_New(&PyArray_Type, nd, dims, typenum, strides, data, 0, NPY_ARRAY_WRITEABLE | NPY_ARRAY_ALIGNED, NULL);
    if (!arr) return NULL;
    Py_INCREF(owner);
    if (PyArray_SetBaseObject((PyArrayObject *)arr, owner) < 0) { /* steals owner even on failure */
        Py_DECREF(arr);
        return NULL;
    }
    return arr;
}

static PyObject *view2d(PyObject *owner, void *data, int typenum, npy_intp rows, npy_intp cols, npy_intp row_stride, npy_intp elsize) {
    npy_intp dims[2] = {rows, cols}, strides[2] = {row_stride, elsize};
    return view(owner, data, typenum, 2, dims, strides);
}

static PyObject *view1d(PyObject *owner, void *data, int typenum, npy_intp n, npy_intp elsize) {
    npy_intp dims[1] = {n}, strides[1] = {elsize};
    return view(owner, data, typenum, 1, dims, strides);
}

static int dict_put(PyObject *d, const char *k, PyObject *v) {
    if (!v) return -1;
    int rc = PyDict_SetItemString(d, k, v);
    Py_DECREF(v);
    return rc;
}

PyObject *tfpy_batch_dict(tf_module_state *st, tf_batch *b) {
    tfpy_Batch *owner = PyObject_New(tfpy_Batch, st->BatchType);
    if (!owner) {
        tf_batch_release(b);
        return NULL;
    }
    owner->b = b;
    tf_batch_view v;
    tf_batch_get_view(b, &v);
    npy_intp B = (npy_intp)v.rows, L = (npy_intp)v.seq_len;
    int tn = tfpy_npy_from_dtype(v.dtype);
    npy_intp isz = (npy_intp)tf_dtype_size(v.dtype);
    PyObject *d = PyDict_New();
    if (!d) goto fail;
    if (v.cp_size > 1) {
        /* context parallelism: this rank's share, with buffers of its own */
        if (v.thd) {
            npy_intp T = (npy_intp)v.num_tokens, n = (npy_intp)v.num_seqs[0];
            if (dict_put(d, "input_ids", view1d((PyObject *)owner, v.input_ids, tn, T, isz)) < 0 ||
                dict_put(d, "labels", view1d((PyObject *)owner, v.labels, tn, T, isz)) < 0 ||
                dict_put(d, "cu_seqlens", view1d((PyObject *)owner, v.cu_seqlens, NPY_INT32, n + 1, 4)) < 0 ||
                dict_put(d, "cu_seqlens_padded", view1d((PyObject *)owner, v.cu_seqlens_padded, NPY_INT32, n + 1, 4)) < 0 ||
                dict_put(d, "max_seqlen", PyLong_FromLong(v.max_seqlen)) < 0 ||
                dict_put(d, "num_seqs", PyLong_FromLong(v.num_seqs[0])) < 0)
                goto fail;
            if (v.position_ids && dict_put(d, "position_ids", view1d((PyObject *)owner, v.position_ids, NPY_INT32, T, 4)) < 0) goto fail;
            if (v.loss_mask && dict_put(d, "loss_mask", view1d((PyObject *)owner, v.loss_mask, NPY_UINT8, T, 1)) < 0) goto fail;
        } else {
            npy_intp Lc = L / (npy_intp)v.cp_size;
            if (dict_put(d, "input_ids", view2d((PyObject *)owner, v.input_ids, tn, B, Lc, Lc * isz, isz)) < 0 ||
                dict_put(d, "labels", view2d((PyObject *)owner, v.labels, tn, B, Lc, Lc * isz, isz)) < 0)
                goto fail;
            if (v.position_ids && dict_put(d, "position_ids", view2d((PyObject *)owner, v.position_ids, NPY_INT32, B, Lc, Lc * 4, 4)) < 0) goto fail;
            if (v.loss_mask && dict_put(d, "loss_mask", view2d((PyObject *)owner, v.loss_mask, NPY_UINT8, B, Lc, Lc, 1)) < 0) goto fail;
        }
        Py_DECREF(owner);
        return d;
    }
    char *tok = v.tokens;
    if (dict_put(d, "tokens", view2d((PyObject *)owner, tok, tn, B, L + 1, (L + 1) * isz, isz)) < 0 ||
        dict_put(d, "input_ids", view2d((PyObject *)owner, tok, tn, B, L, (L + 1) * isz, isz)) < 0 ||
        dict_put(d, "labels", view2d((PyObject *)owner, tok + isz, tn, B, L, (L + 1) * isz, isz)) < 0)
        goto fail;
    if (v.position_ids && dict_put(d, "position_ids", view2d((PyObject *)owner, v.position_ids, NPY_INT32, B, L, L * 4, 4)) < 0) goto fail;
    if (v.cu_seqlens && dict_put(d, "cu_seqlens", view2d((PyObject *)owner, v.cu_seqlens, NPY_INT32, B, L + 1, (L + 1) * 4, 4)) < 0) goto fail;
    if (v.num_seqs && dict_put(d, "num_seqs", view2d((PyObject *)owner, v.num_seqs, NPY_INT32, B, 1, 4, 4)) < 0) goto fail;
    if (v.loss_mask && dict_put(d, "loss_mask", view2d((PyObject *)owner, v.loss_mask, NPY_UINT8, B, L, L, 1)) < 0) goto fail;
    Py_DECREF(owner);
    return d;
fail:
    Py_XDECREF(d);
    Py_DECREF(owner);
    return NULL;
}
