/*
 * dataset_obj.c — _core.Dataset, _core.Writer, _core.Permutation and
 * _core.Order: thin wrappers over the sources and order layers.
 */
#include "binding.h"

#include <errno.h>

/* ------------------------------------------------------------------------ */
/* Dataset                                                                   */
/* ------------------------------------------------------------------------ */

static int parse_format(PyObject *obj, tf_format *out) {
    *out = TF_FORMAT_AUTO;
    if (obj == NULL || obj == Py_None) return 0;
    const char *s = PyUnicode_AsUTF8(obj);
    if (!s) return -1;
    static const struct { const char *name; tf_format f; } names[] = {
        {"auto", TF_FORMAT_AUTO}, {"tokenfeed", TF_FORMAT_NATIVE}, {"native", TF_FORMAT_NATIVE},
        {"megatron", TF_FORMAT_MEGATRON}, {"llm.c", TF_FORMAT_LLMC}, {"llmc", TF_FORMAT_LLMC},
        {"raw", TF_FORMAT_RAW}, {"npy", TF_FORMAT_NPY},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(s, names[i].name) == 0) {
            *out = names[i].f;
            return 0;
        }
    PyErr_Format(PyExc_ValueError, "unknown format %R: expected one of 'tokenfeed', 'megatron', 'llm.c', 'raw', 'npy' or None to detect", obj);
    return -1;
}

static PyObject *Dataset_new(PyTypeObject *tp, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"paths", "dtype", "format", NULL};
    PyObject *paths_obj, *dtype_obj = Py_None, *format_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OO:Dataset", kwlist, &paths_obj, &dtype_obj, &format_obj))
        return NULL;
    tf_module_state *st = tfpy_state_of_type(tp);
    tf_open_options opt = {TF_FORMAT_AUTO, TF_DTYPE_INVALID};
    if (tfpy_parse_dtype(dtype_obj, TF_DTYPE_INVALID, &opt.raw_dtype) < 0) return NULL;
    if (parse_format(format_obj, &opt.format) < 0) return NULL;

    PyObject *seq = PySequence_Fast(paths_obj, "paths must be a sequence of str");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    tfpy_Dataset *self = NULL;
    PyObject *paths = PyTuple_New(n);
    const char **cpaths = PyMem_Calloc(n ? (size_t)n : 1, sizeof(char *));
    if (!paths || !cpaths) {
        PyErr_NoMemory();
        goto finally;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *p = PyOS_FSPath(PySequence_Fast_GET_ITEM(seq, i));
        if (!p) goto finally;
        if (!PyUnicode_Check(p)) {
            PyObject *dec = PyUnicode_DecodeFSDefaultAndSize(PyBytes_AsString(p), PyBytes_Size(p));
            Py_DECREF(p);
            if (!dec) goto finally;
            p = dec;
        }
        PyTuple_SET_ITEM(paths, i, p);
        Py_ssize_t plen;
        cpaths[i] = PyUnicode_AsUTF8AndSize(p, &plen);
        if (!cpaths[i]) goto finally;
        if ((size_t)plen != strlen(cpaths[i])) {
            PyErr_Format(PyExc_ValueError, "path %R contains a NUL character", p);
            goto finally;
        }
    }
    tf_dataset *ds = NULL;
    int rc;
    char msg[1024];
    Py_BEGIN_ALLOW_THREADS
    rc = tf_dataset_open_many(cpaths, (size_t)n, &opt, &ds);
    if (rc < 0) snprintf(msg, sizeof msg, "%s", tf_last_error());
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        tfpy_raise(st, rc, msg);
        goto finally;
    }
    self = (tfpy_Dataset *)tp->tp_alloc(tp, 0);
    if (!self) {
        tf_dataset_free(ds);
        goto finally;
    }
    self->ds = ds;
    self->paths = paths;
    paths = NULL;
finally:
    Py_XDECREF(paths);
    PyMem_Free(cpaths);
    Py_DECREF(seq);
    return (PyObject *)self;
}

static void Dataset_dealloc(tfpy_Dataset *self) {
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    tf_dataset_free(self->ds);
    Py_CLEAR(self->paths);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static int Dataset_traverse(tfpy_Dataset *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->paths);
    return 0;
}

static PyObject *Dataset_info(tfpy_Dataset *self, void *closure) {
    tf_dataset_info in;
    tf_dataset_get_info(self->ds, &in);
    return Py_BuildValue("{s:K,s:K,s:K,s:s,s:s,s:K,s:K}", "num_tokens", (unsigned long long)in.num_tokens,
                         "num_documents", (unsigned long long)in.num_documents, "vocab_size",
                         (unsigned long long)in.vocab_size, "dtype", tf_dtype_name(in.dtype), "format",
                         tf_format_name(in.format), "num_files", (unsigned long long)in.num_files,
                         "fingerprint", (unsigned long long)in.fingerprint);
}

