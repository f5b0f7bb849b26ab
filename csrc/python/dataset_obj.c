/*
 * dataset_obj.c — _core.Dataset: token files opened in place and concatenated
 * (tf_dataset).
 */
#include "binding.h"

/* format= of open and its friends: a name of the format table (C:
 * tf_format_from_name, which names the known ones in its error), or None. */
static int parse_format(PyObject *obj, tf_format *out) {
    *out = TF_FORMAT_AUTO;
    if (obj == NULL || obj == Py_None) return 0;
    const char *s = PyUnicode_AsUTF8(obj);
    if (!s) return -1;
    if (tf_format_from_name(s, out) == 0) return 0;
    PyErr_Format(PyExc_ValueError, "format=%R: %s (None detects it)", obj, tf_last_error());
    return -1;
}

PyDoc_STRVAR(Dataset_formats_doc, "formats()\n--\n\n"
             "The names of the formats the C library reads, in its format table's order (format= takes each).");
static PyObject *Dataset_formats(PyObject *cls, PyObject *noargs) {
    (void)cls;
    (void)noargs;
    PyObject *out = PyList_New(0);
    for (size_t i = 0; out && tf_format_at(i) != TF_FORMAT_AUTO; i++) {
        PyObject *n = PyUnicode_FromString(tf_format_name(tf_format_at(i)));
        if (!n || PyList_Append(out, n) < 0) Py_CLEAR(out);
        Py_XDECREF(n);
    }
    if (!out) return NULL;
    PyObject *t = PyList_AsTuple(out);
    Py_DECREF(out);
    return t;
}

/* paths_obj (a sequence of str or os.PathLike) as a tuple of str and their
 * UTF-8 forms in *cpaths (PyMem, n entries; owned by the tuple's strings). */
static PyObject *as_paths(PyObject *paths_obj, const char ***cpaths, Py_ssize_t *count) {
    PyObject *seq = PySequence_Fast(paths_obj, "paths must be a sequence of str");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *paths = PyTuple_New(n);
    const char **c = PyMem_Calloc(n ? (size_t)n : 1, sizeof(char *));
    if (!paths || !c) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *p = PyOS_FSPath(PySequence_Fast_GET_ITEM(seq, i));
        if (!p) goto fail;
        if (!PyUnicode_Check(p)) {
            PyObject *dec = PyUnicode_DecodeFSDefaultAndSize(PyBytes_AsString(p), PyBytes_Size(p));
            Py_DECREF(p);
            if (!dec) goto fail;
            p = dec;
        }
        PyTuple_SET_ITEM(paths, i, p);
        Py_ssize_t plen;
        c[i] = PyUnicode_AsUTF8AndSize(p, &plen);
        if (!c[i]) goto fail;
        if ((size_t)plen != strlen(c[i])) {
            PyErr_Format(PyExc_ValueError, "path %R contains a NUL character", p);
            goto fail;
        }
    }
    Py_DECREF(seq);
    *cpaths = c;
    *count = n;
    return paths;
fail:
    Py_XDECREF(paths);
    PyMem_Free(c);
    Py_DECREF(seq);
    return NULL;
}

static int parse_open_options(PyObject *dtype_obj, PyObject *format_obj, PyObject *eos_obj, const char *index_dir,
                              tf_open_options *opt) {
    *opt = (tf_open_options){.format = TF_FORMAT_AUTO, .raw_dtype = TF_DTYPE_INVALID};
    if (tfpy_parse_dtype(dtype_obj, TF_DTYPE_INVALID, &opt->raw_dtype) < 0) return -1;
    if (parse_format(format_obj, &opt->format) < 0) return -1;
    if (eos_obj != Py_None) {
        unsigned long long e = PyLong_AsUnsignedLongLong(eos_obj);
        if (e == (unsigned long long)-1 && PyErr_Occurred()) return -1;
        opt->has_eos_id = 1;
        opt->eos_id = (uint64_t)e;
        opt->index_dir = index_dir;
    }
    return 0;
}

