/*
 * module.c — tokenfeed._core: module state, the one table that maps C errors
 * to Python exceptions, dtype and argument helpers shared by the types,
 * constants and build_info().
 */
#define TF_BINDING_MAIN
#include "binding.h"

#include <pthread.h>
#include <stdlib.h>

#ifndef TF_BUILD_SUMMARY
#define TF_BUILD_SUMMARY ""
#endif

/* The exception type of an error code, or NULL where tfpy_raise decides. */
static PyObject *exception_for(tf_module_state *st, int e) {
    switch (e) {
    case TF_EFORMAT: case TF_ECHECKSUM: case TF_EVOCAB: return st->FormatError;
    case TF_EUNSUPPORTED: return PyExc_NotImplementedError;
    case TF_ESTATE: case TF_ECUDA: return PyExc_RuntimeError;
    case EBUSY:  /* device ring: every slot held by the consumer */
    case EAGAIN: /* device ring: no slot free yet and not asked to wait */
        return PyExc_RuntimeError;
    case ENOMEM: return PyExc_MemoryError;
    case EINVAL: return PyExc_ValueError;
    case ERANGE: return PyExc_IndexError;
    default: return NULL;
    }
}

PyObject *tfpy_raise(tf_module_state *st, int rc, const char *msg) {
    if (!msg) msg = tf_last_error();
    if (!msg || !*msg) msg = tf_strerror(rc);
    int e = rc < 0 ? -rc : rc;
    PyObject *type = exception_for(st, e);
    if (type) {
        PyErr_SetString(type, msg);
    } else if (e == TF_EEOF) {
        PyErr_SetNone(PyExc_StopIteration);
    } else if (e == EINTR) {
        /* the wait asked tfpy_interrupted, which left the handler's exception */
        if (PyErr_Occurred()) return NULL;
        if (!PyErr_CheckSignals()) PyErr_SetString(PyExc_InterruptedError, msg);
    } else {
        PyObject *args = Py_BuildValue("(is)", e, msg); /* OSError picks its subclass from errno */
        if (args) {
            PyErr_SetObject(PyExc_OSError, args);
            Py_DECREF(args);
        }
    }
    return NULL;
}

