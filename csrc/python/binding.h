/*
 * binding.h — shared pieces of the tokenfeed._core extension module.
 *
 * The binding is thin: it parses arguments, releases the GIL around C work and
 * turns C results into Python objects. All logic lives in the C library. Every
 * type is a heap type created from a PyType_Spec; per-module state holds the
 * types and the exception class, found from any instance through
 * PyType_GetModuleState.
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

#include "tokenfeed.h"

typedef struct tf_module_state {
    PyObject *FormatError; /* tokenfeed.FormatError (ValueError) */
    PyTypeObject *DatasetType;
    PyTypeObject *WriterType;
    PyTypeObject *PermutationType;
    PyTypeObject *OrderType;
    PyTypeObject *LoaderType;
    PyTypeObject *BatchType;
    PyTypeObject *DeviceRingType;   /* dlpack.c */
    PyTypeObject *DeviceTensorType;
} tf_module_state;

/* State from a heap type defined by this module. */
static inline tf_module_state *tfpy_state_of_type(PyTypeObject *tp) {
    return (tf_module_state *)PyType_GetModuleState(tp);
}
static inline tf_module_state *tfpy_state(PyObject *self) { return tfpy_state_of_type(Py_TYPE(self)); }

/* Raise the Python exception for a negative tokenfeed return code, using the
 * thread's detail message. Always returns NULL. Mapping: format/checksum/
 * vocab -> FormatError; ENOMEM -> MemoryError; EINVAL -> ValueError; ERANGE ->
 * IndexError; TF_EUNSUPPORTED -> NotImplementedError; TF_EEOF ->
 * StopIteration; TF_ESTATE / TF_ECUDA -> RuntimeError; other errno -> OSError.
 * The message must be captured right after the failing call, before anything
 * else can overwrite it: pass it in `msg` when it was captured earlier, or
 * NULL to read tf_last_error() now. */
PyObject *tfpy_raise(tf_module_state *st, int rc, const char *msg);

/* tf_dtype for a NumPy type number, TF_DTYPE_INVALID if not a token dtype. */
tf_dtype tfpy_dtype_from_npy(int typenum);
int tfpy_npy_from_dtype(tf_dtype dt);
/* Parse None / str / numpy dtype-like into a tf_dtype; None gives dflt. */
int tfpy_parse_dtype(PyObject *obj, tf_dtype dflt, tf_dtype *out);

/* Dataset object: owns a tf_dataset. */
typedef struct {
    PyObject_HEAD
    tf_dataset *ds;
    PyObject *paths; /* tuple of str, for messages and pickling */
} tfpy_Dataset;

extern PyType_Spec tfpy_DatasetSpec;
extern PyType_Spec tfpy_WriterSpec;
extern PyType_Spec tfpy_PermutationSpec;
extern PyType_Spec tfpy_OrderSpec;
extern PyType_Spec tfpy_LoaderSpec;
extern PyType_Spec tfpy_BatchSpec;
extern PyType_Spec tfpy_DeviceRingSpec;
extern PyType_Spec tfpy_DeviceTensorSpec;

#endif