static PyObject *Dataset_new(PyTypeObject *tp, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"paths", "dtype", "format", "remote", "eos_id", "index_dir", "shard_set", "set_prefix",
                             "set_pattern", "listing", "immutable", "set_catalog", NULL};
    PyObject *paths_obj, *dtype_obj = Py_None, *format_obj = Py_None, *remote_obj = Py_None, *eos_obj = Py_None;
    PyObject *listing_obj = Py_None;
    const char *index_dir = NULL, *set_prefix = NULL, *set_pattern = NULL;
    int shard_set = 0, immutable = 0, set_catalog = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OOOOzizzOpp:Dataset", kwlist, &paths_obj, &dtype_obj, &format_obj,
                                     &remote_obj, &eos_obj, &index_dir, &shard_set, &set_prefix, &set_pattern,
                                     &listing_obj, &immutable, &set_catalog))
        return NULL;
    tf_remote *remote = NULL;
    if (remote_obj != Py_None && !(remote = tfpy_remote_of(remote_obj))) return NULL;
    if (immutable && shard_set != 1 && !remote) {
        PyErr_SetString(PyExc_ValueError, "immutable=True opens a local shard set from the node's catalog (shard_set=1), "
                                          "or remote paths from the node's recorded listing");
        return NULL;
    }
    if ((set_catalog || immutable) && remote && set_prefix) {
        PyErr_SetString(PyExc_ValueError, "set_catalog and immutable open remote path specs: not with set_prefix");
        return NULL;
    }
    if (shard_set && remote) {
        PyErr_SetString(PyExc_ValueError, "shard_set=True opens local shard sets only");
        return NULL;
    }
    if ((set_pattern || listing_obj != Py_None) && !set_prefix) {
        PyErr_SetString(PyExc_ValueError, "set_pattern and listing describe the remote shard set under set_prefix");
        return NULL;
    }
    if (set_prefix && (!remote || shard_set)) {
        PyErr_SetString(PyExc_ValueError, "set_prefix opens a remote shard set: it needs a remote");
        return NULL;
    }
    tf_module_state *st = tfpy_state_of_type(tp);
    tf_open_options opt;
    if (parse_open_options(dtype_obj, format_obj, eos_obj, index_dir, &opt) < 0) return NULL;
    const char **cpaths = NULL;
    Py_ssize_t n = 0;
    PyObject *paths = as_paths(paths_obj, &cpaths, &n);
    if (!paths) return NULL;
    tfpy_Dataset *self = NULL;
    tf_dataset *ds = NULL;
    int rc;
    char msg[1024];
    /* the set's listing: (url, size, version) per object under set_prefix */
    tf_remote_listing listing = {set_prefix, NULL, NULL, 0};
    PyObject *lseq = NULL;
    const char **lurls = NULL;
    tf_object_info *linfos = NULL;
    if (shard_set == 2 && n != 2) {
        PyErr_SetString(PyExc_ValueError, "shard_set=2 opens [prefix, pattern] from the catalog beside the data");
        goto finally;
    }
    if (listing_obj != Py_None) {
        lseq = PySequence_Fast(listing_obj, "listing must be a sequence of (url, size, version)");
        if (!lseq) goto finally;
        Py_ssize_t ln = PySequence_Fast_GET_SIZE(lseq);
        lurls = PyMem_Calloc((size_t)ln + 1, sizeof *lurls);
        linfos = PyMem_Calloc((size_t)ln + 1, sizeof *linfos);
        if (!lurls || !linfos) {
            PyErr_NoMemory();
            goto finally;
        }
        for (Py_ssize_t i = 0; i < ln; i++) {
            const char *u, *v;
            unsigned long long size;
            if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(lseq, i), "sKs;listing: expected (url, size, version)", &u,
                                  &size, &v))
                goto finally;
            if (strlen(v) >= sizeof linfos[i].version) {
                PyErr_Format(PyExc_ValueError, "%s: version longer than %d bytes", u, (int)sizeof linfos[i].version - 1);
                goto finally;
            }
            lurls[i] = u;
            linfos[i].size = (uint64_t)size;
            memcpy(linfos[i].version, v, strlen(v) + 1);
        }
        listing.urls = lurls;
        listing.infos = linfos;
        listing.n = (size_t)ln;
    }
    if (shard_set == 2) TFPY_NOGIL_CALL(rc, msg, tf_dataset_open_data_catalog(cpaths[0], cpaths[1], &opt, &ds));
    else if (shard_set)
        TFPY_NOGIL_CALL(rc, msg, tf_dataset_open_spec(cpaths, (size_t)n, &opt,
                                                      TF_OPEN_CATALOG_ONLY | (immutable ? TF_OPEN_IMMUTABLE : 0u), &ds));
    else if (set_prefix)
        TFPY_NOGIL_CALL(rc, msg, tf_dataset_open_remote_set(cpaths, (size_t)n, set_prefix, set_pattern,
                                                            lseq ? &listing : NULL, &opt, remote, &ds));
    else if (remote && (immutable || set_catalog))
        TFPY_NOGIL_CALL(rc, msg, tf_dataset_open_remote_spec(cpaths, (size_t)n, &opt,
                                                             (immutable ? TF_OPEN_IMMUTABLE : 0u) |
                                                                 (set_catalog ? TF_OPEN_SET_CATALOG : 0u),
                                                             remote, &ds));
    else TFPY_NOGIL_CALL(rc, msg, tf_dataset_open_remote(cpaths, (size_t)n, &opt, remote, &ds));
    if (rc < 0) {
        tfpy_raise(st, rc, msg);
        goto finally;
    }
    TFPY_NEW_OWNER(self, tp, ds, ds, tf_dataset_free);
    if (!self) goto finally;
    self->paths = paths;
    paths = NULL;
