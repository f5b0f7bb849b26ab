/*
 * remote_obj.c — tokenfeed._core.Remote: a tf_remote whose transport is a
 * Python object (tokenfeed.remote._remote.ObjectStoreTransport, or any object with
 * the same two methods), and the cache directory functions.
 *
 * Threads and the GIL. The C core calls the transport from its fetch threads
 * (and from whichever thread reads). Each callback takes the GIL only around
 * the Python call (PyGILState_Ensure / Release); obstore releases it again
 * while the request is in flight, so fetch threads overlap their I/O.
 * Therefore every binding call that can wait for a fetch (open, reads,
 * verify, next(), and frees that join fetch threads) must run without the
 * GIL, or a fetch thread waiting for the GIL and the caller waiting for the
 * fetch would deadlock.
 *
 * Shutdown. At exit (tokenfeed.remote._remote registers an atexit function that
 * calls shutdown_transports) the callbacks start refusing new requests
 * (-ECANCELED) and the calls in flight are given a bounded time to return,
 * while the interpreter can still take them back; during finalization they
 * refuse too, and handles are no longer freed (TFPY_DESTROY_NOGIL): a fetch
 * thread whose call returns to a finalizing interpreter is parked there for
 * good, and joining it would hang the exit.
 */
#include "binding.h"

#include <structmember.h>

#include <errno.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

typedef struct {
    PyObject_HEAD
    tf_remote *r;
    PyObject *transport;
    PyObject *cache_dir; /* str */
    PyObject *weakrefs;  /* tokenfeed.remote._remote keeps its stores by weak reference */
} tfpy_Remote;

static _Atomic int shutting_down; /* set at exit: no new transport calls */
static _Atomic long in_flight;     /* transport calls between refuse() and done() */

/* Whether a transport callback must refuse; otherwise it is counted in flight
 * until done(). */
static int refuse(void) {
    if (atomic_load(&shutting_down) || tfpy_finalizing()) {
        tf_transport_set_error("the interpreter is exiting");
        return 1;
    }
    atomic_fetch_add(&in_flight, 1);
    return 0;
}
static void done(void) { atomic_fetch_sub(&in_flight, 1); }

/* Turn the pending Python exception into a negative code and a transport
 * message (GIL held). OSError keeps its errno; anything else is -EIO. */
static int code_from_exception(void) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    int code = -EIO;
    if (value && PyObject_IsInstance(value, PyExc_OSError) == 1) {
        PyObject *en = PyObject_GetAttrString(value, "errno");
        if (en && PyLong_Check(en)) {
            long e = PyLong_AsLong(en);
            if (e > 0 && e < 4096) code = -(int)e;
        }
        Py_XDECREF(en);
        PyErr_Clear();
        PyObject *s = PyObject_GetAttrString(value, "strerror");
        if (s && PyUnicode_Check(s)) tf_transport_set_error("%s", PyUnicode_AsUTF8(s));
        else tf_transport_set_error("%s", tf_strerror(code));
        Py_XDECREF(s);
    } else if (value) {
        PyObject *s = PyObject_Str(value);
        const char *tn = type ? ((PyTypeObject *)type)->tp_name : "error";
        tf_transport_set_error("%s: %s", tn, s && PyUnicode_Check(s) ? PyUnicode_AsUTF8(s) : "");
        Py_XDECREF(s);
    }
    PyErr_Clear();
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return code;
}

static int py_stat(void *ctx, const char *url, tf_object_info *info) {
    if (refuse()) return -ECANCELED;
    PyGILState_STATE g = PyGILState_Ensure();
    tfpy_library_thread++;
    int rc = 0;
    PyObject *res = PyObject_CallMethod((PyObject *)ctx, "stat", "s", url);
    if (!res) {
        rc = code_from_exception();
    } else {
        unsigned long long size;
        const char *ver;
        if (!PyArg_ParseTuple(res, "Ks;stat() must return (size, version)", &size, &ver)) {
            rc = code_from_exception();
        } else {
            info->size = size;
            snprintf(info->version, sizeof info->version, "%s", ver);
        }
        Py_DECREF(res);
    }
    tfpy_library_thread--;
    PyGILState_Release(g);
    done();
    return rc;
}

