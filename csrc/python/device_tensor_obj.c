/*
 * device_tensor_obj.c — _core.DeviceTensor: one array of a batch in a device
 * slot, handed to frameworks through DLPack.
 *
 * All tensors of one batch (an upload of device_ring_obj.c, or a batch of
 * device_loader_obj.c) share a small C handle (tfpy_devslot) with an atomic
 * reference count: each DeviceTensor holds one reference and so does every
 * DLPack capsule exported from it, so the slot stays out of the ring while
 * any of them (or any framework tensor made from a capsule) is alive. The
 * last reference releases the slot with an event on the last consumer
 * stream. The handle is plain C so that a consumer's
 * deleter can run on any thread without the GIL.
 *
 * Stream semantics (DLPack / array API): __dlpack__(stream=s) makes s wait on
 * the slot's "copied" event (cudaStreamWaitEvent: the host does not wait)
 * and remembers s as the stream to release on. stream=None means the legacy
 * default stream (1), 2 the per-thread default stream, -1 "do not
 * synchronise" (the consumer orders its work itself); 0 is ambiguous and
 * refused, as the DLPack spec says for CUDA.
 */
#include "binding.h"

/* ------------------------------------------------------------ DLPack ABI */

typedef struct { uint32_t major, minor; } DLPackVersion;
typedef struct { int32_t device_type, device_id; } DLDevice;
typedef struct { uint8_t code, bits; uint16_t lanes; } DLDataType;
typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides;
    uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *);
} DLManagedTensor;
typedef struct DLManagedTensorVersioned {
    DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *);
    uint64_t flags;
    DLTensor dl_tensor;
} DLManagedTensorVersioned;

enum { kDLCUDA = 2, kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBool = 6 };

/* ------------------------------------------------------------ slot handle */

typedef tfpy_devslot devslot;

devslot *tfpy_devslot_new(tf_device_slot *slot, tf_device_batch *batch, int device) {
    devslot *h = malloc(sizeof *h);
    if (!h) {
        if (batch) tf_device_batch_release(batch, TF_DEVICE_STREAM_NONE);
        else tf_device_slot_release(slot, TF_DEVICE_STREAM_NONE);
        PyErr_NoMemory();
        return NULL;
    }
    atomic_init(&h->refs, 1);
    h->slot = slot;
    h->batch = batch;
    atomic_init(&h->stream, TF_DEVICE_STREAM_NONE);
    h->device = device;
    return h;
}

void tfpy_devslot_unref(devslot *h) {
    if (atomic_fetch_sub(&h->refs, 1) != 1) return;
    /* An error here withdraws the slot from the ring (see tokenfeed.h); there
     * is nobody to tell from a deleter. */
    if (h->batch) tf_device_batch_release(h->batch, atomic_load(&h->stream));
    else tf_device_slot_release(h->slot, atomic_load(&h->stream));
    free(h);
}

/* ------------------------------------------------------------ DeviceTensor */

typedef struct {
    PyObject_HEAD
    devslot *h;
    char *data;         /* device address of element 0 */
    size_t extent;      /* bytes from data to the end of its segment */
    int ndim, typenum;
    int64_t shape[TFPY_MAXDIM], strides[TFPY_MAXDIM]; /* strides in elements */
} tfpy_DeviceTensor;

static int dl_dtype(int typenum, DLDataType *dt) {
    PyArray_Descr *d = PyArray_DescrFromType(typenum);
    if (!d) return -1;
    int kind = d->kind, size = (int)PyDataType_ELSIZE(d);
    Py_DECREF(d);
    dt->lanes = 1;
    dt->bits = (uint8_t)(size * 8);
    switch (kind) {
    case 'i': dt->code = kDLInt; return 0;
    case 'u': dt->code = kDLUInt; return 0;
    case 'f': dt->code = kDLFloat; return 0;
    case 'b': dt->code = kDLBool; return 0;
    default: PyErr_Format(PyExc_TypeError, "dtype of type number %d cannot go through DLPack", typenum); return -1;
    }
}

static void DeviceTensor_dealloc(tfpy_DeviceTensor *self) {
    if (self->h) tfpy_devslot_unref(self->h);
    tfpy_free_instance((PyObject *)self);
}

/* Describe self in t for an export (shape and strides in the export's own
 * arrays) and take a reference on the slot for it: the export's manager_ctx,
 * which its deleter gives back. */