PyObject *tfpy_raise_input(tf_module_state *st, int rc, const char *msg) {
    if (rc == -TF_EVOCAB) {
        PyErr_SetString(PyExc_ValueError, msg ? msg : tf_last_error());
        return NULL;
    }
    return tfpy_raise(st, rc, msg);
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

/* ------------------------------------------------------------------------ */
/* argument converters                                                       */
/* ------------------------------------------------------------------------ */

/* An int that is not a bool, as unsigned long long; -1 with an exception. */
static int as_u64(PyObject *o, unsigned long long *v) {
    if (!PyLong_Check(o) || PyBool_Check(o)) {
        PyErr_Format(PyExc_TypeError, "expected an int, got %.100s", Py_TYPE(o)->tp_name);
        return -1;
    }
    int overflow = 0;
    long long sv = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (sv == -1 && PyErr_Occurred()) return -1;
    if (overflow < 0 || (!overflow && sv < 0)) {
        PyErr_Format(PyExc_ValueError, "expected an int >= 0, got %R", o);
        return -1;
    }
    *v = PyLong_AsUnsignedLongLong(o);
    if (*v == (unsigned long long)-1 && PyErr_Occurred()) { /* past 64 bits: say the limit, not "too big" */
        PyErr_Format(PyExc_OverflowError, "expected an int below 2**64 (positions, steps, documents and counts are "
                     "64-bit), got %R", o);
        return -1;
    }
    return 0;
}

int tfpy_u64(PyObject *o, void *out) {
    unsigned long long v;
    if (as_u64(o, &v) < 0) return 0;
    *(uint64_t *)out = v;
    return 1;
}

int tfpy_opt_u64(PyObject *o, void *out) { return o == Py_None ? 1 : tfpy_u64(o, out); }

int tfpy_opt_id(PyObject *o, void *out) {
    unsigned long long v;
    if (o == Py_None) return 1;
    if (as_u64(o, &v) < 0) return 0;
    if (v > INT64_MAX) {
        PyErr_Format(PyExc_OverflowError, "a token id must fit 63 bits, got %R", o);
        return 0;
    }
    *(int64_t *)out = (int64_t)v;
    return 1;
}

int tfpy_nonneg_int(PyObject *o, void *out) {
    unsigned long long v;
    if (as_u64(o, &v) < 0) return 0;
    if (v > INT_MAX) {
        PyErr_Format(PyExc_OverflowError, "expected an int <= %d, got %R", INT_MAX, o);
        return 0;
    }
    *(int *)out = (int)v;
    return 1;
}

/* Prefix the pending exception's message with the keyword, keeping its type. -1. */
static int name_error(const char *k) {
    PyObject *type, *val, *tb;
    PyErr_Fetch(&type, &val, &tb);
    PyErr_NormalizeException(&type, &val, &tb);
    PyErr_Format(type ? type : PyExc_TypeError, "%s: %S", k, val ? val : Py_None);
    Py_XDECREF(type);
    Py_XDECREF(val);
    Py_XDECREF(tb);
    return -1;
}

/* A Python value for a setting's row (see tfpy_parse_settings). */
static int setting_value(const tf_setting *st, PyObject *o, int64_t *v) {
    if (o == Py_None) {
        *v = st->nullable ? st->none_value : st->def;
        return 0;
    }
    if (st->type == TF_SETTING_BOOL) {
        if (!PyBool_Check(o)) {
            PyErr_Format(PyExc_TypeError, "expected True or False, got %.100s %R", Py_TYPE(o)->tp_name, o);
            return -1;
        }
        *v = o == Py_True;
        return 0;
    }
    if (st->type == TF_SETTING_ENUM && PyUnicode_Check(o)) {
        const char *name = PyUnicode_AsUTF8(o);
        if (!name) return -1;
        for (int64_t k = 0; st->names[k]; k++)
            if (!strcmp(st->names[k], name)) {
                *v = k;
                return 0;
            }
        PyObject *names = PyList_New(0);
        for (int k = 0; names && st->names[k]; k++) {
            PyObject *n = PyUnicode_FromString(st->names[k]);
            if (!n || PyList_Append(names, n) < 0) Py_CLEAR(names);
            Py_XDECREF(n);
        }
        if (names) PyErr_Format(PyExc_ValueError, "expected one of %R, got %R", names, o);
        Py_XDECREF(names);
        return -1;
    }
    PyObject *i = PyBool_Check(o) ? NULL : PyNumber_Index(o); /* ints and NumPy ints; never floats or bools */
    if (!i) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "expected %s, got %.100s %R",
                     st->type == TF_SETTING_ENUM ? "a name" : st->nullable ? "an int or None" : "an int",
                     Py_TYPE(o)->tp_name, o);
        return -1;
    }
    int overflow = 0;
    long long sv = PyLong_AsLongLongAndOverflow(i, &overflow);
    if (overflow > 0) {
        unsigned long long uv = PyLong_AsUnsignedLongLong(i);
        Py_DECREF(i);
        if (uv == (unsigned long long)-1 && PyErr_Occurred()) return -1;
        if (st->min < 0 || uv > st->max) {
            PyErr_Format(PyExc_ValueError, "expected %lld <= %s <= %llu, got %R", (long long)st->min, st->name,
                         (unsigned long long)st->max, o);
            return -1;
        }
        *v = (int64_t)uv;
        return 0;
    }
    Py_DECREF(i);
    if (overflow < 0 || (sv == -1 && PyErr_Occurred())) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "expected %s >= %lld, got %R", st->name, (long long)st->min, o);
        return -1;
    }
    if (sv < st->min && !(st->nullable && sv == st->none_value)) {
        /* before a two's complement could pass as a large unsigned value */
        PyErr_Format(PyExc_ValueError, "expected %lld <= %s <= %llu, got %lld", (long long)st->min, st->name,
                     (unsigned long long)st->max, sv);
        return -1;
    }
    *v = sv;
    return 0;
}