static int64_t py_read(void *ctx, const char *url, const tf_object_info *expect, uint64_t off, void *buf,
                       size_t len) {
    if (refuse()) return -ECANCELED;
    PyGILState_STATE g = PyGILState_Ensure();
    tfpy_library_thread++;
    int64_t rc;
    PyObject *mv = PyMemoryView_FromMemory(buf, (Py_ssize_t)len, PyBUF_WRITE);
    PyObject *res = mv ? PyObject_CallMethod((PyObject *)ctx, "read_into", "ssKKO", url, expect->version,
                                             (unsigned long long)expect->size, (unsigned long long)off, mv)
                       : NULL;
    if (!res) {
        rc = code_from_exception();
    } else {
        long long n = PyLong_AsLongLong(res);
        if (n == -1 && PyErr_Occurred()) rc = code_from_exception();
        else rc = n;
        Py_DECREF(res);
    }
    if (mv) {
        /* the buffer belongs to the C core: no Python object may keep it */
        PyObject *r = PyObject_CallMethod(mv, "release", NULL);
        if (!r) PyErr_Clear();
        Py_XDECREF(r);
        Py_DECREF(mv);
    }
    tfpy_library_thread--;
    PyGILState_Release(g);
    done();
    return rc;
}

static int py_list(void *ctx, const char *prefix, tf_list_emit_fn emit, void *emit_ctx) {
    if (refuse()) return -ECANCELED;
    PyGILState_STATE g = PyGILState_Ensure();
    tfpy_library_thread++;
    int rc = 0;
    PyObject *res = PyObject_CallMethod((PyObject *)ctx, "list", "s", prefix);
    PyObject *it = res ? PyObject_GetIter(res) : NULL;
    if (!it) {
        rc = code_from_exception();
    } else {
        PyObject *item;
        while ((item = PyIter_Next(it))) {
            const char *url, *ver;
            unsigned long long size;
            tf_object_info info;
            int ok = PyArg_ParseTuple(item, "sKs;list() must yield (url, size, version)", &url, &size, &ver);
            if (ok) {
                memset(&info, 0, sizeof info);
                info.size = size;
                snprintf(info.version, sizeof info.version, "%s", ver);
                /* emit runs C code that takes no Python objects: keep the GIL */
                if (emit(emit_ctx, url, &info)) {
                    Py_DECREF(item);
                    break;
                }
            }
            Py_DECREF(item);
            if (!ok) {
                rc = code_from_exception();
                break;
            }
        }
        if (!rc && PyErr_Occurred()) rc = code_from_exception();
    }
    Py_XDECREF(it);
    Py_XDECREF(res);
    tfpy_library_thread--;
    PyGILState_Release(g);
    done();
    return rc;
}

static void py_release(void *ctx) {
    if (tfpy_finalizing()) return; /* leaked on purpose: no interpreter to decref in */
    PyGILState_STATE g = PyGILState_Ensure();
    tfpy_library_thread++;
    Py_DECREF((PyObject *)ctx);
    tfpy_library_thread--;
    PyGILState_Release(g);
}

static int u64_arg(PyObject *o, uint64_t *out, const char *name) {
    if (!o || o == Py_None) return 0;
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Format(PyExc_ValueError, "%s must be a non-negative int", name);
        return -1;
    }
    *out = v;
    return 0;
}

