/*
 * read.c — the engine's read backends: how the tokens of a batch come off
 * storage. A batch is cut into pieces (a span of a sample, split at file
 * boundaries); each piece is served by one of:
 *
 *   separator         written in place
 *   compressed file   decompressed blocks from the cache the workers share
 *                     (zcache.c; any backend)
 *   mmap backend      tf__file_read from the mapping (one conversion, no copy)
 *   pread backend     pread() of the piece into the stage (or straight into
 *                     the output when no conversion is needed), then convert
 *   io_uring backend  as pread, but all reads of a batch are queued on the
 *                     worker's ring at once and reaped together
 *
 * Files with no descriptor we can use (memory datasets, a path that no longer
 * opens, EMFILE from descriptors the process holds elsewhere) are read through
 * the mapping, which gives the same bytes. A descriptor is opened by path, so
 * it is checked to be the file the dataset mapped and checked (open_file); the
 * reader keeps a bounded number open over all its workers (get_fd).
 *
 * Contract: every backend writes byte-identical batches (docs/design.md, "What
 * must stay true" #2); only bytes_read and timing differ.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cp.h"
#include "engine.h"
#include "../order/kind.h"
#include "../remote/remote.h"

static const char *errstr(int e, char *buf, size_t cap) {
    /* GNU strerror_r: thread-safe, returns the string to use. */
    return strerror_r(e, buf, cap);
}

/* ------------------------------------------------------------------------ */
/* shared reader                                                             */
/* ------------------------------------------------------------------------ */

void tf__reader_note(tf__reader *r, const char *fmt, ...) {
    int expect = 0;
    if (!atomic_compare_exchange_strong(&r->note_state, &expect, 1)) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->note, sizeof r->note, fmt, ap);
    va_end(ap);
    atomic_store_explicit(&r->note_state, 2, memory_order_release);
}

void tf__reader_get_note(tf__reader *r, char *out, size_t cap) {
    if (!cap) return;
    out[0] = '\0';
    if (atomic_load_explicit(&r->note_state, memory_order_acquire) == 2) snprintf(out, cap, "%s", r->note);
}

int tf__reader_init(tf__reader *r, const tf_dataset *ds, const tf_order *o, tf_backend backend,
                    int direct_io, tf_dtype out_dtype) {
    memset(r, 0, sizeof *r);
    r->ds = ds;
    r->order = o;
    r->direct_io = direct_io;
    r->out_dtype = out_dtype;
    tf_order_config oc;
    TF_TRY(tf_order_get_config(o, &oc));
    r->seq_len = oc.seq_len;
    r->separator = oc.separator_id;
    r->pad = oc.pad_id;
    r->eos_rows = ds->docs_from_rows;
    r->eos_id = ds->eos_id;
    r->max_spans = tf__order_max_spans(o);
    if (r->max_spans < 1) r->max_spans = 1;
    atomic_init(&r->bytes_read, 0);
    atomic_init(&r->note_state, 0);
    atomic_init(&r->uring_workers, 0);

    if (backend == TF_BACKEND_AUTO) {
        const char *env = getenv("TOKENFEED_BACKEND");
        backend = TF_BACKEND_MMAP;
        if (env && *env) {
            if (strcmp(env, "mmap") == 0) backend = TF_BACKEND_MMAP;
            else if (strcmp(env, "pread") == 0) backend = TF_BACKEND_PREAD;
            else if (strcmp(env, "io_uring") == 0) backend = TF_BACKEND_IO_URING;
            else if (strcmp(env, "auto") == 0) backend = TF_BACKEND_MMAP;
            else TF_FAIL(-EINVAL, "TOKENFEED_BACKEND=%s: expected mmap, pread or io_uring. Unset it to use the default (mmap).", env);
        }
    }
    if (backend != TF_BACKEND_MMAP && backend != TF_BACKEND_PREAD && backend != TF_BACKEND_IO_URING)
        TF_FAIL(-EINVAL, "backend: expected auto, mmap, pread or io_uring, found code %d", (int)backend);
    if (backend == TF_BACKEND_IO_URING) {
        char why[128];
        if (!tf_io_uring_usable(why, sizeof why)) {
            backend = TF_BACKEND_PREAD;
            tf__reader_note(r, "io_uring -> pread: %s", why);
        }
    }
    r->backend = backend;
    if (backend != TF_BACKEND_MMAP) {
        uint64_t n = ds->nfiles ? ds->nfiles : 1;
        r->fds = malloc(n * sizeof *r->fds);
        r->dfds = malloc(n * sizeof *r->dfds);
        if (!r->fds || !r->dfds || pthread_mutex_init(&r->fd_mu, NULL) != 0) {
            tf__reader_destroy(r);
            return -ENOMEM;
        }
        if (pthread_cond_init(&r->fd_cv, NULL) != 0) {
            pthread_mutex_destroy(&r->fd_mu);
            tf__reader_destroy(r);
            return -ENOMEM;
        }
        r->fd_mu_ok = 1;
        for (uint64_t i = 0; i < n; i++) r->fds[i] = r->dfds[i] = (tf__fdslot){TF__FD_UNOPENED, 0, 0};
        struct rlimit rl;
        uint64_t lim = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? (uint64_t)rl.rlim_cur : 4096;
        r->max_open = lim / 4 < 8 ? 8 : lim / 4 > 1024 ? 1024 : lim / 4;
    }
    return 0;
}

void tf__reader_destroy(tf__reader *r) {
    if (!r) return;
    uint64_t n = r->ds && r->ds->nfiles ? r->ds->nfiles : 1;
    for (uint64_t i = 0; r->fds && i < n; i++)
        if (r->fds[i].fd >= 0) close(r->fds[i].fd);
    for (uint64_t i = 0; r->dfds && i < n; i++)
        if (r->dfds[i].fd >= 0) close(r->dfds[i].fd);
    free(r->fds);
    free(r->dfds);
    r->fds = r->dfds = NULL;
    if (r->fd_mu_ok) {
        pthread_cond_destroy(&r->fd_cv);
        pthread_mutex_destroy(&r->fd_mu);
    }
    r->fd_mu_ok = 0;
    tf__zcache_free(r->zc);
    r->zc = NULL;
}

/* Byte offset of file f's first token inside the file, or -1 when f cannot be
 * read with a descriptor (compressed, memory dataset, tokens not in the map). */
static int64_t token_offset(const tf_file *f) {
    return tf__file_token_offset(f);
}

/* Open the file behind f (its path, or, for a pair opened by its prefix
 * (Megatron's), the prefix and the data file's suffix) into *fdp. The descriptor must be the very file whose
 * bytes the dataset checked (tf__file_check_fd: device, inode, size and
 * modification time): a name that holds another file by now, say one renamed
 * over it, is an error naming it, never that file's tokens. Returns 0, the
 * errno of an open that failed (> 0; no message), or a negative code with the
 * error set (the file found is not the dataset's). */