static PyObject *Dataset_files(tfpy_Dataset *self, PyObject *unused) {
    tf_dataset_info in;
    tf_dataset_get_info(self->ds, &in);
    PyObject *list = PyList_New(0);
    if (!list) return NULL;
    for (uint64_t i = 0; i < in.num_files; i++) {
        tf_file_info fi;
        if (tf_dataset_get_file(self->ds, i, &fi) < 0) break;
        PyObject *d = Py_BuildValue("{s:s,s:s,s:s,s:K,s:K,s:K,s:K,s:O}", "path", fi.path, "format",
                                    tf_format_name(fi.format), "dtype", tf_dtype_name(fi.dtype),
                                    "first_token", (unsigned long long)fi.first_token, "num_tokens",
                                    (unsigned long long)fi.num_tokens, "first_document",
                                    (unsigned long long)fi.first_document, "num_documents",
                                    (unsigned long long)fi.num_documents, "compressed",
                                    fi.compressed ? Py_True : Py_False);
        if (!d || PyList_Append(list, d) < 0) {
            Py_XDECREF(d);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(d);
    }
    return list;
}

PyDoc_STRVAR(Dataset_read_doc, "read($self, start, count, dtype=None)\n--\n\nReturns numpy.ndarray. Copy tokens [start, start+count), converted to dtype (default: the dataset's).");

static PyObject *Dataset_read(tfpy_Dataset *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"start", "count", "dtype", NULL};
    unsigned long long start, count;
    PyObject *dtype_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "KK|O:read", kwlist, &start, &count, &dtype_obj)) return NULL;
    tf_dataset_info in;
    tf_dataset_get_info(self->ds, &in);
    tf_dtype dt;
    if (tfpy_parse_dtype(dtype_obj, in.dtype, &dt) < 0) return NULL;
    if (start > in.num_tokens || count > in.num_tokens - start)
        return PyErr_Format(PyExc_IndexError, "tokens [%llu, %llu) out of range: the dataset has %llu tokens",
                            start, start + count, (unsigned long long)in.num_tokens);
    npy_intp dims[1] = {(npy_intp)count};
    PyObject *arr = PyArray_SimpleNew(1, dims, tfpy_npy_from_dtype(dt));
    if (!arr) return NULL;
    int rc;
    char msg[1024];
    Py_BEGIN_ALLOW_THREADS
    rc = tf_dataset_read(self->ds, start, count, PyArray_DATA((PyArrayObject *)arr), dt);
    if (rc < 0) snprintf(msg, sizeof msg, "%s", tf_last_error());
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        Py_DECREF(arr);
        return tfpy_raise(tfpy_state((PyObject *)self), rc, msg);
    }
    return arr;
}

PyDoc_STRVAR(Dataset_view_doc, "view($self, start, count, /)\n--\n\nReturns numpy.ndarray | None. Zero-copy read-only view of tokens [start, start+count) when they lie in one uncompressed mapped file, else None.");

static PyObject *Dataset_view(tfpy_Dataset *self, PyObject *args) {
    unsigned long long start, count;
    if (!PyArg_ParseTuple(args, "KK:view", &start, &count)) return NULL;
    const void *ptr;
    tf_dtype dt;
    int rc = tf_dataset_view(self->ds, start, count, &ptr, &dt);
    if (rc == -TF_EUNSUPPORTED) Py_RETURN_NONE;
    if (rc < 0) return tfpy_raise(tfpy_state((PyObject *)self), rc, NULL);
    npy_intp dims[1] = {(npy_intp)count};
    PyObject *arr = PyArray_New(&PyArray_Type, 1, dims, tfpy_npy_from_dtype(dt), NULL, (void *)ptr, 0, NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED, NULL);
    if (!arr) return NULL;
    Py_INCREF(self);
    if (PyArray_SetBaseObject((PyArrayObject *)arr, (PyObject *)self) < 0) { /* steals self even on failure */
        Py_DECREF(arr);
        return NULL;
    }
    return arr;
}

static PyObject *Dataset_document(tfpy_Dataset *self, PyObject *arg) {
    unsigned long long i = PyLong_AsUnsignedLongLong(arg);
    if (i == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    uint64_t s, n;
    int rc = tf_dataset_document(self->ds, i, &s, &n);
    if (rc < 0) return tfpy_raise(tfpy_state((PyObject *)self), rc, NULL);
    return Py_BuildValue("(KK)", (unsigned long long)s, (unsigned long long)n);
}

static PyObject *Dataset_find_document(tfpy_Dataset *self, PyObject *arg) {
    unsigned long long pos = PyLong_AsUnsignedLongLong(arg);
    if (pos == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    uint64_t d;
    int rc = tf_dataset_find_document(self->ds, pos, &d);
    if (rc < 0) return tfpy_raise(tfpy_state((PyObject *)self), rc, NULL);
    return PyLong_FromUnsignedLongLong(d);
}

typedef struct verify_cb_ctx {
    PyObject *callback;
    int failed; /* a Python exception is pending (raised by the callback or a signal) */
} verify_cb_ctx;

/* Called by tf_dataset_verify from the thread that called it, without the GIL. */
static int verify_cb(void *user, uint64_t done, uint64_t total) {
    verify_cb_ctx *c = user;
    if (c->failed) return 1;
    PyGILState_STATE g = PyGILState_Ensure();
    int stop = 0;
    if (PyErr_CheckSignals() < 0) stop = 1;
    else if (c->callback != Py_None) {
        PyObject *r = PyObject_CallFunction(c->callback, "KK", (unsigned long long)done, (unsigned long long)total);
        if (!r) stop = 1;
        Py_XDECREF(r);
    }
    if (stop) {
        /* keep the exception for the caller: fetch and restore after return */
        c->failed = 1;
    }
    PyGILState_Release(g);
    return stop;
}

PyDoc_STRVAR(Dataset_verify_doc, "verify($self, threads=0, progress=None)\n--\n\nFull check of checksums, document indices and token ids < vocab_size. progress(done_bytes, total_bytes) is called periodically.");

static PyObject *Dataset_verify(tfpy_Dataset *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"threads", "progress", NULL};
    int threads = 0;
    PyObject *progress = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|iO:verify", kwlist, &threads, &progress)) return NULL;
    verify_cb_ctx c = {progress, 0};
    int rc;
    char msg[1024];
    PyThreadState *ts = PyEval_SaveThread();
    rc = tf_dataset_verify(self->ds, threads, verify_cb, &c);
    if (rc < 0) snprintf(msg, sizeof msg, "%s", tf_last_error());
    PyEval_RestoreThread(ts);
    if (c.failed) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "verify cancelled");
        return NULL;
    }
    if (rc < 0) return tfpy_raise(tfpy_state((PyObject *)self), rc, msg);
    Py_RETURN_NONE;
}

