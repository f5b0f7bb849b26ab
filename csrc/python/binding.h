/*
 * binding.h — shared pieces of the tokenfeed._core extension module.
 *
 * The binding is thin: it parses arguments, releases the GIL around C work and
 * turns C results into Python objects. All logic lives in the C library,
 * which the binding reaches through the public header only. Every type is a
 * heap type created from a PyType_Spec, one file per type:
 *
 *   module.c             module state, error mapping, dtype and argument
 *                        helpers, constants, build_info()
 *   dataset_obj.c        Dataset        (tf_dataset)
 *   writer_obj.c         Writer         (tf_writer)
 *   permutation_obj.c    Permutation    (tf_perm)
 *   order_obj.c          Order          (tf_order)
 *   loader_obj.c         Loader         (tf_loader over an Order)
 *   batch_obj.c          Batch          (owner of one tf_batch's buffers)
 *   device_ring_obj.c    DeviceRing     (tf_device_ring)
 *   device_loader_obj.c  DeviceLoader   (tf_device_loader over a Loader)
 *   device_tensor_obj.c  DeviceTensor   (one array of a batch on the device, DLPack)
 *   explain.c            provenance (Order.segments_at / find_document) and the
 *                        data-wait meter's dict (Loader / DeviceLoader.meter)
 *
 * TFPY_TYPES lists them. Per-module state holds the types and the exception class, found from any
 * instance through PyType_GetModuleState. Every function that takes keyword
 * arguments parses them with a fixed list, so an unknown keyword is a
 * TypeError.
 */
#ifndef TF_BINDING_H
#define TF_BINDING_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#ifndef TF_BINDING_MAIN
#define NO_IMPORT_ARRAY
#endif
#define PY_ARRAY_UNIQUE_SYMBOL tokenfeed_ARRAY_API
#include <numpy/arrayobject.h>

#include <errno.h>
#include <stdatomic.h>

#define TF_EXPERIMENTAL_API /* Permutation and DeviceRing wrap the experimental API */
#include "tokenfeed.h"

/* The module's types, one list: X(Name) for tokenfeed._core.Name, defined in
 * <name>_obj.c as tfpy_<Name>Spec and kept in the state as <Name>Type. */
#define TFPY_TYPES(X)                                                                              \
    X(Dataset) X(Writer) X(Permutation) X(Order) X(Loader) X(Batch) X(DeviceRing) X(DeviceLoader) X(DeviceTensor) \
    X(Remote)

#define TFPY_STATE_TYPE(N) PyTypeObject *N##Type;
typedef struct tf_module_state {
    PyObject *FormatError; /* tokenfeed.FormatError (ValueError) */
    TFPY_TYPES(TFPY_STATE_TYPE)
} tf_module_state;
#undef TFPY_STATE_TYPE

/* State from a heap type defined by this module. */
static inline tf_module_state *tfpy_state_of_type(PyTypeObject *tp) {
    return (tf_module_state *)PyType_GetModuleState(tp);
}
static inline tf_module_state *tfpy_state(PyObject *self) { return tfpy_state_of_type(Py_TYPE(self)); }

/* ---- errors (module.c) ---------------------------------------------------- */

/* Raise the Python exception for a negative tokenfeed return code, using the
 * thread's detail message. Always returns NULL. The one table of the binding:
 * format/checksum/vocab -> FormatError; ENOMEM -> MemoryError; EINVAL ->
 * ValueError; ERANGE -> IndexError; TF_EUNSUPPORTED -> NotImplementedError;
 * TF_EEOF -> StopIteration; TF_ESTATE / TF_ECUDA / EBUSY / EAGAIN (device
 * slots all held or in flight) -> RuntimeError; EINTR -> the pending signal's
 * exception or InterruptedError; other errno -> OSError. The message must be
 * captured right after the failing call, before anything else can overwrite
 * it: pass it in `msg` when it was captured earlier, or NULL to read
 * tf_last_error() now. */