finally:
    Py_XDECREF(paths);
    PyMem_Free(cpaths);
    PyMem_Free(lurls);
    PyMem_Free(linfos);
    Py_XDECREF(lseq);
    return (PyObject *)self;
}

PyDoc_STRVAR(Dataset_recorded_doc,
             "recorded(remote, urls, dtype=None, format=None, eos_id=None, index_dir=None, set_prefix=None, "
             "set_pattern=None)\n--\n\n"
             "Returns bool. Whether the node's cache of remote holds the metadata of opening exactly urls with "
             "these options (an open of them then sends no request); with set_prefix and set_pattern, of opening "
             "them from that shard set's catalog.");

static PyObject *Dataset_recorded(PyObject *unused, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"remote", "urls", "dtype", "format", "eos_id", "index_dir", "set_prefix", "set_pattern",
                             NULL};
    PyObject *remote_obj, *urls_obj, *dtype_obj = Py_None, *format_obj = Py_None, *eos_obj = Py_None;
    const char *index_dir = NULL, *set_prefix = NULL, *set_pattern = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|OOOzzz:recorded", kwlist, &remote_obj, &urls_obj, &dtype_obj,
                                     &format_obj, &eos_obj, &index_dir, &set_prefix, &set_pattern))
        return NULL;
    tf_remote *remote = tfpy_remote_of(remote_obj);
    if (!remote) return NULL;
    tf_open_options opt;
    if (parse_open_options(dtype_obj, format_obj, eos_obj, index_dir, &opt) < 0) return NULL;
    const char **curls = NULL;
    Py_ssize_t n = 0;
    PyObject *urls = as_paths(urls_obj, &curls, &n);
    if (!urls) return NULL;
    int has = set_prefix && set_pattern
                  ? tf_remote_has_set_record(remote, curls, (size_t)n, set_prefix, set_pattern, &opt)
                  : tf_remote_has_record(remote, curls, (size_t)n, &opt);
    Py_DECREF(urls);
    PyMem_Free(curls);
    return PyBool_FromLong(has);
}

PyDoc_STRVAR(Dataset_write_data_catalog_doc,
             "write_data_catalog($self, prefix, pattern, dtype=None, format=None, eos_id=None, index_dir=None)\n--\n\n"
             "Returns str. Write this dataset, opened from the files named prefix + a name matching pattern, as "
             "that shard set's catalog beside the data; the catalog's path.");

static PyObject *Dataset_write_data_catalog(tfpy_Dataset *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"prefix", "pattern", "dtype", "format", "eos_id", "index_dir", NULL};
    const char *prefix, *pattern, *index_dir = NULL;
    PyObject *dtype_obj = Py_None, *format_obj = Py_None, *eos_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "ss|OOOz:write_data_catalog", kwlist, &prefix, &pattern, &dtype_obj,
                                     &format_obj, &eos_obj, &index_dir))
        return NULL;
    tf_open_options opt;
    if (parse_open_options(dtype_obj, format_obj, eos_obj, index_dir, &opt) < 0) return NULL;
    char path[4096], msg[1024];
    int rc;
    TFPY_NOGIL_CALL(rc, msg, tf_dataset_write_data_catalog(self->ds, prefix, pattern, &opt, path, sizeof path));
    if (rc < 0) return tfpy_raise(tfpy_state_of_type(Py_TYPE(self)), rc, msg);
    return PyUnicode_DecodeFSDefault(path);
}

