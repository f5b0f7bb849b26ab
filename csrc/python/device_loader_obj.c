/*
 * device_loader_obj.c — _core.DeviceLoader: a Loader's batches copied to a
 * CUDA device ahead of the consumer (tf_device_loader, csrc/device/stage.c).
 *
 * DeviceLoader(loader, /, *, device, prefetch, slots, static) takes over a
 * _core.Loader (kept alive: the C device loader borrows its engine). next()
 * waits with the GIL released, in 50 ms slices so that Ctrl-C interrupts it
 * promptly; an interrupted wait leaves the batch where it was, so the
 * position does not move. It returns the batch as a dict of DeviceTensors,
 * named and shaped as Loader.next() names and shapes its NumPy arrays
 * ('input_ids' and 'labels' are views of 'tokens'; a context-parallel share
 * has them as arrays of their own, and in the THD layout its counts
 * 'max_seqlen' and 'num_seqs' as ints). Every tensor of the batch, and every
 * DLPack capsule made from one, shares one tfpy_devslot holding the
 * tf_device_batch; the last of them releases it on the stream of the most
 * recent __dlpack__ export. No stream is made to wait at next():
 * __dlpack__(stream=s) makes s wait on the batch's copy, as DLPack asks.
 *
 * static=True: static buffers the device loader allocates (alloc_static):
 * every batch in the same device memory, copied there on the stream given to
 * next(stream=...) (None: the legacy default stream), after the work queued
 * there before.
 */
#include "binding.h"

typedef struct {
    PyObject_HEAD
    tf_device_loader *d;
    PyObject *loader;  /* the _core.Loader whose engine the device loader borrows */
    int device;
    int busy;          /* a thread is inside next() with the GIL released */
    int close_pending; /* close() was called while busy */
    int is_static;     /* static buffers: next() queues their copies on a stream */
} tfpy_DeviceLoader;

/* DeviceLoader's keywords into cfg: device and static, and the settings
 * table's device rows (device_prefetch_batches, device_slots). */
static int device_config(PyObject *kw, tf_device_config *cfg) {
    tf_device_config_init(cfg);
    const tfpy_kwarg table[] = {
        {"device", tfpy_nonneg_int, &cfg->device},
        {"static", tfpy_flag, &cfg->alloc_static},
        {NULL, NULL, NULL},
    };
    return tfpy_parse_settings(kw, TF_SCOPE_DEVICE, cfg, table, "DeviceLoader");
}

static PyObject *DeviceLoader_new(PyTypeObject *tp, PyObject *args, PyObject *kw) {
    PyObject *ldobj;
    tf_module_state *st = tfpy_state_of_type(tp);
    if (!PyArg_ParseTuple(args, "O!:DeviceLoader", st->LoaderType, &ldobj)) return NULL;
    tf_device_config cfg;
    if (device_config(kw, &cfg) < 0) return NULL;
    tf_loader *l = tfpy_loader_use(ldobj);
    if (!l) return NULL;
    tf_device_loader *d = NULL;
    int rc;
    char msg[1024];
    TFPY_NOGIL_CALL(rc, msg, tf_device_loader_create(l, &cfg, &d));
    if (rc < 0) {
        tfpy_loader_unuse(ldobj);
        return tfpy_raise(st, rc, msg);
    }
    tfpy_DeviceLoader *self = (tfpy_DeviceLoader *)tp->tp_alloc(tp, 0);
    if (!self) {
        TFPY_DESTROY_NOGIL(d, tf_device_loader_free);
        tfpy_loader_unuse(ldobj);
        return NULL;
    }
    self->d = d;
    self->loader = Py_NewRef(ldobj);
    self->device = cfg.device;
    self->is_static = cfg.alloc_static;
    return (PyObject *)self;
}

/* Stopping the copy thread and waiting for copies in flight: without the GIL.
 * Then the engine is the Loader's again (which frees it if it was closed). */