static devslot *export_dl(tfpy_DeviceTensor *self, DLTensor *t, int64_t *shape, int64_t *strides) {
    memcpy(shape, self->shape, sizeof self->shape);
    memcpy(strides, self->strides, sizeof self->strides);
    t->data = self->data;
    t->device.device_type = kDLCUDA;
    t->device.device_id = self->h->device;
    t->ndim = self->ndim;
    dl_dtype(self->typenum, &t->dtype); /* validated at creation */
    t->shape = shape;
    t->strides = strides;
    t->byte_offset = 0;
    atomic_fetch_add(&self->h->refs, 1);
    return self->h;
}

typedef struct { DLManagedTensor mt; int64_t shape[TFPY_MAXDIM], strides[TFPY_MAXDIM]; } legacy_ctx;
typedef struct { DLManagedTensorVersioned mt; int64_t shape[TFPY_MAXDIM], strides[TFPY_MAXDIM]; } versioned_ctx;

static void legacy_deleter(DLManagedTensor *mt) {
    tfpy_devslot_unref(mt->manager_ctx);
    free(mt); /* mt is the first member of legacy_ctx */
}
static void versioned_deleter(DLManagedTensorVersioned *mt) {
    tfpy_devslot_unref(mt->manager_ctx);
    free(mt);
}

/* Capsules nobody consumed still own their tensor. */
static void legacy_capsule_dtor(PyObject *cap) {
    if (!PyCapsule_IsValid(cap, "dltensor")) return; /* renamed "used_dltensor" by a consumer */
    DLManagedTensor *mt = PyCapsule_GetPointer(cap, "dltensor");
    if (mt && mt->deleter) mt->deleter(mt);
}
static void versioned_capsule_dtor(PyObject *cap) {
    if (!PyCapsule_IsValid(cap, "dltensor_versioned")) return;
    DLManagedTensorVersioned *mt = PyCapsule_GetPointer(cap, "dltensor_versioned");
    if (mt && mt->deleter) mt->deleter(mt);
}

/* Parse the DLPack stream argument; *wait is 0 for -1 (no synchronisation). */
static int parse_stream(PyObject *obj, uintptr_t *stream, int *wait) {
    *wait = 1;
    if (!obj || obj == Py_None) {
        *stream = 1; /* legacy default stream */
        return 0;
    }
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "stream must be None or an int (a cudaStream_t), not %.100s", Py_TYPE(obj)->tp_name);
        return -1;
    }
    long long v = PyLong_AsLongLong(obj);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        unsigned long long u = PyLong_AsUnsignedLongLong(obj);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) return -1;
        *stream = (uintptr_t)u;
        return 0;
    }
    if (v == -1) {
        *wait = 0;
        return 0;
    }
    if (v == 0) {
        PyErr_SetString(PyExc_ValueError, "stream=0 is ambiguous for CUDA in DLPack: pass 1 for the legacy default "
                                          "stream, 2 for the per-thread default stream, or a stream handle");
        return -1;
    }
    if (v < 0) {
        PyErr_Format(PyExc_ValueError, "invalid stream %lld", v);
        return -1;
    }
    *stream = (uintptr_t)v;
    return 0;
}

PyDoc_STRVAR(DeviceTensor_dlpack_doc,
"__dlpack__($self, *, stream=None, max_version=None, dl_device=None, copy=None)\n--\n\n"
"Export as a DLPack capsule. `stream` is the consumer's CUDA stream: it is made to\n"
"wait for this batch's host-to-device copy (no host wait), and the batch's device\n"
"slot is recycled only after work queued on that stream before the tensor is freed\n"
"has completed.");