PyDoc_STRVAR(Dataset_remote_set_catalog_doc,
             "remote_set_catalog($self, prefix, pattern, dtype=None, format=None, eos_id=None)\n--\n\n"
             "Returns bytes. The catalog of this dataset, opened from the objects prefix + names matching pattern "
             "as listed, to be stored as the object prefix + set_catalog_name(pattern, ...).");

static PyObject *Dataset_remote_set_catalog(tfpy_Dataset *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"prefix", "pattern", "dtype", "format", "eos_id", NULL};
    const char *prefix, *pattern;
    PyObject *dtype_obj = Py_None, *format_obj = Py_None, *eos_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "ss|OOO:remote_set_catalog", kwlist, &prefix, &pattern, &dtype_obj,
                                     &format_obj, &eos_obj))
        return NULL;
    tf_open_options opt;
    if (parse_open_options(dtype_obj, format_obj, eos_obj, NULL, &opt) < 0) return NULL;
    char msg[1024];
    int rc;
    size_t len = 0;
    TFPY_NOGIL_CALL(rc, msg, tf_dataset_remote_set_catalog(self->ds, prefix, pattern, &opt, NULL, 0, &len));
    if (rc < 0 && rc != -ENOSPC) return tfpy_raise(tfpy_state_of_type(Py_TYPE(self)), rc, msg);
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)len);
    if (!out) return NULL;
    void *buf = PyBytes_AS_STRING(out);
    size_t len2 = 0;
    TFPY_NOGIL_CALL(rc, msg, tf_dataset_remote_set_catalog(self->ds, prefix, pattern, &opt, buf, len, &len2));
    if (rc < 0 || len2 != len) {
        Py_DECREF(out);
        return tfpy_raise(tfpy_state_of_type(Py_TYPE(self)), rc < 0 ? rc : -EAGAIN, msg);
    }
    return out;
}

PyDoc_STRVAR(Dataset_set_catalog_name_doc,
             "set_catalog_name(pattern, dtype=None, format=None, eos_id=None)\n--\n\n"
             "Returns str. The name, under a remote shard set's prefix, of the catalog of the objects matching "
             "pattern opened with these options.");

static PyObject *Dataset_set_catalog_name(PyObject *unused, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"pattern", "dtype", "format", "eos_id", NULL};
    const char *pattern;
    PyObject *dtype_obj = Py_None, *format_obj = Py_None, *eos_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|OOO:set_catalog_name", kwlist, &pattern, &dtype_obj, &format_obj,
                                     &eos_obj))
        return NULL;
    tf_open_options opt;
    if (parse_open_options(dtype_obj, format_obj, eos_obj, NULL, &opt) < 0) return NULL;
    char name[64];
    if (tf_remote_set_catalog_name(pattern, &opt, name, sizeof name) < 0) {
        PyErr_SetString(PyExc_ValueError, tf_last_error());
        return NULL;
    }
    return PyUnicode_FromString(name);
}

PyDoc_STRVAR(Dataset_write_dataset_catalog_doc,
             "write_dataset_catalog($self, dataset_dir)\n--\n\n"
             "Returns str. Write the catalog of this tokenfeed dataset, opened from dataset_dir, into that "
             "directory (tokenfeed.catalog) from the shards as opened, none read again; the catalog's path.");

static PyObject *Dataset_write_dataset_catalog(tfpy_Dataset *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"dataset_dir", NULL};
    const char *dir;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s:write_dataset_catalog", kwlist, &dir)) return NULL;
    char path[4096], msg[1024];
    int rc;
    TFPY_NOGIL_CALL(rc, msg, tf_dataset_write_dataset_catalog(self->ds, dir, path, sizeof path));
    if (rc < 0) return tfpy_raise(tfpy_state_of_type(Py_TYPE(self)), rc, msg);
    return PyUnicode_DecodeFSDefault(path);
}

PyDoc_STRVAR(Dataset_catalog_set_doc,
             "catalog_set($self, spec, dirs, ids, dtype=None, format=None, eos_id=None, index_dir=None)\n--\n\n"
             "Returns bool. Record this dataset, opened from the files spec expanded to, as the shard set spec "
             "in the node's catalog; dirs hold every file, ids are their (st_dev, st_ino, st_size, st_mtime_ns) "
             "when listed. False when not recorded.");