static PyObject *Remote_new(PyTypeObject *tp, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"transport", "cache_dir", "cache_limit", "chunk_bytes", "prefetch_bytes",
                             "fetch_threads", "max_attempts", "backoff_ms", "backoff_max_ms", "deadline_ms", NULL};
    PyObject *transport, *dir_obj, *limit = NULL, *chunk = NULL, *prefetch = NULL;
    int threads = 0, attempts = 0;
    unsigned int backoff = 0, backoff_max = 0, deadline = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO&|OOOiiIII:Remote", kwlist, &transport, PyUnicode_FSConverter,
                                     &dir_obj, &limit, &chunk, &prefetch, &threads, &attempts, &backoff,
                                     &backoff_max, &deadline))
        return NULL;
    tf_remote_config cfg;
    tf_remote_config_init(&cfg);
    cfg.cache_dir = PyBytes_AS_STRING(dir_obj);
    if (u64_arg(limit, &cfg.cache_limit, "cache_limit") || u64_arg(chunk, &cfg.chunk_bytes, "chunk_bytes") ||
        u64_arg(prefetch, &cfg.prefetch_bytes, "prefetch_bytes")) {
        Py_DECREF(dir_obj);
        return NULL;
    }
    cfg.fetch_threads = threads;
    cfg.max_attempts = attempts;
    cfg.backoff_ms = backoff;
    cfg.backoff_max_ms = backoff_max;
    cfg.deadline_ms = deadline;
    if (!PyObject_HasAttrString(transport, "stat") || !PyObject_HasAttrString(transport, "read_into")) {
        Py_DECREF(dir_obj);
        PyErr_SetString(PyExc_TypeError, "transport must have stat(url) and read_into(url, version, size, offset, buffer)");
        return NULL;
    }
    tfpy_Remote *self = (tfpy_Remote *)tp->tp_alloc(tp, 0);
    if (!self) {
        Py_DECREF(dir_obj);
        return NULL;
    }
    Py_INCREF(transport); /* owned by the tf_remote; dropped by py_release */
    tf_transport t = {.ctx = transport, .stat = py_stat, .read = py_read, .release = py_release,
                      .list = PyObject_HasAttrString(transport, "list") ? py_list : NULL};
    int rc;
    char msg[1024];
    Py_BEGIN_ALLOW_THREADS
    rc = tf_remote_create(&t, &cfg, &self->r);
    if (rc < 0) snprintf(msg, sizeof msg, "%s", tf_last_error());
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        Py_DECREF(transport);
        Py_DECREF(dir_obj);
        Py_DECREF(self);
        return tfpy_raise(tfpy_state_of_type(tp), rc, msg);
    }
    self->cache_dir = PyUnicode_DecodeFSDefault(PyBytes_AS_STRING(dir_obj));
    Py_DECREF(dir_obj);
    Py_INCREF(transport);
    self->transport = transport;
    if (!self->cache_dir) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static void remote_free(void *r) { tf_remote_free(r); }

static void Remote_dealloc(tfpy_Remote *self) {
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (self->weakrefs) PyObject_ClearWeakRefs((PyObject *)self);
    tf_remote *r = self->r;
    self->r = NULL;
    /* may join fetch threads that wait for the GIL; not from one of them (a
     * collection that one started), and not while finalizing: see "Shutdown" */
    tfpy_destroy(remote_free, r, NULL);
    Py_CLEAR(self->transport);
    Py_CLEAR(self->cache_dir);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static int Remote_traverse(tfpy_Remote *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->transport);
    return 0;
}

PyDoc_STRVAR(Remote_stat_doc, "stat($self, url, /)\n--\n\nReturns (size, version), with retries.");

static PyObject *Remote_stat(tfpy_Remote *self, PyObject *arg) {
    const char *url = PyUnicode_AsUTF8(arg);
    if (!url) return NULL;
    tf_object_info info;
    int rc;
    char msg[1024];
    Py_BEGIN_ALLOW_THREADS
    rc = tf_remote_stat(self->r, url, &info);
    if (rc < 0) snprintf(msg, sizeof msg, "%s", tf_last_error());
    Py_END_ALLOW_THREADS
    if (rc < 0) return tfpy_raise(tfpy_state((PyObject *)self), rc, msg);
    return Py_BuildValue("(Ks)", (unsigned long long)info.size, info.version);
}

PyDoc_STRVAR(Remote_read_doc, "read($self, url, size, version, offset, length)\n--\n\nReturns bytes. "
                              "Bytes [offset, offset + length) of the object through the chunk cache.");

static PyObject *Remote_read(tfpy_Remote *self, PyObject *args) {
    const char *url, *ver;
    unsigned long long size, off, len;
    if (!PyArg_ParseTuple(args, "sKsKK:read", &url, &size, &ver, &off, &len)) return NULL;
    tf_object_info info;
    memset(&info, 0, sizeof info);
    info.size = size;
    snprintf(info.version, sizeof info.version, "%s", ver);
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)len);
    if (!out) return NULL;
    int rc;
    char msg[1024];
    char *p = PyBytes_AS_STRING(out);
    Py_BEGIN_ALLOW_THREADS
    rc = tf_remote_read(self->r, url, &info, off, len, p);
    if (rc < 0) snprintf(msg, sizeof msg, "%s", tf_last_error());
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        Py_DECREF(out);
        return tfpy_raise(tfpy_state((PyObject *)self), rc, msg);
    }
    return out;
}