static PyObject *Dataset_paths(tfpy_Dataset *self, void *closure) {
    Py_INCREF(self->paths);
    return self->paths;
}

static PyMethodDef Dataset_methods[] = {
    {"files", (PyCFunction)Dataset_files, METH_NOARGS, "files($self)\n--\n\nReturns list[dict]. One dict per file: path, format, dtype, counts."},
    {"read", (PyCFunction)(void (*)(void))Dataset_read, METH_VARARGS | METH_KEYWORDS, Dataset_read_doc},
    {"view", (PyCFunction)Dataset_view, METH_VARARGS, Dataset_view_doc},
    {"document", (PyCFunction)Dataset_document, METH_O, "document(i) -> (start, length)"},
    {"find_document", (PyCFunction)Dataset_find_document, METH_O, "find_document($self, pos, /)\n--\n\nReturns int. Index of the document containing token pos."},
    {"verify", (PyCFunction)(void (*)(void))Dataset_verify, METH_VARARGS | METH_KEYWORDS, Dataset_verify_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Dataset_getset[] = {
    {"info", (getter)Dataset_info, NULL, "dict of counts, dtype, vocab size, format, fingerprint", NULL},
    {"paths", (getter)Dataset_paths, NULL, "the paths the dataset was opened from", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot Dataset_slots[] = {
    {Py_tp_new, Dataset_new},
    {Py_tp_dealloc, Dataset_dealloc},
    {Py_tp_traverse, Dataset_traverse},
    {Py_tp_methods, Dataset_methods},
    {Py_tp_getset, Dataset_getset},
    {Py_tp_doc, "Dataset(paths, dtype=None, format=None)\n--\n\nToken files opened in place and concatenated."},
    {0, NULL},
};

PyType_Spec tfpy_DatasetSpec = {
    "tokenfeed._core.Dataset", sizeof(tfpy_Dataset), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, Dataset_slots,
};

/* ------------------------------------------------------------------------ */
/* Writer                                                                    */
/* ------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    tf_writer *w;
    tf_dtype dtype;
} tfpy_Writer;

/* "O&" converter for a non-negative int that must fit in 64 bits: unlike the
 * "K" format it raises OverflowError instead of wrapping. */
static int u64_converter(PyObject *o, void *out) {
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "expected an int, got %.100s", Py_TYPE(o)->tp_name);
        return 0;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return 0;
    *(unsigned long long *)out = v;
    return 1;
}

static PyObject *Writer_new(PyTypeObject *tp, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"path", "dtype", "vocab_size", "shard_tokens", "compression", "level", "block_tokens", "overwrite", NULL};
    PyObject *path_obj, *dtype_obj = Py_None, *comp_obj = Py_None;
    unsigned long long vocab = 0, shard_tokens = 0, block_tokens = 0;
    int level = 3, overwrite = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OO&O&OiO&p:Writer", kwlist, &path_obj, &dtype_obj, u64_converter, &vocab,
                                     u64_converter, &shard_tokens, &comp_obj, &level, u64_converter, &block_tokens, &overwrite))
        return NULL;
    tf_writer_options opt;
    tf_writer_options_init(&opt);
    if (tfpy_parse_dtype(dtype_obj, opt.dtype, &opt.dtype) < 0) return NULL;
    opt.vocab_size = vocab;
    if (shard_tokens) opt.shard_tokens = shard_tokens;
    if (block_tokens) opt.block_tokens = block_tokens;
    opt.level = level;
    opt.overwrite = overwrite;
    if (comp_obj != Py_None) {
        const char *c = PyUnicode_AsUTF8(comp_obj);
        if (!c) return NULL;
        if (strcmp(c, "zstd") == 0) opt.compression = TF_COMPRESS_ZSTD;
        else if (strcmp(c, "none") == 0) opt.compression = TF_COMPRESS_NONE;
        else return PyErr_Format(PyExc_ValueError, "compression must be None or 'zstd', not %R", comp_obj);
    }
    PyObject *fs = NULL;
    if (!PyUnicode_FSConverter(path_obj, &fs)) return NULL;
    tf_writer *w = NULL;
    int rc = tf_writer_create(PyBytes_AS_STRING(fs), &opt, &w);
    Py_DECREF(fs);
    if (rc < 0) return tfpy_raise(tfpy_state_of_type(tp), rc, NULL);
    tfpy_Writer *self = (tfpy_Writer *)tp->tp_alloc(tp, 0);
    if (!self) {
        tf_writer_free(w);
        return NULL;
    }
    self->w = w;
    self->dtype = opt.dtype;
    return (PyObject *)self;
}