static PyObject *Dataset_catalog_set(tfpy_Dataset *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"spec", "dirs", "ids", "dtype", "format", "eos_id", "index_dir", NULL};
    PyObject *spec_obj, *dirs_obj, *ids_obj, *dtype_obj = Py_None, *format_obj = Py_None, *eos_obj = Py_None;
    const char *index_dir = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|OOOz:catalog_set", kwlist, &spec_obj, &dirs_obj, &ids_obj,
                                     &dtype_obj, &format_obj, &eos_obj, &index_dir))
        return NULL;
    tf_open_options opt;
    if (parse_open_options(dtype_obj, format_obj, eos_obj, index_dir, &opt) < 0) return NULL;
    const char **cspec = NULL, **cdirs = NULL;
    Py_ssize_t nspec = 0, ndirs = 0;
    uint64_t *ids = NULL;
    PyObject *result = NULL, *dirs = NULL, *idseq = NULL;
    PyObject *spec = as_paths(spec_obj, &cspec, &nspec);
    if (!spec || !(dirs = as_paths(dirs_obj, &cdirs, &ndirs))) goto finally;
    if (!(idseq = PySequence_Fast(ids_obj, "ids must be a sequence of 4-tuples of int"))) goto finally;
    if (PySequence_Fast_GET_SIZE(idseq) != ndirs) {
        PyErr_SetString(PyExc_ValueError, "ids must have one 4-tuple per directory");
        goto finally;
    }
    if (!(ids = PyMem_Calloc(4 * (size_t)ndirs + 1, sizeof *ids))) {
        PyErr_NoMemory();
        goto finally;
    }
    for (Py_ssize_t k = 0; k < ndirs; k++) {
        unsigned long long v[4];
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(idseq, k), "KKKK", &v[0], &v[1], &v[2], &v[3])) goto finally;
        for (int j = 0; j < 4; j++) ids[4 * k + j] = (uint64_t)v[j];
    }
    int rc;
    char msg[1024];
    TFPY_NOGIL_CALL(rc, msg, tf_dataset_catalog_set(self->ds, cspec, (size_t)nspec, &opt, cdirs, ids, (size_t)ndirs));
    if (rc < 0) {
        tfpy_raise(tfpy_state_of_type(Py_TYPE(self)), rc, msg);
        goto finally;
    }
    result = PyBool_FromLong(rc == 0);
finally:
    Py_XDECREF(spec);
    Py_XDECREF(dirs);
    Py_XDECREF(idseq);
    PyMem_Free(cspec);
    PyMem_Free(cdirs);
    PyMem_Free(ids);
    return result;
}

static void dataset_free(void *ds) { tf_dataset_free(ds); }

static void Dataset_dealloc(tfpy_Dataset *self) {
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    /* a remote dataset may drop the last reference to its store, whose fetch
     * threads may be waiting for the GIL in a transport call */
    tf_dataset *ds = self->ds;
    self->ds = NULL;
    /* a view goes before the dataset whose files it reads */
    PyObject *parent = self->parent;
    self->parent = NULL;
    tfpy_destroy(dataset_free, ds, parent);
    Py_CLEAR(self->paths);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static int Dataset_traverse(tfpy_Dataset *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->paths);
    Py_VISIT(self->parent);
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
    TFPY_NOGIL_CALL(rc, msg, tf_dataset_read(self->ds, start, count, PyArray_DATA((PyArrayObject *)arr), dt));
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
    int rc;
    char msg[1024];
    /* (a shard opened on first touch may be mapped, or fetched, first) */
    TFPY_NOGIL_CALL(rc, msg, tf_dataset_view(self->ds, start, count, &ptr, &dt));
    if (rc == -TF_EUNSUPPORTED) Py_RETURN_NONE;
    if (rc < 0) return tfpy_raise(tfpy_state((PyObject *)self), rc, msg);
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
    int rc;
    char msg[1024];
    /* without the GIL: the document's shard may be opened on first touch,
     * through a remote transport written in Python */
    TFPY_NOGIL_CALL(rc, msg, tf_dataset_document(self->ds, i, &s, &n));
    if (rc < 0) return tfpy_raise(tfpy_state((PyObject *)self), rc, msg);
    return Py_BuildValue("(KK)", (unsigned long long)s, (unsigned long long)n);
}

