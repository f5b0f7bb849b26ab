/*
 * engine.h — private interface between the batch engine's thread machinery
 * (loader.c) and its read backends (read.c). Not installed.
 *
 * read.c turns "fill rows [p, p + rows) of the stream into these buffers" into
 * reads, through one of the backends (mmap, pread, io_uring), with a cache of
 * decompressed zstd blocks shared by the workers (zcache.c). All backends
 * produce byte-identical output; they differ only in how the bytes come off
 * storage.
 */
#ifndef TF_ENGINE_H
#define TF_ENGINE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/internal.h"
#include "../order/order_internal.h"
#include "../sources/source.h"
#include "zcache.h"

#ifdef TF_HAVE_IO_URING
#include <liburing.h>
#endif

struct tf__cp_work;
struct tf__cp_piece;

/* fd table states besides a real descriptor (>= 0). */
#define TF__FD_UNOPENED (-1)
#define TF__FD_UNUSABLE (-2) /* read this file through its mapping instead */

#define TF__PREFETCH_LINES 16 /* cache lines prefetched at the start of the next sample */
#define TF__PREFETCH_SPANS 8  /* spans of the next sample whose starts are prefetched */
#define TF__PREFETCH_SPAN_LINES 64 /* lines of each span prefetched when a sample has several */
#define TF__ROWS_AHEAD 16     /* rows whose samples are computed, and order lookups prefetched, together */
#define TF__URING_QD 64    /* io_uring submission queue depth per worker */
#define TF__DIO_ALIGN 4096 /* O_DIRECT offset / length / buffer alignment */

/* A file's descriptor in the reader's table (fd_mu): TF__FD_* or open, with
 * the reads queued on it now (never closed while > 0) and its last use. */
typedef struct tf__fdslot {
    int fd;
    uint32_t users;
    uint64_t last;
} tf__fdslot;

/* What every worker shares: read-only after tf__reader_init, except the fd
 * tables (fd_mu), bytes_read, the note and the zstd block cache (its own
 * lock). At most max_open descriptors are open (a quarter of the soft
 * RLIMIT_NOFILE, at most 1024), over all the workers: beyond, the least
 * recently used one that no queued read holds is closed, and when all are
 * held a worker runs its own queued reads or waits for another's to end
 * (read.c, get_fd), so that a dataset of many thousand shards leaves the
 * process its descriptors. */
typedef struct tf__reader {
    const tf_dataset *ds;
    const tf_order *order;
    tf_backend backend; /* effective backend after the create-time probe */
    int direct_io;
    tf_dtype out_dtype;
    uint64_t seq_len;
    int64_t separator;
    int64_t pad; /* pad id of BEST_FIT / DOCUMENT samples */
    /* The dataset's documents end after eos_id and it has no document index
     * (tf_dataset.docs_from_rows): a row's extras come from its own tokens. */
    int eos_rows;
    uint64_t eos_id;
    size_t max_spans;
    /* context parallelism (cp.h): set by the loader after tf__reader_init */
    uint32_t cp_size, cp_rank; /* cp_size <= 1: none */
    int thd;                   /* THD layout (with cu_seqlens) */
    uint64_t cp_c, cp_first[2]; /* plain split: chunk length and rank's two chunks */
    uint64_t thd_cap_tokens, thd_cap_seqs; /* THD: capacity of the batch's arrays */
    /* balancing (tf_balance): which rows of a step this rank's batch takes;
     * bal == TF_BALANCE_NONE: the contiguous slice */
    tf_balance bal;
    uint32_t bal_world, bal_rank, bal_micro;
    uint64_t bal_B;
    /* per-row accounting of a mixture (sources > 0): first sample id of each
     * source, nsources + 1 entries */
    size_t nsources;
    const uint64_t *source_first;
    tf__fdslot *fds;  /* per file, buffered reads */
    tf__fdslot *dfds; /* per file, O_DIRECT reads (only with direct_io) */
    pthread_mutex_t fd_mu;
    pthread_cond_t fd_cv; /* a descriptor's last queued read is over (fd_waiters > 0) */
    int fd_mu_ok;         /* fd_mu and fd_cv initialised */
    uint64_t nopen, max_open, fd_clock;
    uint32_t fd_waiters; /* workers waiting for a descriptor (fd_mu) */
    _Atomic uint64_t bytes_read;
    _Atomic int uring_workers; /* workers whose ring works (for stats) */
    tf__zcache *zc;            /* decompressed zstd blocks; NULL without compressed files */
    /* A one-time note on a fallback (backend, O_DIRECT, fds): state 0 empty,
     * 1 being written, 2 readable. */
    _Atomic int note_state;
    char note[160];
} tf__reader;