static int parse_one_setting(PyObject *value, tf_setting_scope scope, void *cfg, const char *k, const char *fname) {
    const tf_setting *st = tf_setting_find(k);
    int64_t v;
    if (st->type == TF_SETTING_PATH) {
        /* the UTF-8 of a str lives as long as the str, which the caller's keywords hold */
        const char *path = NULL;
        if (value != Py_None && !PyUnicode_Check(value)) {
            PyErr_Format(PyExc_TypeError, "%s: expected a path as str or None, got %.100s %R", k, Py_TYPE(value)->tp_name,
                         value);
            return -1;
        }
        if (value != Py_None && !(path = PyUnicode_AsUTF8(value))) return name_error(k);
        if (tf_config_set_path(scope, cfg, k, path) < 0) {
            PyErr_SetString(PyExc_ValueError, tf_last_error());
            return -1;
        }
        return 0;
    }
    if (setting_value(st, value, &v) < 0) return name_error(k);
    if (tf_config_set(scope, cfg, k, v) < 0) { /* outside its bounds (its name is in the message) */
        PyErr_SetString(PyExc_ValueError, tf_last_error());
        return -1;
    }
    return 0;
}

/* Whether name is a setting of scope (the engine over an Order takes no
 * order setting: the Order decides the stream). */
static int in_scope(const char *name, tf_setting_scope scope) {
    const tf_setting *st = tf_setting_find(name);
    return st && st->scope == scope;
}

int tfpy_parse_settings(PyObject *kw, tf_setting_scope scope, void *cfg, const tfpy_kwarg *table, const char *fname) {
    static const tfpy_kwarg none[] = {{NULL, NULL, NULL}};
    if (!kw) return 0;
    PyObject *rest = PyDict_New(), *key, *value;
    if (!rest) return -1;
    Py_ssize_t pos = 0;
    int rc = 0;
    while (!rc && PyDict_Next(kw, &pos, &key, &value)) {
        const char *k = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
        if (k && in_scope(k, scope)) rc = parse_one_setting(value, scope, cfg, k, fname);
        else rc = PyDict_SetItem(rest, key, value);
    }
    if (!rc) rc = tfpy_parse_kwargs(rest, table ? table : none, fname);
    Py_DECREF(rest);
    return rc;
}

int tfpy_parse_kwargs(PyObject *kw, const tfpy_kwarg *table, const char *fname) {
    if (!kw) return 0;
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(kw, &pos, &key, &value)) {
        const char *k = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
        if (!k) {
            if (!PyErr_Occurred()) PyErr_Format(PyExc_TypeError, "%s() keywords must be strings", fname);
            return -1;
        }
        const tfpy_kwarg *a = table;
        while (a->name && strcmp(a->name, k) != 0) a++;
        if (!a->name) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%s'", fname, k);
            return -1;
        }
        if (!a->conv(value, a->dest)) return name_error(k);
    }
    return 0;
}