static PyObject *stats_dict(const tf_remote_stats *s) {
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:d,s:K,s:K,s:K,s:K}",
                         "requests", (unsigned long long)s->requests,
                         "bytes_fetched", (unsigned long long)s->bytes_fetched,
                         "retries", (unsigned long long)s->retries,
                         "chunks_fetched", (unsigned long long)s->chunks_fetched,
                         "chunk_hits", (unsigned long long)s->chunk_hits,
                         "chunk_waits", (unsigned long long)s->chunk_waits,
                         "refetches", (unsigned long long)s->refetches,
                         "evictions", (unsigned long long)s->evictions,
                         "bytes_evicted", (unsigned long long)s->bytes_evicted,
                         "wait_s", (double)s->wait_ns / 1e9,
                         "cache_bytes", (unsigned long long)s->cache_bytes,
                         "cache_limit", (unsigned long long)s->cache_limit,
                         "chunk_bytes", (unsigned long long)s->chunk_bytes,
                         "small_reads", (unsigned long long)s->small_reads);
}

static PyObject *Remote_stats(tfpy_Remote *self, PyObject *unused) {
    tf_remote_stats s;
    Py_BEGIN_ALLOW_THREADS
    tf_remote_get_stats(self->r, &s);
    Py_END_ALLOW_THREADS
    return stats_dict(&s);
}

static PyObject *Remote_get_cache_dir(tfpy_Remote *self, void *closure) {
    Py_INCREF(self->cache_dir);
    return self->cache_dir;
}

static PyObject *Remote_get_transport(tfpy_Remote *self, void *closure) {
    Py_INCREF(self->transport);
    return self->transport;
}

PyDoc_STRVAR(Remote_list_doc, "list($self, prefix, immutable=False)\n--\n\nReturns list. (url, size, version) of "
                              "every object under prefix, from the node's recorded listing when it is trusted, else "
                              "listed once per node and recorded (docs/remote.md).");

typedef struct listed_objs {
    char **urls;
    tf_object_info *infos;
    size_t n, cap;
} listed_objs;

static int collect_obj(void *ctx, const char *url, const tf_object_info *info) {
    listed_objs *l = ctx;
    if (l->n == l->cap) {
        size_t c = l->cap ? l->cap * 2 : 256;
        char **u = realloc(l->urls, c * sizeof *u);
        if (!u) return 1;
        l->urls = u;
        tf_object_info *in = realloc(l->infos, c * sizeof *in);
        if (!in) return 1;
        l->infos = in;
        l->cap = c;
    }
    if (!(l->urls[l->n] = strdup(url))) return 1;
    l->infos[l->n++] = *info;
    return 0;
}

static PyObject *Remote_list(tfpy_Remote *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"prefix", "immutable", NULL};
    const char *prefix;
    int immutable = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|p:list", kwlist, &prefix, &immutable)) return NULL;
    listed_objs l = {NULL, NULL, 0, 0};
    int rc;
    char msg[1024];
    TFPY_NOGIL_CALL(rc, msg, tf_remote_list_objects(self->r, prefix, immutable ? TF_OPEN_IMMUTABLE : 0u, collect_obj, &l));
    PyObject *out = rc < 0 ? NULL : PyList_New((Py_ssize_t)l.n);
    for (size_t i = 0; out && i < l.n; i++) {
        PyObject *t = Py_BuildValue("(sKs)", l.urls[i], (unsigned long long)l.infos[i].size, l.infos[i].version);
        if (!t) Py_CLEAR(out);
        else PyList_SET_ITEM(out, (Py_ssize_t)i, t);
    }
    for (size_t i = 0; i < l.n; i++) free(l.urls[i]);
    free(l.urls);
    free(l.infos);
    if (rc < 0) return tfpy_raise(tfpy_state((PyObject *)self), rc, msg);
    return out;
}