static PyObject *DeviceTensor_dlpack(tfpy_DeviceTensor *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"stream", "max_version", "dl_device", "copy", NULL};
    PyObject *stream_obj = Py_None, *max_version = Py_None, *dl_device = Py_None, *copy = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$OOOO:__dlpack__", kwlist, &stream_obj, &max_version, &dl_device, &copy))
        return NULL;
    if (copy == Py_True) {
        PyErr_SetString(PyExc_BufferError, "tokenfeed device tensors are exported without copying (copy=True is not supported)");
        return NULL;
    }
    if (dl_device != Py_None) {
        int dt = 0, id = 0;
        if (!PyArg_ParseTuple(dl_device, "ii", &dt, &id)) return NULL;
        if (dt != kDLCUDA || id != self->h->device) {
            PyErr_Format(PyExc_BufferError, "this tensor lives on CUDA device %d; it cannot be exported to (%d, %d)",
                         self->h->device, dt, id);
            return NULL;
        }
    }
    int versioned = 0;
    if (max_version != Py_None) {
        unsigned major = 0, minor = 0;
        if (!PyArg_ParseTuple(max_version, "II", &major, &minor)) return NULL;
        versioned = major >= 1;
    }
    uintptr_t stream;
    int wait;
    if (parse_stream(stream_obj, &stream, &wait) < 0) return NULL;
    if (wait) {
        int rc = self->h->batch ? tf_device_batch_wait(self->h->batch, stream) : tf_device_slot_wait(self->h->slot, stream);
        if (rc < 0) return tfpy_raise(tfpy_state((PyObject *)self), rc, NULL);
        atomic_store(&self->h->stream, stream);
    }
    PyObject *cap;
    if (versioned) {
        versioned_ctx *c = calloc(1, sizeof *c);
        if (!c) return PyErr_NoMemory();
        c->mt.version.major = 1;
        c->mt.version.minor = 0;
        c->mt.manager_ctx = export_dl(self, &c->mt.dl_tensor, c->shape, c->strides);
        c->mt.deleter = versioned_deleter;
        cap = PyCapsule_New(&c->mt, "dltensor_versioned", versioned_capsule_dtor);
        if (!cap) versioned_deleter(&c->mt);
    } else {
        legacy_ctx *c = calloc(1, sizeof *c);
        if (!c) return PyErr_NoMemory();
        c->mt.manager_ctx = export_dl(self, &c->mt.dl_tensor, c->shape, c->strides);
        c->mt.deleter = legacy_deleter;
        cap = PyCapsule_New(&c->mt, "dltensor", legacy_capsule_dtor);
        if (!cap) legacy_deleter(&c->mt);
    }
    return cap;
}

static PyObject *DeviceTensor_dlpack_device(tfpy_DeviceTensor *self, PyObject *unused) {
    return Py_BuildValue("(ii)", kDLCUDA, self->h->device);
}

static PyObject *DeviceTensor_synchronize(tfpy_DeviceTensor *self, PyObject *unused) {
    int rc;
    char msg[1024] = "";
    TFPY_NOGIL_CALL(rc, msg,
                    self->h->batch ? tf_device_batch_synchronize(self->h->batch) : tf_device_slot_synchronize(self->h->slot));
    if (rc < 0) return tfpy_raise(tfpy_state((PyObject *)self), rc, msg);
    Py_RETURN_NONE;
}

static tfpy_DeviceTensor *tensor_new(PyTypeObject *tp, devslot *h, char *data, size_t extent, int typenum, int ndim,
                                     const int64_t *shape, const int64_t *strides) {
    tfpy_DeviceTensor *t = PyObject_New(tfpy_DeviceTensor, tp);
    if (!t) return NULL;
    atomic_fetch_add(&h->refs, 1);
    t->h = h;
    t->data = data;
    t->extent = extent;
    t->typenum = typenum;
    t->ndim = ndim;
    memset(t->shape, 0, sizeof t->shape);
    memset(t->strides, 0, sizeof t->strides);
    memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    memcpy(t->strides, strides, (size_t)ndim * sizeof *strides);
    return t;
}

PyObject *tfpy_device_tensor_new(tf_module_state *st, tfpy_devslot *h, char *data, size_t extent, int typenum,
                                 int ndim, const int64_t *shape, const int64_t *strides) {
    return (PyObject *)tensor_new(st->DeviceTensorType, h, data, extent, typenum, ndim, shape, strides);
}

int tfpy_dlpack_dtype_ok(int typenum) {
    DLDataType dt;
    return dl_dtype(typenum, &dt);
}

PyDoc_STRVAR(DeviceTensor_view_doc,
"_view($self, offset, shape, strides)\n--\n\nReturns DeviceTensor. "
"A view sharing this tensor's device slot: element `offset` onwards, with the given\n"
"shape and strides (in elements). Bounds are checked against the segment.");