static int open_file(const tf_file *f, int flags, int *fdp) {
    char alt[4096];
    const char *cands[2] = {f->path, NULL};
    const tf__format_row *row = tf__format_row_of(f->format);
    if (row && row->pair_data_suffix && snprintf(alt, sizeof alt, "%s%s", f->path, row->pair_data_suffix) < (int)sizeof alt)
        cands[1] = alt;
    int err = ENOENT, bad = 0;
    char msg[1024];
    msg[0] = '\0';
    for (int c = 0; c < 2 && cands[c]; c++) {
        int fd = open(cands[c], flags | O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            if (c == 0 || err == ENOENT) err = errno;
            continue;
        }
        int rc = tf__file_check_fd(f, fd);
        if (rc == 0) {
            *fdp = fd;
            return 0;
        }
        close(fd);
        if (!bad) {
            bad = rc;
            snprintf(msg, sizeof msg, "%s", tf_last_error());
        }
    }
    if (bad) return tf__seterr(bad, "%s", msg);
    return err;
}

/* fd_mu held: close the least recently used descriptor no read holds (both
 * tables), if any; 1 when one was closed. */
static int evict_fd(tf__reader *r) {
    uint64_t n = r->ds->nfiles ? r->ds->nfiles : 1;
    tf__fdslot *best = NULL;
    for (int t = 0; t < 2; t++) {
        tf__fdslot *tab = t ? r->dfds : r->fds;
        for (uint64_t i = 0; i < n; i++)
            if (tab[i].fd >= 0 && !tab[i].users && (!best || tab[i].last < best->last)) best = &tab[i];
    }
    if (!best) return 0;
    close(best->fd);
    best->fd = TF__FD_UNOPENED;
    r->nopen--;
    return 1;
}

/* fd_mu held: a descriptor slot's last queued read is over. */
static void slot_put(tf__reader *r, tf__fdslot *slot, int fd) {
    if (slot->fd != fd || !slot->users) return;
    if (--slot->users == 0 && r->fd_waiters) pthread_cond_broadcast(&r->fd_cv);
}

/* Descriptor for file i (buffered or O_DIRECT) into *fdp, opened lazily,
 * cached and held until put_fds. At most max_open descriptors are open, over
 * all the workers (least recently used closed first). When every one of them
 * is held by a queued read, a worker that holds some returns 1 (it runs its
 * queued reads, which gives them back, and asks again); one that holds none
 * waits until another gives one back, which it does when its own reads are
 * over, so the bound holds however many files a batch touches. *fdp is
 * TF__FD_UNUSABLE when the mapping must be used instead (not held). Returns 0,
 * 1, or a negative code (the file at the path is not the dataset's). */
static int get_fd(tf__worker *w, uint64_t i, int direct, int *fdp) {
    tf__reader *r = w->rd;
    const tf_file *f = &r->ds->files[i];
    pthread_mutex_lock(&r->fd_mu);
    tf__fdslot *slot = direct ? &r->dfds[i] : &r->fds[i];
    while (slot->fd == TF__FD_UNOPENED) {
        while (r->nopen >= r->max_open && evict_fd(r)) {}
        int fd = -1, rc = r->nopen < r->max_open ? open_file(f, direct ? O_DIRECT : 0, &fd) : EMFILE;
        /* Out of descriptors: give back the least recently used one this
         * reader holds idle and cache fewer from now on. */
        while ((rc == EMFILE || rc == ENFILE) && r->nopen > 0 && evict_fd(r)) {
            r->max_open = r->nopen > 1 ? r->nopen : 1;
            rc = open_file(f, direct ? O_DIRECT : 0, &fd);
        }
        if ((rc == EMFILE || rc == ENFILE) && r->nopen > 0) {
            /* every descriptor open is held by a queued read */
            if (w->nrds) {
                pthread_mutex_unlock(&r->fd_mu);
                return 1;
            }
            r->fd_waiters++;
            pthread_cond_wait(&r->fd_cv, &r->fd_mu);
            r->fd_waiters--;
            continue; /* another worker may have opened this file meanwhile */
        }
        if (rc < 0) {
            pthread_mutex_unlock(&r->fd_mu);
            return rc;
        }
        if (rc > 0) {
            char eb[96];
            if (rc == EMFILE || rc == ENFILE) {
                /* Transient (the process holds them, not this reader): do
                 * not cache; this piece goes through the mapping. */
                tf__reader_note(r, "%s: out of file descriptors; reading through the mapping", f->path);
                pthread_mutex_unlock(&r->fd_mu);
                *fdp = TF__FD_UNUSABLE;
                return 0;
            }
            if (direct)
                tf__reader_note(r, "%s: O_DIRECT open failed (%s); buffered reads", f->path, errstr(rc, eb, sizeof eb));
            else
                tf__reader_note(r, "%s: cannot open for %s (%s); reading through the mapping", f->path,
                                r->backend == TF_BACKEND_IO_URING ? "io_uring" : "pread", errstr(rc, eb, sizeof eb));
            slot->fd = TF__FD_UNUSABLE;
            break;
        }
        slot->fd = fd;
        r->nopen++;
    }
    int fd = slot->fd;
    if (fd >= 0) {
        slot->users++;
        slot->last = ++r->fd_clock;
    }
    pthread_mutex_unlock(&r->fd_mu);
    *fdp = fd;
    return 0;
}

static void release_one(tf__reader *r, uint64_t fi, int direct, int fd) {
    pthread_mutex_lock(&r->fd_mu);
    slot_put(r, direct ? &r->dfds[fi] : &r->fds[fi], fd);
    pthread_mutex_unlock(&r->fd_mu);
}

/* The reads queued on the worker's descriptors are over (done, failed or
 * abandoned): they may be closed again. */
static void put_fds(tf__worker *w) {
    tf__reader *r = w->rd;
    if (!w->nrds || !r->fd_mu_ok) return;
    pthread_mutex_lock(&r->fd_mu);
    for (size_t k = 0; k < w->nrds; k++) {
        tf__rd *d = &w->rds[k];
        slot_put(r, d->direct ? &r->dfds[d->fi] : &r->fds[d->fi], d->fd);
    }
    pthread_mutex_unlock(&r->fd_mu);
    w->nrds = 0;
}

/* ------------------------------------------------------------------------ */
/* worker                                                                    */
/* ------------------------------------------------------------------------ */

int tf__worker_init(tf__worker *w, tf__reader *r, int index) {
    memset(w, 0, sizeof *w);
    w->rd = r;
    w->index = index;
    w->backend = r->backend;
    w->spans = malloc(r->max_spans * sizeof *w->spans);
    w->spans_next = malloc(r->max_spans * sizeof *w->spans_next);
    if (!w->spans || !w->spans_next) {
        free(w->spans);
        free(w->spans_next);
        w->spans = w->spans_next = NULL;
        return -ENOMEM;
    }
#ifdef TF_HAVE_IO_URING
    if (w->backend == TF_BACKEND_IO_URING) {
        int rc = io_uring_queue_init(TF__URING_QD, &w->ring, 0);
        if (rc < 0) {
            char eb[96];
            tf__reader_note(r, "io_uring -> pread on worker %d: io_uring_queue_init: %s", index,
                            errstr(-rc, eb, sizeof eb));
            w->backend = TF_BACKEND_PREAD;
        } else {
            w->ring_ok = 1;
            atomic_fetch_add(&r->uring_workers, 1);
        }
    }
#else
    if (w->backend == TF_BACKEND_IO_URING) w->backend = TF_BACKEND_PREAD;
#endif
    return 0;
}

