/*
 * loader_obj.c — _core.Loader and _core.Batch.
 *
 * A Batch owns one tf_batch; every NumPy array handed out for it has the Batch
 * as its base object, so the buffers go back to the engine's pool only when
 * the last array (or tensor sharing its memory) is gone. next() waits with the
 * GIL released, in 50 ms slices so that Ctrl-C interrupts it promptly.
 */
#include "binding.h"

#include <errno.h>

int tfpy_parse_order_config(PyObject *kw, tf_order_config *cfg);
int tfpy_parse_sources(tf_module_state *st, PyObject *dsobj, PyObject *kw, const tf_dataset ***dss, double **w,
                       size_t *n);

typedef struct {
    PyObject_HEAD
    tf_batch *b;
} tfpy_Batch;

static void Batch_dealloc(tfpy_Batch *self) {
    PyTypeObject *tp = Py_TYPE(self);
    tf_batch_release(self->b);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyType_Slot Batch_slots[] = {
    {Py_tp_dealloc, Batch_dealloc},
    {Py_tp_doc, "Owner of one batch's buffers; they return to the loader when the last array is gone."},
    {0, NULL},
};
PyType_Spec tfpy_BatchSpec = {"tokenfeed._core.Batch", sizeof(tfpy_Batch), 0, Py_TPFLAGS_DEFAULT, Batch_slots};

typedef struct {
    PyObject_HEAD
    tf_loader *l;
    PyObject *dataset;   /* keeps the tf_dataset alive */
    int busy;            /* a thread is inside next() with the GIL released */
    int close_pending;   /* close() was called while busy */
    uint64_t seq_len, batch_size, global_batch;
    tf_dtype out_dtype;
    unsigned want;
} tfpy_Loader;

static tf_backend parse_backend(PyObject *v, int *err) {
    *err = 0;
    if (!v || v == Py_None) return TF_BACKEND_AUTO;
    const char *s = PyUnicode_AsUTF8(v);
    if (!s) { *err = 1; return TF_BACKEND_AUTO; }
    if (!strcmp(s, "auto")) return TF_BACKEND_AUTO;
    if (!strcmp(s, "mmap")) return TF_BACKEND_MMAP;
    if (!strcmp(s, "pread")) return TF_BACKEND_PREAD;
    if (!strcmp(s, "io_uring")) return TF_BACKEND_IO_URING;
    PyErr_Format(PyExc_ValueError, "backend must be 'auto', 'mmap', 'pread' or 'io_uring', not %R", v);
    *err = 1;
    return TF_BACKEND_AUTO;
}

static int get_u64(PyObject *kw, const char *key, uint64_t *out) {
    PyObject *v = kw ? PyDict_GetItemString(kw, key) : NULL;
    if (!v || v == Py_None) return 0;
    if (!PyLong_Check(v)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, not %.100s", key, Py_TYPE(v)->tp_name);
        return -1;
    }
    int overflow = 0;
    long long sv = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (sv == -1 && PyErr_Occurred()) return -1;
    if (overflow < 0 || (!overflow && sv < 0)) {
        PyErr_Format(PyExc_ValueError, "%s must be >= 0, got %R", key, v);
        return -1;
    }
    unsigned long long x = PyLong_AsUnsignedLongLong(v);
    if (x == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    *out = x;
    return 0;
}

static PyObject *Loader_new(PyTypeObject *tp, PyObject *args, PyObject *kw) {
    PyObject *dsobj;
    if (!PyArg_ParseTuple(args, "O:Loader", &dsobj)) return NULL;
    tf_module_state *st = tfpy_state_of_type(tp);
    tf_loader_config cfg;
    tf_loader_config_init(&cfg);
    if (tfpy_parse_order_config(kw, &cfg.order) < 0) return NULL;
    uint64_t rank = cfg.rank, world = cfg.world_size, threads = 0, prefetch = 0, want = 0, direct = 0;
    if (get_u64(kw, "batch_size", &cfg.batch_size) < 0 || get_u64(kw, "rank", &rank) < 0 ||
        get_u64(kw, "world_size", &world) < 0 || get_u64(kw, "num_threads", &threads) < 0 ||
        get_u64(kw, "prefetch", &prefetch) < 0 || get_u64(kw, "want", &want) < 0 ||
        get_u64(kw, "direct_io", &direct) < 0 || get_u64(kw, "zstd_cache_bytes", &cfg.zstd_cache_bytes) < 0)
        return NULL;
    if (rank > UINT32_MAX || world > UINT32_MAX || threads > 4096 || prefetch > 1 << 20)
        return PyErr_Format(PyExc_ValueError, "rank/world_size/num_threads/prefetch out of range");
    cfg.rank = (uint32_t)rank;
    cfg.world_size = (uint32_t)world;
    cfg.num_threads = (int)threads;
    cfg.prefetch = (int)prefetch;
    cfg.want = (unsigned)want;
    cfg.direct_io = direct != 0;
    int err;
    cfg.backend = parse_backend(kw ? PyDict_GetItemString(kw, "backend") : NULL, &err);
    if (err) return NULL;
    const tf_dataset **dss;
    double *w;
    size_t n;
    if (tfpy_parse_sources(st, dsobj, kw, &dss, &w, &n) < 0) return NULL;
    tf_dataset_info in;
    tf_dataset_get_info(dss[0], &in);
    for (size_t i = 1; i < n; i++) { /* default out dtype: the widest source */
        tf_dataset_info o;
        tf_dataset_get_info(dss[i], &o);
        if (tf_dtype_size(o.dtype) > tf_dtype_size(in.dtype)) in.dtype = o.dtype;
    }
    if (tfpy_parse_dtype(kw ? PyDict_GetItemString(kw, "dtype") : NULL, in.dtype, &cfg.out_dtype) < 0) {
        PyMem_Free(dss);
        PyMem_Free(w);
        return NULL;
    }
    tf_loader *l = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = n ? tf_loader_create_mix(dss, w, n, &cfg, &l) : tf_loader_create(dss[0], &cfg, &l);
    Py_END_ALLOW_THREADS
    PyMem_Free(dss);
    PyMem_Free(w);
    if (rc < 0) return tfpy_raise(st, rc, NULL);
    tfpy_Loader *self = (tfpy_Loader *)tp->tp_alloc(tp, 0);
    if (!self) {
        tf_loader_free(l);
        return NULL;
    }
    self->l = l;
    /* a mixture keeps its sources in a tuple: a list could drop them */
    self->dataset = PyObject_TypeCheck(dsobj, st->DatasetType) ? Py_NewRef(dsobj) : PySequence_Tuple(dsobj);
    if (!self->dataset) {
        Py_DECREF(self);
        return NULL;
    }
    self->seq_len = cfg.order.seq_len;
    self->batch_size = cfg.batch_size;
    self->global_batch = cfg.batch_size * cfg.world_size;
    self->out_dtype = cfg.out_dtype;
    self->want = cfg.want;
    return (PyObject *)self;
}

static void loader_free(tfpy_Loader *self) {
    tf_loader *l = self->l;
    self->l = NULL;
    if (l) {
        /* Joining worker threads can take a moment: do it without the GIL. */
        Py_BEGIN_ALLOW_THREADS
        tf_loader_free(l);
        Py_END_ALLOW_THREADS
    }
}

static void Loader_dealloc(tfpy_Loader *self) {
    PyTypeObject *tp = Py_TYPE(self);
    loader_free(self);
    Py_CLEAR(self->dataset);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static int loader_check(tfpy_Loader *self) {
    if (!self->l || self->close_pending) {
        PyErr_SetString(PyExc_ValueError, "the loader is closed");
        return -1;
    }
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "the loader is being iterated by another thread; a Loader is not shared between threads");
        return -1;
    }
    return 0;
}

/* A 2-D view into the batch's buffer with the Batch as base. */
static PyObject *view2d(PyObject *owner, void *data, int typenum, npy_intp rows, npy_intp cols, npy_intp row_stride, npy_intp elsize) {
    npy_intp dims[2] = {rows, cols};
    npy_intp strides[2] = {row_stride, elsize};
    PyObject *arr = PyArray_New(&PyArray_Type, 2, dims, typenum, strides, data, 0, NPY_ARRAY_WRITEABLE | NPY_ARRAY_ALIGNED, NULL);
    if (!arr) return NULL;
    Py_INCREF(owner);
    if (PyArray_SetBaseObject((PyArrayObject *)arr, owner) < 0) { /* steals owner even on failure */
        Py_DECREF(arr);
        return NULL;
    }
    return arr;
}

static int dict_put(PyObject *d, const char *k, PyObject *v) {
    if (!v) return -1;
    int rc = PyDict_SetItemString(d, k, v);
    Py_DECREF(v);
    return rc;
}

PyDoc_STRVAR(Loader_next_doc,
"next($self)\n--\n\nReturns dict. "
"The next batch for this rank: 'tokens' (B, L+1), 'input_ids' and 'labels'\n"
"(B, L) views of it, plus 'position_ids', 'cu_seqlens', 'num_seqs' and\n"
"'loss_mask' when asked for. Raises StopIteration at the end of a finite stream.");

static PyObject *Loader_next(tfpy_Loader *self, PyObject *unused) {
    if (loader_check(self) < 0) return NULL;
    tf_module_state *st = tfpy_state((PyObject *)self);
    tf_batch *b = NULL;
    int rc;
    char msg[1024];
    self->busy = 1;
    for (;;) {
        Py_BEGIN_ALLOW_THREADS
        rc = tf_loader_next_timed(self->l, &b, 50ull * 1000 * 1000);
        if (rc < 0 && rc != -ETIMEDOUT) snprintf(msg, sizeof msg, "%s", tf_last_error());
        Py_END_ALLOW_THREADS
        if (rc != -ETIMEDOUT) break;
        if (self->close_pending || PyErr_CheckSignals() < 0) break;
    }
    self->busy = 0;
    if (self->close_pending) {
        if (rc == 0) tf_batch_release(b);
        loader_free(self);
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "the loader was closed while waiting for a batch");
        return NULL;
    }
    if (rc == -ETIMEDOUT) return NULL; /* interrupted: exception set by PyErr_CheckSignals */
    if (rc < 0) return tfpy_raise(st, rc, msg);

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

static PyObject *Loader_seek(tfpy_Loader *self, PyObject *arg) {
    if (loader_check(self) < 0) return NULL;
    unsigned long long pos = PyLong_AsUnsignedLongLong(arg);
    if (pos == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    int rc;
    char msg[1024];
    Py_BEGIN_ALLOW_THREADS
    rc = tf_loader_seek(self->l, pos);
    if (rc < 0) snprintf(msg, sizeof msg, "%s", tf_last_error());
    Py_END_ALLOW_THREADS
    if (rc < 0) return tfpy_raise(tfpy_state((PyObject *)self), rc, msg);
    Py_RETURN_NONE;
}

static PyObject *Loader_close(tfpy_Loader *self, PyObject *unused) {
    if (self->busy) self->close_pending = 1; /* the waiting thread frees it */
    else loader_free(self);
    Py_RETURN_NONE;
}

static PyObject *Loader_stats(tfpy_Loader *self, PyObject *unused) {
    if (!self->l) {
        PyErr_SetString(PyExc_ValueError, "the loader is closed");
        return NULL;
    }
    tf_loader_stats s;
    memset(&s, 0, sizeof s);
    tf_loader_get_stats(self->l, &s);
    PyObject *d = Py_BuildValue("{s:K,s:K,s:K,s:d,s:K,s:K,s:s,s:i,s:s}", "batches", (unsigned long long)s.batches, "tokens",
                         (unsigned long long)s.tokens, "bytes_read", (unsigned long long)s.bytes_read, "wait_seconds",
                         (double)s.wait_ns / 1e9, "ring_ready", (unsigned long long)s.ring_ready, "ring_slots",
                         (unsigned long long)s.ring_slots, "backend", tf_backend_name(s.backend), "num_threads",
                         s.num_threads, "backend_note", s.backend_note);
    if (!d) return NULL;
    if (!s.zstd_cache_bytes) { /* no compressed file */
        if (PyDict_SetItemString(d, "zstd", Py_None) < 0) {
            Py_DECREF(d);
            return NULL;
        }
        return d;
    }
    PyObject *z = Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:d,s:d,s:s}",
                                "cache_bytes", (unsigned long long)s.zstd_cache_bytes,
                                "cache_allocated", (unsigned long long)s.zstd_cache_allocated,
                                "blocks_decoded", (unsigned long long)s.zstd_blocks_decoded,
                                "tokens_decoded", (unsigned long long)s.zstd_tokens_decoded,
                                "tokens_used", (unsigned long long)s.zstd_tokens_used,
                                "cache_hits", (unsigned long long)s.zstd_cache_hits,
                                "cache_misses", (unsigned long long)s.zstd_cache_misses,
                                "cache_waits", (unsigned long long)s.zstd_cache_waits,
                                "decode_ratio", s.zstd_decode_ratio, "decode_model", s.zstd_decode_model,
                                "note", s.zstd_note);
    if (!z || PyDict_SetItemString(d, "zstd", z) < 0) {
        Py_XDECREF(z);
        Py_DECREF(d);
        return NULL;
    }
    Py_DECREF(z);
    return d;
}

