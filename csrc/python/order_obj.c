/*
 * order_obj.c — _core.Order: the global sample order (tf_order), built once
 * and shared with the Loaders made from it.
 */
#include "binding.h"

/* Keep the object as given (borrowed; the caller holds the kwargs). */
static int keep_obj(PyObject *o, void *out) {
    *(PyObject **)out = o;
    return 1;
}

static int opt_int(PyObject *o, void *out) { return o == Py_None ? 1 : tfpy_nonneg_int(o, out); }

/* A Dataset (*n = 0, (*dss)[0] = its dataset) or, with weights, a sequence of
 * them with as many weights. *dss and *w are PyMem_Malloc'ed (free with
 * PyMem_Free). */
static int parse_sources(tf_module_state *st, PyObject *dsobj, PyObject *wobj, const tf_dataset ***dss, double **w,
                         size_t *n) {
    *dss = NULL;
    *w = NULL;
    *n = 0;
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

/* A list of non-negative ints (PyMem_Malloc'ed into *out, *n entries). */
static int parse_u64_list(PyObject *obj, const char *what, uint64_t **out, size_t *n) {
    *out = NULL;
    *n = 0;
    PyObject *seq = PySequence_Fast(obj, what);
    if (!seq) return -1;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seq);
    *out = PyMem_Malloc((size_t)(k ? k : 1) * sizeof **out);
    if (!*out) {
        Py_DECREF(seq);
        return PyErr_NoMemory(), -1;
    }
    for (Py_ssize_t i = 0; i < k; i++)
        if (!tfpy_u64(PySequence_Fast_GET_ITEM(seq, i), &(*out)[i])) {
            Py_DECREF(seq);
            PyMem_Free(*out);
            *out = NULL;
            return -1;
        }
    *n = (size_t)k;
    Py_DECREF(seq);
    return 0;
}

/* Schedule weights: one list of n numbers per point, flattened into *w. */
static int parse_points(PyObject *wobj, size_t npoints, size_t n, double **w) {
    *w = NULL;
    PyObject *seq = PySequence_Fast(wobj, "a schedule's weights must be a list of lists (one per point)");
    if (!seq) return -1;
    int rc = -1;
    if ((size_t)PySequence_Fast_GET_SIZE(seq) != npoints) {
        PyErr_Format(PyExc_ValueError, "a schedule needs one list of weights per step: %zu steps, %zd lists", npoints,
                     PySequence_Fast_GET_SIZE(seq));
        goto done;
    }
    *w = PyMem_Malloc(npoints * n * sizeof **w);
    if (!*w) {
        PyErr_NoMemory();
        goto done;
    }
    for (size_t m = 0; m < npoints; m++) {
        PyObject *row = PySequence_Fast(PySequence_Fast_GET_ITEM(seq, (Py_ssize_t)m), "schedule weights must be lists of numbers");
        if (!row) goto done;
        if ((size_t)PySequence_Fast_GET_SIZE(row) != n) {
            PyErr_Format(PyExc_ValueError, "schedule point %zu has %zd weights for %zu datasets", m,
                         PySequence_Fast_GET_SIZE(row), n);
            Py_DECREF(row);
            goto done;
        }
        for (size_t i = 0; i < n; i++) {
            double x = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(row, (Py_ssize_t)i));
            if (x == -1.0 && PyErr_Occurred()) {
                Py_DECREF(row);
                goto done;
            }
            (*w)[m * n + i] = x;
        }
        Py_DECREF(row);
    }
    rc = 0;
done:
    if (rc) {
        PyMem_Free(*w);
        *w = NULL;
    }
    Py_DECREF(seq);
    return rc;
}

/* Order(dataset, /, **config): None for any setting means its default; the C
 * library checks the values (tf_order_create). */
