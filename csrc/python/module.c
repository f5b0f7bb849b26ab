/*
 * module.c — tokenfeed._core: module state, the one function that maps C
 * errors to Python exceptions, dtype helpers and build_info().
 */
#define TF_BINDING_MAIN
#include "binding.h"

#include <errno.h>

#ifndef TF_BUILD_SUMMARY
#define TF_BUILD_SUMMARY ""
#endif

PyObject *tfpy_raise(tf_module_state *st, int rc, const char *msg) {
    if (!msg) msg = tf_last_error();
    if (!msg || !*msg) msg = tf_strerror(rc);
    int e = rc < 0 ? -rc : rc;
    switch (e) {
    case TF_EFORMAT:
    case TF_ECHECKSUM:
    case TF_EVOCAB:
        PyErr_SetString(st->FormatError, msg);
        break;
    case TF_EEOF:
        PyErr_SetNone(PyExc_StopIteration);
        break;
    case TF_EUNSUPPORTED:
        PyErr_SetString(PyExc_NotImplementedError, msg);
        break;
    case TF_ESTATE:
    case TF_ECUDA:
        PyErr_SetString(PyExc_RuntimeError, msg);
        break;
    case ENOMEM:
        PyErr_SetString(PyExc_MemoryError, msg);
        break;
    case EINVAL:
        PyErr_SetString(PyExc_ValueError, msg);
        break;
    case ERANGE:
        PyErr_SetString(PyExc_IndexError, msg);
        break;
    case EINTR:
        if (!PyErr_CheckSignals()) PyErr_SetString(PyExc_InterruptedError, msg);
        break;
    default: {
        PyObject *args = Py_BuildValue("(is)", e, msg);
        if (args) {
            PyErr_SetObject(PyExc_OSError, args);
            Py_DECREF(args);
        }
    }
    }
    return NULL;
}

tf_dtype tfpy_dtype_from_npy(int t) {
    switch (t) {
    case NPY_UINT8: return TF_UINT8;
    case NPY_UINT16: return TF_UINT16;
    case NPY_UINT32: return TF_UINT32;
    case NPY_UINT64: return TF_UINT64;
    case NPY_INT8: return TF_INT8;
    case NPY_INT16: return TF_INT16;
    case NPY_INT32: return TF_INT32;
    case NPY_INT64: return TF_INT64;
    case NPY_FLOAT32: return TF_FLOAT32;
    case NPY_FLOAT64: return TF_FLOAT64;
    default: break;
    }
    /* long / longlong aliases on LP64 */
    if (t == NPY_LONGLONG) return TF_INT64;
    if (t == NPY_ULONGLONG) return TF_UINT64;
    return TF_DTYPE_INVALID;
}

int tfpy_npy_from_dtype(tf_dtype dt) {
    switch (dt) {
    case TF_UINT8: return NPY_UINT8;
    case TF_UINT16: return NPY_UINT16;
    case TF_UINT32: return NPY_UINT32;
    case TF_UINT64: return NPY_UINT64;
    case TF_INT8: return NPY_INT8;
    case TF_INT16: return NPY_INT16;
    case TF_INT32: return NPY_INT32;
    case TF_INT64: return NPY_INT64;
    case TF_FLOAT32: return NPY_FLOAT32;
    case TF_FLOAT64: return NPY_FLOAT64;
    default: return -1;
    }
}

int tfpy_parse_dtype(PyObject *obj, tf_dtype dflt, tf_dtype *out) {
    if (obj == NULL || obj == Py_None) {
        *out = dflt;
        return 0;
    }
    PyArray_Descr *d = NULL;
    if (!PyArray_DescrConverter(obj, &d)) return -1;
    tf_dtype dt = TF_DTYPE_INVALID;
    if (PyDataType_ISNOTSWAPPED(d)) dt = tfpy_dtype_from_npy(d->type_num);
    Py_DECREF(d);
    if (dt == TF_DTYPE_INVALID) {
        PyErr_Format(PyExc_ValueError, "dtype %R is not a supported token dtype (use uint8, uint16, uint32, int32 or int64)", obj);
        return -1;
    }
    *out = dt;
    return 0;
}