static void Writer_dealloc(tfpy_Writer *self) {
    PyTypeObject *tp = Py_TYPE(self);
    tf_writer_free(self->w);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static int writer_check(tfpy_Writer *self) {
    if (!self->w) {
        PyErr_SetString(PyExc_ValueError, "the writer is closed");
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(Writer_add_doc, "add_document($self, tokens, /)\n--\n\nAppend one document: any 1-D integer array-like.");

static PyObject *Writer_add_document(tfpy_Writer *self, PyObject *obj) {
    if (writer_check(self) < 0) return NULL;
    PyArrayObject *arr = (PyArrayObject *)PyArray_FROMANY(obj, NPY_NOTYPE, 0, 1, NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED | NPY_ARRAY_NOTSWAPPED);
    if (!arr) return NULL;
    PyObject *result = NULL;
    int tn = PyArray_TYPE(arr);
    if (PyArray_NDIM(arr) != 1) {
        PyErr_Format(PyExc_ValueError, "a document must be a 1-D sequence of token ids, got %d dimensions", PyArray_NDIM(arr));
        goto finally;
    }
    if (PyArray_SIZE(arr) == 0) tn = NPY_INT64; /* [] has a float dtype */
    if (!PyTypeNum_ISINTEGER(tn) && !(PyArray_SIZE(arr) == 0)) {
        PyErr_Format(PyExc_TypeError, "token ids must be integers, got an array of %s (document %llu)",
                     PyArray_DESCR(arr)->typeobj->tp_name, (unsigned long long)tf_writer_num_documents(self->w));
        goto finally;
    }
    tf_dtype dt = PyArray_SIZE(arr) == 0 ? TF_INT64 : tfpy_dtype_from_npy(tn);
    if (dt == TF_DTYPE_INVALID) {
        PyErr_SetString(PyExc_TypeError, "unsupported integer dtype for token ids");
        goto finally;
    }
    int rc;
    char msg[1024];
    Py_BEGIN_ALLOW_THREADS
    rc = tf_writer_add_document(self->w, PyArray_DATA(arr), (uint64_t)PyArray_SIZE(arr), dt);
    if (rc < 0) snprintf(msg, sizeof msg, "%s", tf_last_error());
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        tf_module_state *st = tfpy_state((PyObject *)self);
        if (rc == -TF_EVOCAB) PyErr_SetString(PyExc_ValueError, msg);
        else tfpy_raise(st, rc, msg);
        goto finally;
    }
    result = Py_None;
    Py_INCREF(result);
finally:
    Py_DECREF(arr);
    return result;
}

static PyObject *Writer_finish(tfpy_Writer *self, PyObject *unused) {
    if (writer_check(self) < 0) return NULL;
    int rc;
    char msg[1024];
    Py_BEGIN_ALLOW_THREADS
    rc = tf_writer_finish(self->w);
    if (rc < 0) snprintf(msg, sizeof msg, "%s", tf_last_error());
    Py_END_ALLOW_THREADS
    tf_writer_free(self->w);
    self->w = NULL;
    if (rc < 0) return tfpy_raise(tfpy_state((PyObject *)self), rc, msg);
    Py_RETURN_NONE;
}

static PyObject *Writer_abort(tfpy_Writer *self, PyObject *unused) {
    tf_writer_free(self->w);
    self->w = NULL;
    Py_RETURN_NONE;
}

static PyObject *Writer_counts(tfpy_Writer *self, void *closure) {
    if (!self->w) Py_RETURN_NONE;
    return Py_BuildValue("(KK)", (unsigned long long)tf_writer_num_documents(self->w), (unsigned long long)tf_writer_num_tokens(self->w));
}

static PyMethodDef Writer_methods[] = {
    {"add_document", (PyCFunction)Writer_add_document, METH_O, Writer_add_doc},
    {"finish", (PyCFunction)Writer_finish, METH_NOARGS, "finish($self)\n--\n\nFlush the last shard and publish the manifest."},
    {"abort", (PyCFunction)Writer_abort, METH_NOARGS, "abort($self)\n--\n\nDiscard what was written; any previous dataset stays."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Writer_getset[] = {
    {"counts", (getter)Writer_counts, NULL, "(documents, tokens) written so far, or None when closed", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot Writer_slots[] = {
    {Py_tp_new, Writer_new},
    {Py_tp_dealloc, Writer_dealloc},
    {Py_tp_methods, Writer_methods},
    {Py_tp_getset, Writer_getset},
    {Py_tp_doc, "Writer(path, dtype, vocab_size, shard_tokens=0, compression=None, level=3, block_tokens=0, overwrite=False)"},
    {0, NULL},
};

PyType_Spec tfpy_WriterSpec = {"tokenfeed._core.Writer", sizeof(tfpy_Writer), 0, Py_TPFLAGS_DEFAULT, Writer_slots};

/* ------------------------------------------------------------------------ */
/* Permutation                                                               */
/* ------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    tf_perm p;
} tfpy_Permutation;

static PyObject *Permutation_new(PyTypeObject *tp, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"n", "key", NULL};
    unsigned long long n, key = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "K|K:Permutation", kwlist, &n, &key)) return NULL;
    tfpy_Permutation *self = (tfpy_Permutation *)tp->tp_alloc(tp, 0);
    if (!self) return NULL;
    int rc = tf_perm_init(&self->p, n, key);
    if (rc < 0) {
        Py_DECREF(self);
        if (rc == -EINVAL) return PyErr_Format(PyExc_ValueError, "a permutation needs n >= 1, got %llu", n);
        return tfpy_raise(tfpy_state_of_type(tp), rc, NULL);
    }
    return (PyObject *)self;
}

static void Permutation_dealloc(PyObject *self) {
    PyTypeObject *tp = Py_TYPE(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

/* Apply fn(ctx, x) to an int or elementwise to an integer array (as uint64,
 * GIL released), refusing inputs >= limit with IndexError. One loop for every
 * "position -> index" method of the binding. */
typedef uint64_t (*u64_map_fn)(const void *ctx, uint64_t x);

static PyObject *map_u64(PyObject *arg, u64_map_fn fn, const void *ctx, uint64_t limit) {
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

static uint64_t perm_fwd(const void *p, uint64_t i) { return tf_perm_apply(p, i); }
static uint64_t perm_inv(const void *p, uint64_t i) { return tf_perm_inverse(p, i); }
static uint64_t order_at(const void *o, uint64_t pos) { return tf_order_sample_at(o, pos); }

static PyObject *Permutation_apply(tfpy_Permutation *self, PyObject *arg) { return map_u64(arg, perm_fwd, &self->p, self->p.n); }
static PyObject *Permutation_inverse(tfpy_Permutation *self, PyObject *arg) { return map_u64(arg, perm_inv, &self->p, self->p.n); }
static PyObject *Permutation_len(tfpy_Permutation *self, void *c) { return PyLong_FromUnsignedLongLong(self->p.n); }

static PyMethodDef Permutation_methods[] = {
    {"apply", (PyCFunction)Permutation_apply, METH_O, "apply($self, i, /)\n--\n\nReturns int | ndarray. The image of i (scalar or uint64 array)."},
    {"inverse", (PyCFunction)Permutation_inverse, METH_O, "inverse($self, j, /)\n--\n\nReturns int | ndarray. The preimage of j."},
    {NULL, NULL, 0, NULL},
};
static PyGetSetDef Permutation_getset[] = {
    {"n", (getter)Permutation_len, NULL, "size of the domain", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};
static PyType_Slot Permutation_slots[] = {
    {Py_tp_new, Permutation_new},
    {Py_tp_dealloc, Permutation_dealloc},
    {Py_tp_methods, Permutation_methods},
    {Py_tp_getset, Permutation_getset},
    {Py_tp_doc, "Permutation(n, key=0)\n--\n\nThe keyed Feistel bijection on [0, n) used by the shuffle."},
    {0, NULL},
};
PyType_Spec tfpy_PermutationSpec = {"tokenfeed._core.Permutation", sizeof(tfpy_Permutation), 0, Py_TPFLAGS_DEFAULT, Permutation_slots};

/* ------------------------------------------------------------------------ */
/* Order                                                                     */
/* ------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    tf_order *o;
    PyObject *dataset; /* keeps the tf_dataset alive */
    tf_order_config cfg;
} tfpy_Order;

/* Shared with loader_obj.c through this declaration. */
int tfpy_parse_order_config(PyObject *kw, tf_order_config *cfg);

int tfpy_parse_order_config(PyObject *kw, tf_order_config *cfg) {
    tf_order_config_init(cfg);
    if (!kw) return 0;
    uint64_t pad = 0, packing = TF_PACK_CONCAT;
    static const char *u64keys[] = {"seq_len", "seed", "block_size", "window_blocks", "global_batch", "epochs",
                                    "pad_id", "pack_window", "mix_window", "packing"};
    uint64_t *u64slots[] = {&cfg->seq_len, &cfg->seed, &cfg->block_size, &cfg->window_blocks, &cfg->global_batch, &cfg->epochs,
                            &pad, &cfg->pack_window, &cfg->mix_window, &packing};
    for (size_t i = 0; i < sizeof u64keys / sizeof u64keys[0]; i++) {
        PyObject *v = PyDict_GetItemString(kw, u64keys[i]);
        if (!v || v == Py_None) continue;
        if (!PyLong_Check(v)) {
            PyErr_Format(PyExc_TypeError, "%s must be an int, not %.100s", u64keys[i], Py_TYPE(v)->tp_name);
            return -1;
        }
        int overflow = 0;
        long long sv = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (sv == -1 && PyErr_Occurred()) return -1;
        if (overflow < 0 || (!overflow && sv < 0)) {
            PyErr_Format(PyExc_ValueError, "%s must be >= 0, got %R", u64keys[i], v);
            return -1;
        }
        unsigned long long x = PyLong_AsUnsignedLongLong(v);
        if (x == (unsigned long long)-1 && PyErr_Occurred()) return -1;
        *u64slots[i] = x;
    }
    if (pad > INT64_MAX || packing > TF_PACK_DOCUMENT) {
        PyErr_Format(PyExc_ValueError, "pad_id or packing out of range");
        return -1;
    }
    cfg->pad_id = (int64_t)pad;
    cfg->packing = (tf_packing)packing;
    PyObject *v = PyDict_GetItemString(kw, "separator_id");
    if (v && v != Py_None) {
        long long s = PyLong_AsLongLong(v);
        if (s == -1 && PyErr_Occurred()) return -1;
        if (s < 0) {
            PyErr_Format(PyExc_ValueError, "separator_id must be >= 0 or None, got %lld", s);
            return -1;
        }
        cfg->separator_id = s;
    }
    v = PyDict_GetItemString(kw, "shuffle");
    if (v && v != Py_None) {
        long s = PyLong_AsLong(v);
        if (s == -1 && PyErr_Occurred()) return -1;
        if (s < TF_SHUFFLE_NONE || s > TF_SHUFFLE_BLOCK) {
            PyErr_Format(PyExc_ValueError, "unknown shuffle mode %ld", s);
            return -1;
        }
        cfg->shuffle = (tf_shuffle)s;
    }
    return 0;
}

/* Shared with loader_obj.c: a _core.Dataset (*n = 0, (*dss)[0] = its
 * dataset) or, with kw["weights"], a sequence of them with as many weights.
 * *dss and *w are PyMem_Malloc'ed (free with PyMem_Free). */
int tfpy_parse_sources(tf_module_state *st, PyObject *dsobj, PyObject *kw, const tf_dataset ***dss, double **w,
                       size_t *n);

int tfpy_parse_sources(tf_module_state *st, PyObject *dsobj, PyObject *kw, const tf_dataset ***dss, double **w,
                       size_t *n) {
    *dss = NULL;
    *w = NULL;
    *n = 0;
    PyObject *wobj = kw ? PyDict_GetItemString(kw, "weights") : NULL;
    if (!wobj || wobj == Py_None) {
        if (!PyObject_TypeCheck(dsobj, st->DatasetType)) {
            PyErr_SetString(PyExc_TypeError, "expected a _core.Dataset (or a list of them with weights=)");
            return -1;
        }
        *dss = PyMem_Malloc(sizeof **dss);
        if (!*dss) return PyErr_NoMemory(), -1;
        (*dss)[0] = ((tfpy_Dataset *)dsobj)->ds;
        return 0;
    }
    PyObject *seq = PySequence_Fast(dsobj, "a mixture needs a list of datasets");
    if (!seq) return -1;
    PyObject *wseq = PySequence_Fast(wobj, "weights must be a list of numbers");
    if (!wseq) {
        Py_DECREF(seq);
        return -1;
    }
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seq);
    int rc = -1;
    if (k < 1 || PySequence_Fast_GET_SIZE(wseq) != k) {
        PyErr_Format(PyExc_ValueError, "a mixture needs as many weights as datasets (>= 1), got %zd datasets and %zd weights",
                     k, PySequence_Fast_GET_SIZE(wseq));
        goto done;
    }
    *dss = PyMem_Malloc((size_t)k * sizeof **dss);
    *w = PyMem_Malloc((size_t)k * sizeof **w);
    if (!*dss || !*w) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *d = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyObject_TypeCheck(d, st->DatasetType)) {
            PyErr_Format(PyExc_TypeError, "mixture source %zd is not a _core.Dataset", i);
            goto done;
        }
        (*dss)[i] = ((tfpy_Dataset *)d)->ds;
        (*w)[i] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(wseq, i));
        if ((*w)[i] == -1.0 && PyErr_Occurred()) goto done;
    }
    *n = (size_t)k;
    rc = 0;
done:
    if (rc) {
        PyMem_Free(*dss);
        PyMem_Free(*w);
        *dss = NULL;
        *w = NULL;
    }
    Py_DECREF(seq);
    Py_DECREF(wseq);
    return rc;
}

static PyObject *Order_new(PyTypeObject *tp, PyObject *args, PyObject *kw) {
    PyObject *dsobj;
    if (!PyArg_ParseTuple(args, "O:Order", &dsobj)) return NULL;
    tf_module_state *st = tfpy_state_of_type(tp);
    tf_order_config cfg;
    if (tfpy_parse_order_config(kw, &cfg) < 0) return NULL;
    const tf_dataset **dss;
    double *w;
    size_t n;
    if (tfpy_parse_sources(st, dsobj, kw, &dss, &w, &n) < 0) return NULL;
    tf_order *o = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS /* building packing plans takes time */
    rc = n ? tf_order_create_mix(dss, w, n, &cfg, &o) : tf_order_create(dss[0], &cfg, &o);
    Py_END_ALLOW_THREADS
    PyMem_Free(dss);
    PyMem_Free(w);
    if (rc < 0) return tfpy_raise(st, rc, NULL);
    tfpy_Order *self = (tfpy_Order *)tp->tp_alloc(tp, 0);
    if (!self) {
        tf_order_free(o);
        return NULL;
    }
    self->o = o;
    self->cfg = cfg;
    /* a mixture keeps its sources in a tuple: a list could drop them */
    self->dataset = PyObject_TypeCheck(dsobj, st->DatasetType) ? Py_NewRef(dsobj) : PySequence_Tuple(dsobj);
    if (!self->dataset) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static void Order_dealloc(tfpy_Order *self) {
    PyTypeObject *tp = Py_TYPE(self);
    tf_order_free(self->o);
    Py_CLEAR(self->dataset);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyObject *Order_sample_at(tfpy_Order *self, PyObject *arg) {
    return map_u64(arg, order_at, self->o, UINT64_MAX);
}

PyDoc_STRVAR(Order_fill_doc, "fill($self, sample, dtype=None, want=0)\n--\n\nReturns dict. Tokens (L+1) and the requested extras of one sample.");

static PyObject *Order_fill(tfpy_Order *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"sample", "dtype", "want", NULL};
    unsigned long long sample;
    PyObject *dtype_obj = Py_None;
    unsigned int want = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "K|OI:fill", kwlist, &sample, &dtype_obj, &want)) return NULL;
    tf_dataset_info in;
    tf_dataset_get_info(tf_order_dataset(self->o), &in);
    tf_dtype dt;
    if (tfpy_parse_dtype(dtype_obj, in.dtype, &dt) < 0) return NULL;
    if (sample >= tf_order_num_samples(self->o))
        return PyErr_Format(PyExc_IndexError, "sample %llu out of range [0, %llu)", sample, (unsigned long long)tf_order_num_samples(self->o));
    uint64_t L = self->cfg.seq_len;
    npy_intp d1[1] = {(npy_intp)(L + 1)}, dL[1] = {(npy_intp)L}, d0[1] = {1};
    PyObject *tok = PyArray_SimpleNew(1, d1, tfpy_npy_from_dtype(dt));
    PyObject *pos = (want & TF_WANT_POSITION_IDS) ? PyArray_SimpleNew(1, dL, NPY_INT32) : NULL;
    PyObject *cu = (want & TF_WANT_CU_SEQLENS) ? PyArray_SimpleNew(1, d1, NPY_INT32) : NULL;
    PyObject *ns = (want & TF_WANT_CU_SEQLENS) ? PyArray_SimpleNew(1, d0, NPY_INT32) : NULL;
    PyObject *lm = (want & TF_WANT_LOSS_MASK) ? PyArray_SimpleNew(1, dL, NPY_UINT8) : NULL;
    PyObject *result = NULL;
    if (!tok || ((want & TF_WANT_POSITION_IDS) && !pos) || ((want & TF_WANT_CU_SEQLENS) && (!cu || !ns)) || ((want & TF_WANT_LOSS_MASK) && !lm))
        goto finally;
    tf_sample_extras ex = {
        pos ? PyArray_DATA((PyArrayObject *)pos) : NULL,
        cu ? PyArray_DATA((PyArrayObject *)cu) : NULL,
        ns ? PyArray_DATA((PyArrayObject *)ns) : NULL,
        lm ? PyArray_DATA((PyArrayObject *)lm) : NULL,
    };
    int rc;
    char msg[1024];
    Py_BEGIN_ALLOW_THREADS
    rc = tf_order_fill_sample(self->o, sample, PyArray_DATA((PyArrayObject *)tok), dt, &ex);
    if (rc < 0) snprintf(msg, sizeof msg, "%s", tf_last_error());
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        tfpy_raise(tfpy_state((PyObject *)self), rc, msg);
        goto finally;
    }
    result = PyDict_New();
    if (!result) goto finally;
    if (PyDict_SetItemString(result, "tokens", tok) < 0 ||
        (pos && PyDict_SetItemString(result, "position_ids", pos) < 0) ||
        (cu && PyDict_SetItemString(result, "cu_seqlens", cu) < 0) ||
        (ns && PyDict_SetItemString(result, "num_seqs", ns) < 0) ||
        (lm && PyDict_SetItemString(result, "loss_mask", lm) < 0))
        Py_CLEAR(result);
finally:
    Py_XDECREF(tok);
    Py_XDECREF(pos);
    Py_XDECREF(cu);
    Py_XDECREF(ns);
    Py_XDECREF(lm);
    return result;
}

PyDoc_STRVAR(Order_packing_stats_doc, "packing_stats($self)\n--\n\nReturns dict. "
"Packing efficiency of one epoch (a mixture: summed over sources, each over its own epoch).");

static PyObject *stats_dict(const tf_packing_stats *s) {
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:d}", "samples", (unsigned long long)s->samples,
                         "documents", (unsigned long long)s->documents, "empty_documents",
                         (unsigned long long)s->empty_documents, "token_slots", (unsigned long long)s->token_slots,
                         "pad_tokens", (unsigned long long)s->pad_tokens, "documents_split",
                         (unsigned long long)s->documents_split, "documents_truncated",
                         (unsigned long long)s->documents_truncated, "tokens_dropped",
                         (unsigned long long)s->tokens_dropped, "padding_fraction", s->padding_fraction);
}