static PyObject *Order_new(PyTypeObject *tp, PyObject *args, PyObject *kw) {
    PyObject *dsobj, *wobj = NULL, *stepsobj = NULL, *anchorobj = NULL;
    int interpolation = TF_MIX_CONSTANT;
    uint64_t anchor_pos = 0;
    if (!PyArg_ParseTuple(args, "O:Order", &dsobj)) return NULL;
    tf_module_state *st = tfpy_state_of_type(tp);
    tf_order_config cfg;
    tf_order_config_init(&cfg);
    /* the order's settings come from the settings table; these are the mixture's */
    const tfpy_kwarg table[] = {
        {"weights", keep_obj, &wobj}, {"schedule_steps", keep_obj, &stepsobj},
        {"interpolation", opt_int, &interpolation}, {"anchor_position", tfpy_opt_u64, &anchor_pos},
        {"anchor_counts", keep_obj, &anchorobj},
        {NULL, NULL, NULL},
    };
    if (tfpy_parse_settings(kw, TF_SCOPE_ORDER, &cfg, table, "Order") < 0) return NULL;
    const tf_dataset **dss;
    double *w = NULL;
    size_t n;
    uint64_t *steps = NULL, *anchor = NULL;
    size_t npoints = 0, nanchor = 0;
    int sched = stepsobj && stepsobj != Py_None;
    if (sched) {
        /* a schedule: weights are one list per step; parse_sources only sees the datasets */
        if (!wobj || wobj == Py_None) {
            PyErr_SetString(PyExc_TypeError, "schedule_steps= needs weights= (one list of weights per step)");
            return NULL;
        }
        if (parse_u64_list(stepsobj, "schedule_steps must be a list of ints", &steps, &npoints) < 0) return NULL;
        PyObject *seq = PySequence_Fast(wobj, "weights must be a list");
        if (!seq) {
            PyMem_Free(steps);
            return NULL;
        }
        PyObject *first = PySequence_Fast_GET_SIZE(seq) ? PySequence_Fast_GET_ITEM(seq, 0) : Py_None;
        int rc0 = parse_sources(st, dsobj, first, &dss, &w, &n);
        Py_DECREF(seq);
        PyMem_Free(w);
        w = NULL;
        if (rc0 < 0 || parse_points(wobj, npoints, n, &w) < 0) {
            if (rc0 == 0) PyMem_Free(dss);
            PyMem_Free(steps);
            return NULL;
        }
    } else if (parse_sources(st, dsobj, wobj, &dss, &w, &n) < 0) {
        return NULL;
    }
    if (anchorobj && anchorobj != Py_None) {
        if (parse_u64_list(anchorobj, "anchor_counts must be a list of ints", &anchor, &nanchor) < 0) goto fail_args;
        if (!sched || nanchor != n) {
            PyErr_Format(PyExc_ValueError, "anchor_counts= needs schedule_steps= and one count per dataset (%zu), got %zu",
                         n, nanchor);
            goto fail_args;
        }
    }
    tf_mix_schedule ms = {npoints, steps, w, (tf_mix_interpolation)interpolation, anchor_pos, anchor};
    tf_order *o = NULL;
    int rc;
    char msg[1024];
    /* building packing plans takes time */
    TFPY_NOGIL_CALL(rc, msg, sched ? tf_order_create_mix_schedule(dss, n, &ms, &cfg, &o)
                             : n ? tf_order_create_mix(dss, w, n, &cfg, &o)
                             : tf_order_create(dss[0], &cfg, &o));
    PyMem_Free(dss);
    PyMem_Free(w);
    PyMem_Free(steps);
    PyMem_Free(anchor);
    if (rc < 0) return tfpy_raise(st, rc, msg);
    tfpy_Order *self;
    TFPY_NEW_OWNER(self, tp, o, o, tf_order_free);
    if (!self) return NULL;
    /* a mixture keeps its sources in a tuple: a list could drop them */
    self->dataset = n ? PySequence_Tuple(dsobj) : Py_NewRef(dsobj);
    if (!self->dataset) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
fail_args:
    PyMem_Free(dss);
    PyMem_Free(w);
    PyMem_Free(steps);
    PyMem_Free(anchor);
    return NULL;
}

