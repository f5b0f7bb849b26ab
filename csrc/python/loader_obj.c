/*
 * loader_obj.c — _core.Loader: the C batch engine over an Order built once
 * (tf_loader_create_from_order). The Loader keeps its Order, and through it
 * the datasets, alive. next() waits with the GIL released, in 50 ms slices
 * so that Ctrl-C interrupts it promptly, and hands the batch to batch_obj.c.
 */
#include "binding.h"

typedef struct {
    PyObject_HEAD
    tf_loader *l;
    PyObject *order;     /* the _core.Order the engine borrows */
    int busy;            /* a thread is inside next() with the GIL released */
    int close_pending;   /* close() was called while busy or used */
    int users;           /* DeviceLoaders driving the engine (their copy thread calls it) */
} tfpy_Loader;

static int parse_dtype(PyObject *v, void *out) { return tfpy_parse_dtype(v, TF_DTYPE_INVALID, out) == 0; }

static int parse_u32(PyObject *v, void *out) {
    uint64_t x;
    if (!tfpy_u64(v, &x)) return 0;
    if (x > UINT32_MAX) {
        PyErr_Format(PyExc_OverflowError, "expected an int < 2**32, got %R", v);
        return 0;
    }
    *(uint32_t *)out = (uint32_t)x;
    return 1;
}

/* Loader(order, /, *, dtype, want, **settings): the engine's settings (rows
 * of the settings table: batch_size, dp_rank, dp_size, num_threads,
 * prefetch_batches, backend, direct_io, zstd_cache_bytes, cp_rank, cp_size);
 * the order decides the stream. The C library checks the values. */
static PyObject *Loader_new(PyTypeObject *tp, PyObject *args, PyObject *kw) {
    PyObject *ordobj;
    tf_module_state *st = tfpy_state_of_type(tp);
    if (!PyArg_ParseTuple(args, "O!:Loader", st->OrderType, &ordobj)) return NULL;
    tf_loader_config cfg;
    tf_loader_config_init(&cfg);
    /* the engine's settings come from the settings table (batch_size, dp_rank, dp_size, ...) */
    const tfpy_kwarg table[] = {
        {"dtype", parse_dtype, &cfg.out_dtype}, {"want", parse_u32, &cfg.want}, {NULL, NULL, NULL},
    };
    if (tfpy_parse_settings(kw, TF_SCOPE_ENGINE, &cfg, table, "Loader") < 0) return NULL;
    tf_loader *l = NULL;
    int rc;
    char msg[1024];
    TFPY_NOGIL_CALL(rc, msg, tf_loader_create_from_order(((tfpy_Order *)ordobj)->o, &cfg, &l));
    if (rc < 0) return tfpy_raise(st, rc, msg);
    tfpy_Loader *self;
    TFPY_NEW_OWNER(self, tp, l, l, tf_loader_free);
    if (self) self->order = Py_NewRef(ordobj);
    return (PyObject *)self;
}

static void engine_free(void *l) { tf_loader_free(l); }

/* Joining worker threads can take a moment: done without the GIL, and the
 * Order the engine borrows is held until it is done (tfpy_destroy may do it
 * later, on a thread of its own). */
static void loader_free(tfpy_Loader *self) {
    tf_loader *l = self->l;
    self->l = NULL;
    if (l) tfpy_destroy(engine_free, l, Py_XNewRef(self->order));
}