static PyObject *Loader_get_position(tfpy_Loader *self, void *c) {
    if (!self->l) {
        PyErr_SetString(PyExc_ValueError, "the loader is closed");
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(tf_loader_position(self->l));
}

static PyObject *Loader_get_closed(tfpy_Loader *self, void *c) { return PyBool_FromLong(!self->l || self->close_pending); }

static PyMethodDef Loader_methods[] = {
    {"next", (PyCFunction)Loader_next, METH_NOARGS, Loader_next_doc},
    {"seek", (PyCFunction)Loader_seek, METH_O, "seek($self, position, /)\n--\n\nMove to a global position (a multiple of the global batch). O(1)."},
    {"close", (PyCFunction)Loader_close, METH_NOARGS, "close($self)\n--\n\nStop the worker threads. Batches already handed out stay valid."},
    {"stats", (PyCFunction)Loader_stats, METH_NOARGS, "stats() -> dict"},
    {NULL, NULL, 0, NULL},
};
static PyGetSetDef Loader_getset[] = {
    {"position", (getter)Loader_get_position, NULL, "global position of the next batch this rank receives", NULL},
    {"closed", (getter)Loader_get_closed, NULL, "whether close() was called", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};
static PyType_Slot Loader_slots[] = {
    {Py_tp_new, Loader_new},
    {Py_tp_dealloc, Loader_dealloc},
    {Py_tp_methods, Loader_methods},
    {Py_tp_getset, Loader_getset},
    {Py_tp_doc, "Loader(dataset, **config)\n--\n\nThe C batch engine over a dataset."},
    {0, NULL},
};
PyType_Spec tfpy_LoaderSpec = {"tokenfeed._core.Loader", sizeof(tfpy_Loader), 0, Py_TPFLAGS_DEFAULT, Loader_slots};