void tf__worker_destroy(tf__worker *w) {
    if (!w) return;
#ifdef TF_HAVE_IO_URING
    if (w->ring_ok) {
        io_uring_queue_exit(&w->ring);
        atomic_fetch_sub(&w->rd->uring_workers, 1);
    }
    w->ring_ok = 0;
#endif
    free(w->spans);
    free(w->spans_next);
    free(w->cp_pos);
    free(w->cp_cu);
    free(w->cp_mask);
    free(w->cp_seg);
    free(w->cp_pad);
    free(w->cp_work);
    free(w->cp_pieces);
    free(w->cp_ranges);
    free(w->td_segs);
    w->td_segs = NULL;
    tf__balance_cache_free(&w->bal);
    free(w->warm_cu);
    free(w->stage);
    free(w->rds);
    free(w->queue);
    tf__zcache_release(w->rd->zc, &w->zh);
    tf__zhold_destroy(&w->zh);
    memset(w, 0, sizeof *w);
}

static tf__rd *push_rd(tf__worker *w) {
    if (w->nrds == w->cap_rds) {
        size_t nc = w->cap_rds ? w->cap_rds * 2 : 64;
        tf__rd *n = realloc(w->rds, nc * sizeof *n);
        if (!n) return NULL;
        size_t *q = realloc(w->queue, nc * sizeof *q);
        if (!q) {
            w->rds = n;
            return NULL;
        }
        w->rds = n;
        w->queue = q;
        w->cap_rds = nc;
    }
    tf__rd *r = &w->rds[w->nrds++];
    memset(r, 0, sizeof *r);
    return r;
}

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static int finish_reads(tf__worker *w, size_t stage_need);

/* Run the reads queued so far and give their descriptors back (the fill goes
 * on queueing from an empty stage). */
static int flush_reads(tf__worker *w, size_t *stage_need) {
    int rc = finish_reads(w, *stage_need);
    put_fds(w);
    *stage_need = 0;
    return rc;
}

/* Queue a read of tokens [start, start+count) of uncompressed file fi into
 * out. Returns 0, 1 when the file has no usable descriptor (caller reads the
 * mapping), or a negative code. *stage_need grows by the stage bytes used. */
static int queue_read(tf__worker *w, uint64_t fi, uint64_t start, uint64_t count, void *out,
                      size_t *stage_need) {
    tf__reader *r = w->rd;
    const tf_file *f = &r->ds->files[fi];
    int64_t base = token_offset(f);
    if (base < 0) return 1;
    TF_TRY(tf__file_touch(f)); /* a file known from a catalog: checked before its bytes are used */
    int direct, fd;
    for (;;) {
        int rc = 0;
        direct = 0;
        fd = TF__FD_UNUSABLE;
        if (r->direct_io) {
            rc = get_fd(w, fi, 1, &fd);
            direct = rc == 0 && fd >= 0;
        }
        if (rc == 0 && fd < 0) rc = get_fd(w, fi, 0, &fd);
        if (rc < 0) return rc;
        if (rc == 0) break;
        /* every descriptor is held: run this worker's queued reads first */
        TF_TRY(flush_reads(w, stage_need));
    }
    if (fd < 0) return 1;
    size_t isz = tf_dtype_size(f->dtype);
    uint64_t off = (uint64_t)base + start * isz;
    size_t bytes = (size_t)(count * isz);
    tf__rd *d = push_rd(w);
    if (!d) {
        release_one(r, fi, direct, fd);
        return -ENOMEM;
    }
    d->fd = fd;
    d->fi = fi;
    d->out = out;
    d->sdt = f->dtype;
    d->count = (size_t)count;
    d->path = f->path;
    d->direct = direct;
    if (direct) {
        uint64_t aoff = off / TF__DIO_ALIGN * TF__DIO_ALIGN;
        d->head = (size_t)(off - aoff);
        d->off = aoff;
        d->need = d->head + bytes;
        d->len = round_up(d->need, TF__DIO_ALIGN);
        d->stage_off = *stage_need;
        *stage_need += d->len;
    } else {
        d->off = off;
        d->len = d->need = bytes;
        if (f->dtype == r->out_dtype) {
            d->stage_off = SIZE_MAX; /* read straight into the batch */
        } else {
            d->stage_off = *stage_need;
            *stage_need += round_up(bytes, 64);
        }
    }
    return 0;
}

static int ensure_stage(tf__worker *w, size_t need) {
    if (need <= w->stage_cap) return 0;
    size_t cap = round_up(need + need / 2, TF__DIO_ALIGN);
    void *p = NULL;
    if (posix_memalign(&p, TF__DIO_ALIGN, cap) != 0) return -ENOMEM;
    free(w->stage);
    w->stage = p;
    w->stage_cap = cap;
    return 0;
}

/* Account for `got` more bytes of read d. Returns 1 when complete, 0 when more
 * must be read, or a negative code (EOF before the data, unaligned tail). */
static int rd_advance(tf__rd *d, size_t got) {
    d->done += got;
    if (d->done >= d->need) return 1;
    if (got == 0)
        return tf__seterr(-EIO, "%s: read of %zu bytes at offset %llu: the file ends after %zu of them. The file was truncated while in use; reopen the dataset.",
                          d->path, d->need - d->head, (unsigned long long)(d->off + d->head),
                          d->done > d->head ? d->done - d->head : 0);
    if (d->direct && d->done % TF__DIO_ALIGN)
        return tf__seterr(-EIO, "%s: O_DIRECT read at offset %llu returned %zu bytes, short of %zu. The file was truncated while in use; reopen the dataset.",
                          d->path, (unsigned long long)d->off, d->done, d->need);
    return 0;
}

static int rd_error(const tf__rd *d, int e) {
    char eb[96];
    return tf__seterr(-e, "%s: read of %zu bytes at offset %llu failed: %s. Check the disk or the network file system; the loader retries this batch on the next call.",
                      d->path, d->len - d->done, (unsigned long long)(d->off + d->done), errstr(e, eb, sizeof eb));
}

/* Test-only fault injection ($TOKENFEED_FAULT_READ, read once per process;
 * tests/engine/test_faults.py): "eio:N", "short:N" or "eof:N" makes the Nth read
 * completion of the pread and io_uring backends (counted from 1 across the
 * process) fail with EIO, report half of its bytes (the rest must be read
 * again), or report 0 bytes (end of file). res is bytes or -errno.
 * Compiled only into test builds (TF_TEST_HOOKS); elsewhere a no-op. */