PyObject *tfpy_map_u64(PyObject *arg, tfpy_u64_map fn, const void *ctx, uint64_t limit) {
    if (PyLong_Check(arg)) {
        unsigned long long i = PyLong_AsUnsignedLongLong(arg);
        if (i == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
        if (i >= limit) return PyErr_Format(PyExc_IndexError, "index %llu out of range [0, %llu)", i, (unsigned long long)limit);
        return PyLong_FromUnsignedLongLong(fn(ctx, i));
    }
    PyArrayObject *in = (PyArrayObject *)PyArray_FROMANY(arg, NPY_UINT64, 0, 0, NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED | NPY_ARRAY_FORCECAST);
    if (!in) return NULL;
    PyArrayObject *out = (PyArrayObject *)PyArray_SimpleNew(PyArray_NDIM(in), PyArray_DIMS(in), NPY_UINT64);
    if (!out) {
        Py_DECREF(in);
        return NULL;
    }
    const uint64_t *a = PyArray_DATA(in);
    uint64_t *b = PyArray_DATA(out);
    npy_intp n = PyArray_SIZE(in);
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    for (npy_intp k = 0; k < n; k++) {
        if (a[k] >= limit) { bad = 1; break; }
        b[k] = fn(ctx, a[k]);
    }
    Py_END_ALLOW_THREADS
    Py_DECREF(in);
    if (bad) {
        Py_DECREF(out);
        return PyErr_Format(PyExc_IndexError, "an index is out of range [0, %llu)", (unsigned long long)limit);
    }
    return (PyObject *)out;
}

/* ------------------------------------------------------------------------ */
/* module                                                                    */
/* ------------------------------------------------------------------------ */

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

PyDoc_STRVAR(parse_size_doc,
"parse_size(text, what, /)\n--\n\n"
"Bytes of a size written for people (\"200GB\", \"1.5TiB\", \"500M\", \"4096\"): tf_parse_size,\n"
"the one parser of tokenfeed's size settings. ValueError naming what and the accepted forms.");

static PyObject *parse_size(PyObject *mod, PyObject *args) {
    const char *text, *what;
    if (!PyArg_ParseTuple(args, "ss", &text, &what)) return NULL;
    uint64_t v = 0;
    int rc = tf_parse_size(text, what, &v);
    if (rc < 0) {
        PyErr_SetString(PyExc_ValueError, tf_last_error());
        return NULL;
    }
    return PyLong_FromUnsignedLongLong((unsigned long long)v);
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
    if (rc == -EBUSY) { /* another writer or merge holds the directory */
        PyObject *a = Py_BuildValue("(is)", EBUSY, msg);
        if (a) PyErr_SetObject(PyExc_OSError, a);
        Py_XDECREF(a);
        goto finally;
    }
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

PyDoc_STRVAR(settings_doc,
"settings($module)\n--\n\nReturns list[dict]. The C settings table: one dict per setting of the order, the "
"engine, the device stage and remote reading, with name, scope ('order', 'engine', 'device', 'remote'), type ('int', 'bool', 'enum', 'path'), "
"default, min, max, nullable, none_value, names (an enum's, else None), stream (when it changes the stream) "
"and description.");

static PyObject *settings(PyObject *mod, PyObject *unused) {
    static const char *const scopes[] = {"order", "engine", "device", "remote"}, *const types[] = {"int", "bool", "enum", "path"};
    size_t n = tf_settings_count();
    PyObject *out = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; out && i < n; i++) {
        const tf_setting *st = tf_setting_get(i);
        PyObject *names = Py_None;
        if (st->names) {
            names = PyList_New(0);
            for (int k = 0; names && st->names[k]; k++) {
                PyObject *nm = PyUnicode_FromString(st->names[k]);
                if (!nm || PyList_Append(names, nm) < 0) Py_CLEAR(names);
                Py_XDECREF(nm);
            }
            if (!names) {
                Py_DECREF(out);
                return NULL;
            }
        } else {
            Py_INCREF(names);
        }
        PyObject *d = Py_BuildValue("{s:s,s:s,s:s,s:L,s:L,s:K,s:O,s:L,s:N,s:s,s:s}", "name", st->name, "scope",
                                    scopes[st->scope], "type", types[st->type], "default", (long long)st->def, "min",
                                    (long long)st->min, "max", (unsigned long long)st->max, "nullable",
                                    st->nullable ? Py_True : Py_False, "none_value", (long long)st->none_value,
                                    "names", names, "stream", st->stream, "description", st->description);
        if (!d) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, d);
    }
    return out;
}

PyObject *tfpy_settings_values(tf_setting_scope scope, const void *cfg) {
    PyObject *out = PyDict_New();
    for (size_t i = 0; out && i < tf_settings_count(); i++) {
        const tf_setting *st = tf_setting_get(i);
        int64_t v;
        if (st->scope != scope || tf_config_get(scope, cfg, st->name, &v) < 0) continue;
        PyObject *o;
        const char *path = NULL;
        if (st->type == TF_SETTING_PATH && tf_config_get_path(scope, cfg, st->name, &path) == 0 && path)
            o = PyUnicode_DecodeFSDefault(path);
        else if (st->nullable && v == st->none_value) o = Py_NewRef(Py_None);
        else if (st->type == TF_SETTING_BOOL) o = PyBool_FromLong(v != 0);
        else if (st->type == TF_SETTING_ENUM && v >= 0 && v <= (int64_t)st->max) o = PyUnicode_FromString(st->names[v]);
        else if (st->min < 0) o = PyLong_FromLongLong((long long)v);
        else o = PyLong_FromUnsignedLongLong((unsigned long long)(uint64_t)v); /* above INT64_MAX: two's complement */
        if (!o || PyDict_SetItemString(out, st->name, o) < 0) Py_CLEAR(out);
        Py_XDECREF(o);
    }
    return out;
}