static void Order_dealloc(tfpy_Order *self) {
    PyTypeObject *tp = Py_TYPE(self);
    tf_order_free(self->o);
    Py_CLEAR(self->dataset);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static uint64_t order_at(const void *o, uint64_t pos) { return tf_order_sample_at(o, pos); }

static PyObject *Order_sample_at(tfpy_Order *self, PyObject *arg) {
    return tfpy_map_u64(arg, order_at, self->o, UINT64_MAX);
}

static PyObject *Order_settings(tfpy_Order *self, PyObject *unused) {
    tf_order_config cfg;
    tf_order_get_config(self->o, &cfg);
    return tfpy_settings_values(TF_SCOPE_ORDER, &cfg);
}

PyDoc_STRVAR(Order_fill_doc, "fill($self, sample, dtype=None, want=0)\n--\n\nReturns dict. Tokens (L+1) and the requested extras of one sample.");

static PyObject *Order_fill(tfpy_Order *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"sample", "dtype", "want", NULL};
    uint64_t sample;
    PyObject *dtype_obj = Py_None;
    unsigned int want = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|OI:fill", kwlist, tfpy_u64, &sample, &dtype_obj, &want)) return NULL;
    tf_dataset_info in;
    tf_dataset_get_info(tf_order_dataset(self->o), &in);
    tf_dtype dt;
    if (tfpy_parse_dtype(dtype_obj, in.dtype, &dt) < 0) return NULL;
    if (sample >= tf_order_num_samples(self->o))
        return PyErr_Format(PyExc_IndexError, "sample %llu out of range [0, %llu)", (unsigned long long)sample,
                            (unsigned long long)tf_order_num_samples(self->o));
    tf_order_config cfg;
    tf_order_get_config(self->o, &cfg);
    uint64_t L = cfg.seq_len;
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
    TFPY_NOGIL_CALL(rc, msg, tf_order_fill_sample(self->o, sample, PyArray_DATA((PyArrayObject *)tok), dt, &ex));
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
    char msg[1024];
    TFPY_NOGIL_CALL(rc, msg, tf_order_packing_stats(self->o, &total));
    if (rc < 0) return tfpy_raise(tfpy_state((PyObject *)self), rc, msg);
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

static PyObject *Order_mix_source_at(tfpy_Order *self, PyObject *arg) {
    uint64_t pos;
    if (!tfpy_u64(arg, &pos)) return NULL;
    size_t src;
    uint64_t idx;
    int rc = tf_order_mix_source_at(self->o, pos, &src, &idx);
    if (rc < 0) return tfpy_raise(tfpy_state((PyObject *)self), rc, NULL);
    return Py_BuildValue("(nK)", (Py_ssize_t)src, (unsigned long long)idx);
}

static PyObject *Order_mix_source_count(tfpy_Order *self, PyObject *args) {
    Py_ssize_t src;
    uint64_t pos;
    if (!PyArg_ParseTuple(args, "nO&:mix_source_count", &src, tfpy_u64, &pos)) return NULL;
    if (src < 0 || (size_t)src >= tf_order_num_sources(self->o))
        return PyErr_Format(PyExc_IndexError, "source %zd out of range [0, %zu)", src, tf_order_num_sources(self->o));
    uint64_t c = tf_order_mix_source_count(self->o, (size_t)src, pos);
    if (c == UINT64_MAX) { /* the position's error when it cannot be told (tf_order_mix_source_at), else memory */
        size_t s;
        uint64_t j;
        int rc = tf_order_mix_source_at(self->o, pos, &s, &j);
        return rc ? tfpy_raise(tfpy_state((PyObject *)self), rc, NULL) : PyErr_NoMemory();
    }
    return PyLong_FromUnsignedLongLong(c);
}

/* balance(start, world_size, micro_batches, mode): tf_order_balance as an ndarray. */
static PyObject *Order_balance(tfpy_Order *self, PyObject *args) {
    uint64_t start;
    unsigned int R, M;
    int mode;
    if (!PyArg_ParseTuple(args, "O&IIi:balance", tfpy_u64, &start, &R, &M, &mode)) return NULL;
    tf_order_config cfg;
    tf_order_get_config(self->o, &cfg);
    uint64_t m = M ? M : 1, cap = cfg.global_batch * m;
    if (cfg.global_batch > (uint64_t)PY_SSIZE_T_MAX / 8 / m)
        return PyErr_Format(PyExc_ValueError, "micro_batches x global_batch is too large");
    npy_intp d[1] = {(npy_intp)cap};
    PyArrayObject *out = (PyArrayObject *)PyArray_SimpleNew(1, d, NPY_UINT64);
    if (!out) return NULL;
    size_t n = 0;
    int rc;
    char msg[1024];
    TFPY_NOGIL_CALL(rc, msg, tf_order_balance(self->o, start, R, M, (tf_balance)mode, PyArray_DATA(out), (size_t)cap, &n));
    if (rc < 0) {
        Py_DECREF(out);
        return tfpy_raise(tfpy_state_of_type(Py_TYPE(self)), rc, msg);
    }
    if ((uint64_t)n == cap) return (PyObject *)out;
    PyObject *r = PySequence_GetSlice((PyObject *)out, 0, (Py_ssize_t)n);
    Py_DECREF(out);
    return r;
}

/* rank_rows(batch, world_size, micro_batches, mode, rank): tf_order_rank_rows, a list. */
static PyObject *Order_rank_rows(tfpy_Order *self, PyObject *args) {
    uint64_t batch;
    unsigned int R, M, rank;
    int mode;
    if (!PyArg_ParseTuple(args, "O&IIiI:rank_rows", tfpy_u64, &batch, &R, &M, &mode, &rank)) return NULL;
    tf_order_config cfg;
    tf_order_get_config(self->o, &cfg);
    uint64_t cap = R ? cfg.global_batch / R : 0;
    if (cap > (uint64_t)PY_SSIZE_T_MAX / 8) return PyErr_Format(PyExc_ValueError, "global_batch is too large");
    uint64_t *rows = PyMem_Malloc((size_t)(cap ? cap : 1) * sizeof *rows);
    if (!rows) return PyErr_NoMemory();
    size_t n = 0;
    int rc;
    char msg[1024];
    TFPY_NOGIL_CALL(rc, msg, tf_order_rank_rows(self->o, (tf_balance)mode, R, M, batch, rank, rows, (size_t)cap, &n));
    PyObject *lst = rc < 0 ? tfpy_raise(tfpy_state_of_type(Py_TYPE(self)), rc, msg) : PyList_New((Py_ssize_t)n);
    for (size_t i = 0; lst && i < n; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(rows[i]);
        if (!v) Py_CLEAR(lst);
        else PyList_SET_ITEM(lst, (Py_ssize_t)i, v);
    }
    PyMem_Free(rows);
    return lst;
}

/* row_of(pos, world_size, micro_batches, mode): tf_order_row_of, (batch, rank, row). */
static PyObject *Order_row_of(tfpy_Order *self, PyObject *args) {
    uint64_t pos, batch = 0, row = 0;
    unsigned int R, M, rank = 0;
    int mode;
    if (!PyArg_ParseTuple(args, "O&IIi:row_of", tfpy_u64, &pos, &R, &M, &mode)) return NULL;
    int rc;
    char msg[1024];
    TFPY_NOGIL_CALL(rc, msg, tf_order_row_of(self->o, (tf_balance)mode, R, M, pos, &batch, &rank, &row));
    if (rc < 0) return tfpy_raise(tfpy_state_of_type(Py_TYPE(self)), rc, msg);
    return Py_BuildValue("(KIK)", (unsigned long long)batch, rank, (unsigned long long)row);
}

/* row_costs(start, count, mode): tf_order_row_cost of positions [start, start + count). */
static PyObject *Order_row_costs(tfpy_Order *self, PyObject *args) {
    uint64_t start, count;
    int mode;
    if (!PyArg_ParseTuple(args, "O&O&i:row_costs", tfpy_u64, &start, tfpy_u64, &count, &mode)) return NULL;
    if (count > (uint64_t)PY_SSIZE_T_MAX / 8) return PyErr_Format(PyExc_ValueError, "count is too large");
    if (count && start > UINT64_MAX - (count - 1))
        return PyErr_Format(PyExc_ValueError, "row_costs: positions [%llu, %llu + %llu) pass the last 64-bit position",
                            (unsigned long long)start, (unsigned long long)start, (unsigned long long)count);
    npy_intp d[1] = {(npy_intp)count};
    PyArrayObject *out = (PyArrayObject *)PyArray_SimpleNew(1, d, NPY_UINT64);
    if (!out) return NULL;
    uint64_t *c = PyArray_DATA(out);
    int rc = 0;
    char msg[1024];
    Py_BEGIN_ALLOW_THREADS
    for (uint64_t i = 0; i < count && rc >= 0; i++) rc = tf_order_row_cost(self->o, start + i, (tf_balance)mode, &c[i]);
    if (rc < 0) snprintf(msg, sizeof msg, "%s", tf_last_error());
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        Py_DECREF(out);
        return tfpy_raise(tfpy_state_of_type(Py_TYPE(self)), rc, msg);
    }
    return (PyObject *)out;
}