PyDoc_STRVAR(build_info_doc,
"build_info($module)\n--\n\nReturns dict. "
"What the C core was compiled with and what is usable at run time.");

static PyObject *build_info(PyObject *mod, PyObject *unused) {
    unsigned f = tf_features();
    char why[256];
    int uring = tf_io_uring_usable(why, sizeof why);
    char cuda_why[512]; /* loads the CUDA runtime (once per process) to say what is usable */
    int cuda = tf_cuda_available(cuda_why, sizeof cuda_why);
    return Py_BuildValue("{s:s,s:{s:O,s:O},s:{s:O,s:O,s:s},s:{s:O,s:O,s:s},s:s}",
                         "version", tf_version(),
                         "zstd", "compiled", (f & TF_FEATURE_ZSTD) ? Py_True : Py_False,
                         "usable", (f & TF_FEATURE_ZSTD) ? Py_True : Py_False,
                         "io_uring", "compiled", (f & TF_FEATURE_IO_URING) ? Py_True : Py_False,
                         "usable", uring ? Py_True : Py_False, "detail", why,
                         "cuda", "compiled", (f & TF_FEATURE_CUDA) ? Py_True : Py_False,
                         "usable", cuda ? Py_True : Py_False, "detail", cuda_why,
                         "build", TF_BUILD_SUMMARY);
}

PyDoc_STRVAR(merge_doc,
"merge($module, path, parts, overwrite=False)\n--\n\n"
"Write path's manifest joining the datasets parts (paths relative to path), in order.\n"
"No token data is copied. See tf_dataset_merge in tokenfeed.h.");

static PyObject *merge(PyObject *mod, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"path", "parts", "overwrite", NULL};
    PyObject *path_obj, *parts_obj, *seq = NULL, *fs = NULL, *ret = NULL;
    int overwrite = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|p", kwlist, &path_obj, &parts_obj, &overwrite)) return NULL;
    if (!PyUnicode_FSConverter(path_obj, &fs)) return NULL;
    seq = PySequence_Fast(parts_obj, "parts must be a sequence of paths");
    Py_ssize_t n = seq ? PySequence_Fast_GET_SIZE(seq) : 0;
    PyObject **conv = seq ? PyMem_Calloc((size_t)n + 1, sizeof *conv) : NULL;
    const char **names = seq ? PyMem_Calloc((size_t)n + 1, sizeof *names) : NULL;
    if (seq && (!conv || !names)) {
        PyErr_NoMemory();
        goto finally;
    }
    for (Py_ssize_t i = 0; seq && i < n; i++) {
        if (!PyUnicode_FSConverter(PySequence_Fast_GET_ITEM(seq, i), &conv[i])) goto finally;
        names[i] = PyBytes_AS_STRING(conv[i]);
    }
    if (!seq) goto finally;
    int rc;
    char msg[1024];
    const char *dir = PyBytes_AS_STRING(fs);
    Py_BEGIN_ALLOW_THREADS
    rc = tf_dataset_merge(dir, names, (uint64_t)n, overwrite);
    if (rc < 0) snprintf(msg, sizeof msg, "%s", tf_last_error());
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        tfpy_raise(PyModule_GetState(mod), rc, msg);
        goto finally;
    }
    ret = Py_NewRef(Py_None);
finally:
    for (Py_ssize_t i = 0; conv && i < n; i++) Py_XDECREF(conv[i]);
    PyMem_Free(conv);
    PyMem_Free(names);
    Py_XDECREF(seq);
    Py_XDECREF(fs);
    return ret;
}

static PyMethodDef module_methods[] = {
    {"build_info", build_info, METH_NOARGS, build_info_doc},
    {"merge", (PyCFunction)(void (*)(void))merge, METH_VARARGS | METH_KEYWORDS, merge_doc},
    {NULL, NULL, 0, NULL},
};