static PyObject *Order_packing_stats(tfpy_Order *self, PyObject *unused) {
    size_t k = tf_order_num_sources(self->o);
    tf_packing_stats total;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = tf_order_packing_stats(self->o, &total);
    Py_END_ALLOW_THREADS
    if (rc < 0) return tfpy_raise(tfpy_state((PyObject *)self), rc, NULL);
    PyObject *d = stats_dict(&total);
    if (!d || tf_order_num_sources(self->o) < 2 || !tf_order_mix_window(self->o)) return d;
    PyObject *lst = PyList_New((Py_ssize_t)k);
    if (!lst) goto fail;
    for (size_t i = 0; i < k; i++) {
        tf_packing_stats one;
        rc = tf_order_packing_stats(tf_order_source(self->o, i), &one);
        if (rc < 0) {
            Py_DECREF(lst);
            tfpy_raise(tfpy_state((PyObject *)self), rc, NULL);
            goto fail;
        }
        PyObject *e = stats_dict(&one);
        if (!e) {
            Py_DECREF(lst);
            goto fail;
        }
        PyList_SET_ITEM(lst, (Py_ssize_t)i, e);
    }
    if (PyDict_SetItemString(d, "sources", lst) < 0) {
        Py_DECREF(lst);
        goto fail;
    }
    Py_DECREF(lst);
    return d;
fail:
    Py_DECREF(d);
    return NULL;
}