static PyObject *Order_mix_counts_at(tfpy_Order *self, PyObject *arg) {
    uint64_t pos;
    if (!tfpy_u64(arg, &pos)) return NULL;
    size_t k = tf_order_num_sources(self->o);
    uint64_t *c = PyMem_Malloc(k * sizeof *c);
    if (!c) return PyErr_NoMemory();
    uint64_t W = tf_order_mix_counts_at(self->o, pos, c);
    PyObject *counts = PyList_New((Py_ssize_t)k);
    for (size_t i = 0; counts && i < k; i++)
        PyList_SET_ITEM(counts, (Py_ssize_t)i, PyLong_FromUnsignedLongLong(c[i]));
    PyMem_Free(c);
    if (!counts) return NULL;
    PyObject *r = Py_BuildValue("(KO)", (unsigned long long)W, counts);
    Py_DECREF(counts);
    return r;
}

static PyObject *Order_get_num_samples(tfpy_Order *self, void *c) { return PyLong_FromUnsignedLongLong(tf_order_num_samples(self->o)); }
static PyObject *Order_get_epoch_positions(tfpy_Order *self, void *c) { return PyLong_FromUnsignedLongLong(tf_order_epoch_positions(self->o)); }
static PyObject *Order_get_num_positions(tfpy_Order *self, void *c) { return PyLong_FromUnsignedLongLong(tf_order_num_positions(self->o)); }
static PyObject *Order_get_fingerprint(tfpy_Order *self, void *c) { return PyLong_FromUnsignedLongLong(tf_order_fingerprint(self->o)); }
static PyObject *Order_get_dataset_fingerprint(tfpy_Order *self, void *c) {
    tf_dataset_info in;
    tf_dataset_get_info(tf_order_dataset(self->o), &in);
    return PyLong_FromUnsignedLongLong(in.fingerprint);
}