PyObject *tfpy_raise(tf_module_state *st, int rc, const char *msg);
/* The same for errors about data the caller passed in (not a file): an id
 * outside the vocabulary is then a ValueError, not a FormatError. */
PyObject *tfpy_raise_input(tf_module_state *st, int rc, const char *msg);

/* Run `call` (an int expression) with the GIL released, storing its result in
 * rc and, on failure, the thread's message in msg (a char array) before the
 * GIL is taken back. */
#define TFPY_NOGIL_CALL(rc, msg, call)                                                             \
    do {                                                                                           \
        Py_BEGIN_ALLOW_THREADS                                                                     \
        (rc) = (call);                                                                             \
        if ((rc) < 0) snprintf((msg), sizeof(msg), "%s", tf_last_error());                         \
        Py_END_ALLOW_THREADS                                                                       \
    } while (0)

/* self = a new instance of tp whose member `field` owns handle; when the
 * allocation fails, destroy(handle) runs and self is NULL. */
#define TFPY_NEW_OWNER(self, tp, field, handle, destroy)                                            \
    do {                                                                                           \
        (self) = (void *)(tp)->tp_alloc((tp), 0);                                                  \
        if (self) (self)->field = (handle);                                                        \
        else destroy(handle);                                                                      \
    } while (0)

/* Whether the interpreter is being finalized (module.c). */
int tfpy_finalizing(void);

/* Take the handle out of `field` (NULL after) and destroy it, if any, with the
 * GIL released: destroying an engine or a device ring joins threads or waits
 * on events. While the interpreter is finalized the handle is left to the
 * ending process instead: a thread it would join may be inside a transport
 * call that returns to a finalizing interpreter, which parks it for good. */
#define TFPY_DESTROY_NOGIL(field, destroy)                                                         \
    do {                                                                                           \
        __typeof__(field) tfpy_h = (field);                                                        \
        (field) = NULL;                                                                            \
        if (tfpy_h && !tfpy_finalizing()) {                                                        \
            Py_BEGIN_ALLOW_THREADS                                                                 \
            destroy(tfpy_h);                                                                       \
            Py_END_ALLOW_THREADS                                                                   \
        }                                                                                          \
    } while (0)

/* Python code that the library's own threads run (transport calls of the
 * fetch and worker threads, progress notices) may start a garbage collection,
 * and the collection may free the very object whose engine or store owns that
 * thread: a Loader or Dataset left in a reference cycle. Destroying it there
 * would join the thread from itself and free what it is still reading.
 * tfpy_library_thread counts those calls on the current thread; while it is
 * set, tfpy_destroy hands the destruction to a thread of its own. */
extern _Thread_local int tfpy_library_thread;

/* destroy(h) without the GIL, then drop `keep` (a reference given over, or
 * NULL: what h borrows). On a library thread (above) both happen later on a
 * detached thread; while the interpreter is finalized both are left to the
 * ending process, as TFPY_DESTROY_NOGIL does. h may be NULL. */
void tfpy_destroy(void (*destroy)(void *), void *h, PyObject *keep);

/* ---- dtypes and arguments (module.c) -------------------------------------- */

/* tf_dtype for a NumPy type number, TF_DTYPE_INVALID if not a token dtype. */
tf_dtype tfpy_dtype_from_npy(int typenum);
int tfpy_npy_from_dtype(tf_dtype dt);
/* Parse None / str / numpy dtype-like into a tf_dtype; None gives dflt. */
int tfpy_parse_dtype(PyObject *obj, tf_dtype dflt, tf_dtype *out);

/* "O&" converters. tfpy_u64: a non-negative int that fits 64 bits (bool and
 * other types: TypeError; negative: ValueError; too large: OverflowError).
 * tfpy_opt_u64: the same, or None to leave *out (its default) untouched.
 * tfpy_opt_id: a token id (>= 0, fits int64) or None, stored in an int64_t
 * (None leaves it). tfpy_nonneg_int: an int in [0, INT_MAX] into an int. */