static PyObject *Order_mix_schedule(tfpy_Order *self, PyObject *unused) {
    size_t k = tf_order_num_sources(self->o);
    PyObject *counts = PyList_New((Py_ssize_t)k);
    if (!counts) return NULL;
    for (size_t i = 0; i < k; i++)
        PyList_SET_ITEM(counts, (Py_ssize_t)i, PyLong_FromUnsignedLongLong(tf_order_mix_count(self->o, i)));
    PyObject *r = Py_BuildValue("(KO)", (unsigned long long)tf_order_mix_window(self->o), counts);
    Py_DECREF(counts);
    return r;
}

static PyObject *Order_get_num_samples(tfpy_Order *self, void *c) { return PyLong_FromUnsignedLongLong(tf_order_num_samples(self->o)); }
static PyObject *Order_get_num_positions(tfpy_Order *self, void *c) { return PyLong_FromUnsignedLongLong(tf_order_num_positions(self->o)); }
static PyObject *Order_get_fingerprint(tfpy_Order *self, void *c) { return PyLong_FromUnsignedLongLong(tf_order_fingerprint(self->o)); }
static PyObject *Order_get_dataset_fingerprint(tfpy_Order *self, void *c) {
    tf_dataset_info in;
    tf_dataset_get_info(tf_order_dataset(self->o), &in);
    return PyLong_FromUnsignedLongLong(in.fingerprint);
}