#ifdef TF_TEST_HOOKS
static int fault_mode; /* 0 off, 1 eio, 2 short, 3 eof */
static uint64_t fault_n;
static _Atomic uint64_t fault_count;
static pthread_once_t fault_once = PTHREAD_ONCE_INIT;
static void fault_init(void) {
    const char *e = getenv("TOKENFEED_FAULT_READ");
    if (!e) return;
    int m = !strncmp(e, "eio:", 4) ? 1 : !strncmp(e, "short:", 6) ? 2 : !strncmp(e, "eof:", 4) ? 3 : 0;
    if (m) fault_n = strtoull(strchr(e, ':') + 1, NULL, 10);
    fault_mode = fault_n ? m : 0;
}
static long fault_read(long res) {
    pthread_once(&fault_once, fault_init);
    if (TF_LIKELY(!fault_mode) || res < 0 || atomic_fetch_add(&fault_count, 1) + 1 != fault_n) return res;
    return fault_mode == 1 ? -EIO : fault_mode == 2 ? res / 2 : 0;
}
#else
static inline long fault_read(long res) { return res; }
#endif

static int run_pread(tf__worker *w, tf__rd *d) {
    for (;;) {
        ssize_t n = pread(d->fd, d->buf + d->done, d->len - d->done, (off_t)(d->off + d->done));
        n = (ssize_t)fault_read(n < 0 ? -(long)errno : (long)n);
        if (n < 0) {
            if (n == -EINTR || n == -EAGAIN) continue;
            return rd_error(d, (int)-n);
        }
        w->bytes += (uint64_t)n;
        int rc = rd_advance(d, (size_t)n);
        if (rc != 0) return rc < 0 ? rc : 0;
    }
}

#ifdef TF_HAVE_IO_URING
/* Run all queued reads on the worker's ring: submit as many as fit, reap,
 * resubmit the remainder of short reads. Never returns while a read is in
 * flight (the buffers belong to the batch). Returns 1 if the ring itself
 * failed before anything was lost (caller redoes the reads with pread). */
static int run_uring(tf__worker *w) {
    struct io_uring *ring = &w->ring;
    size_t next = 0, nq = 0, inflight = 0, queued = 0;
    int err = 0, ring_err = 0;
    for (;;) {
        while (!err && !ring_err && (nq || next < w->nrds)) {
            struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
            if (!sqe) break;
            size_t i = nq ? w->queue[--nq] : next++;
            tf__rd *d = &w->rds[i];
            io_uring_prep_read(sqe, d->fd, d->buf + d->done, (unsigned)(d->len - d->done), d->off + d->done);
            io_uring_sqe_set_data64(sqe, (uint64_t)i);
            queued++;
        }
        if (queued) {
            int s = io_uring_submit(ring);
            if (s >= 0) {
                inflight += (size_t)s;
                queued -= (size_t)s < queued ? (size_t)s : queued;
            } else if (s != -EINTR && s != -EAGAIN && s != -EBUSY) {
                ring_err = s;
            }
        }
        if (!inflight) {
            if (ring_err) {
                /* Nothing in flight; prepared SQEs stay unsubmitted and the
                 * ring is not used again. */
                w->ring_ok = 0;
                io_uring_queue_exit(ring);
                atomic_fetch_sub(&w->rd->uring_workers, 1);
                return 1;
            }
            if (err || (!nq && next >= w->nrds && !queued)) break;
            continue;
        }
        struct io_uring_cqe *cqe;
        int rc = io_uring_wait_cqe(ring, &cqe);
        if (rc < 0) {
            if (rc == -EINTR || rc == -EAGAIN) continue;
            /* Cannot reap: reads may still land in our buffers. Give the
             * stage away (leak it) rather than reuse memory under the kernel. */
            w->stage = NULL;
            w->stage_cap = 0;
            w->ring_ok = 0;
            w->backend = TF_BACKEND_PREAD;
            atomic_fetch_sub(&w->rd->uring_workers, 1);
            return tf__seterr(rc, "io_uring_wait_cqe failed: %s; the worker falls back to pread", strerror(-rc));
        }
        unsigned head, seen = 0;
        io_uring_for_each_cqe(ring, head, cqe) {
            seen++;
            inflight--;
            size_t i = (size_t)io_uring_cqe_get_data64(cqe);
            tf__rd *d = &w->rds[i];
            int res = (int)fault_read(cqe->res);
            if (res < 0) {
                if (res == -EINTR || res == -EAGAIN) w->queue[nq++] = i;
                else if (!err) err = rd_error(d, -res);
                continue;
            }
            w->bytes += (uint64_t)res;
            int a = rd_advance(d, (size_t)res);
            if (a == 0) w->queue[nq++] = i;
            else if (a < 0 && !err) err = a;
        }
        io_uring_cq_advance(ring, seen);
    }
    return err;
}
#endif

static void fill_separator(void *out, size_t osz, tf_dtype odt, int64_t sep, uint64_t n) {
    uint8_t one[8];
    tf_convert(one, odt, &sep, TF_INT64, 1);
    uint8_t *o = out;
    for (uint64_t k = 0; k < n; k++) memcpy(o + k * osz, one, osz);
}

static int worker_fill(tf__worker *w, uint64_t pos, uint64_t rows, const uint64_t *rowpos, tf_batch_view *v,
                       tf__row_acct *acct);

/* With balancing: the positions of the rows of this rank's batch whose
 * contiguous slice would start at pos (the step is computed once per worker
 * and kept for the step's other micro-batches). */
static int balanced_rows(tf__worker *w, uint64_t pos, const uint64_t **rowpos) {
    const tf__reader *r = w->rd;
    const uint64_t B = r->bal_B, G = B * r->bal_world;
    const uint64_t batch = (pos - (uint64_t)r->bal_rank * B) / G;
    return tf__balance_rows(r->order, r->bal, r->bal_world, r->bal_micro, batch, r->bal_rank, &w->bal, rowpos);
}

typedef struct fill_call {
    tf__worker *w;
    uint64_t pos, rows;
    tf_batch_view *v;
    tf__row_acct *acct;
} fill_call;
static int call_fill(void *p) {
    fill_call *c = p;
    const uint64_t *rowpos = NULL;
    if (c->w->rd->bal != TF_BALANCE_NONE) TF_TRY(balanced_rows(c->w, c->pos, &rowpos));
    return worker_fill(c->w, c->pos, c->rows, rowpos, c->v, c->acct);
}

/* The whole fill runs under the SIGBUS guard (common/sigbus.c): a file that
 * shrank while mapped gives -EIO naming it instead of killing the process.
 * This covers mmap reads, zstd blocks, and the document index walks of the
 * order layer's spans and extras. Mapped bytes are never touched while an
 * io_uring read is in flight (finish_reads submits and reaps them together),
 * and every allocation inside is stored in the
 * worker before mapped bytes are read, so abandoning the fill is safe; the
 * zstd cache takes its lock only around bookkeeping, never across a decode. */
int tf__worker_fill(tf__worker *w, uint64_t pos, uint64_t rows, tf_batch_view *v, tf__row_acct *acct) {
    /* remote chunks this fill must fetch itself are needed at pos */
    tf__remote_set_reader_position(pos);
    fill_call c = {w, pos, rows, v, acct};
    int rc = tf__files_guard(w->rd->ds->files, w->rd->ds->nfiles, call_fill, &c);
    put_fds(w);
    /* Drop this worker's pin in the zstd cache; after a fault mid-decode
     * (SIGBUS), also empty the entry it was loading so others stop waiting. */
    if (rc) tf__zcache_abandon(w->rd->zc, &w->zh);
    else tf__zcache_release(w->rd->zc, &w->zh);
    return rc;
}