PyDoc_STRVAR(Order_state_save_doc, "state_save($self, position, world_size, /)\n--\n\nReturns str. The loader state (JSON) "
             "at a global position, saved by world_size data-parallel ranks.");

static PyObject *Order_state_save(tfpy_Order *self, PyObject *args) {
    uint64_t pos, ws;
    if (!PyArg_ParseTuple(args, "O&O&:state_save", tfpy_u64, &pos, tfpy_u64, &ws)) return NULL;
    if (ws > UINT32_MAX) return PyErr_Format(PyExc_ValueError, "state_save: world_size %llu is above 2**32 - 1",
                                             (unsigned long long)ws);
    size_t len = 0;
    int rc = tf_order_state_save(self->o, pos, (uint32_t)ws, NULL, 0, &len);
    if (rc < 0 && rc != -ENOSPC) return tfpy_raise(tfpy_state((PyObject *)self), rc, NULL);
    char *buf = PyMem_Malloc(len + 1);
    if (!buf) return PyErr_NoMemory();
    rc = tf_order_state_save(self->o, pos, (uint32_t)ws, buf, len + 1, &len);
    PyObject *r = rc < 0 ? tfpy_raise(tfpy_state((PyObject *)self), rc, NULL) : PyUnicode_FromStringAndSize(buf, (Py_ssize_t)len);
    PyMem_Free(buf);
    return r;
}

PyDoc_STRVAR(Order_state_load_doc, "state_load($self, state, lenient=False, /)\n--\n\nReturns (position, Order | None). Check "
             "a loader state (JSON text) against this order: the position to seek to, and the order to read instead "
             "when a mixture hands over (None: this one). RuntimeError (TF_ESTATE) naming what differs.");