int tfpy_u64(PyObject *o, void *out);
int tfpy_opt_u64(PyObject *o, void *out);
int tfpy_opt_id(PyObject *o, void *out);
int tfpy_nonneg_int(PyObject *o, void *out);

/* Keyword arguments parsed from a fixed table (NULL name ends it): each value
 * goes through its converter into dest; a keyword not in the table is a
 * TypeError naming it, and a converter's error is prefixed with the keyword.
 * Returns 0 or -1 with an exception set. */
typedef struct tfpy_kwarg {
    const char *name;
    int (*conv)(PyObject *o, void *dest);
    void *dest;
} tfpy_kwarg;
int tfpy_parse_kwargs(PyObject *kw, const tfpy_kwarg *table, const char *fname);
/* The same, where every setting of the C settings table in scope is a keyword too, parsed by its row into cfg
 * through tf_config_set: an int (not a bool) for INT rows, a name or its
 * index for ENUM rows, a bool for BOOL rows, None for the default (a
 * nullable row's none value). table (may be NULL) gives the other keywords. */
int tfpy_parse_settings(PyObject *kw, tf_setting_scope scope, void *cfg, const tfpy_kwarg *table, const char *fname);
/* The settings of scope in cfg (a tf_order_config, tf_loader_config, ...) as
 * a dict by row name, in the values the keywords take: None for a nullable
 * row's none value, an enum's name, True/False, an int. */
PyObject *tfpy_settings_values(tf_setting_scope scope, const void *cfg);

/* Apply fn(ctx, x) to an int or elementwise to an integer array (as uint64,
 * GIL released), refusing inputs >= limit with IndexError. One loop for every
 * "position -> index" method of the binding. */
typedef uint64_t (*tfpy_u64_map)(const void *ctx, uint64_t x);
PyObject *tfpy_map_u64(PyObject *arg, tfpy_u64_map fn, const void *ctx, uint64_t limit);

/* ---- objects shared between files ----------------------------------------- */

/* The tf_remote of a _core.Remote (remote_obj.c), borrowed; NULL with a
 * TypeError for anything else. The cache directory functions of the module. */
tf_remote *tfpy_remote_of(PyObject *obj);
extern PyMethodDef tfpy_remote_functions[];

/* Dataset: owns a tf_dataset. */
typedef struct {
    PyObject_HEAD
    tf_dataset *ds;
    PyObject *paths; /* tuple of str, for messages and pickling */
    PyObject *parent; /* a view: the Dataset whose files it reads (kept alive), else NULL */
} tfpy_Dataset;

/* Views and metadata columns (columns_obj.c): the Dataset methods select,
 * selection, document_id, and the module's column functions. */
PyObject *tfpy_dataset_select(tfpy_Dataset *self, PyObject *arg);
PyObject *tfpy_dataset_selection(tfpy_Dataset *self, PyObject *unused);
PyObject *tfpy_dataset_document_id(tfpy_Dataset *self, PyObject *arg);
extern PyMethodDef tfpy_columns_functions[];

/* Order: owns a tf_order; keeps the Dataset(s) it reads alive. */
typedef struct {
    PyObject_HEAD
    tf_order *o;
    PyObject *dataset; /* a Dataset, or a tuple of them for a mixture */
} tfpy_Order;

/* A Batch owning b, whose buffers go back to the engine when it dies; and
 * the dict of NumPy views of b (each with the Batch as base), as
 * Loader.next() returns it. tfpy_batch_dict takes b over, even on failure. */
PyObject *tfpy_batch_dict(tf_module_state *st, tf_batch *b);

/* One batch on the device, shared by its DeviceTensors and every DLPack
 * capsule made from them (device_tensor_obj.c): plain C with an atomic count,
 * so a consumer's deleter may drop it on any thread without the GIL. It is a
 * ring slot (DeviceRing.upload) or a device loader's batch (DeviceLoader.next,
 * then `batch` is set). The last reference releases it on the last consumer
 * stream. */