static PyMethodDef Remote_methods[] = {
    {"list", (PyCFunction)(void (*)(void))Remote_list, METH_VARARGS | METH_KEYWORDS, Remote_list_doc},
    {"stat", (PyCFunction)Remote_stat, METH_O, Remote_stat_doc},
    {"read", (PyCFunction)Remote_read, METH_VARARGS, Remote_read_doc},
    {"stats", (PyCFunction)Remote_stats, METH_NOARGS, "stats($self)\n--\n\nReturns dict. Requests, bytes, chunks, cache usage."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Remote_getset[] = {
    {"cache_dir", (getter)Remote_get_cache_dir, NULL, "the cache directory", NULL},
    {"transport", (getter)Remote_get_transport, NULL, "the transport object", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef Remote_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(tfpy_Remote, weakrefs), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot Remote_slots[] = {
    {Py_tp_members, Remote_members},
    {Py_tp_new, Remote_new},
    {Py_tp_dealloc, Remote_dealloc},
    {Py_tp_traverse, Remote_traverse},
    {Py_tp_methods, Remote_methods},
    {Py_tp_getset, Remote_getset},
    {Py_tp_doc, "Remote(transport, cache_dir, cache_limit=0, chunk_bytes=0, prefetch_bytes=0, fetch_threads=0, "
                "max_attempts=0, backoff_ms=0, backoff_max_ms=0, deadline_ms=0)\n--\n\n"
                "A remote store: a transport, a node-local chunk cache and fetch threads (0 = default)."},
    {0, NULL},
};

PyType_Spec tfpy_RemoteSpec = {
    "tokenfeed._core.Remote", sizeof(tfpy_Remote), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, Remote_slots,
};

/* tf_remote of a Remote object (borrowed), or NULL with TypeError. */
tf_remote *tfpy_remote_of(PyObject *obj) {
    PyTypeObject *tp = Py_TYPE(obj);
    if (tp->tp_dealloc == (destructor)Remote_dealloc) return ((tfpy_Remote *)obj)->r;
    PyErr_Format(PyExc_TypeError, "remote must be a tokenfeed._core.Remote, not %.100s", tp->tp_name);
    return NULL;
}

/* ---- cache directory functions --------------------------------------- */

static PyObject *raise_plain(int rc, const char *msg) {
    PyObject *a = Py_BuildValue("(is)", rc < 0 ? -rc : rc, msg && *msg ? msg : tf_strerror(rc));
    if (a) {
        PyErr_SetObject(rc == -EINVAL ? PyExc_ValueError : PyExc_OSError, a);
        Py_DECREF(a);
    }
    return NULL;
}

static PyObject *cache_info(PyObject *mod, PyObject *arg) {
    PyObject *b = NULL;
    if (!PyUnicode_FSConverter(arg, &b)) return NULL;
    tf_cache_info ci;
    int rc;
    char msg[1024];
    Py_BEGIN_ALLOW_THREADS
    rc = tf_cache_info_get(PyBytes_AS_STRING(b), &ci);
    if (rc < 0) snprintf(msg, sizeof msg, "%s", tf_last_error());
    Py_END_ALLOW_THREADS
    Py_DECREF(b);
    if (rc < 0) return raise_plain(rc, msg);
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K}", "bytes", (unsigned long long)ci.bytes, "chunks",
                         (unsigned long long)ci.chunks, "fetching", (unsigned long long)ci.fetching, "objects",
                         (unsigned long long)ci.objects, "processes", (unsigned long long)ci.processes,
                         "temp_bytes", (unsigned long long)ci.temp_bytes);
}

static PyObject *cache_prune(PyObject *mod, PyObject *args) {
    PyObject *b = NULL;
    unsigned long long keep;
    if (!PyArg_ParseTuple(args, "O&K:cache_prune", PyUnicode_FSConverter, &b, &keep)) return NULL;
    int rc;
    char msg[1024];
    Py_BEGIN_ALLOW_THREADS
    rc = tf_cache_prune(PyBytes_AS_STRING(b), keep);
    if (rc < 0) snprintf(msg, sizeof msg, "%s", tf_last_error());
    Py_END_ALLOW_THREADS
    Py_DECREF(b);
    if (rc < 0) return raise_plain(rc, msg);
    Py_RETURN_NONE;
}

/* At exit, before finalization: refuse new transport calls and give those in
 * flight up to `timeout` seconds to come back (they need the GIL: released
 * while waiting). Returns the number still in flight. */
static PyObject *shutdown_transports(PyObject *mod, PyObject *arg) {
    double timeout = PyFloat_AsDouble(arg);
    if (timeout == -1.0 && PyErr_Occurred()) return NULL;
    atomic_store(&shutting_down, 1);
    long left;
    Py_BEGIN_ALLOW_THREADS
    for (int i = 0; (left = atomic_load(&in_flight)) > 0 && i < (int)(timeout * 100); i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(left);
}

PyMethodDef tfpy_remote_functions[] = {
    {"shutdown_transports", shutdown_transports, METH_O, "shutdown_transports(timeout, /)\n--\n\nReturns int. At exit: refuse new remote requests, wait up to timeout seconds for those in flight; returns how many are left."},
    {"cache_info", cache_info, METH_O, "cache_info(dir, /)\n--\n\nReturns dict. Bytes, chunks, objects and processes of a chunk cache."},
    {"cache_prune", cache_prune, METH_VARARGS, "cache_prune(dir, keep_bytes, /)\n--\n\nEvict chunks until at most keep_bytes remain (0: empty; refused while in use)."},
    {NULL, NULL, 0, NULL},
};