static void dl_free(tfpy_DeviceLoader *self) {
    if (!self->d) return;
    TFPY_DESTROY_NOGIL(self->d, tf_device_loader_free);
    tfpy_loader_unuse(self->loader);
}

static void DeviceLoader_dealloc(tfpy_DeviceLoader *self) {
    dl_free(self);
    /* after the device loader that borrows its engine (left running, with
     * what it borrows, while finalizing: TFPY_DESTROY_NOGIL) */
    if (!tfpy_finalizing()) Py_CLEAR(self->loader);
    tfpy_free_instance((PyObject *)self);
}

static int dl_check(tfpy_DeviceLoader *self) {
    return tfpy_check_idle(self->d, self->close_pending, self->busy, "device loader");
}

static int dict_put(PyObject *d, const char *k, PyObject *v) {
    if (!v) return -1;
    int rc = PyDict_SetItemString(d, k, v);
    Py_DECREF(v);
    return rc;
}

/* A 2-D DeviceTensor over rows x cols elements, row stride `ld` (elements). */
static PyObject *tensor2d(tf_module_state *st, tfpy_devslot *h, void *data, int typenum, int64_t rows, int64_t cols,
                          int64_t ld, size_t extent) {
    int64_t shape[2] = {rows, cols}, strides[2] = {ld, 1};
    return tfpy_device_tensor_new(st, h, data, extent, typenum, 2, shape, strides);
}

/* A dense array: 2-D rows x cols, or 1-D of cols entries when rows < 0. */
static PyObject *dense(tf_module_state *st, tfpy_devslot *h, void *data, int typenum, size_t isz, int64_t rows,
                       int64_t cols) {
    if (rows >= 0) return tensor2d(st, h, data, typenum, rows, cols, cols, (size_t)(rows * cols) * isz);
    int64_t shape[1] = {cols}, strides[1] = {1};
    return tfpy_device_tensor_new(st, h, data, (size_t)cols * isz, typenum, 1, shape, strides);
}

/* The batch's dict, keys in the order Loader.next() gives them; takes b over
 * (released with the last tensor, or now on failure). */
static PyObject *batch_dict(tf_module_state *st, tf_device_batch *b) {
    tf_device_batch_view v;
    tf_device_batch_get_view(b, &v);
    tfpy_devslot *h = tfpy_devslot_new(NULL, b, v.device); /* ours until the tensors hold it */
    if (!h) return NULL;
    int64_t B = (int64_t)v.rows, L = (int64_t)v.seq_len;
    int tn = tfpy_npy_from_dtype(v.dtype);
    size_t isz = tf_dtype_size(v.dtype);
    PyObject *d = PyDict_New();
    if (!d) goto fail;
    /* Rows and entries of the per-token arrays: B x L for whole samples, B x
     * L / cp for a context-parallel share, num_tokens entries (1-D) in the
     * THD layout. */
    int64_t rows = B, cols = L;
    if (v.cp_size > 1) {
        if (v.thd) rows = -1, cols = (int64_t)v.num_tokens;
        else cols = L / (int64_t)v.cp_size;
        if (dict_put(d, "input_ids", dense(st, h, v.input_ids, tn, isz, rows, cols)) < 0 ||
            dict_put(d, "labels", dense(st, h, v.labels, tn, isz, rows, cols)) < 0)
            goto fail;
        if (v.thd && (dict_put(d, "cu_seqlens", dense(st, h, v.cu_seqlens, NPY_INT32, 4, -1, v.thd_seqs + 1)) < 0 ||
                      dict_put(d, "cu_seqlens_padded",
                               dense(st, h, v.cu_seqlens_padded, NPY_INT32, 4, -1, v.thd_seqs + 1)) < 0 ||
                      dict_put(d, "max_seqlen", PyLong_FromLong(v.max_seqlen)) < 0 ||
                      dict_put(d, "num_seqs", PyLong_FromLong(v.thd_seqs)) < 0))
            goto fail;
    } else {
        char *tok = v.tokens;
        size_t tok_bytes = (size_t)(B * (L + 1)) * isz;
        if (dict_put(d, "tokens", tensor2d(st, h, tok, tn, B, L + 1, L + 1, tok_bytes)) < 0 ||
            dict_put(d, "input_ids", tensor2d(st, h, tok, tn, B, L, L + 1, tok_bytes)) < 0 ||
            dict_put(d, "labels", tensor2d(st, h, tok + isz, tn, B, L, L + 1, tok_bytes - isz)) < 0)
            goto fail;
    }
    if (v.position_ids && dict_put(d, "position_ids", dense(st, h, v.position_ids, NPY_INT32, 4, rows, cols)) < 0)
        goto fail;
    if (v.cu_seqlens && !v.thd && dict_put(d, "cu_seqlens", dense(st, h, v.cu_seqlens, NPY_INT32, 4, B, L + 1)) < 0)
        goto fail;
    if (v.num_seqs && dict_put(d, "num_seqs", dense(st, h, v.num_seqs, NPY_INT32, 4, B, 1)) < 0) goto fail;
    if (v.loss_mask && dict_put(d, "loss_mask", dense(st, h, v.loss_mask, NPY_UINT8, 1, rows, cols)) < 0) goto fail;
    tfpy_devslot_unref(h);
    return d;
fail:
    Py_XDECREF(d); /* drops the tensors made so far */
    tfpy_devslot_unref(h);
    return NULL;
}