typedef struct tfpy_devslot {
    atomic_int refs;
    tf_device_slot *slot;
    tf_device_batch *batch;
    _Atomic uintptr_t stream; /* last consumer stream, TF_DEVICE_STREAM_NONE if none */
    int device;
} tfpy_devslot;
void tfpy_devslot_unref(tfpy_devslot *h);
/* A devslot holding a ring slot, or a device loader's batch where batch is
 * not NULL, on device `device`: one reference, the caller's until tensors
 * hold it. NULL with MemoryError, the slot or batch then released. */
tfpy_devslot *tfpy_devslot_new(tf_device_slot *slot, tf_device_batch *batch, int device);
/* The engine of a _core.Loader, for a DeviceLoader to drive (NULL with
 * ValueError when it is closed, RuntimeError when another drives it). While
 * used, the Loader refuses next()/seek() and defers close() until
 * tfpy_loader_unuse (GIL held), which the DeviceLoader calls once its copy
 * thread is gone. */
tf_loader *tfpy_loader_use(PyObject *loader);
void tfpy_loader_unuse(PyObject *loader);
/* Whether a NumPy type can go through DLPack (TypeError if not). */
int tfpy_dlpack_dtype_ok(int typenum);
/* A DeviceTensor over ndim <= 4 dims of slot h (takes a reference on h):
 * data is element 0, extent the bytes from it to the end of its segment,
 * strides in elements. */
PyObject *tfpy_device_tensor_new(tf_module_state *st, tfpy_devslot *h, char *data, size_t extent, int typenum,
                                 int ndim, const int64_t *shape, const int64_t *strides);
#define TFPY_MAXDIM 4

/* explain.c: Order methods (METH_O and METH_VARARGS) and meter(window=None): the
 * meter of l, or of d where d is not NULL, as a dict; both NULL (closed): ValueError
 * "the <what> is closed". */
PyObject *tfpy_Order_segments_at(PyObject *self, PyObject *arg);
PyObject *tfpy_Order_find_document(PyObject *self, PyObject *args);
PyObject *tfpy_meter(PyObject *args, const tf_loader *l, const tf_device_loader *d, const char *what);
PyObject *tfpy_gpu_meter(PyObject *args, const tf_device_loader *d);

/* Define PyType_Spec tfpy_<NAME>Spec for tokenfeed._core.NAME, whose objects
 * are STRUCTs; the slots ({Py_tp_new, f}, ...) follow the flags. A type's
 * method and attribute tables go inline, {Py_tp_methods, TFPY_METHODS(...)}
 * and {Py_tp_getset, TFPY_GETSET(...)} (file-scope compound literals: static
 * arrays, terminated here). */
#define TFPY_METHODS(...) ((PyMethodDef[]){__VA_ARGS__, {NULL, NULL, 0, NULL}})
#define TFPY_GETSET(...) ((PyGetSetDef[]){__VA_ARGS__, {NULL, NULL, NULL, NULL, NULL}})
#define TFPY_TYPE_SPEC(NAME, STRUCT, FLAGS, ...)                                                    \
    static PyType_Slot NAME##_slots[] = {__VA_ARGS__, {0, NULL}};                                  \
    PyType_Spec tfpy_##NAME##Spec = {"tokenfeed._core." #NAME, sizeof(STRUCT), 0, (FLAGS), NAME##_slots}

#define TFPY_EXTERN_SPEC(N) extern PyType_Spec tfpy_##N##Spec;
TFPY_TYPES(TFPY_EXTERN_SPEC)
#undef TFPY_EXTERN_SPEC

/* ---- the life of an object and its handle ---------------------------------- */

/* The end of a heap type's tp_dealloc: free self, then drop the reference
 * the instance held on its type. */