static int add_type(PyObject *m, PyType_Spec *spec, PyTypeObject **slot) {
    PyObject *t = PyType_FromModuleAndSpec(m, spec, NULL);
    if (!t) return -1;
    *slot = (PyTypeObject *)t;
    Py_INCREF(t);
    if (PyModule_AddObject(m, strrchr(spec->name, '.') + 1, t) < 0) {
        Py_DECREF(t);
        return -1;
    }
    return 0;
}

static int module_exec(PyObject *m) {
    tf_module_state *st = PyModule_GetState(m);
    st->FormatError = PyErr_NewExceptionWithDoc(
        "tokenfeed.FormatError",
        "A token file is malformed, truncated, fails its checksum or holds ids outside the vocabulary.\n"
        "The message names the file, the field, what was expected and found, and what to do.",
        PyExc_ValueError, NULL);
    if (!st->FormatError) return -1;
    Py_INCREF(st->FormatError);
    if (PyModule_AddObject(m, "FormatError", st->FormatError) < 0) {
        Py_DECREF(st->FormatError);
        return -1;
    }
    if (add_type(m, &tfpy_DatasetSpec, &st->DatasetType) < 0) return -1;
    if (add_type(m, &tfpy_WriterSpec, &st->WriterType) < 0) return -1;
    if (add_type(m, &tfpy_PermutationSpec, &st->PermutationType) < 0) return -1;
    if (add_type(m, &tfpy_OrderSpec, &st->OrderType) < 0) return -1;
    if (add_type(m, &tfpy_LoaderSpec, &st->LoaderType) < 0) return -1;
    if (add_type(m, &tfpy_BatchSpec, &st->BatchType) < 0) return -1;
    if (add_type(m, &tfpy_DeviceRingSpec, &st->DeviceRingType) < 0) return -1;
    if (add_type(m, &tfpy_DeviceTensorSpec, &st->DeviceTensorType) < 0) return -1;
    if (PyModule_AddIntConstant(m, "SHUFFLE_NONE", TF_SHUFFLE_NONE) < 0 ||
        PyModule_AddIntConstant(m, "SHUFFLE_FULL", TF_SHUFFLE_FULL) < 0 ||
        PyModule_AddIntConstant(m, "SHUFFLE_BLOCK", TF_SHUFFLE_BLOCK) < 0 ||
        PyModule_AddIntConstant(m, "WANT_POSITION_IDS", TF_WANT_POSITION_IDS) < 0 ||
        PyModule_AddIntConstant(m, "WANT_CU_SEQLENS", TF_WANT_CU_SEQLENS) < 0 ||
        PyModule_AddIntConstant(m, "WANT_LOSS_MASK", TF_WANT_LOSS_MASK) < 0 ||
        PyModule_AddStringConstant(m, "__version__", tf_version()) < 0)
        return -1;
    return 0;
}

static int module_traverse(PyObject *m, visitproc visit, void *arg) {
    tf_module_state *st = PyModule_GetState(m);
    Py_VISIT(st->FormatError);
    Py_VISIT(st->DatasetType);
    Py_VISIT(st->WriterType);
    Py_VISIT(st->PermutationType);
    Py_VISIT(st->OrderType);
    Py_VISIT(st->LoaderType);
    Py_VISIT(st->BatchType);
    Py_VISIT(st->DeviceRingType);
    Py_VISIT(st->DeviceTensorType);
    return 0;
}

static int module_clear(PyObject *m) {
    tf_module_state *st = PyModule_GetState(m);
    Py_CLEAR(st->FormatError);
    Py_CLEAR(st->DatasetType);
    Py_CLEAR(st->WriterType);
    Py_CLEAR(st->PermutationType);
    Py_CLEAR(st->OrderType);
    Py_CLEAR(st->LoaderType);
    Py_CLEAR(st->BatchType);
    Py_CLEAR(st->DeviceRingType);
    Py_CLEAR(st->DeviceTensorType);
    return 0;
}

static void module_free(void *m) { module_clear((PyObject *)m); }

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "tokenfeed._core",
    .m_doc = "C core of tokenfeed (see tokenfeed.h for the C API).",
    .m_size = sizeof(tf_module_state),
    .m_methods = module_methods,
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC PyInit__core(void) {
    import_array();
    return PyModuleDef_Init(&module_def);
}