static void Loader_dealloc(tfpy_Loader *self) {
    PyTypeObject *tp = Py_TYPE(self);
    loader_free(self);
    /* while finalizing, the engine is left running (tfpy_destroy), so what it
     * borrows stays too */
    if (!tfpy_finalizing()) Py_CLEAR(self->order);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static int loader_check(tfpy_Loader *self) {
    if (!self->l || self->close_pending) {
        PyErr_SetString(PyExc_ValueError, "the loader is closed");
        return -1;
    }
    if (self->users) {
        PyErr_SetString(PyExc_RuntimeError, "this loader's engine is driven by a DeviceLoader: take batches from that");
        return -1;
    }
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "the loader is being iterated by another thread; a Loader is not shared between threads");
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(Loader_next_doc,
"next($self)\n--\n\nReturns dict. "
"The next batch for this rank: 'tokens' (B, L+1), 'input_ids' and 'labels'\n"
"(B, L) views of it, plus 'position_ids', 'cu_seqlens', 'num_seqs' and\n"
"'loss_mask' when asked for. With cp_size > 1: 'input_ids', 'labels' and the\n"
"extras of this rank's share (B, L/cp), or in the THD layout 1-D arrays with\n"
"'cu_seqlens', 'cu_seqlens_padded' and 'max_seqlen'. Raises StopIteration at\n"
"the end of a finite stream.");

static PyObject *Loader_next(tfpy_Loader *self, PyObject *unused) {
    if (loader_check(self) < 0) return NULL;
    tf_module_state *st = tfpy_state((PyObject *)self);
    tf_batch *b = NULL;
    int rc;
    char msg[1024];
    self->busy = 1;
    for (;;) {
        TFPY_NOGIL_CALL(rc, msg, tf_loader_next_timed(self->l, &b, 50ull * 1000 * 1000));
        if (rc != -TF_ENOTREADY) break;
        if (self->close_pending || PyErr_CheckSignals() < 0) break;
    }
    self->busy = 0;
    if (self->close_pending) {
        if (rc == 0) tf_batch_release(b);
        loader_free(self);
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "the loader was closed while waiting for a batch");
        return NULL;
    }
    if (rc == -TF_ENOTREADY) return NULL; /* interrupted: exception set by PyErr_CheckSignals */
    if (rc < 0) return tfpy_raise(st, rc, msg);
    return tfpy_batch_dict(st, b);
}

static PyObject *Loader_seek(tfpy_Loader *self, PyObject *arg) {
    if (loader_check(self) < 0) return NULL;
    uint64_t pos;
    if (!tfpy_u64(arg, &pos)) return NULL;
    int rc;
    char msg[1024];
    TFPY_NOGIL_CALL(rc, msg, tf_loader_seek(self->l, pos));
    if (rc < 0) return tfpy_raise(tfpy_state((PyObject *)self), rc, msg);
    Py_RETURN_NONE;
}

static PyObject *Loader_close(tfpy_Loader *self, PyObject *unused) {
    /* the waiting thread, or the last DeviceLoader to let go, frees it */
    if (self->busy || self->users) self->close_pending = 1;
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
    PyObject *z;
    if (!s.zstd_cache_bytes) { /* no compressed file */
        z = Py_NewRef(Py_None);
    } else {
        z = Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:d,s:d,s:s}",
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
        if (!z) return NULL;
    }
    /* "N": the dict takes the reference to z */
    return Py_BuildValue("{s:K,s:K,s:K,s:d,s:K,s:K,s:s,s:i,s:s,s:N}", "batches", (unsigned long long)s.batches, "tokens",
                         (unsigned long long)s.tokens, "bytes_read", (unsigned long long)s.bytes_read, "wait_seconds",
                         (double)s.wait_ns / 1e9, "ring_ready", (unsigned long long)s.ring_ready, "ring_slots",
                         (unsigned long long)s.ring_slots, "backend", tf_backend_name(s.backend), "num_threads",
                         s.num_threads, "backend_note", s.backend_note, "zstd", z);
}

static PyObject *Loader_settings(tfpy_Loader *self, PyObject *unused) {
    if (!self->l) {
        PyErr_SetString(PyExc_ValueError, "the loader is closed");
        return NULL;
    }
    tf_loader_config cfg;
    tf_loader_get_config(self->l, &cfg);
    return tfpy_settings_values(TF_SCOPE_ENGINE, &cfg);
}

