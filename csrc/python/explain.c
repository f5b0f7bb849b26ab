/*
 * explain.c — provenance and the data-wait meter in the binding: the Order
 * methods segments_at() and find_document() (tf_order_segments_at,
 * tf_order_find_document), and the dict both Loader.meter() and
 * DeviceLoader.meter() return (tf_meter).
 */
#include "binding.h"

PyObject *tfpy_Order_segments_at(PyObject *self, PyObject *arg) {
    const tf_order *o = ((tfpy_Order *)self)->o;
    uint64_t pos;
    if (!tfpy_u64(arg, &pos)) return NULL;
    tf_order_config cfg;
    tf_order_get_config(o, &cfg);
    size_t cap = (size_t)cfg.seq_len + 1, n = 0; /* one token per segment at least */
    tf_segment *seg = PyMem_Malloc(cap * sizeof *seg);
    if (!seg) return PyErr_NoMemory();
    int rc;
    char msg[1024];
    TFPY_NOGIL_CALL(rc, msg, tf_order_segments_at(o, pos, seg, cap, &n));
    PyObject *lst = NULL;
    if (rc < 0) {
        tfpy_raise(tfpy_state(self), rc, msg);
        goto done;
    }
    lst = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; lst && i < n; i++) {
        PyObject *t = Py_BuildValue("(KKKKK)", (unsigned long long)seg[i].source, (unsigned long long)seg[i].document,
                                    (unsigned long long)seg[i].start, (unsigned long long)seg[i].stop,
                                    (unsigned long long)seg[i].offset);
        if (!t) Py_CLEAR(lst);
        else PyList_SET_ITEM(lst, (Py_ssize_t)i, t);
    }
done:
    PyMem_Free(seg);
    return lst;
}

PyObject *tfpy_Order_find_document(PyObject *self, PyObject *args) {
    const tf_order *o = ((tfpy_Order *)self)->o;
    uint64_t source, doc, begin, end;
    if (!PyArg_ParseTuple(args, "O&O&O&O&:find_document", tfpy_u64, &source, tfpy_u64, &doc, tfpy_u64, &begin,
                          tfpy_u64, &end))
        return NULL;
    if (source > SIZE_MAX) source = SIZE_MAX; /* past any mixture's sources: the library says how many */
    size_t cap = 1024, n = 0;
    for (;;) {
        uint64_t *pos = PyMem_Malloc(cap * sizeof *pos);
        if (!pos) return PyErr_NoMemory();
        int rc;
        char msg[1024];
        TFPY_NOGIL_CALL(rc, msg, tf_order_find_document(o, (size_t)source, doc, begin, end, pos, cap, &n));
        if (rc == -ENOBUFS) { /* more positions than room: again, with room for all */
            PyMem_Free(pos);
            cap = n;
            continue;
        }
        PyObject *lst = rc < 0 ? tfpy_raise(tfpy_state(self), rc, msg) : tfpy_list_u64(pos, n);
        PyMem_Free(pos);
        return lst;
    }
}

/* Window argument of meter(): None or an int >= 0 (0: all kept). */
static int meter_window(PyObject *args, uint32_t *window) {
    PyObject *w = Py_None;
    *window = 0;
    if (!PyArg_ParseTuple(args, "|O:meter", &w)) return -1;
    if (w == Py_None) return 0;
    uint64_t x;
    if (!tfpy_u64(w, &x)) return -1;
    *window = x > TF_METER_MAX_WINDOW ? TF_METER_MAX_WINDOW : (uint32_t)x;
    return 0;
}

PyObject *tfpy_meter(PyObject *args, const tf_loader *l, const tf_device_loader *d, const char *what) {
    uint32_t window;
    if (meter_window(args, &window) < 0) return NULL;
    if (!l && !d) {
        PyErr_Format(PyExc_ValueError, "the %s is closed", what);
        return NULL;
    }
    tf_meter m;
    if (d)
        tf_device_loader_get_meter(d, window, &m);
    else
        tf_loader_get_meter(l, window, &m);
    return Py_BuildValue("{s:K,s:K,s:d,s:d,s:d,s:d,s:d,s:d,s:d,s:K,s:d}", "batches", (unsigned long long)m.batches,
                         "total_batches", (unsigned long long)m.total_batches, "window_seconds", m.window_seconds,
                         "wait_seconds", m.wait_seconds, "wait_fraction", m.wait_fraction, "wait_p50_seconds",
                         m.wait_p50_seconds, "wait_p99_seconds", m.wait_p99_seconds, "wait_max_seconds",
                         m.wait_max_seconds, "ready_ahead_mean", m.ready_ahead_mean, "ready_ahead_min",
                         (unsigned long long)m.ready_ahead_min, "startup_seconds", m.startup_seconds);
}

/* DeviceLoader.gpu_meter(): the meter read on the GPU's clock, keys without a
 * prefix (the Python layer adds "gpu_"), and "stopped": why the meter stopped
 * measuring ("" while it runs). */
PyObject *tfpy_gpu_meter(PyObject *args, const tf_device_loader *d) {
    uint32_t window;
    if (meter_window(args, &window) < 0) return NULL;
    if (!d) {
        PyErr_SetString(PyExc_ValueError, "the device loader is closed");
        return NULL;
    }
    tf_meter m;
    uint64_t pending = 0;
    const char *why = "";
    if (tf_device_loader_get_gpu_meter(d, window, &m, &pending) < 0) why = tf_last_error();
    return Py_BuildValue("{s:K,s:K,s:d,s:d,s:d,s:d,s:d,s:d,s:d,s:K,s:s}", "batches", (unsigned long long)m.batches,
                         "total_batches", (unsigned long long)m.total_batches, "window_seconds", m.window_seconds,
                         "wait_seconds", m.wait_seconds, "wait_fraction", m.wait_fraction, "wait_p50_seconds",
                         m.wait_p50_seconds, "wait_p99_seconds", m.wait_p99_seconds, "wait_max_seconds",
                         m.wait_max_seconds, "startup_seconds", m.startup_seconds, "pending",
                         (unsigned long long)pending, "stopped", why);
}
