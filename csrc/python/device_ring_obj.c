/*
 * device_ring_obj.c — _core.DeviceRing: a ring of device slots fed from
 * pinned host staging (tf_device_ring). upload(arrays) copies host arrays
 * into one slot (on the ring's copy stream; it does not wait for the copy)
 * and returns one DeviceTensor per array (device_tensor_obj.c), which share
 * the slot.
 */
#include "binding.h"

typedef struct {
    PyObject_HEAD
    tf_device_ring *r;
    int device;
} tfpy_DeviceRing;

static PyObject *DeviceRing_new(PyTypeObject *tp, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"device", "slot_bytes", "slots", NULL};
    int device, slots;
    Py_ssize_t slot_bytes;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "ini:DeviceRing", kwlist, &device, &slot_bytes, &slots)) return NULL;
    if (slot_bytes <= 0) return PyErr_Format(PyExc_ValueError, "slot_bytes must be > 0");
    tf_device_ring *r = NULL;
    int rc;
    char msg[1024] = "";
    TFPY_NOGIL_CALL(rc, msg, tf_device_ring_create(device, (size_t)slot_bytes, slots, &r));
    if (rc < 0) return tfpy_raise(tfpy_state_of_type(tp), rc, msg);
    tfpy_DeviceRing *self;
    TFPY_NEW_OWNER(self, tp, r, r, tf_device_ring_free);
    if (self) self->device = device;
    return (PyObject *)self;
}

static void ring_close(tfpy_DeviceRing *self) { TFPY_DESTROY_NOGIL(self->r, tf_device_ring_free); }

static void DeviceRing_dealloc(tfpy_DeviceRing *self) {
    ring_close(self);
    tfpy_free_instance((PyObject *)self);
}

PyDoc_STRVAR(DeviceRing_upload_doc,
"upload($self, arrays, wait=True)\n--\n\nReturns list[DeviceTensor]. "
"Copy C-contiguous NumPy arrays into one device slot on the ring's copy stream and\n"
"return a DeviceTensor for each. Returns before the copy completes; consumers are\n"
"ordered after it through __dlpack__(stream=...). With wait=True, blocks (GIL\n"
"released) while every slot is still in use by the GPU.");

static PyObject *DeviceRing_upload(tfpy_DeviceRing *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"arrays", "wait", NULL};
    PyObject *seq_o;
    int wait = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|p:upload", kwlist, &seq_o, &wait)) return NULL;
    tf_module_state *st = tfpy_state((PyObject *)self);
    if (tfpy_check_open(self->r, "device ring") < 0) return NULL;
    PyObject *seq = PySequence_Fast(seq_o, "upload() needs a sequence of NumPy arrays");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = NULL;
    tf_device_seg *segs = NULL;
    size_t *offs = NULL;
    tfpy_devslot *h = NULL;
    if (n < 1 || n > 64) {
        PyErr_SetString(PyExc_ValueError, "upload() takes 1 to 64 arrays");
        goto done;
    }
    segs = PyMem_Calloc((size_t)n, sizeof *segs);
    offs = PyMem_Calloc((size_t)n, sizeof *offs);
    if (!segs || !offs) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyArray_Check(a) || !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)a) ||
            PyArray_NDIM((PyArrayObject *)a) < 1 || PyArray_NDIM((PyArrayObject *)a) > TFPY_MAXDIM) {
            PyErr_Format(PyExc_TypeError, "upload(): item %zd must be a C-contiguous NumPy array of 1 to 4 dimensions", i);
            goto done;
        }
        if (tfpy_dlpack_dtype_ok(PyArray_TYPE((PyArrayObject *)a)) < 0) goto done;
        segs[i].host = PyArray_DATA((PyArrayObject *)a);
        segs[i].bytes = (size_t)PyArray_NBYTES((PyArrayObject *)a);
    }
    tf_device_packed_size(segs, (int)n, offs);
    tf_device_slot *slot = NULL;
    int rc;
    char msg[1024] = "";
    TFPY_NOGIL_CALL(rc, msg, tf_device_ring_upload(self->r, segs, (int)n, wait, &slot));
    if (rc < 0) {
        tfpy_raise(st, rc, msg);
        goto done;
    }
    h = tfpy_devslot_new(slot, NULL, self->device); /* ours until the tensors hold it */
    if (!h) goto done;
    out = PyList_New(n);
    char *base = tf_device_slot_ptr(slot);
    for (Py_ssize_t i = 0; out && i < n; i++) {
        PyArrayObject *a = (PyArrayObject *)PySequence_Fast_GET_ITEM(seq, i);
        int nd = PyArray_NDIM(a);
        int64_t shape[TFPY_MAXDIM], strides[TFPY_MAXDIM];
        int64_t s = 1;
        for (int d = nd - 1; d >= 0; d--) {
            shape[d] = (int64_t)PyArray_DIM(a, d);
            strides[d] = s;
            s *= shape[d];
        }
        PyObject *t = tfpy_device_tensor_new(st, h, base + offs[i], segs[i].bytes, PyArray_TYPE(a), nd, shape, strides);
        if (!t) Py_CLEAR(out);
        else PyList_SET_ITEM(out, i, t);
    }
    tfpy_devslot_unref(h);