/* One pending read of a file range (pread and io_uring backends). */
typedef struct tf__rd {
    int fd;
    uint64_t fi;       /* the file (its descriptor is held until the fill ends) */
    uint64_t off;      /* file offset of buf[0] (aligned for O_DIRECT) */
    size_t len;        /* bytes requested into buf */
    size_t need;       /* bytes of buf that must arrive (head + payload) */
    size_t done;       /* bytes arrived so far */
    size_t stage_off;  /* where buf lies in the stage, or SIZE_MAX: buf = out */
    uint8_t *buf;
    size_t head;       /* payload starts at buf + head */
    void *out;         /* converted destination */
    tf_dtype sdt;      /* file dtype */
    size_t count;      /* tokens */
    int direct;
    const char *path;  /* for messages */
} tf__rd;

/* Per worker thread: never shared, so no locking. */
/* A loader's takedowns (tf_order_exclude) as of its last seek: a copy the
 * workers read while the consumer may change the order's own list (the loader
 * takes a new copy at every seek, and tf_loader_exclude seeks). refs counts
 * the loader and the workers filling a batch with it, under the loader's mu. */
typedef struct tf__takedown {
    uint64_t pos;  /* from this global position on */
    size_t source;
    size_t n;
    uint64_t *ids; /* ascending, distinct */
} tf__takedown;
typedef struct tf__takedowns {
    size_t refs;
    size_t n;
    tf__takedown *e;
} tf__takedowns;

typedef struct tf__worker {
    tf__reader *rd;
    struct tf_loader *loader; /* back pointer for the thread loop (loader.c) */
    int index;
    tf_backend backend;       /* this worker's backend (io_uring may fall back) */
    tf__span *spans;
    tf__span *spans_next;     /* the next row's spans, computed while this row is read (worker_fill) */
    uint8_t *stage;           /* TF__DIO_ALIGN-aligned staging buffer */
    size_t stage_cap;
    tf__rd *rds;
    size_t nrds, cap_rds;
    size_t *queue;            /* io_uring: indices to (re)submit */
    tf__zhold zh;             /* this worker's pin in the shared zstd cache */
    /* balancing: the last step this worker computed (tf_order_balance) */
    tf__balance_cache bal;    /* the last balancing step this worker read (order/balance.c) */
    int32_t *warm_cu;         /* sequence-length warmup: one sample's cu_seqlens (L + 1) */
    uint64_t bytes;           /* bytes read in the current batch */
    /* context parallelism: one row's extras (L positions, L + 1 cu_seqlens, L
     * mask), its segment lengths and padded lengths, the pieces of the batch
     * (THD) and the ranges of a row to read */
    int32_t *cp_pos, *cp_cu;
    uint8_t *cp_mask;
    uint64_t *cp_seg, *cp_pad;
    struct tf__cp_work *cp_work;
    size_t cp_nwork, cp_cap_work;
    struct tf__cp_piece *cp_pieces; /* 4 L */
    uint64_t *cp_ranges;            /* 2 L + 2 pairs [lo, hi) */
    /* takedowns: the copy in force for the batch being filled (NULL: none),
     * the batch's global position, and one row's segments (L + 1) */
    const tf__takedowns *td;
    uint64_t td_gpos;
    tf_segment *td_segs;
#ifdef TF_HAVE_IO_URING
    struct io_uring ring;
    int ring_ok;
#endif
} tf__worker;

/* The chunk scheduler of a loader whose dataset has remote files
 * (remote_glue.c): *out stays NULL when nothing is remote. ctx_out is the
 * scheduler's locate context, freed by tf__engine_prefetch_free. With
 * balancing the scheduler reads ahead the rows the rank is given. */
struct tf__prefetch;
TF_HIDDEN int tf__engine_prefetch_create(const tf_order *order, uint64_t B, uint64_t G, uint64_t rank,
                                         tf_balance bal, uint32_t micro, struct tf__prefetch **out, void **ctx_out);
TF_HIDDEN void tf__engine_prefetch_free(struct tf__prefetch *p, void *ctx);

/* Set up the shared reader; resolves backend AUTO/$TOKENFEED_BACKEND and
 * probes io_uring. Returns -EINVAL (with a message) for a bad env value. */
TF_HIDDEN int tf__reader_init(tf__reader *r, const tf_dataset *ds, const tf_order *o,
                              tf_backend backend, int direct_io, tf_dtype out_dtype);