PyDoc_STRVAR(build_doc_index_doc,
"build_doc_index($module, path, dtype, eos_id, ends=None, index_dir=None)\n--\n\n"
"Write the document index of the headerless token file path (documents end after\n"
"eos_id; ends: cumulative document ends as a uint64 array, or None for OLMo's metadata\n"
"x.csv.gz beside x.npy when there is one, else a scan of the tokens).\n"
"Returns the path written. See tf_doc_index_build in tokenfeed.h.");

static PyObject *build_doc_index(PyObject *mod, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"path", "dtype", "eos_id", "ends", "index_dir", NULL};
    PyObject *path_obj, *dtype_obj, *ends_obj = Py_None, *dir_obj = Py_None, *fs = NULL, *dfs = NULL, *ret = NULL;
    unsigned long long eos;
    Py_buffer ends = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOK|OO", kwlist, &path_obj, &dtype_obj, &eos, &ends_obj, &dir_obj))
        return NULL;
    tf_open_options opt = {TF_FORMAT_RAW, TF_DTYPE_INVALID, 1, (uint64_t)eos, NULL};
    if (tfpy_parse_dtype(dtype_obj, TF_DTYPE_INVALID, &opt.raw_dtype) < 0) return NULL;
    if (!PyUnicode_FSConverter(path_obj, &fs)) return NULL;
    if (dir_obj != Py_None) {
        if (!PyUnicode_FSConverter(dir_obj, &dfs)) goto finally;
        opt.index_dir = PyBytes_AS_STRING(dfs);
    }
    if (ends_obj != Py_None) {
        if (PyObject_GetBuffer(ends_obj, &ends, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto finally;
        if (ends.itemsize != 8 || !ends.format || (strcmp(ends.format, "Q") != 0 && strcmp(ends.format, "L") != 0 &&
                                                   strcmp(ends.format, "<Q") != 0 && strcmp(ends.format, "=Q") != 0)) {
            PyErr_SetString(PyExc_TypeError, "ends must be a contiguous uint64 array");
            goto finally;
        }
    }
    int rc;
    char msg[1024], out[4096];
    const char *path = PyBytes_AS_STRING(fs);
    const uint64_t *e = ends.buf ? (const uint64_t *)ends.buf : NULL;
    uint64_t ne = ends.buf ? (uint64_t)(ends.len / 8) : 0;
    Py_BEGIN_ALLOW_THREADS
    rc = tf_doc_index_build(path, &opt, e, ne, out, sizeof out);
    if (rc < 0) snprintf(msg, sizeof msg, "%s", tf_last_error());
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        tfpy_raise(PyModule_GetState(mod), rc, msg);
        goto finally;
    }
    ret = PyUnicode_DecodeFSDefault(out);
finally:
    if (ends.obj) PyBuffer_Release(&ends);
    Py_XDECREF(fs);
    Py_XDECREF(dfs);
    return ret;
}

static PyObject *seq_len_warmup(PyObject *m, PyObject *args) {
    unsigned long long L, lo, steps, step;
    if (!PyArg_ParseTuple(args, "KKKK:seq_len_warmup", &L, &lo, &steps, &step)) return NULL;
    return PyLong_FromUnsignedLongLong(tf_seq_len_warmup(L, lo, steps, step));
}

static PyObject *cp_chunks(PyObject *m, PyObject *args) {
    unsigned long long L;
    unsigned int cp, r;
    if (!PyArg_ParseTuple(args, "KII:cp_chunks", &L, &cp, &r)) return NULL;
    uint64_t first[2], c;
    int rc = tf_cp_chunks(L, cp, r, first, &c);
    if (rc < 0) return tfpy_raise(PyModule_GetState(m), rc, tf_last_error());
    return Py_BuildValue("(KKK)", (unsigned long long)first[0], (unsigned long long)first[1], (unsigned long long)c);
}