static PyMethodDef Order_methods[] = {
    {"sample_at", (PyCFunction)Order_sample_at, METH_O, "sample_at($self, pos, /)\n--\n\nReturns int | ndarray. Sample index at global stream position(s)."},
    {"fill", (PyCFunction)(void (*)(void))Order_fill, METH_VARARGS | METH_KEYWORDS, Order_fill_doc},
    {"packing_stats", (PyCFunction)Order_packing_stats, METH_NOARGS, Order_packing_stats_doc},
    {"mix_schedule", (PyCFunction)Order_mix_schedule, METH_NOARGS, "mix_schedule($self)\n--\n\nReturns (window, [count per source]). Exact per-window counts of a mixture ((1, [1]) for one dataset)."},
    {NULL, NULL, 0, NULL},
};
static PyGetSetDef Order_getset[] = {
    {"num_samples", (getter)Order_get_num_samples, NULL, "samples per epoch (N)", NULL},
    {"num_positions", (getter)Order_get_num_positions, NULL, "positions in the stream (2**64-1 when infinite)", NULL},
    {"fingerprint", (getter)Order_get_fingerprint, NULL, "64-bit configuration fingerprint", NULL},
    {"dataset_fingerprint", (getter)Order_get_dataset_fingerprint, NULL, "64-bit fingerprint of the data read (a mixture: of its sources in order)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};
static PyType_Slot Order_slots[] = {
    {Py_tp_new, Order_new},
    {Py_tp_dealloc, Order_dealloc},
    {Py_tp_methods, Order_methods},
    {Py_tp_getset, Order_getset},
    {Py_tp_doc, "Order(dataset, **config)\n--\n\nThe global sample order: packing, shuffle and positions."},
    {0, NULL},
};
PyType_Spec tfpy_OrderSpec = {"tokenfeed._core.Order", sizeof(tfpy_Order), 0, Py_TPFLAGS_DEFAULT, Order_slots};