PyDoc_STRVAR(DeviceLoader_next_doc,
"next($self, /, stream=None)\n--\n\nReturns dict. "
"The next batch on the device, as DeviceTensors named as Loader.next() names its\n"
"arrays. Its copy was issued ahead; __dlpack__(stream=s) makes s wait for it.\n"
"With static buffers, `stream` (a cudaStream_t: 1 the legacy default stream, 2 the\n"
"per-thread one; None: 1) is where the copy into them is queued, after the work\n"
"already there. Raises StopIteration at the end of a finite stream.");

static PyObject *DeviceLoader_next(tfpy_DeviceLoader *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"stream", NULL};
    PyObject *stream_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:next", kwlist, &stream_obj)) return NULL;
    uintptr_t stream = self->is_static ? 1 : TF_DEVICE_STREAM_NONE;
    if (stream_obj != Py_None) {
        unsigned long long s = PyLong_AsUnsignedLongLong(stream_obj);
        if (s == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
        if (s == 0) {
            PyErr_SetString(PyExc_ValueError, "stream=0 is ambiguous: pass 1 for the legacy default stream, 2 for the "
                                              "per-thread default stream, or a stream handle");
            return NULL;
        }
        stream = (uintptr_t)s;
    }
    if (dl_check(self) < 0) return NULL;
    tf_module_state *st = tfpy_state((PyObject *)self);
    tf_device_batch *b = NULL;
    int rc;
    char msg[1024];
    TFPY_WAIT_SLICED(rc, msg, self, tf_device_loader_next_timed(self->d, stream, &b, 50ull * 1000 * 1000));
    int closed = self->close_pending;
    if (closed) {
        if (rc == 0) tf_device_batch_release(b, TF_DEVICE_STREAM_NONE);
        dl_free(self);
    }
    if (tfpy_waited(st, rc, msg, closed) < 0) return NULL;
    return batch_dict(st, b);
}