done:
    PyMem_Free(segs);
    PyMem_Free(offs);
    Py_DECREF(seq);
    return out;
}

static PyObject *DeviceRing_close(tfpy_DeviceRing *self, PyObject *unused) {
    ring_close(self);
    Py_RETURN_NONE;
}

static PyObject *DeviceRing_info(tfpy_DeviceRing *self, PyObject *unused) {
    if (tfpy_check_open(self->r, "device ring") < 0) return NULL;
    tf_device_ring_info in;
    tf_device_ring_get_info(self->r, &in);
    return Py_BuildValue("{s:i,s:i,s:n,s:O,s:i,s:i,s:i,s:K,s:K,s:s}", "device", in.device, "slots", in.slots,
                         "slot_bytes", (Py_ssize_t)in.slot_bytes, "host_pinned", in.host_pinned ? Py_True : Py_False,
                         "free_slots", in.free_slots, "in_use", in.in_use, "lost", in.lost, "uploads",
                         (unsigned long long)in.uploads, "release_waits", (unsigned long long)in.release_waits, "note",
                         in.note);
}

static PyObject *DeviceRing_cuda_available(PyObject *unused_cls, PyObject *unused) {
    char why[512] = "";
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = tf_cuda_available(why, sizeof why);
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(Os)", ok ? Py_True : Py_False, why);
}

static PyObject *DeviceRing_device_count(PyObject *unused_cls, PyObject *unused) {
    int n = 0, rc = tf_cuda_device_count(&n);
    if (rc < 0) return PyLong_FromLong(0);
    return PyLong_FromLong(n);
}

static PyObject *DeviceRing_get_closed(tfpy_DeviceRing *self, void *c) { return PyBool_FromLong(self->r == NULL); }

PyDoc_STRVAR(DeviceRing_doc, "DeviceRing(device, slot_bytes, slots)\n--\n\n"
                "Preallocated device slots fed from pinned host staging on a side stream (see docs/gpu.md).");

TFPY_TYPE_SPEC(DeviceRing, tfpy_DeviceRing, Py_TPFLAGS_DEFAULT,
               {Py_tp_doc, (void *)DeviceRing_doc}, {Py_tp_new, DeviceRing_new}, {Py_tp_dealloc, DeviceRing_dealloc},
               {Py_tp_methods, TFPY_METHODS(
                   {"upload", (PyCFunction)(void (*)(void))DeviceRing_upload, METH_VARARGS | METH_KEYWORDS, DeviceRing_upload_doc},
                   {"close", (PyCFunction)DeviceRing_close, METH_NOARGS,
                    "close($self)\n--\n\nDrop the ring. Device tensors already handed out stay valid; their memory goes with the last of them."},
                   {"info", (PyCFunction)DeviceRing_info, METH_NOARGS, "info($self)\n--\n\nReturns dict. Slots, occupancy, pinned staging, counters."},
                   {"cuda_available", (PyCFunction)DeviceRing_cuda_available, METH_NOARGS | METH_STATIC,
                    "cuda_available()\n--\n\nReturns (bool, str). Whether CUDA is usable here, and what was loaded or why not."},
                   {"device_count", (PyCFunction)DeviceRing_device_count, METH_NOARGS | METH_STATIC,
                    "device_count()\n--\n\nReturns int. CUDA devices visible to this process (0 without CUDA)."})},
               {Py_tp_getset, TFPY_GETSET(
                   {"closed", (getter)DeviceRing_get_closed, NULL, "whether close() was called", NULL})});