static PyObject *cp_thd_positions(PyObject *m, PyObject *args) {
    PyObject *lens;
    unsigned int cp, r;
    if (!PyArg_ParseTuple(args, "OII:cp_thd_positions", &lens, &cp, &r)) return NULL;
    PyObject *fast = PySequence_Fast(lens, "cp_thd_positions: seg_lengths must be a sequence of ints");
    if (!fast) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    uint64_t *seg = PyMem_Malloc((size_t)(n ? n : 1) * sizeof *seg);
    if (!seg) {
        Py_DECREF(fast);
        return PyErr_NoMemory();
    }
    uint64_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        seg[i] = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(fast, i));
        if (PyErr_Occurred() || seg[i] > (1ull << 40) || (total += seg[i]) > (1ull << 40)) {
            PyMem_Free(seg);
            Py_DECREF(fast);
            if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_OverflowError)) {
                PyErr_Clear();
                PyErr_Format(PyExc_ValueError, "cp_thd_positions: sequence %zd: expected a length in [0, 2**40]", i);
            }
            return NULL;
        }
    }
    Py_DECREF(fast);
    /* each sequence grows by less than 2 * cp to its padded length; a rank gets 1/cp of those */
    size_t cap = (size_t)(total / (cp ? cp : 1) + 2 * (uint64_t)n + 1), len = 0;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(cap * sizeof(int64_t)));
    if (!out) {
        PyMem_Free(seg);
        return NULL;
    }
    int rc = tf_cp_thd_positions(seg, (size_t)n, cp, r, (int64_t *)PyBytes_AS_STRING(out), cap, &len);
    PyMem_Free(seg);
    if (rc < 0) {
        Py_DECREF(out);
        return tfpy_raise(PyModule_GetState(m), rc, tf_last_error());
    }
    if (_PyBytes_Resize(&out, (Py_ssize_t)(len * sizeof(int64_t))) < 0) return NULL;
    return out;
}

PyDoc_STRVAR(resolve_path_doc,
"resolve_path($module, path, format=None)\n--\n\n"
"What an open of the local path reads, by the open's own rules (tf_path_resolve):\n"
"(\"dataset\", directory), (\"pair\", prefix) or (\"file\", path). Raises\n"
"FileNotFoundError when nothing is there, ValueError for a URL, a FIFO or a\n"
"device, and tokenfeed's format error for a directory without a manifest or a\n"
"pair whose companion is not the format's.");

static PyObject *resolve_path(PyObject *mod, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"path", "format", NULL};
    PyObject *path_obj, *format_obj = Py_None, *fs = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O", kwlist, &path_obj, &format_obj)) return NULL;
    tf_format fmt = TF_FORMAT_AUTO;
    if (format_obj != Py_None) {
        const char *s = PyUnicode_AsUTF8(format_obj);
        if (!s) return NULL;
        if (tf_format_from_name(s, &fmt) != 0) {
            PyErr_Format(PyExc_ValueError, "format=%R: %s (None detects it)", format_obj, tf_last_error());
            return NULL;
        }
    }
    if (!PyUnicode_FSConverter(path_obj, &fs)) return NULL;
    const char *path = PyBytes_AS_STRING(fs);
    tf_path_kind kind = TF_PATH_FILE;
    char out[4096], msg[1024];
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = tf_path_resolve(path, fmt, &kind, out, sizeof out);
    if (rc < 0) snprintf(msg, sizeof msg, "%s", tf_last_error());
    Py_END_ALLOW_THREADS
    Py_DECREF(fs);
    if (rc < 0) return tfpy_raise(PyModule_GetState(mod), rc, msg);
    const char *name = kind == TF_PATH_DATASET ? "dataset" : kind == TF_PATH_PAIR ? "pair" : "file";
    PyObject *p = PyUnicode_DecodeFSDefault(out);
    if (!p) return NULL;
    return Py_BuildValue("(sN)", name, p);
}

static PyMethodDef module_methods[] = {
    {"seq_len_warmup", seq_len_warmup, METH_VARARGS,
     "seq_len_warmup(seq_len, min_seq_len, warmup_steps, step, /)\n--\n\nReturns int. The row length at a global step of a sequence-length warmup (tf_seq_len_warmup)."},
    {"cp_chunks", cp_chunks, METH_VARARGS,
     "cp_chunks(seq_len, cp_size, cp_rank, /)\n--\n\nReturns (first0, first1, chunk): the input positions [first_k, first_k + chunk) a context-parallel rank takes of a sample (tf_cp_chunks)."},
    {"cp_thd_positions", cp_thd_positions, METH_VARARGS,
     "cp_thd_positions(seg_lengths, cp_size, cp_rank, /)\n--\n\nReturns bytes of int64: for each entry a context-parallel rank receives of a sample in the THD layout, the sample input position it holds, or -1 for padding (tf_cp_thd_positions)."},
    {"build_info", build_info, METH_NOARGS, build_info_doc},
    {"settings", settings, METH_NOARGS, settings_doc},
    {"build_doc_index", (PyCFunction)(void (*)(void))build_doc_index, METH_VARARGS | METH_KEYWORDS, build_doc_index_doc},
    {"merge", (PyCFunction)(void (*)(void))merge, METH_VARARGS | METH_KEYWORDS, merge_doc},
    {"parse_size", parse_size, METH_VARARGS, parse_size_doc},
    {"resolve_path", (PyCFunction)(void (*)(void))resolve_path, METH_VARARGS | METH_KEYWORDS, resolve_path_doc},
    {NULL, NULL, 0, NULL},
};