static PyObject *DeviceLoader_seek(tfpy_DeviceLoader *self, PyObject *arg) {
    if (dl_check(self) < 0) return NULL;
    unsigned long long pos = PyLong_AsUnsignedLongLong(arg);
    if (pos == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    TFPY_RETURN_NONE_AFTER(self, tf_device_loader_seek(self->d, pos));
}

static PyObject *DeviceLoader_start(tfpy_DeviceLoader *self, PyObject *unused) {
    if (dl_check(self) < 0) return NULL;
    TFPY_RETURN_NONE_AFTER(self, tf_device_loader_start(self->d));
}

static PyObject *DeviceLoader_close(tfpy_DeviceLoader *self, PyObject *unused) {
    if (self->busy) self->close_pending = 1; /* the waiting thread frees it */
    else dl_free(self);
    Py_RETURN_NONE;
}

static PyObject *DeviceLoader_stats(tfpy_DeviceLoader *self, PyObject *unused) {
    if (tfpy_check_open(self->d, "device loader") < 0) return NULL;
    tf_device_stats s;
    tf_device_loader_get_stats(self->d, &s);
    PyObject *pinned = s.host_pinned < 0 ? Py_None : s.host_pinned ? Py_True : Py_False;
    return Py_BuildValue(
        "{s:i,s:K,s:K,s:d,s:K,s:K,s:K,s:d,s:d,s:K,s:K,s:K,s:K,s:d,s:d,s:d,s:K,s:K,s:i,s:i,s:i,s:i,s:O,s:O,s:s}",
        "device", self->device, "batches", (unsigned long long)s.batches, "issued_ahead",
        (unsigned long long)s.issued_ahead, "copies_issued_ahead", s.copies_issued_ahead, "copies",
        (unsigned long long)s.copies, "h2d_bytes", (unsigned long long)s.h2d_bytes, "h2d_timed_bytes",
        (unsigned long long)s.h2d_timed_bytes, "h2d_seconds", s.h2d_seconds, "h2d_gbps", s.h2d_gbps, "direct_copies",
        (unsigned long long)s.direct_copies, "staging_copies", (unsigned long long)s.staging_copies, "staging_bytes",
        (unsigned long long)s.staging_bytes, "engine_buffers_locked", (unsigned long long)s.engine_buffers_locked,
        "wait_mean_seconds", s.wait_mean_s, "wait_p99_seconds", s.wait_p99_s, "wait_seconds", s.wait_total_s,
        "release_waits", (unsigned long long)s.release_waits, "slot_full_waits", (unsigned long long)s.slot_full_waits,
        "prefetch", s.prefetch, "slots", s.slots, "queued", s.queued, "held", s.held, "host_pinned", pinned,
        "static_buffers", s.static_buffers ? Py_True : Py_False, "note", s.note);
}

static PyObject *DeviceLoader_get_position(tfpy_DeviceLoader *self, void *c) {
    if (tfpy_check_open(self->d, "device loader") < 0) return NULL;
    return PyLong_FromUnsignedLongLong(tf_device_loader_position(self->d));
}

static PyObject *DeviceLoader_get_closed(tfpy_DeviceLoader *self, void *c) {
    return PyBool_FromLong(!self->d || self->close_pending);
}

static PyObject *DeviceLoader_meter(tfpy_DeviceLoader *self, PyObject *args) {
    return tfpy_meter(args, NULL, self->d, "device loader");
}

static PyObject *DeviceLoader_gpu_meter(tfpy_DeviceLoader *self, PyObject *args) {
    return tfpy_gpu_meter(args, self->d);
}

/* gpu_request(stream) / gpu_handoff(stream): the GPU-clock meter's marks, made
 * by the Python layer around its own work for a batch (a stream handle, > 0). */
static PyObject *gpu_mark_call(tfpy_DeviceLoader *self, PyObject *arg, int handoff) {
    unsigned long long s = PyLong_AsUnsignedLongLong(arg);
    if (s == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    if (s == 0) {
        PyErr_SetString(PyExc_ValueError, "stream=0 is ambiguous: pass 1 for the legacy default stream");
        return NULL;
    }
    if (dl_check(self) < 0) return NULL;
    int rc = handoff ? tf_device_loader_gpu_handoff(self->d, (uintptr_t)s)
                     : tf_device_loader_gpu_request(self->d, (uintptr_t)s);
    if (rc < 0) return tfpy_raise(tfpy_state((PyObject *)self), rc, tf_last_error());
    Py_RETURN_NONE;
}
static PyObject *DeviceLoader_gpu_request(tfpy_DeviceLoader *self, PyObject *arg) { return gpu_mark_call(self, arg, 0); }
static PyObject *DeviceLoader_gpu_handoff(tfpy_DeviceLoader *self, PyObject *arg) { return gpu_mark_call(self, arg, 1); }

PyDoc_STRVAR(DeviceLoader_doc,
"DeviceLoader(loader, /, *, device=0, prefetch=0, slots=0, static=False)\n--\n\n"
"A Loader's batches copied to CUDA device `device` by a thread of its own as soon as\n"
"the engine has assembled them, `prefetch` (default 2) ahead of next(), into `slots`\n"
"(default prefetch + 2) device slots. The Loader's engine then assembles its batches\n"
"in page-locked memory, which the copies read in place. static=True delivers every\n"
"batch into the same device buffers (for CUDA graphs). See docs/gpu.md.");

TFPY_TYPE_SPEC(DeviceLoader, tfpy_DeviceLoader, Py_TPFLAGS_DEFAULT,
               {Py_tp_doc, (void *)DeviceLoader_doc}, {Py_tp_new, DeviceLoader_new},
               {Py_tp_dealloc, DeviceLoader_dealloc},
               {Py_tp_methods, TFPY_METHODS(
                   {"next", (PyCFunction)(void (*)(void))DeviceLoader_next, METH_VARARGS | METH_KEYWORDS,
                    DeviceLoader_next_doc},
                   {"seek", (PyCFunction)DeviceLoader_seek, METH_O,
                    "seek($self, position, /)\n--\n\nMove to a global position; batches copied ahead are dropped."},
                   {"start", (PyCFunction)DeviceLoader_start, METH_NOARGS,
                    "start($self)\n--\n\nStart copying ahead now rather than at the first next()."},
                   {"close", (PyCFunction)DeviceLoader_close, METH_NOARGS,
                    "close($self)\n--\n\nStop the copy thread and wait for copies in flight. Batches already handed out stay valid."},
                   {"meter", (PyCFunction)DeviceLoader_meter, METH_VARARGS,
                    "meter($self, window=None, /)\n--\n\nReturns dict. The consumer's wait in next() over the last `window` batches."},
                   {"gpu_meter", (PyCFunction)DeviceLoader_gpu_meter, METH_VARARGS,
                    "gpu_meter($self, window=None, /)\n--\n\nReturns dict. What the consumer's stream waited for data at each "
                    "hand-off, on the GPU's clock, over the last `window` batches read (`pending`: hand-offs not yet "
                    "completed on the GPU; `stopped`: why the meter stopped, or '')."},
                   {"gpu_request", (PyCFunction)DeviceLoader_gpu_request, METH_O,
                    "gpu_request($self, stream, /)\n--\n\nThe GPU-clock meter's request mark on `stream`, before the caller's own work for the next batch."},
                   {"gpu_handoff", (PyCFunction)DeviceLoader_gpu_handoff, METH_O,
                    "gpu_handoff($self, stream, /)\n--\n\nThe GPU-clock meter's hand-off mark, once the batch is in the consumer's hands."},
                   {"stats", (PyCFunction)DeviceLoader_stats, METH_NOARGS,
                    "stats($self)\n--\n\nReturns dict. Copies issued ahead, consumer wait, host-to-device bytes and GB/s, slots."})},
               {Py_tp_getset, TFPY_GETSET(
                   {"position", (getter)DeviceLoader_get_position, NULL,
                    "global position of the next batch the consumer receives (never counts batches copied ahead)", NULL},
                   {"closed", (getter)DeviceLoader_get_closed, NULL, "whether close() was called", NULL})});