static inline void tfpy_free_instance(PyObject *self) {
    PyTypeObject *tp = Py_TYPE(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

/* 0 while an object's handle is open; -1 with ValueError "the <what> is
 * closed" once it is NULL. */
static inline int tfpy_check_open(const void *handle, const char *what) {
    if (handle) return 0;
    PyErr_Format(PyExc_ValueError, "the %s is closed", what);
    return -1;
}

/* 0 when an object that one thread iterates at a time may be used now; -1
 * with ValueError when it is closed (handle NULL or a close pending) or
 * RuntimeError while another thread is inside its next(). */
static inline int tfpy_check_idle(const void *handle, int close_pending, int busy, const char *what) {
    if (tfpy_check_open(close_pending ? NULL : handle, what) < 0) return -1;
    if (busy) {
        PyErr_SetString(PyExc_RuntimeError,
                        "the loader is being iterated by another thread; a Loader is not shared between threads");
        return -1;
    }
    return 0;
}

/* next() of an object with `busy` and `close_pending` members: `call` (an
 * int expression waiting at most 50 ms, -TF_ENOTREADY when nothing came)
 * again and again with the GIL released and self->busy set, until it gives
 * something else, close() is called from another thread, or a signal's
 * handler raises (PyErr_CheckSignals: Ctrl-C interrupts the wait). */
#define TFPY_WAIT_SLICED(rc, msg, self, call)                                                      \
    do {                                                                                           \
        (self)->busy = 1;                                                                          \
        for (;;) {                                                                                 \
            TFPY_NOGIL_CALL(rc, msg, call);                                                        \
            if ((rc) != -TF_ENOTREADY) break;                                                      \
            if ((self)->close_pending || PyErr_CheckSignals() < 0) break;                          \
        }                                                                                          \
        (self)->busy = 0;                                                                          \
    } while (0)

/* The end of a method that returns None: `call` (an int expression) run with
 * the GIL released, then None, or the exception for its error. */
#define TFPY_RETURN_NONE_AFTER(self, call)                                                         \
    do {                                                                                           \
        int tfpy_rc;                                                                               \
        char tfpy_msg[1024];                                                                       \
        TFPY_NOGIL_CALL(tfpy_rc, tfpy_msg, call);                                                  \
        if (tfpy_rc < 0) return tfpy_raise(tfpy_state((PyObject *)(self)), tfpy_rc, tfpy_msg);     \
        Py_RETURN_NONE;                                                                            \
    } while (0)

/* How a TFPY_WAIT_SLICED wait ended: 0 with what it waited for, else -1
 * with an exception set: ValueError when close() was called meanwhile
 * (closed: the caller has let go of what came and freed the handle), the
 * signal handler's exception when interrupted, or the library's error. */
static inline int tfpy_waited(tf_module_state *st, int rc, const char *msg, int closed) {
    if (closed) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "the loader was closed while waiting for a batch");
        return -1;
    }
    if (rc == -TF_ENOTREADY) return -1; /* interrupted: exception set by PyErr_CheckSignals */
    if (rc < 0) {
        tfpy_raise(st, rc, msg);
        return -1;
    }
    return 0;
}

/* "O&" converter of a flag, True or False (anything else: TypeError), into
 * an int. */
static inline int tfpy_flag(PyObject *o, void *out) {
    if (o != Py_True && o != Py_False) {
        PyErr_Format(PyExc_TypeError, "expected True or False, got %R", o);
        return 0;
    }
    *(int *)out = o == Py_True;
    return 1;
}

/* A list of the n ints v[i] (NULL with an exception set). */
static inline PyObject *tfpy_list_u64(const uint64_t *v, size_t n) {
    PyObject *lst = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; lst && i < n; i++) {
        PyObject *x = PyLong_FromUnsignedLongLong(v[i]);
        if (!x) Py_CLEAR(lst);
        else PyList_SET_ITEM(lst, (Py_ssize_t)i, x);
    }
    return lst;
}

#endif