int tfpy_finalizing(void) {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
}

/* The interpreter's main thread: the only one whose waits Ctrl-C ends (Python
 * runs signal handlers there). */
static unsigned long main_thread_ident;

/* tf_interrupt_set_check: on the main thread, run pending signal handlers;
 * one that raises (KeyboardInterrupt) ends the library's wait with -EINTR,
 * its exception left set for tfpy_raise. Other threads, and an interpreter
 * being finalized, are never interrupted. */
static int tfpy_interrupted(void) {
    if (PyThread_get_thread_ident() != main_thread_ident) return 0;
    if (tfpy_finalizing()) return 0;
    PyGILState_STATE g = PyGILState_Ensure();
    int r = PyErr_CheckSignals() < 0;
    PyGILState_Release(g);
    return r;
}

_Thread_local int tfpy_library_thread;

typedef struct {
    void (*destroy)(void *);
    void *h;
    PyObject *keep;
} tfpy_deferred;

static void *deferred_destroy(void *arg) {
    tfpy_deferred *d = arg;
    if (d->h) d->destroy(d->h);
    if (d->keep && !tfpy_finalizing()) {
        PyGILState_STATE g = PyGILState_Ensure();
        Py_DECREF(d->keep);
        PyGILState_Release(g);
    }
    free(d);
    return NULL;
}

void tfpy_destroy(void (*destroy)(void *), void *h, PyObject *keep) {
    if (tfpy_finalizing()) return; /* left to the ending process (TFPY_DESTROY_NOGIL) */
    if (tfpy_library_thread) {
        tfpy_deferred *d = malloc(sizeof *d);
        pthread_attr_t at;
        pthread_t t;
        int ok = d && pthread_attr_init(&at) == 0;
        if (ok) {
            *d = (tfpy_deferred){destroy, h, keep};
            pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
            ok = pthread_create(&t, &at, deferred_destroy, d) == 0;
            pthread_attr_destroy(&at);
        }
        /* no thread to do it: leaked, which is safe, where destroying it here is not */
        if (!ok) free(d);
        return;
    }
    if (h) {
        Py_BEGIN_ALLOW_THREADS
        destroy(h);
        Py_END_ALLOW_THREADS
    }
    Py_XDECREF(keep);
}

/* tf_notice_set_fn: progress lines of long waits go to the "tokenfeed" logger
 * (stderr at WARNING unless the application configured logging). Any thread;
 * nothing during finalization. */
static void tfpy_notice(const char *msg) {
    if (tfpy_finalizing()) return;
    PyGILState_STATE g = PyGILState_Ensure();
    tfpy_library_thread++;
    PyObject *et, *ev, *etb; /* a pending exception (a waiter's KeyboardInterrupt) survives */
    PyErr_Fetch(&et, &ev, &etb);
    PyObject *logging = PyImport_ImportModule("logging");
    PyObject *log = logging ? PyObject_CallMethod(logging, "getLogger", "s", "tokenfeed") : NULL;
    PyObject *r = log ? PyObject_CallMethod(log, "warning", "ss", "%s", msg) : NULL;
    Py_XDECREF(r);
    Py_XDECREF(log);
    Py_XDECREF(logging);
    PyErr_Clear();
    PyErr_Restore(et, ev, etb);
    tfpy_library_thread--;
    PyGILState_Release(g);
}