static PyObject *Order_state_load(tfpy_Order *self, PyObject *args) {
    const char *text;
    Py_ssize_t len;
    int lenient = 0;
    if (!PyArg_ParseTuple(args, "s#|p:state_load", &text, &len, &lenient)) return NULL;
    uint64_t pos = 0;
    tf_order *h = NULL;
    int rc;
    char msg[1024];
    TFPY_NOGIL_CALL(rc, msg, tf_order_state_load(self->o, text, (size_t)len, lenient ? TF_STATE_LENIENT : 0, &pos, &h));
    if (rc < 0) return tfpy_raise(tfpy_state((PyObject *)self), rc, msg);
    if (!h) return Py_BuildValue("(KO)", (unsigned long long)pos, Py_None);
    tfpy_Order *o;
    TFPY_NEW_OWNER(o, Py_TYPE(self), o, h, tf_order_free);
    if (!o) return NULL;
    o->dataset = Py_NewRef(self->dataset);
    return Py_BuildValue("(KN)", (unsigned long long)pos, (PyObject *)o);
}

PyDoc_STRVAR(Order_mix_set_weights_doc, "mix_set_weights($self, position, weights, /)\n--\n\nReturns Order. This "
             "mixture up to a global position and the given weights from there, each source continuing where it was "
             "(tf_order_mix_set_weights); the change is recorded in the state's weights_history.");

static PyObject *Order_mix_set_weights(tfpy_Order *self, PyObject *args) {
    uint64_t pos;
    PyObject *wobj;
    if (!PyArg_ParseTuple(args, "O&O:mix_set_weights", tfpy_u64, &pos, &wobj)) return NULL;
    PyObject *wseq = PySequence_Fast(wobj, "weights must be a list of numbers");
    if (!wseq) return NULL;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(wseq);
    double *w = PyMem_Malloc(((size_t)k + 1) * sizeof *w);
    if (!w) {
        Py_DECREF(wseq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        w[i] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(wseq, i));
        if (w[i] == -1.0 && PyErr_Occurred()) {
            PyMem_Free(w);
            Py_DECREF(wseq);
            return NULL;
        }
    }
    Py_DECREF(wseq);
    tf_order *h = NULL;
    int rc;
    char msg[1024];
    TFPY_NOGIL_CALL(rc, msg, tf_order_mix_set_weights(self->o, pos, w, (size_t)k, &h));
    PyMem_Free(w);
    if (rc < 0) return tfpy_raise(tfpy_state((PyObject *)self), rc, msg);
    tfpy_Order *o;
    TFPY_NEW_OWNER(o, Py_TYPE(self), o, h, tf_order_free);
    if (!o) return NULL;
    o->dataset = Py_NewRef(self->dataset);
    return (PyObject *)o;
}

static PyObject *Order_skip(tfpy_Order *self, PyObject *args) {
    uint64_t start, stop;
    if (!PyArg_ParseTuple(args, "O&O&:skip", tfpy_u64, &start, tfpy_u64, &stop)) return NULL;
    int rc = tf_order_skip(self->o, start, stop);
    if (rc < 0) return tfpy_raise(tfpy_state((PyObject *)self), rc, NULL);
    Py_RETURN_NONE;
}

static PyObject *Order_skips(tfpy_Order *self, PyObject *unused) {
    size_t n = tf_order_skips(self->o, NULL, 0);
    uint64_t *r = PyMem_Malloc((2 * n + 1) * sizeof *r);
    if (!r) return PyErr_NoMemory();
    tf_order_skips(self->o, r, n);
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        PyObject *t = Py_BuildValue("(KK)", (unsigned long long)r[2 * i], (unsigned long long)r[2 * i + 1]);
        if (!t) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, t);
    }
    PyMem_Free(r);
    return list;
}