static PyObject *Dataset_find_document(tfpy_Dataset *self, PyObject *arg) {
    unsigned long long pos = PyLong_AsUnsignedLongLong(arg);
    if (pos == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    uint64_t d;
    int rc;
    char msg[1024];
    TFPY_NOGIL_CALL(rc, msg, tf_dataset_find_document(self->ds, pos, &d));
    if (rc < 0) return tfpy_raise(tfpy_state((PyObject *)self), rc, msg);
    return PyLong_FromUnsignedLongLong(d);
}

static PyObject *Dataset_check_documents(tfpy_Dataset *self, PyObject *unused) {
    int rc = tf_dataset_check_documents(self->ds);
    if (rc < 0) return tfpy_raise(tfpy_state((PyObject *)self), rc, tf_last_error());
    Py_RETURN_NONE;
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

PyDoc_STRVAR(Dataset_doc, "Dataset(paths, dtype=None, format=None)\n--\n\nToken files opened in place and concatenated.");

TFPY_TYPE_SPEC(Dataset, tfpy_Dataset, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
               {Py_tp_doc, (void *)Dataset_doc}, {Py_tp_new, Dataset_new}, {Py_tp_dealloc, Dataset_dealloc},
               {Py_tp_traverse, Dataset_traverse},
               {Py_tp_methods, TFPY_METHODS(
                   {"catalog_set", (PyCFunction)(void (*)(void))Dataset_catalog_set, METH_VARARGS | METH_KEYWORDS, Dataset_catalog_set_doc},
                   {"write_data_catalog", (PyCFunction)(void (*)(void))Dataset_write_data_catalog, METH_VARARGS | METH_KEYWORDS, Dataset_write_data_catalog_doc},
                   {"write_dataset_catalog", (PyCFunction)(void (*)(void))Dataset_write_dataset_catalog, METH_VARARGS | METH_KEYWORDS, Dataset_write_dataset_catalog_doc},
                   {"formats", (PyCFunction)Dataset_formats, METH_NOARGS | METH_STATIC, Dataset_formats_doc},
                   {"recorded", (PyCFunction)(void (*)(void))Dataset_recorded, METH_VARARGS | METH_KEYWORDS | METH_STATIC, Dataset_recorded_doc},
                   {"set_catalog_name", (PyCFunction)(void (*)(void))Dataset_set_catalog_name, METH_VARARGS | METH_KEYWORDS | METH_STATIC, Dataset_set_catalog_name_doc},
                   {"remote_set_catalog", (PyCFunction)(void (*)(void))Dataset_remote_set_catalog, METH_VARARGS | METH_KEYWORDS, Dataset_remote_set_catalog_doc},
                   {"files", (PyCFunction)Dataset_files, METH_NOARGS, "files($self)\n--\n\nReturns list[dict]. One dict per file: path, format, dtype, counts."},
                   {"read", (PyCFunction)(void (*)(void))Dataset_read, METH_VARARGS | METH_KEYWORDS, Dataset_read_doc},
                   {"view", (PyCFunction)Dataset_view, METH_VARARGS, Dataset_view_doc},
                   {"document", (PyCFunction)Dataset_document, METH_O, "document(i) -> (start, length)"},
                   {"find_document", (PyCFunction)Dataset_find_document, METH_O, "find_document($self, pos, /)\n--\n\nReturns int. Index of the document containing token pos."},
                   {"check_documents", (PyCFunction)Dataset_check_documents, METH_NOARGS, "check_documents($self, /)\n--\n\nReturns None. ValueError naming the file and the tokenfeed index command when a file split at an eos id has no document index (its documents are known only inside concat rows)."},
                   {"verify", (PyCFunction)(void (*)(void))Dataset_verify, METH_VARARGS | METH_KEYWORDS, Dataset_verify_doc},
                   {"select", (PyCFunction)tfpy_dataset_select, METH_O, "select($self, ids, /)\n--\n\nReturns Dataset. The view of the documents ids (ascending, distinct uint64)."},
                   {"selection", (PyCFunction)tfpy_dataset_selection, METH_NOARGS, "selection($self, /)\n--\n\nReturns tuple[int, int] | None. A view's documents and tokens; None for a dataset."},
                   {"document_id", (PyCFunction)tfpy_dataset_document_id, METH_O, "document_id($self, i, /)\n--\n\nReturns int. The id, in the dataset a view selects from, of its document i."})},
               {Py_tp_getset, TFPY_GETSET(
                   {"info", (getter)Dataset_info, NULL, "dict of counts, dtype, vocab size, format, fingerprint", NULL},
                   {"paths", (getter)Dataset_paths, NULL, "the paths the dataset was opened from", NULL})});