static PyObject *Loader_source_stats(tfpy_Loader *self, PyObject *unused) {
    if (!self->l) {
        PyErr_SetString(PyExc_ValueError, "the loader is closed");
        return NULL;
    }
    PyObject *lst = PyList_New(0);
    if (!lst) return NULL;
    for (size_t i = 0;; i++) {
        tf_source_stats s;
        int rc = tf_loader_get_source_stats(self->l, i, &s);
        if (rc == -ERANGE) break;
        if (rc == -EINVAL) { /* one dataset: no per-source accounting */
            Py_DECREF(lst);
            Py_RETURN_NONE;
        }
        PyObject *d = Py_BuildValue("{s:K,s:K,s:K}", "samples", (unsigned long long)s.samples, "tokens",
                                    (unsigned long long)s.tokens, "documents", (unsigned long long)s.documents);
        if (!d || PyList_Append(lst, d) < 0) {
            Py_XDECREF(d);
            Py_DECREF(lst);
            return NULL;
        }
        Py_DECREF(d);
    }
    return lst;
}

static PyObject *Loader_get_position(tfpy_Loader *self, void *c) {
    if (!self->l) {
        PyErr_SetString(PyExc_ValueError, "the loader is closed");
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(tf_loader_position(self->l));
}

tf_loader *tfpy_loader_use(PyObject *loader) {
    tfpy_Loader *self = (tfpy_Loader *)loader;
    if (loader_check(self) < 0) return NULL;
    self->users++;
    return self->l;
}

void tfpy_loader_unuse(PyObject *loader) {
    tfpy_Loader *self = (tfpy_Loader *)loader;
    if (--self->users == 0 && self->close_pending && !self->busy) loader_free(self);
}

static PyObject *Loader_get_closed(tfpy_Loader *self, void *c) { return PyBool_FromLong(!self->l || self->close_pending); }

static PyObject *Loader_meter(tfpy_Loader *self, PyObject *args) { return tfpy_meter(args, self->l, NULL, "loader"); }

PyDoc_STRVAR(Loader_doc, "Loader(order, /, *, batch_size=8, rank=0, world_size=1, dtype=None, want=0, num_threads=0, prefetch=0, "
                "backend=None, direct_io=False, zstd_cache_bytes=0, cp_rank=0, cp_size=1)\n--\n\n"
                "The C batch engine over an Order (whose global_batch is batch_size * world_size). cp_size > 1: this "
                "rank's load-balanced share of every sample (docs/packing.md).");

TFPY_TYPE_SPEC(Loader, tfpy_Loader, Py_TPFLAGS_DEFAULT,
               {Py_tp_doc, (void *)Loader_doc}, {Py_tp_new, Loader_new}, {Py_tp_dealloc, Loader_dealloc},
               {Py_tp_methods, TFPY_METHODS(
                   {"next", (PyCFunction)Loader_next, METH_NOARGS, Loader_next_doc},
                   {"seek", (PyCFunction)Loader_seek, METH_O, "seek($self, position, /)\n--\n\nMove to a global position (a multiple of the global batch). O(1)."},
                   {"close", (PyCFunction)Loader_close, METH_NOARGS, "close($self)\n--\n\nStop the worker threads. Batches already handed out stay valid."},
                   {"stats", (PyCFunction)Loader_stats, METH_NOARGS, "stats() -> dict"},
                   {"settings", (PyCFunction)Loader_settings, METH_NOARGS, "settings($self)\n--\n\nReturns dict. The engine's settings (every engine row of _core.settings(), as the keywords take them) as the engine holds them (tf_loader_get_config)."},
                   {"meter", (PyCFunction)Loader_meter, METH_VARARGS, "meter($self, window=None, /)\n--\n\nReturns dict. The consumer's wait for data over the last `window` batches (None: all kept, at most 4096)."},
                   {"source_stats", (PyCFunction)Loader_source_stats, METH_NOARGS, "source_stats($self)\n--\n\nReturns list | None. Per source of a mixture: samples, tokens and documents the consumer received (None for one dataset)."})},
               {Py_tp_getset, TFPY_GETSET(
                   {"position", (getter)Loader_get_position, NULL, "global position of the next batch this rank receives", NULL},
                   {"closed", (getter)Loader_get_closed, NULL, "whether close() was called", NULL})});