/* Read sample offsets [lo, hi) of span sp (all of it: 0, L + 1) into row,
 * at their offsets in the sample. */
static int read_span(tf__worker *w, uint64_t sample, const tf__span *sp, uint64_t lo, uint64_t hi, uint8_t *row,
                     size_t *stage_need) {
    tf__reader *r = w->rd;
    const tf_dataset *ds = r->ds;
    const size_t osz = tf_dtype_size(r->out_dtype);
    const int mmap_only = w->backend == TF_BACKEND_MMAP;
    uint64_t a = sp->dst > lo ? sp->dst : lo, b = sp->dst + sp->len < hi ? sp->dst + sp->len : hi;
    if (a >= b) return 0;
    uint8_t *dst = row + a * osz;
    if (sp->src == TF_SPAN_SEPARATOR || sp->src == TF_SPAN_PAD) {
        fill_separator(dst, osz, r->out_dtype, sp->src == TF_SPAN_PAD ? r->pad : r->separator, b - a);
        return 0;
    }
    if (sp->len > ds->num_tokens || sp->src > ds->num_tokens - sp->len)
        return tf__seterr(-ERANGE, "sample %llu: span [%llu, %llu) lies past the %llu tokens of the dataset",
                          (unsigned long long)sample, (unsigned long long)sp->src,
                          (unsigned long long)(sp->src + sp->len), (unsigned long long)ds->num_tokens);
    uint64_t start = sp->src + (a - sp->dst), left = b - a;
    uint64_t fi = tf__dataset_file_of(ds, start);
    int rc = 0;
    while (left && !rc) {
        const tf_file *f = &ds->files[fi];
        uint64_t local = start - ds->tok_prefix[fi];
        uint64_t n = f->num_tokens - local < left ? f->num_tokens - local : left;
        if (n) {
            if (f->blocks.ops) {
                rc = r->zc ? tf__zcache_read(r->zc, &w->zh, ds, fi, local, n, dst, r->out_dtype)
                           : tf__seterr(-EFAULT, "internal: %s is compressed but the loader has no block cache", f->path);
            } else {
                int q = mmap_only ? 1 : queue_read(w, fi, local, n, dst, stage_need);
                if (q == 1) {
                    rc = tf__file_read(f, local, n, dst, r->out_dtype);
                    if ((rc == -EMFILE || rc == -ENFILE) && r->fd_mu_ok) {
                        /* mapping the file on demand needs a descriptor for a moment */
                        pthread_mutex_lock(&r->fd_mu);
                        evict_fd(r);
                        pthread_mutex_unlock(&r->fd_mu);
                        rc = tf__file_read(f, local, n, dst, r->out_dtype);
                    }
                    w->bytes += n * tf_dtype_size(f->dtype);
                } else {
                    rc = q;
                }
            }
        }
        dst += n * osz;
        start += n;
        left -= n;
        fi++;
    }
    return rc;
}

/* Source, non-padding input tokens and document starts of a mixture's row
 * (its spans are in w->spans). A document counts where its first token is:
 * the first non-empty document starting inside a token span of the input
 * positions [0, L). */
static int account_row(tf__worker *w, uint64_t sample, size_t ns, tf__row_acct *acct) {
    const tf__reader *r = w->rd;
    const uint64_t L = r->seq_len;
    size_t lo = 0, hi = r->nsources; /* source_first[lo] <= sample < source_first[hi] */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (r->source_first[mid] <= sample) lo = mid;
        else hi = mid;
    }
    acct->source = lo;
    acct->tokens = 0;
    acct->documents = 0;
    for (size_t s = 0; s < ns; s++) {
        const tf__span *sp = &w->spans[s];
        if (sp->dst >= L) break;
        uint64_t n = sp->dst + sp->len <= L ? sp->len : L - sp->dst;
        if (sp->src == TF_SPAN_PAD) continue;
        acct->tokens += n;
        if (sp->src == TF_SPAN_SEPARATOR || !n) continue;
        uint64_t a = sp->src, b = sp->src + n, k, st, len;
        TF_TRY(tf_dataset_find_document(r->ds, a, &k));
        TF_TRY(tf_dataset_document(r->ds, k, &st, &len));
        if (st == a) acct->documents++;
        for (k++; k < r->ds->num_docs; k++) {
            TF_TRY(tf_dataset_document(r->ds, k, &st, &len));
            if (st >= b) break;
            acct->documents += len > 0;
        }
    }
    return 0;
}

/* Prefetch the first source lines of the token spans of a sample (the first
 * TF__PREFETCH_SPANS of them): one span for concat without separators, one
 * per document for a view's concat rows. Best effort: returns the number of
 * the sample's spans, written to sp (r->max_spans of room, reused by the
 * caller), or 0 if it could not compute them. */
static size_t prefetch_sample(const tf__reader *r, uint64_t sample, tf__span *sp) {
    size_t ns = 0;
    if (tf__order_sample_spans(r->order, sample, sp, r->max_spans, &ns) != 0) return 0;
    /* A sample of one span: its first TF__PREFETCH_LINES lines (the
     * hardware prefetcher follows the rest). A sample of several (a view's
     * concat rows: a span per document, each in a page of its own): each
     * span whole, up to TF__PREFETCH_SPAN_LINES lines, none past its end —
     * short spans give the hardware prefetcher no stream to follow, and the
     * next row's misses overlap this row's copy instead of stalling it. */
    size_t tok = 0;
    for (size_t s = 0; s < ns && tok < 2; s++)
        tok += !(sp[s].src == TF_SPAN_SEPARATOR || sp[s].src == TF_SPAN_PAD || !sp[s].len);
    const uint64_t per = tok > 1 ? TF__PREFETCH_SPAN_LINES : TF__PREFETCH_LINES;
    const size_t isz = r->ds->nfiles ? tf_dtype_size(r->ds->files[0].dtype) : 1;
    for (size_t s = 0, done = 0; s < ns && done < TF__PREFETCH_SPANS; s++) {
        if (sp[s].src == TF_SPAN_SEPARATOR || sp[s].src == TF_SPAN_PAD || !sp[s].len) continue;
        done++;
        const void *p = tf__dataset_peek(r->ds, sp[s].src);
        if (!p) {
            /* a compressed file: prefetch from its decoded block, if cached */
            if (r->zc) tf__zcache_prefetch(r->zc, r->ds, sp[s].src, sp[s].len);
            continue;
        }
        uint64_t lines = (sp[s].len * isz + 63) / 64 + 1;
        if (lines > per) lines = per;
        if (!lines) lines = 1;
        for (uint64_t k = 0; k < lines; k++) __builtin_prefetch((const char *)p + 64 * k, 0, 0);
    }
    return ns;
}

/* ------------------------------------------------------------------------ */
/* takedowns: documents a loader no longer serves (tf_loader_exclude)        */
/* ------------------------------------------------------------------------ */

/* Whether document doc of source src is taken down for the batch at global
 * position gpos (an entry made at or before it names it). */