static PyObject *Order_exclude(tfpy_Order *self, PyObject *args) {
    uint64_t pos;
    Py_ssize_t source;
    PyObject *seq;
    if (!PyArg_ParseTuple(args, "O&nO:exclude", tfpy_u64, &pos, &source, &seq)) return NULL;
    if (source < 0) {
        PyErr_Format(PyExc_ValueError, "exclude: source must be >= 0, got %zd", source);
        return NULL;
    }
    PyObject *fast = PySequence_Fast(seq, "exclude: ids must be a sequence of document ids");
    if (!fast) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    uint64_t *ids = PyMem_Malloc(((size_t)n + 1) * sizeof *ids);
    if (!ids) {
        Py_DECREF(fast);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (!tfpy_u64(PySequence_Fast_GET_ITEM(fast, i), &ids[i])) {
            PyMem_Free(ids);
            Py_DECREF(fast);
            return NULL;
        }
    Py_DECREF(fast);
    int rc = tf_order_exclude(self->o, pos, (size_t)source, ids, (size_t)n);
    PyMem_Free(ids);
    if (rc < 0) return tfpy_raise(tfpy_state((PyObject *)self), rc, NULL);
    Py_RETURN_NONE;
}

static PyObject *Order_excluded(tfpy_Order *self, PyObject *unused) {
    size_t n = tf_order_num_excluded(self->o);
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        uint64_t pos;
        size_t src, m;
        const uint64_t *ids;
        tf_order_excluded(self->o, i, &pos, &src, &ids, &m);
        PyObject *l = PyList_New((Py_ssize_t)m);
        for (size_t k = 0; l && k < m; k++) {
            PyObject *v = PyLong_FromUnsignedLongLong(ids[k]);
            if (!v) Py_CLEAR(l);
            else PyList_SET_ITEM(l, (Py_ssize_t)k, v);
        }
        PyObject *t = l ? Py_BuildValue("(KnN)", (unsigned long long)pos, (Py_ssize_t)src, l) : NULL;
        if (!t) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, t);
    }
    return list;
}

static PyObject *Order_skip_to(tfpy_Order *self, PyObject *arg) {
    uint64_t pos;
    if (!tfpy_u64(arg, &pos)) return NULL;
    return PyLong_FromUnsignedLongLong(tf_order_skip_to(self->o, pos));
}

PyDoc_STRVAR(Order_doc, "Order(dataset, /, *, weights=None, schedule_steps=None, interpolation=None, anchor_position=None, "
                "anchor_counts=None, **settings)\n--\n\n"
                "The global sample order: packing, shuffle and positions; settings are the order's rows of settings(). "
                "`dataset` is a Dataset, or with weights a "
                "list of them (a mixture). With schedule_steps, weights holds one list per step and interpolation is "
                "0 (constant) or 1 (linear); anchor_position/anchor_counts hand over from another schedule. None "
                "means the C default (tf_order_config_init).");