static int set_interrupt_check(void) {
    PyObject *th = PyImport_ImportModule("threading");
    PyObject *mt = th ? PyObject_CallMethod(th, "main_thread", NULL) : NULL;
    PyObject *id = mt ? PyObject_GetAttrString(mt, "ident") : NULL;
    unsigned long v = id ? PyLong_AsUnsignedLong(id) : 0;
    Py_XDECREF(id);
    Py_XDECREF(mt);
    Py_XDECREF(th);
    if (PyErr_Occurred()) return -1;
    main_thread_ident = v;
    tf_interrupt_set_check(tfpy_interrupted);
    tf_notice_set_fn(tfpy_notice);
    return 0;
}

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
#define ADD_TYPE(N) if (add_type(m, &tfpy_##N##Spec, &st->N##Type) < 0) return -1;
    TFPY_TYPES(ADD_TYPE)
#undef ADD_TYPE
    if (PyModule_AddFunctions(m, tfpy_remote_functions) < 0) return -1;
    if (PyModule_AddFunctions(m, tfpy_columns_functions) < 0) return -1;
    if (set_interrupt_check() < 0) return -1;
    if (PyModule_AddIntConstant(m, "PACK_CONCAT", TF_PACK_CONCAT) < 0 ||
        PyModule_AddIntConstant(m, "STATE_FORMAT_VERSION", TF_STATE_FORMAT_VERSION) < 0 ||
        PyModule_AddIntConstant(m, "PACK_BEST_FIT", TF_PACK_BEST_FIT) < 0 ||
        PyModule_AddIntConstant(m, "PACK_DOCUMENT", TF_PACK_DOCUMENT) < 0 ||
        PyModule_AddIntConstant(m, "SHUFFLE_NONE", TF_SHUFFLE_NONE) < 0 ||
        PyModule_AddIntConstant(m, "SHUFFLE_FULL", TF_SHUFFLE_FULL) < 0 ||
        PyModule_AddIntConstant(m, "SHUFFLE_BLOCK", TF_SHUFFLE_BLOCK) < 0 ||
        PyModule_AddIntConstant(m, "WANT_POSITION_IDS", TF_WANT_POSITION_IDS) < 0 ||
        PyModule_AddIntConstant(m, "WANT_CU_SEQLENS", TF_WANT_CU_SEQLENS) < 0 ||
        PyModule_AddIntConstant(m, "WANT_LOSS_MASK", TF_WANT_LOSS_MASK) < 0 ||
        PyModule_AddIntConstant(m, "MAX_THREADS", TF_MAX_THREADS) < 0 ||
        PyModule_AddIntConstant(m, "MAX_PREFETCH", TF_MAX_PREFETCH) < 0 ||
        PyModule_AddIntConstant(m, "BALANCE_NONE", TF_BALANCE_NONE) < 0 ||
        PyModule_AddIntConstant(m, "BALANCE_TOKENS", TF_BALANCE_TOKENS) < 0 ||
        PyModule_AddIntConstant(m, "BALANCE_ATTENTION", TF_BALANCE_ATTENTION) < 0 ||
        PyModule_AddIntConstant(m, "BALANCE_STRIDED", TF_BALANCE_STRIDED) < 0 ||
        PyModule_AddStringConstant(m, "__version__", tf_version()) < 0)
        return -1;
    return 0;
}

#define VISIT_TYPE(N) Py_VISIT(st->N##Type);
#define CLEAR_TYPE(N) Py_CLEAR(st->N##Type);

static int module_traverse(PyObject *m, visitproc visit, void *arg) {
    tf_module_state *st = PyModule_GetState(m);
    Py_VISIT(st->FormatError);
    TFPY_TYPES(VISIT_TYPE)
    return 0;
}

static int module_clear(PyObject *m) {
    tf_module_state *st = PyModule_GetState(m);
    Py_CLEAR(st->FormatError);
    TFPY_TYPES(CLEAR_TYPE)
    return 0;
}

static void module_free(void *m) { module_clear((PyObject *)m); }

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
#ifdef Py_mod_gil
    /* Free-threaded CPython (3.13t, 3.14t): the binding relies on the GIL to
     * serialise calls on one object (a Loader's state, a Dataset's caches), so
     * importing it there turns the GIL back on, with CPython's RuntimeWarning
     * that says so (docs/install.md). */
    {Py_mod_gil, Py_MOD_GIL_USED},
#endif
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