static int taken_down(const tf__takedowns *t, uint64_t gpos, uint64_t src, uint64_t doc) {
    for (size_t i = 0; i < t->n; i++) {
        const tf__takedown *e = &t->e[i];
        if (e->pos > gpos || e->source != src) continue;
        size_t lo = 0, hi = e->n;
        while (lo < hi) {
            size_t m = lo + (hi - lo) / 2;
            if (e->ids[m] < doc) lo = m + 1; else hi = m;
        }
        if (lo < e->n && e->ids[lo] == doc) return 1;
    }
    return 0;
}

/* Whether any takedown is in force for the worker's batch. */
static int takedowns_active(const tf__worker *w) {
    const tf__takedowns *t = w->td;
    for (size_t i = 0; t && i < t->n; i++)
        if (t->e[i].pos <= w->td_gpos) return 1;
    return 0;
}

/* The sample at stream position p without its taken-down documents: their
 * tokens in row (L + 1 of them, at their sample offsets; NULL: leave the
 * tokens) become pad_id, and the labels they make in mask (L; NULL: none)
 * 0. Segments come from the order (as tf_order_segments_at tells them), so
 * the boundaries, positions and cu_seqlens stay those of the order: the
 * documents keep their places, only their tokens are gone. */
static int take_down_row(tf__worker *w, uint64_t p, uint8_t *row, uint8_t *mask) {
    tf__reader *r = w->rd;
    const uint64_t L = r->seq_len;
    const size_t osz = tf_dtype_size(r->out_dtype);
    if (!w->td_segs && !(w->td_segs = malloc((L + 1) * sizeof *w->td_segs))) return -ENOMEM;
    size_t n = 0;
    TF_TRY(tf_order_segments_at(r->order, p, w->td_segs, L + 1, &n));
    for (size_t i = 0; i < n; i++) {
        const tf_segment *sg = &w->td_segs[i];
        if (!taken_down(w->td, w->td_gpos, sg->source, sg->document)) continue;
        uint64_t len = sg->stop - sg->start;
        if (sg->offset > L + 1 || len > L + 1 - sg->offset)
            return tf__seterr(-EFAULT, "internal: a segment of the sample at position %llu lies past its %llu tokens",
                              (unsigned long long)p, (unsigned long long)(L + 1));
        if (row) fill_separator(row + sg->offset * osz, osz, r->out_dtype, r->pad, len);
        /* label t is sample token t + 1 */
        uint64_t a = sg->offset ? sg->offset - 1 : 0, b = sg->offset + len - 1 < L ? sg->offset + len - 1 : L;
        if (mask && b > a) memset(mask + a, 0, (size_t)(b - a));
    }
    return 0;
}

static int cp_fill(tf__worker *w, uint64_t pos, uint64_t rows, const uint64_t *rowpos, tf_batch_view *v,
                   tf__row_acct *acct);
static int finish_reads(tf__worker *w, size_t stage_need);

/* Token k of a row in the batch's dtype, widened (eos comparisons). */
static uint64_t row_token(const uint8_t *row, uint64_t k, tf_dtype dt) {
    switch (dt) {
    case TF_UINT8: return row[k];
    case TF_UINT16: { uint16_t x; memcpy(&x, row + 2 * k, 2); return x; }
    case TF_INT16: { int16_t x; memcpy(&x, row + 2 * k, 2); return (uint64_t)(int64_t)x; }
    case TF_UINT32: { uint32_t x; memcpy(&x, row + 4 * k, 4); return x; }
    case TF_INT32: { int32_t x; memcpy(&x, row + 4 * k, 4); return (uint64_t)(int64_t)x; }
    default: { uint64_t x; memcpy(&x, row + 8 * k, 8); return x; }
    }
}

/* The concat extras of one row of a dataset split at eos_id without a
 * document index: a document starts at offset b in (0, L] iff row[b - 1] is
 * the eos id, the same boundaries the index gives (docindex.c), so the
 * formulas of concat.c hold. */
static void eos_row_extras(const tf__reader *r, const uint8_t *row, const tf_sample_extras *ex) {
    const uint64_t L = r->seq_len;
    uint64_t last = 0, nc = 1;
    if (ex->cu_seqlens) ex->cu_seqlens[0] = 0;
    for (uint64_t t = 0; t < L; t++) {
        int eos = row_token(row, t, r->out_dtype) == r->eos_id;
        if (ex->loss_mask) ex->loss_mask[t] = !eos;
        if (eos && t + 1 < L) tf__extras_segment(ex, t + 1, &last, &nc);
    }
    tf__extras_finish(ex, L, last, nc);
}

/* Stream position of row j: the contiguous slice from pos, or rowpos[j]. */
#define ROW_POS(j) (rowpos ? rowpos[j] : pos + (j))

/* The samples of rows [from, from + n) into win, and the order's prefetch of
 * what locating them reads (all rows' stage 0, then all rows' stage 1). */
static void plan_rows(const tf_order *o, uint64_t pos, const uint64_t *rowpos, uint64_t from, uint64_t n,
                      uint64_t *win) {
    for (uint64_t i = 0; i < n; i++) {
        win[i] = tf_order_sample_at(o, ROW_POS(from + i));
        tf__order_prefetch(o, win[i], 0);
    }
    for (uint64_t i = 0; i < n; i++) tf__order_prefetch(o, win[i], 1);
}