/* Close every descriptor opened; free the tables. */
TF_HIDDEN void tf__reader_destroy(tf__reader *r);
/* Record a fallback note once (first writer wins). */
TF_HIDDEN void tf__reader_note(tf__reader *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Copy the note into out (cap bytes), "" if none. */
TF_HIDDEN void tf__reader_get_note(tf__reader *r, char *out, size_t cap);

TF_HIDDEN int tf__worker_init(tf__worker *w, tf__reader *r, int index);
TF_HIDDEN void tf__worker_destroy(tf__worker *w);

/* Accounting of one row of a mixture (per-source stats). */
typedef struct tf__row_acct {
    uint64_t source, tokens, documents;
} tf__row_acct;

/* Fill `rows` samples, stream positions [pos, pos + rows), into the view's
 * buffers (tokens rows x (L+1) in the out dtype, and the extras that are not
 * NULL; under context parallelism tokens is where the rank's ranges are read,
 * at their offsets in the sample, and input_ids, labels and the extras get
 * the rank's share, with num_tokens / max_seqlen set for THD). acct: rows
 * entries filled for a mixture, or NULL. Returns 0 or a negative code with
 * tf_last_error set on this thread. */
TF_HIDDEN int tf__worker_fill(tf__worker *w, uint64_t pos, uint64_t rows, tf_batch_view *v, tf__row_acct *acct);

/* Sequence-length warmup (warmup.c): -EINVAL unless min_len is L / 2^m (when
 * steps > 0); cut a filled batch's samples into rows of l tokens in place
 * (the buffer has room for rows x (L + L / l) tokens and cu_seqlens
 * entries); cu_scratch holds L + 1 entries. */
TF_HIDDEN int tf__warmup_check(uint64_t L, uint64_t min_len, uint64_t steps);
TF_HIDDEN void tf__warmup_cut(tf_batch_view *v, uint64_t l, int32_t *cu_scratch);

/* ---- hand-off to the device stage (csrc/device/stage.c) ------------------- */

/* The engine knows nothing of CUDA. A device stage that wants the batch
 * buffers page-locked, so that its copies read them in place, gives the
 * loader an allocator of page-aligned memory. From then on every new buffer
 * comes from it; buffers made before are freed as they come back instead of
 * being reused; buffers from it are kept while the loader lives (never freed
 * to a cap), so each is page-locked once. `a` must outlive every buffer (a
 * static table); NULL goes back to ordinary memory. Thread-safe. */
typedef struct tf__buffer_allocator {
    void *(*alloc)(size_t bytes, int *locked); /* page-aligned, or NULL; *locked: page-locked */
    void (*free)(void *p, size_t bytes, int locked);
} tf__buffer_allocator;
TF_HIDDEN void tf__loader_set_allocator(tf_loader *l, const tf__buffer_allocator *a);
/* Whether b's buffer is page-locked memory (from the allocator). */
TF_HIDDEN int tf__batch_locked(const tf_batch *b);
/* Buffers the allocator has made page-locked so far (each once). */
TF_HIDDEN uint64_t tf__loader_locked_buffers(const tf_loader *l);

/* The arrays of a batch, for a stage that copies them elsewhere: whatever
 * the loader's configuration makes (the plain arrays, or a context-parallel
 * rank's input_ids / labels / extras and the THD cu_seqlens_padded), indexed
 * by tf__seg_id. `cap` is the room the loader gives the array, the same for
 * every batch of the loader (0: an array it does not make); `bytes` is what
 * this batch fills, a prefix of it: equal to cap except under THD, where the
 * token arrays hold num_tokens entries and cu_seqlens / cu_seqlens_padded
 * num_seqs + 1. Counts that are not arrays (THD num_seqs and max_seqlen, the
 * view's num_tokens) are not segments: read them from the view. Under
 * context parallelism `tokens` is the workers' scratch, not a segment. */
typedef enum tf__seg_id {
    TF__SEG_TOKENS,
    TF__SEG_POSITION_IDS,
    TF__SEG_CU_SEQLENS,
    TF__SEG_NUM_SEQS,
    TF__SEG_LOSS_MASK,
    TF__SEG_INPUT_IDS,
    TF__SEG_LABELS,
    TF__SEG_CU_SEQLENS_PADDED,
    TF__NSEGS
} tf__seg_id;
typedef struct tf__batch_seg {
    const void *host; /* in the batch's buffer; NULL when cap is 0 */
    size_t bytes, cap;
} tf__batch_seg;
/* The array names, as the binding names them (indexed by tf__seg_id). */
TF_HIDDEN extern const char *const tf__seg_names[TF__NSEGS];
TF_HIDDEN void tf__batch_segments(const tf_batch *b, tf__batch_seg seg[TF__NSEGS]);


#endif