static PyObject *DeviceTensor_view(tfpy_DeviceTensor *self, PyObject *args) {
    Py_ssize_t off;
    PyObject *shape_o, *strides_o;
    if (!PyArg_ParseTuple(args, "nOO:_view", &off, &shape_o, &strides_o)) return NULL;
    PyObject *sh = PySequence_Tuple(shape_o), *st = sh ? PySequence_Tuple(strides_o) : NULL;
    PyObject *res = NULL;
    if (!st) goto done;
    Py_ssize_t nd = PyTuple_GET_SIZE(sh);
    if (nd < 1 || nd > TFPY_MAXDIM || PyTuple_GET_SIZE(st) != nd) {
        PyErr_SetString(PyExc_ValueError, "_view: shape and strides must have the same length, 1 to 4");
        goto done;
    }
    int64_t shape[TFPY_MAXDIM], strides[TFPY_MAXDIM];
    PyArray_Descr *descr = PyArray_DescrFromType(self->typenum);
    if (!descr) goto done;
    npy_intp isz = (npy_intp)PyDataType_ELSIZE(descr);
    Py_DECREF(descr);
    int64_t hi = off;
    for (Py_ssize_t i = 0; i < nd; i++) {
        shape[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(sh, i));
        strides[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(st, i));
        if (PyErr_Occurred()) goto done;
        if (shape[i] < 0 || strides[i] < 0) {
            PyErr_SetString(PyExc_ValueError, "_view: negative shape or stride");
            goto done;
        }
        if (shape[i] > 0) hi += (shape[i] - 1) * strides[i];
    }
    if (off < 0 || (uint64_t)(hi + 1) * (uint64_t)isz > self->extent) {
        PyErr_SetString(PyExc_IndexError, "_view: out of the tensor's bounds");
        goto done;
    }
    res = (PyObject *)tensor_new(Py_TYPE(self), self->h, self->data + off * isz, self->extent - (size_t)off * (size_t)isz,
                                 self->typenum, (int)nd, shape, strides);
done:
    Py_XDECREF(sh);
    Py_XDECREF(st);
    return res;
}

static PyObject *tuple64(const int64_t *v, int n) {
    PyObject *t = PyTuple_New(n);
    for (int i = 0; t && i < n; i++) {
        PyObject *x = PyLong_FromLongLong(v[i]);
        if (!x) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, x);
    }
    return t;
}

static PyObject *DeviceTensor_get_shape(tfpy_DeviceTensor *self, void *c) { return tuple64(self->shape, self->ndim); }
static PyObject *DeviceTensor_get_strides(tfpy_DeviceTensor *self, void *c) { return tuple64(self->strides, self->ndim); }
static PyObject *DeviceTensor_get_dtype(tfpy_DeviceTensor *self, void *c) { return (PyObject *)PyArray_DescrFromType(self->typenum); }
static PyObject *DeviceTensor_get_device(tfpy_DeviceTensor *self, void *c) { return PyLong_FromLong(self->h->device); }
static PyObject *DeviceTensor_get_ptr(tfpy_DeviceTensor *self, void *c) { return PyLong_FromVoidPtr(self->data); }

PyDoc_STRVAR(DeviceTensor_doc, "A batch array in device memory, exported with DLPack (torch.from_dlpack, cupy.from_dlpack, jax.dlpack).");

TFPY_TYPE_SPEC(DeviceTensor, tfpy_DeviceTensor, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
               {Py_tp_doc, (void *)DeviceTensor_doc}, {Py_tp_dealloc, DeviceTensor_dealloc},
               {Py_tp_methods, TFPY_METHODS(
                   {"__dlpack__", (PyCFunction)(void (*)(void))DeviceTensor_dlpack, METH_VARARGS | METH_KEYWORDS, DeviceTensor_dlpack_doc},
                   {"__dlpack_device__", (PyCFunction)DeviceTensor_dlpack_device, METH_NOARGS,
                    "__dlpack_device__($self)\n--\n\nReturns (2, device). (kDLCUDA, device index)."},
                   {"synchronize", (PyCFunction)DeviceTensor_synchronize, METH_NOARGS,
                    "synchronize($self)\n--\n\nBlock this thread until the batch's copy has landed (an event wait; for checks and tests)."},
                   {"_view", (PyCFunction)DeviceTensor_view, METH_VARARGS, DeviceTensor_view_doc})},
               {Py_tp_getset, TFPY_GETSET(
                   {"shape", (getter)DeviceTensor_get_shape, NULL, "shape", NULL},
                   {"strides", (getter)DeviceTensor_get_strides, NULL, "strides in elements", NULL},
                   {"dtype", (getter)DeviceTensor_get_dtype, NULL, "NumPy dtype of the elements", NULL},
                   {"device", (getter)DeviceTensor_get_device, NULL, "CUDA device index", NULL},
                   {"data_ptr", (getter)DeviceTensor_get_ptr, NULL, "device address of the first element", NULL})});

