/*
 * writer_obj.c — _core.Writer: writes the native format (tf_writer).
 */
#include "binding.h"

#define TF_CHUNK_SUMS_DEFAULT_ UINT64_MAX /* chunk_checksum_bytes not given */

typedef struct {
    PyObject_HEAD
    tf_writer *w;
    tf_dtype dtype;
} tfpy_Writer;

static PyObject *Writer_new(PyTypeObject *tp, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"path", "dtype", "vocab_size", "shard_tokens", "compression", "level", "block_tokens", "overwrite",
                             "chunk_checksum_bytes", NULL};
    PyObject *path_obj, *dtype_obj = Py_None, *comp_obj = Py_None;
    uint64_t vocab = 0, shard_tokens = 0, block_tokens = 0, chunk_sums = TF_CHUNK_SUMS_DEFAULT_;
    int level = 3, overwrite = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OO&O&OiO&pO&:Writer", kwlist, &path_obj, &dtype_obj, tfpy_u64, &vocab,
                                     tfpy_u64, &shard_tokens, &comp_obj, &level, tfpy_u64, &block_tokens, &overwrite,
                                     tfpy_opt_u64, &chunk_sums))
        return NULL;
    tf_writer_options opt;
    tf_writer_options_init(&opt);
    if (tfpy_parse_dtype(dtype_obj, opt.dtype, &opt.dtype) < 0) return NULL;
    opt.vocab_size = vocab;
    if (shard_tokens) opt.shard_tokens = shard_tokens;
    if (block_tokens) opt.block_tokens = block_tokens;
    opt.level = level;
    opt.overwrite = overwrite;
    if (chunk_sums != TF_CHUNK_SUMS_DEFAULT_) opt.chunk_checksum_bytes = chunk_sums; /* None: the default */
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
    if (rc == -EBUSY) { /* another writer holds the directory: an OSError, not the device ring's RuntimeError */
        PyObject *a = Py_BuildValue("(is)", EBUSY, tf_last_error());
        if (a) PyErr_SetObject(PyExc_OSError, a);
        Py_XDECREF(a);
        return NULL;
    }
    if (rc < 0) return tfpy_raise(tfpy_state_of_type(tp), rc, NULL);
    tfpy_Writer *self;
    TFPY_NEW_OWNER(self, tp, w, w, tf_writer_free);
    if (!self) return NULL;
    self->dtype = opt.dtype;
    return (PyObject *)self;
}

static void Writer_dealloc(tfpy_Writer *self) {
    tf_writer_free(self->w);
    tfpy_free_instance((PyObject *)self);
}

static int writer_check(tfpy_Writer *self) { return tfpy_check_open(self->w, "writer"); }

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
    TFPY_NOGIL_CALL(rc, msg, tf_writer_add_document(self->w, PyArray_DATA(arr), (uint64_t)PyArray_SIZE(arr), dt));
    if (rc < 0) {
        tfpy_raise_input(tfpy_state((PyObject *)self), rc, msg);
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
    TFPY_NOGIL_CALL(rc, msg, tf_writer_finish(self->w));
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

PyDoc_STRVAR(Writer_doc, "Writer(path, dtype, vocab_size, shard_tokens=0, compression=None, level=3, block_tokens=0, overwrite=False, chunk_checksum_bytes=None)");

TFPY_TYPE_SPEC(Writer, tfpy_Writer, Py_TPFLAGS_DEFAULT,
               {Py_tp_doc, (void *)Writer_doc}, {Py_tp_new, Writer_new}, {Py_tp_dealloc, Writer_dealloc},
               {Py_tp_methods, TFPY_METHODS(
                   {"add_document", (PyCFunction)Writer_add_document, METH_O, Writer_add_doc},
                   {"finish", (PyCFunction)Writer_finish, METH_NOARGS, "finish($self)\n--\n\nFlush the last shard and publish the manifest."},
                   {"abort", (PyCFunction)Writer_abort, METH_NOARGS, "abort($self)\n--\n\nDiscard what was written; any previous dataset stays."})},
               {Py_tp_getset, TFPY_GETSET(
                   {"counts", (getter)Writer_counts, NULL, "(documents, tokens) written so far, or None when closed", NULL})});