static int worker_fill(tf__worker *w, uint64_t pos, uint64_t rows, const uint64_t *rowpos, tf_batch_view *v,
                       tf__row_acct *acct) {
    tf__reader *r = w->rd;
    if (r->cp_size > 1 && r->eos_rows)
        TF_FAIL(-EINVAL, "context parallelism needs the document index of data split at eos id %llu: build it with `tokenfeed index`",
                (unsigned long long)r->eos_id);
    if (r->cp_size > 1) return cp_fill(w, pos, rows, rowpos, v, acct);
    const tf_order *o = r->order;
    const uint64_t L = r->seq_len;
    const size_t osz = tf_dtype_size(r->out_dtype);
    const int mmap_only = w->backend == TF_BACKEND_MMAP;
    size_t stage_need = 0;
    w->nrds = 0;
    w->bytes = 0;
    int want_extras = v->position_ids || v->cu_seqlens || v->num_seqs || v->loss_mask;
    int rc = 0;

    /* Software pipelining: the next row's sample index (a Feistel network:
     * ~100 dependent multiplies) is computed, and its first source lines are
     * prefetched, before this row is copied, so the copy of one row overlaps
     * the memory latency of the next. Without it the loader ran at 9.1 us per
     * 8x2048 batch against 6.5 us with precomputed offsets. */
    const int prefetch = mmap_only || r->zc;
    /* Further ahead, the order's own lookups: the sample indices of the next
     * TF__ROWS_AHEAD rows are computed together and the order prefetches
     * what locating each will read (a view's tables), in two rounds, so
     * those cache misses overlap instead of following one another row by
     * row. */
    uint64_t win[TF__ROWS_AHEAD], win0 = 0, winn = rows < TF__ROWS_AHEAD ? rows : TF__ROWS_AHEAD;
    plan_rows(o, pos, rowpos, 0, winn, win);
    uint64_t sample = rows ? win[0] : 0;
    size_t ns_next = 0; /* spans of this row already in w->spans (0: compute them) */
    for (uint64_t j = 0; j < rows && !rc; j++) {
        uint64_t next = 0;
        if (j + 1 < rows) {
            if (j + 1 >= win0 + winn) {
                win0 = j + 1;
                winn = rows - win0 < TF__ROWS_AHEAD ? rows - win0 : TF__ROWS_AHEAD;
                plan_rows(o, pos, rowpos, win0, winn, win);
            }
            next = win[j + 1 - win0];
        }
        size_t ns = ns_next;
        ns_next = prefetch && j + 1 < rows ? prefetch_sample(r, next, w->spans_next) : 0;
        uint8_t *row = (uint8_t *)v->tokens + j * (L + 1) * osz;
        if (!ns) {
            rc = tf__order_sample_spans(o, sample, w->spans, r->max_spans, &ns);
            if (rc) break;
        }
        for (size_t s = 0; s < ns && !rc; s++) rc = read_span(w, sample, &w->spans[s], 0, L + 1, row, &stage_need);
        if (!rc && acct) rc = account_row(w, sample, ns, &acct[j]);
        if (!rc && want_extras) {
            tf_sample_extras ex = {
                v->position_ids ? v->position_ids + j * L : NULL,
                v->cu_seqlens ? v->cu_seqlens + j * (L + 1) : NULL,
                v->num_seqs ? v->num_seqs + j : NULL,
                v->loss_mask ? v->loss_mask + j * L : NULL,
            };
            rc = tf__order_fill_extras(o, sample, &ex);
        }
        tf__span *t = w->spans; /* the next row's spans become this row's */
        w->spans = w->spans_next;
        w->spans_next = t;
        sample = next;
    }

    if (!rc) rc = finish_reads(w, stage_need);
    if (!rc && want_extras && r->eos_rows)
        for (uint64_t j = 0; j < rows; j++) {
            tf_sample_extras ex = {
                v->position_ids ? v->position_ids + j * L : NULL,
                v->cu_seqlens ? v->cu_seqlens + j * (L + 1) : NULL,
                v->num_seqs ? v->num_seqs + j : NULL,
                v->loss_mask ? v->loss_mask + j * L : NULL,
            };
            eos_row_extras(r, (const uint8_t *)v->tokens + j * (L + 1) * osz, &ex);
            if (ex.loss_mask && tf__order_pads_last(o)) ex.loss_mask[L - 1] = 0; /* its label is the pad */
        }
    /* after the reads (the pread and io_uring backends write the tokens in
     * finish_reads) and after the extras read from the tokens themselves */
    if (!rc && takedowns_active(w))
        for (uint64_t j = 0; j < rows && !rc; j++)
            rc = take_down_row(w, ROW_POS(j), (uint8_t *)v->tokens + j * (L + 1) * osz,
                               v->loss_mask ? v->loss_mask + j * L : NULL);
    /* compressed files count the zstd bytes decoded, not the tokens they hold */
    w->bytes += w->zh.decoded_bytes;
    w->zh.decoded_bytes = 0;
    atomic_fetch_add_explicit(&r->bytes_read, w->bytes, memory_order_relaxed);
    return rc;
}

/* Run the reads queued by queue_read (pread / io_uring backends) and convert
 * what was staged. */
static int finish_reads(tf__worker *w, size_t stage_need) {
    tf__reader *r = w->rd;
    int rc = 0;
    if (!w->nrds) return 0;
    rc = ensure_stage(w, stage_need);
    for (size_t i = 0; !rc && i < w->nrds; i++) {
        tf__rd *d = &w->rds[i];
        d->buf = d->stage_off == SIZE_MAX ? (uint8_t *)d->out : w->stage + d->stage_off;
    }
    int done = 0;
#ifdef TF_HAVE_IO_URING
    if (!rc && w->backend == TF_BACKEND_IO_URING && w->ring_ok) {
        int u = run_uring(w);
        if (u == 1) {
            tf__reader_note(r, "io_uring -> pread on worker %d: the ring failed", w->index);
            w->backend = TF_BACKEND_PREAD;
            for (size_t i = 0; i < w->nrds; i++) w->rds[i].done = 0;
        } else {
            rc = u;
            done = 1;
        }
    }
#endif
    for (size_t i = 0; !rc && !done && i < w->nrds; i++) rc = run_pread(w, &w->rds[i]);
    for (size_t i = 0; !rc && i < w->nrds; i++) {
        tf__rd *d = &w->rds[i];
        if (d->stage_off != SIZE_MAX) tf_convert(d->out, r->out_dtype, d->buf + d->head, d->sdt, d->count);
    }
    return rc;
}

/* ------------------------------------------------------------------------ */
/* context parallelism: a rank's share of every row (cp.h)                   */
/* ------------------------------------------------------------------------ */

/* One piece of the THD output: len entries at output offset out, from row
 * `row`'s input positions [src, src + len) (labels: + 1), or padding. */
struct tf__cp_work {
    uint64_t row, src, len, out;
};

static int cp_scratch(tf__worker *w, uint64_t L) {
    if (w->cp_ranges) return 0;
    w->cp_pos = malloc(L * sizeof *w->cp_pos);
    w->cp_cu = malloc((L + 1) * sizeof *w->cp_cu);
    w->cp_mask = malloc(L);
    w->cp_seg = malloc(L * sizeof *w->cp_seg);
    w->cp_pad = malloc(L * sizeof *w->cp_pad);
    w->cp_pieces = malloc(4 * L * sizeof *w->cp_pieces);
    uint64_t *ranges = malloc((4 * L + 4) * sizeof *ranges);
    if (!w->cp_pos || !w->cp_cu || !w->cp_mask || !w->cp_seg || !w->cp_pad || !w->cp_pieces || !ranges) {
        free(ranges);
        return -ENOMEM;
    }
    w->cp_ranges = ranges; /* last: it marks the scratch complete */
    return 0;
}

static int cp_push(tf__worker *w, uint64_t row, uint64_t src, uint64_t len, uint64_t out) {
    if (w->cp_nwork == w->cp_cap_work) {
        size_t nc = w->cp_cap_work ? 2 * w->cp_cap_work : 256;
        struct tf__cp_work *n = realloc(w->cp_work, nc * sizeof *n);
        if (!n) return -ENOMEM;
        w->cp_work = n;
        w->cp_cap_work = nc;
    }
    w->cp_work[w->cp_nwork++] = (struct tf__cp_work){row, src, len, out};
    return 0;
}

/* Read the union of the sorted ranges [lo, hi) of a row (nr pairs in
 * w->cp_ranges, merged here) from its spans, at their offsets in the row. */
static int cp_read_ranges(tf__worker *w, uint64_t sample, size_t ns, size_t nr, uint8_t *row, size_t *stage_need) {
    uint64_t *rg = w->cp_ranges;
    size_t m = 0;
    for (size_t i = 0; i < nr; i++) {
        if (m && rg[2 * i] <= rg[2 * m - 1]) {
            if (rg[2 * i + 1] > rg[2 * m - 1]) rg[2 * m - 1] = rg[2 * i + 1];
        } else {
            rg[2 * m] = rg[2 * i];
            rg[2 * m + 1] = rg[2 * i + 1];
            m++;
        }
    }
    size_t k = 0;
    for (size_t s = 0; s < ns; s++) {
        const tf__span *sp = &w->spans[s];
        while (k < m && rg[2 * k + 1] <= sp->dst) k++;
        for (size_t q = k; q < m && rg[2 * q] < sp->dst + sp->len; q++)
            TF_TRY(read_span(w, sample, sp, rg[2 * q], rg[2 * q + 1], row, stage_need));
    }
    return 0;
}