TFPY_TYPE_SPEC(Order, tfpy_Order, Py_TPFLAGS_DEFAULT,
               {Py_tp_doc, (void *)Order_doc}, {Py_tp_new, Order_new}, {Py_tp_dealloc, Order_dealloc},
               {Py_tp_methods, TFPY_METHODS(
                   {"settings", (PyCFunction)Order_settings, METH_NOARGS, "settings($self)\n--\n\nReturns dict. The order's settings (every order row of _core.settings(), as the keywords take them) as the order holds them (tf_order_get_config)."},
                   {"sample_at", (PyCFunction)Order_sample_at, METH_O, "sample_at($self, pos, /)\n--\n\nReturns int | ndarray. Sample index at global stream position(s)."},
                   {"fill", (PyCFunction)(void (*)(void))Order_fill, METH_VARARGS | METH_KEYWORDS, Order_fill_doc},
                   {"packing_stats", (PyCFunction)Order_packing_stats, METH_NOARGS, Order_packing_stats_doc},
                   {"mix_schedule", (PyCFunction)Order_mix_schedule, METH_NOARGS, "mix_schedule($self)\n--\n\nReturns (window, [count per source]). Exact per-window counts of a mixture at position 0 ((1, [1]) for one dataset)."},
                   {"mix_source_at", (PyCFunction)Order_mix_source_at, METH_O, "mix_source_at($self, pos, /)\n--\n\nReturns (source, index). The source of a global position and its index in that source's own stream."},
                   {"mix_source_count", (PyCFunction)Order_mix_source_count, METH_VARARGS, "mix_source_count($self, source, pos, /)\n--\n\nReturns int. Positions of a source among positions [0, pos)."},
                   {"rank_rows", (PyCFunction)Order_rank_rows, METH_VARARGS, "rank_rows($self, batch, world_size, micro_batches, mode, rank, /)\n--\n\nReturns list. The positions rank `rank` reads as its rows of global batch `batch` (tf_order_rank_rows)."},
                   {"row_of", (PyCFunction)Order_row_of, METH_VARARGS, "row_of($self, position, world_size, micro_batches, mode, /)\n--\n\nReturns (batch, rank, row): who reads `position` (tf_order_row_of)."},
                   {"balance", (PyCFunction)Order_balance, METH_VARARGS, "balance($self, start, world_size, micro_batches, mode, /)\n--\n\nReturns ndarray. The positions of the step at start as world_size x micro_batches bins (tf_order_balance): entry (m * world_size + r) * B + j is row j of rank r's micro-batch m."},
                   {"row_costs", (PyCFunction)Order_row_costs, METH_VARARGS, "row_costs($self, start, count, mode, /)\n--\n\nReturns ndarray. The balancing cost (tf_order_row_cost) of positions [start, start + count)."},
                   {"state_save", (PyCFunction)Order_state_save, METH_VARARGS, Order_state_save_doc},
                   {"state_load", (PyCFunction)Order_state_load, METH_VARARGS, Order_state_load_doc},
                   {"mix_set_weights", (PyCFunction)Order_mix_set_weights, METH_VARARGS, Order_mix_set_weights_doc},
                   {"skip", (PyCFunction)Order_skip, METH_VARARGS, "skip($self, start, stop, /)\n--\n\nLeave global positions [start, stop) (whole global batches) out of the stream a loader delivers (tf_order_skip); kept in the state."},
                   {"skips", (PyCFunction)Order_skips, METH_NOARGS, "skips($self, /)\n--\n\nReturns list of (start, stop). The skipped ranges, ascending."},
                   {"exclude", (PyCFunction)Order_exclude, METH_VARARGS, "exclude($self, position, source, ids, /)\n--\n\nTake documents ids of source down from global position on (tf_order_exclude); kept in the state (excluded)."},
                   {"excluded", (PyCFunction)Order_excluded, METH_NOARGS, "excluded($self, /)\n--\n\nReturns list of (position, source, [ids]). The takedowns, in the order they were made."},
                   {"skip_to", (PyCFunction)Order_skip_to, METH_O, "skip_to($self, pos, /)\n--\n\nReturns int. Where a loader at pos reads: the end of the skipped range holding pos, else pos."},
                   {"mix_counts_at", (PyCFunction)Order_mix_counts_at, METH_O, "mix_counts_at($self, pos, /)\n--\n\nReturns (window, [count per source]). The exact counts per window in force at a position."},
                   {"segments_at", (PyCFunction)tfpy_Order_segments_at, METH_O, "segments_at($self, pos, /)\n--\n\nReturns list of (source, document, start, stop, offset). The document pieces that make the sample at a global position; reads no tokens."},
                   {"find_document", (PyCFunction)tfpy_Order_find_document, METH_VARARGS, "find_document($self, source, document, begin, end, /)\n--\n\nReturns list of int. The positions in [begin, end) whose sample holds tokens of the document."})},

               {Py_tp_getset, TFPY_GETSET(
                   {"num_samples", (getter)Order_get_num_samples, NULL, "samples per epoch (N)", NULL},
                   {"epoch_positions", (getter)Order_get_epoch_positions, NULL, "positions per epoch (N, or fewer where an epoch leaves samples out)", NULL},
                   {"num_positions", (getter)Order_get_num_positions, NULL, "positions in the stream (2**64-1 when infinite)", NULL},
                   {"fingerprint", (getter)Order_get_fingerprint, NULL, "64-bit configuration fingerprint", NULL},
                   {"dataset_fingerprint", (getter)Order_get_dataset_fingerprint, NULL, "64-bit fingerprint of the data read (a mixture: of its sources in order)", NULL})});