static int cp_fill(tf__worker *w, uint64_t pos, uint64_t rows, const uint64_t *rowpos, tf_batch_view *v,
                   tf__row_acct *acct) {
    tf__reader *r = w->rd;
    const tf_order *o = r->order;
    const uint64_t L = r->seq_len, c = r->cp_c, Lc = L / r->cp_size;
    const size_t osz = tf_dtype_size(r->out_dtype);
    size_t stage_need = 0;
    w->nrds = 0;
    w->bytes = 0;
    w->cp_nwork = 0;
    TF_TRY(cp_scratch(w, L));
    const int td = takedowns_active(w);
    uint64_t out = 0, nseq = 0, cu = 0, cup = 0, maxp = 0;
    if (r->thd) v->cu_seqlens[0] = v->cu_seqlens_padded[0] = 0;
    int rc = 0;
    for (uint64_t j = 0; j < rows && !rc; j++) {
        uint64_t sample = tf_order_sample_at(o, ROW_POS(j));
        size_t ns = 0, nr = 0;
        rc = tf__order_sample_spans(o, sample, w->spans, r->max_spans, &ns);
        if (rc) break;
        uint8_t *row = (uint8_t *)v->tokens + j * (L + 1) * osz;
        int32_t nseg = 0;
        tf_sample_extras ex = {v->position_ids && !r->thd ? w->cp_pos : NULL, r->thd ? w->cp_cu : NULL,
                               r->thd ? &nseg : NULL, v->loss_mask ? w->cp_mask : NULL};
        if (ex.position_ids || ex.cu_seqlens || ex.loss_mask) {
            rc = tf__order_fill_extras(o, sample, &ex);
            if (rc) break;
        }
        if (ex.loss_mask && td) {
            rc = take_down_row(w, ROW_POS(j), NULL, w->cp_mask); /* the sample's mask, before it is cut */
            if (rc) break;
        }
        if (!r->thd) {
            for (int h = 0; h < 2; h++) {
                uint64_t a = r->cp_first[h], at = j * Lc + (uint64_t)h * c;
                w->cp_ranges[nr * 2] = a;
                w->cp_ranges[nr * 2 + 1] = a + c + 1;
                nr++;
                if (v->position_ids) memcpy(v->position_ids + at, w->cp_pos + a, c * sizeof *w->cp_pos);
                if (v->loss_mask) memcpy(v->loss_mask + at, w->cp_mask + a, c);
            }
        } else {
            size_t n = (size_t)nseg;
            for (size_t q = 0; q < n; q++) w->cp_seg[q] = (uint64_t)(w->cp_cu[q + 1] - w->cp_cu[q]);
            uint64_t local;
            size_t np = tf__cp_thd_pieces(w->cp_seg, n, r->cp_size, r->cp_rank, w->cp_pieces, &local, w->cp_pad);
            if (out + local > r->thd_cap_tokens || nseq + n > r->thd_cap_seqs) {
                rc = tf__seterr(-EFAULT, "internal: a THD batch outgrew its buffer (%llu entries, %llu sequences)",
                                (unsigned long long)r->thd_cap_tokens, (unsigned long long)r->thd_cap_seqs);
                break;
            }
            for (size_t q = 0; q < n; q++) {
                cu += w->cp_seg[q];
                cup += w->cp_pad[q];
                if (w->cp_pad[q] > maxp) maxp = w->cp_pad[q];
                nseq++;
                v->cu_seqlens[nseq] = (int32_t)cu;
                v->cu_seqlens_padded[nseq] = (int32_t)cup;
            }
            for (size_t q = 0; q < np && !rc; q++) {
                const tf__cp_piece *pc = &w->cp_pieces[q];
                rc = cp_push(w, j, pc->src, pc->len, out);
                if (v->position_ids)
                    for (uint64_t e = 0; e < pc->len; e++) v->position_ids[out + e] = (int32_t)(pc->pos + e);
                if (v->loss_mask) {
                    if (pc->src == TF_CP_PAD) memset(v->loss_mask + out, 0, pc->len);
                    else memcpy(v->loss_mask + out, w->cp_mask + pc->src, pc->len);
                }
                if (pc->src != TF_CP_PAD) {
                    w->cp_ranges[nr * 2] = pc->src;
                    w->cp_ranges[nr * 2 + 1] = pc->src + pc->len + 1;
                    nr++;
                }
                out += pc->len;
            }
            if (rc) break;
        }
        rc = cp_read_ranges(w, sample, ns, nr, row, &stage_need);
        if (!rc && acct) rc = account_row(w, sample, ns, &acct[j]);
    }
    if (!rc) rc = finish_reads(w, stage_need);
    /* the whole sample's tokens before this rank's share is copied out */
    for (uint64_t j = 0; td && !rc && j < rows; j++)
        rc = take_down_row(w, ROW_POS(j), (uint8_t *)v->tokens + j * (L + 1) * osz, NULL);
    if (!rc) {
        uint8_t *in = v->input_ids, *lab = v->labels;
        if (!r->thd) {
            for (uint64_t j = 0; j < rows; j++) {
                const uint8_t *row = (const uint8_t *)v->tokens + j * (L + 1) * osz;
                for (int h = 0; h < 2; h++) {
                    uint64_t a = r->cp_first[h], at = (j * Lc + (uint64_t)h * c) * osz;
                    memcpy(in + at, row + a * osz, c * osz);
                    memcpy(lab + at, row + (a + 1) * osz, c * osz);
                }
            }
            v->num_tokens = rows * Lc;
        } else {
            for (size_t q = 0; q < w->cp_nwork; q++) {
                const struct tf__cp_work *k = &w->cp_work[q];
                if (k->src == TF_CP_PAD) {
                    fill_separator(in + k->out * osz, osz, r->out_dtype, r->pad, k->len);
                    fill_separator(lab + k->out * osz, osz, r->out_dtype, r->pad, k->len);
                } else {
                    const uint8_t *row = (const uint8_t *)v->tokens + k->row * (L + 1) * osz;
                    memcpy(in + k->out * osz, row + k->src * osz, k->len * osz);
                    memcpy(lab + k->out * osz, row + (k->src + 1) * osz, k->len * osz);
                }
            }
            v->num_tokens = out;
            v->num_seqs[0] = (int32_t)nseq;
            v->max_seqlen = (int32_t)maxp;
        }
    }
    /* compressed files count the zstd bytes decoded, not the tokens they hold */
    w->bytes += w->zh.decoded_bytes;
    w->zh.decoded_bytes = 0;
    atomic_fetch_add_explicit(&r->bytes_read, w->bytes, memory_order_relaxed);
    return rc;
}
