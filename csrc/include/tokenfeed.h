/*
 * tokenfeed.h — the complete C API of tokenfeed.
 *
 * tokenfeed feeds pre-tokenized training data to accelerators. The library is
 * layered, each layer usable without the ones above it (docs/design.md in the
 * source repository):
 *
 *   sources  tf_dataset, tf_writer   open / write token shards of several formats,
 *            tf_remote               locally or from object storage through a
 *                                    transport you supply and a node-local chunk
 *                                    cache; join datasets made of parts
 *   order    tf_perm, tf_order       which tokens make sample i: packing, shuffle,
 *                                    mixing and mixture schedules; pure functions
 *                                    of (config, position)
 *   engine   tf_loader, tf_batch     batches assembled into reusable buffers, over
 *                                    an order built once (tf_loader_create_from_order);
 *                                    context-parallel shares of each sample
 *   device   tf_device_loader,       a loader's batches copied to a CUDA device
 *            tf_device_ring          ahead of the consumer; pinned host memory and
 *                                    device slots; the CUDA runtime is loaded at
 *                                    run time
 *
 * Conventions, said once for the whole header:
 *   - Functions that can fail return 0 on success or a negative error code:
 *     -errno for system errors (-ENOMEM, -ENOENT, -EINVAL, -EIO, ...), or one of the
 *     -TF_E* codes below. tf_strerror() names a code; tf_last_error() returns a
 *     longer, thread-local message for the most recent failure on this thread
 *     (file, field, expected, found, and what to do).
 *   - Objects are opaque handles with create/free pairs. Every free function
 *     accepts NULL. Ownership is stated on each function; "borrowed" pointers
 *     must outlive the object that borrows them.
 *   - All counters (tokens, documents, samples, positions) are 64-bit.
 *   - No function calls exit() or abort(), whatever the input.
 *   - Process-wide state: the first mapped file installs a SIGBUS handler
 *     (see "Sources: the SIGBUS guard of mapped files" for what it does and
 *     how a program with a SIGBUS handler of its own keeps it working).
 *
 * Stable and experimental API. Everything declared by default is the stable
 * API: it keeps its meaning and its binary interface across releases with the
 * same major version (TF_VERSION_MAJOR; the shared library's soname is
 * libtokenfeed.so.MAJOR, and its symbols carry the version TOKENFEED_MAJOR).
 * The experimental API (the raw keyed permutation tf_perm, llm.c's and
 * Megatron's orders by their own constructors, the device ring
 * tf_device_ring/tf_device_slot, shard sets and their catalogs, local and
 * remote) is declared only where
 * the including file defines TF_EXPERIMENTAL_API first:
 *
 *     #define TF_EXPERIMENTAL_API
 *     #include "tokenfeed.h"
 *
 * as zstd.h does with ZSTD_STATIC_LINKING_ONLY. It may change in any release;
 * its symbols carry a version of their own (TOKENFEED_EXPERIMENTAL_N, N raised
 * whenever it changes), so a program built against an older one refuses to
 * load rather than misbehave.
 */
#ifndef TOKENFEED_H
#define TOKENFEED_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define TF_API __attribute__((visibility("default")))
#else
#define TF_API
#endif

/* The version of tokenfeed: written here only (setup.py reads it for the
 * Python package's version). */
#define TF_VERSION_MAJOR 0
#define TF_VERSION_MINOR 1
#define TF_VERSION_PATCH 0
#define TF__STR_(x) #x
#define TF__STR(x) TF__STR_(x)
#define TF_VERSION_STRING TF__STR(TF_VERSION_MAJOR) "." TF__STR(TF_VERSION_MINOR) "." TF__STR(TF_VERSION_PATCH)

/* ------------------------------------------------------------------------ */
/* Errors                                                                    */
/* ------------------------------------------------------------------------ */

/* Library-specific error codes; functions return their negation. They lie above
 * the errno range so that the two never collide. */
enum {
    TF_EFORMAT = 10001,   /* malformed input file (header, offsets, index, ...) */
    TF_ECHECKSUM = 10002, /* a stored checksum does not match the data */
    TF_EVOCAB = 10003,    /* a token id is negative or >= vocab_size */
    TF_ESTATE = 10004,    /* a saved state does not match this loader */
    TF_EEOF = 10005,      /* end of stream (epochs exhausted) */
    TF_EUNSUPPORTED = 10006, /* feature not compiled in or not usable here */
    TF_ECUDA = 10007,     /* CUDA runtime error (details in tf_last_error) */
    TF_ENOTREADY = 10008, /* a timed wait ended with nothing ready yet: not a failure,
                           * call again (the *_next_timed functions only) */
};

/* Interrupts. A blocking wait that a caller's thread makes inside the library
 * (a remote open waiting for its requests, a read waiting for a chunk to be
 * fetched) calls check every 50 ms or so, from that thread, without holding a
 * lock of the library's; when it returns non-zero the wait ends with -EINTR
 * (work it started is cancelled, or left to finish in the background where it
 * writes nothing of the caller's). An interpreter passes a function that looks
 * for a pending signal on its main thread. Process-wide; NULL (the default)
 * means never interrupted. */
typedef int (*tf_interrupt_check_fn)(void);
TF_API void tf_interrupt_set_check(tf_interrupt_check_fn check);

/* Progress notices: a wait that goes on (a remote request unanswered for 10 s
 * and every 10 s after) says what it waits for, e.g. "waiting for
 * s3://b/k (10 s, attempt 2 of 8)", through fn, from the waiting thread
 * (any thread; no lock of the library's held). Process-wide; NULL (the
 * default) keeps quiet. */
typedef void (*tf_notice_fn)(const char *msg);
TF_API void tf_notice_set_fn(tf_notice_fn fn);

/* Static description of an error code (either sign accepted). Never NULL. */
TF_API const char *tf_strerror(int err);

/* Thread-local detail message of the last error raised on this thread by the
 * library ("" when none). Valid until the next failing call on this thread. */
TF_API const char *tf_last_error(void);

/* Library version string, "MAJOR.MINOR.PATCH" (TF_VERSION_STRING). */
TF_API const char *tf_version(void);

/* Features compiled in: bit set of TF_FEATURE_*. */
enum {
    TF_FEATURE_ZSTD = 1u << 0,
    TF_FEATURE_IO_URING = 1u << 1,
    TF_FEATURE_CUDA = 1u << 2, /* the dlopen-based CUDA layer is compiled in */
};
TF_API unsigned tf_features(void);

/* Whether io_uring can be used in this process right now (it may be compiled
 * in but blocked by seccomp, memlock limits or an old kernel). Returns 1 if
 * usable, 0 if not, with the reason written to why (may be NULL). */
TF_API int tf_io_uring_usable(char *why, size_t why_len);

/* ------------------------------------------------------------------------ */
/* Token dtypes                                                              */
/* ------------------------------------------------------------------------ */

typedef enum tf_dtype {
    TF_DTYPE_INVALID = 0,
    TF_UINT8 = 1,
    TF_UINT16 = 2,
    TF_UINT32 = 3,
    TF_UINT64 = 4,
    TF_INT8 = 5,
    TF_INT16 = 6,
    TF_INT32 = 7,
    TF_INT64 = 8,
    TF_FLOAT32 = 9, /* only Megatron files can carry these */
    TF_FLOAT64 = 10,
} tf_dtype;

/* Size in bytes of one element (0 for an invalid dtype). */
TF_API size_t tf_dtype_size(tf_dtype dt);
/* NumPy-style name ("uint16", ...); "invalid" for an unknown value. */
TF_API const char *tf_dtype_name(tf_dtype dt);
/* Parse a NumPy-style name; returns TF_DTYPE_INVALID when unknown. */
TF_API tf_dtype tf_dtype_from_name(const char *name);

/* Convert n elements from src (dtype s) to dst (dtype d). Float -> integer
 * truncates toward zero. Buffers must not overlap. */
TF_API void tf_convert(void *dst, tf_dtype d, const void *src, tf_dtype s, size_t n);

/* A size written for people, as every size setting of tokenfeed reads it:
 * a number, optionally with a fraction ("1.5"), then optionally a unit,
 * case-insensitive: B; K, M, G, T, P with or without B (powers of 1000);
 * KiB, MiB, GiB, TiB, PiB (powers of 1024). "2G" is 2,000,000,000 bytes,
 * "1.5TiB" 1,649,267,441,664, "4096" 4096. A fraction of a byte is dropped.
 * -EINVAL for anything else (-ERANGE past 2^64 - 1), with a message naming
 * what (the setting or variable read, for the message) and the accepted
 * forms; *bytes is then 0. */
TF_API int tf_parse_size(const char *text, const char *what, uint64_t *bytes);

/* XXH64 of a buffer (the checksum used by the native format and fingerprints). */
TF_API uint64_t tf_hash64(const void *data, size_t len, uint64_t seed);

/* ------------------------------------------------------------------------ */
/* Sources: datasets                                                         */
/* ------------------------------------------------------------------------ */

typedef struct tf_dataset tf_dataset;

typedef enum tf_format {
    TF_FORMAT_AUTO = 0,
    TF_FORMAT_NATIVE = 1,   /* tokenfeed shard (.tfs) or dataset directory */
    TF_FORMAT_MEGATRON = 2, /* Megatron MMIDIDX v1 .bin/.idx, given the prefix */
    TF_FORMAT_LLMC = 3,     /* llm.c shard (.bin with 256 x int32 header) */
    TF_FORMAT_RAW = 4,      /* headerless tokens (+ optional datatrove .index) */
    TF_FORMAT_NPY = 5,      /* 1-D integer NumPy array */
    TF_FORMAT_NEMO_NANOGPT = 6, /* NeMo AutoModel nanogpt shard (+ optional .bos.idx) */
} tf_format;

/* Formats by name. tf_format_name gives a format's name ("tokenfeed",
 * "llm.c", ...; "auto" for TF_FORMAT_AUTO). tf_format_from_name takes a name
 * or an alias ("native", "llmc", "nanogpt") or "auto": 0, or -EINVAL with the
 * known names in tf_last_error(). tf_format_at(i) is the i-th format the
 * library reads, from 0, and TF_FORMAT_AUTO past the last. */
TF_API const char *tf_format_name(tf_format f);
TF_API int tf_format_from_name(const char *name, tf_format *out);
TF_API tf_format tf_format_at(size_t i);

typedef struct tf_open_options {
    tf_format format;   /* TF_FORMAT_AUTO to detect */
    tf_dtype raw_dtype; /* dtype of headerless files (required for them) */
    /* Headerless files whose documents are separated by an end-of-document
     * token: with has_eos_id set, a document ends after each eos_id. Its
     * document index (tf_doc_index_build) is read from beside the file, or
     * else from index_dir; without one, concat packing finds the documents of
     * each row in the row's own tokens, and the other packings are refused.
     * eos_id enters the dataset fingerprint; whether an index is present does
     * not. Zero-initialised: no eos id, no index_dir. */
    int has_eos_id;
    uint64_t eos_id;
    const char *index_dir; /* NULL: only beside the file */
} tf_open_options;

/* Open one path: a native dataset directory, a native shard, a Megatron prefix
 * (path without .bin/.idx), an llm.c shard, a .npy file, or a headerless token
 * file (only with raw_dtype set). Validates headers and sizes only: O(files).
 * URLs of remote objects need tf_dataset_open_remote.
 * opt may be NULL. On success *out owns the mappings; free with tf_dataset_free. */
TF_API int tf_dataset_open(const char *path, const tf_open_options *opt, tf_dataset **out);

/* Open several paths and concatenate them in order (documents and tokens).
 * A dataset of several local files maps each on first touch and keeps at most
 * $TOKENFEED_MAX_OPEN_SHARDS (default 256) of them mapped per process; the
 * node's catalog ($TOKENFEED_CATALOG_DIR) lets a later open of the same paths
 * skip reading their headers (docs/format.md, "The node's catalog"). */
TF_API int tf_dataset_open_many(const char *const *paths, size_t n, const tf_open_options *opt,
                                tf_dataset **out);

typedef struct tf_remote tf_remote; /* see "Sources: remote objects" below */

/* As tf_dataset_open_many, where paths may also be URLs of remote objects
 * ("s3://bucket/prefix/", "https://host/file.bin", any "scheme://" but
 * file://), read through remote (tf_remote_create; borrowed: the dataset
 * takes its own reference). Each URL names what a local path can (a native
 * dataset directory, a shard, a Megatron prefix, an llm.c / .npy / raw file),
 * or a shard set: a glob or a directory URL of foreign files, expanded from
 * one listing per node (tf_dataset_open_remote_spec). Only metadata is read at open, with concurrent ranged requests; the
 * fingerprint equals that of the same files on local disk. Token bytes are
 * read later through the node-local chunk cache. What the open fetched is
 * recorded in the cache directory: a later open of the same paths with the
 * same options, by any process using that cache_dir, reads it there and sends
 * no request (an object changed since is refused, by name, when read, and its
 * record dropped). remote may be NULL when no path is a URL. */
TF_API int tf_dataset_open_remote(const char *const *paths, size_t n, const tf_open_options *opt,
                                  tf_remote *remote, tf_dataset **out);

/* A dataset over memory: tokens (n of dtype dt) and optional document ends
 * (cumulative, ndocs entries, last == n; NULL means one document). Copies both.
 * vocab_size 0 means unknown. Used by tests and by embedders. */
TF_API int tf_dataset_from_memory(const void *tokens, uint64_t n, tf_dtype dt,
                                  const uint64_t *doc_ends, uint64_t ndocs, uint64_t vocab_size,
                                  tf_dataset **out);

TF_API void tf_dataset_free(tf_dataset *ds);

/* Build the document index of the headerless token file data_path (dtype
 * opt->raw_dtype, documents ending after opt->eos_id, so opt->has_eos_id must
 * be set): "<data_path>.tfdocs" beside it, or when that directory is not
 * writable, in opt->index_dir. ends (cumulative document ends, nends entries,
 * last == the file's token count) gives the documents from metadata written
 * with the file; NULL takes them from OLMo's document metadata when data_path
 * is "x.npy" and "x.csv.gz" lies beside it (a gzip'd CSV of start,end,...
 * rows, every row checked; zlib is loaded at run time for it, libz.so.1 or
 * $TOKENFEED_ZLIB, and without it this fails with -ENOSYS and says so), and
 * otherwise scans the tokens for eos_id. Such an index records the metadata
 * file too, and open refuses it once that file changes or goes. The file is written under a
 * temporary name, fsynced and renamed, never through a symlink; it records the
 * data file's size and modification time, which every open checks.
 * The path written goes to out (cap bytes). Format: docs/format.md. */
TF_API int tf_doc_index_build(const char *data_path, const tf_open_options *opt, const uint64_t *ends,
                              uint64_t nends, char *out, size_t cap);

typedef struct tf_dataset_info {
    uint64_t num_tokens;
    uint64_t num_documents;
    uint64_t vocab_size; /* 0 when the format does not record it */
    tf_dtype dtype;      /* widest dtype among the files */
    tf_format format;    /* of the first file */
    uint64_t num_files;
    uint64_t fingerprint; /* 64-bit dataset fingerprint */
} tf_dataset_info;

TF_API int tf_dataset_get_info(const tf_dataset *ds, tf_dataset_info *info);

typedef struct tf_file_info {
    const char *path; /* borrowed from the dataset */
    tf_format format;
    tf_dtype dtype;
    uint64_t first_token;    /* global offset of this file's first token */
    uint64_t num_tokens;
    uint64_t first_document; /* global index of this file's first document */
    uint64_t num_documents;
    int compressed;
} tf_file_info;

TF_API int tf_dataset_get_file(const tf_dataset *ds, uint64_t i, tf_file_info *info);

/* Copy tokens [start, start+count) into out, converted to out_dtype; crosses
 * file boundaries. -ERANGE if the range exceeds num_tokens. */
TF_API int tf_dataset_read(const tf_dataset *ds, uint64_t start, uint64_t count, void *out,
                           tf_dtype out_dtype);

/* Zero-copy: if [start, start+count) lies in one uncompressed mapped file,
 * *ptr points at it (in the file's dtype, reported in *dtype) and 0 is returned;
 * otherwise -TF_EUNSUPPORTED (use tf_dataset_read). The pointer lives as long as
 * the dataset. The files of a dataset of several local files are mapped on
 * demand and may be unmapped again (TOKENFEED_MAX_OPEN_SHARDS): they give
 * -TF_EUNSUPPORTED too. */
TF_API int tf_dataset_view(const tf_dataset *ds, uint64_t start, uint64_t count, const void **ptr,
                           tf_dtype *dtype);

/* Whether the dataset's documents are known: 0, or -EINVAL when a file is
 * split at an eos id without its document index (tf_open_options.has_eos_id;
 * tf_doc_index_build). Such a file's documents are found only inside the
 * rows of a concat loader, from the row's own tokens; until its index is
 * built, tf_dataset_get_info's num_documents counts it as one document and
 * tf_dataset_document and tf_dataset_find_document place documents by file,
 * so a caller that needs documents checks here first. The message names the
 * file and the `tokenfeed index` command that builds its index. */
TF_API int tf_dataset_check_documents(const tf_dataset *ds);

/* Document i: its first token (global) and its length. */
TF_API int tf_dataset_document(const tf_dataset *ds, uint64_t i, uint64_t *start, uint64_t *len);

/* Index of the document that contains global token position pos: O(log). */
TF_API int tf_dataset_find_document(const tf_dataset *ds, uint64_t pos, uint64_t *doc);

/* Progress callback: done and total in bytes; return non-zero to cancel. */
typedef int (*tf_progress_fn)(void *user, uint64_t done, uint64_t total);

/* Full verification: checksums where the format has them, document index
 * consistency, and every token id < vocab_size (when known). Runs on `threads`
 * threads (0 = number of cores). cb may be NULL; it is called from the calling
 * thread only. Returns -TF_ECHECKSUM / -TF_EVOCAB / -TF_EFORMAT with details. */
TF_API int tf_dataset_verify(const tf_dataset *ds, int threads, tf_progress_fn cb, void *user);

/* ------------------------------------------------------------------------ */
/* Sources: the SIGBUS guard of mapped files                                 */
/* ------------------------------------------------------------------------ */

/* Files are read through mmap. If another process truncates a mapped file (or
 * rewrites it in place), touching a page past its new end raises SIGBUS, whose
 * default action kills the process. So the library reads mapped memory under a
 * guard, and a fault there becomes -EIO with a message naming the file and the
 * offset, from the call that was reading (tf_dataset_read, tf_loader_next, ...).
 *
 * The guard needs a process-wide SIGBUS handler. It is installed once, the
 * first time any file is mapped (the first tf_dataset_open* of a local or
 * cached file), with sigaction(SA_SIGINFO | SA_ONSTACK), and never removed.
 * It handles a fault only when the faulting thread is inside one of the
 * library's guarded reads and the fault is a memory fault (si_code
 * BUS_ADRERR, BUS_OBJERR or BUS_MCEERR_AR): it then jumps back into the
 * library (siglongjmp), which returns -EIO. Every other SIGBUS (a fault in
 * your own code, a signal sent with kill) goes to the handler that was
 * installed before it, or, if that was SIG_DFL / SIG_IGN, behaves as it would
 * without tokenfeed. A fault in memory the library handed out without a copy
 * (tf_dataset_view, read by your code) is not guarded.
 *
 * A program with a SIGBUS handler of its own keeps the guard working by:
 *   - installing its handler before the first dataset is opened: the
 *     library's handler then passes every fault that is not its own to it; or
 *   - if it installs its handler later (replacing the library's), calling
 *     tf_sigbus_handle(sig, info, ucontext) first thing in that handler, or
 *     chaining to the previous handler that sigaction returned.
 * A handler installed later that does neither turns a file truncated under
 * the library into whatever that handler does with SIGBUS. */

/* For a SIGBUS handler (SA_SIGINFO) that replaced the library's: pass it the
 * handler's three arguments (info is the siginfo_t *, ucontext the third
 * argument). If the fault is one the library guards, it does not return: the
 * library's read that faulted returns -EIO. Otherwise it returns 0 and the
 * handler goes on with the fault. Async-signal-safe. */
TF_API int tf_sigbus_handle(int sig, void *info, void *ucontext);

/* ------------------------------------------------------------------------ */
/* Sources: writer of the native format                                      */
/* ------------------------------------------------------------------------ */

typedef struct tf_writer tf_writer;

enum { TF_COMPRESS_NONE = 0, TF_COMPRESS_ZSTD = 1 };

typedef struct tf_writer_options {
    tf_dtype dtype;          /* TF_UINT8, TF_UINT16 or TF_UINT32 */
    uint64_t vocab_size;     /* > 0; every id must be < vocab_size */
    uint64_t shard_tokens;   /* roll over to a new shard past this many tokens */
    int compression;         /* TF_COMPRESS_NONE or TF_COMPRESS_ZSTD */
    int level;               /* zstd level */
    uint64_t block_tokens;   /* tokens per compressed block; default 2048, so that a full
                                shuffle decodes ~2x what it reads at seq_len 2048 */
    int overwrite;           /* replace an existing dataset in dir */
    uint64_t chunk_checksum_bytes; /* a table of XXH64 per this many stored token bytes (a power
                                      of two, 4096 to 2^30), so that each chunk fetched from
                                      object storage is checked alone; 0: none (shards that
                                      older tokenfeed versions read). Default 64 KiB. */
} tf_writer_options;

TF_API void tf_writer_options_init(tf_writer_options *opt);

/* Start writing a dataset into directory dir (created if missing). Nothing is
 * visible to readers until tf_writer_finish: shards are written to temporary
 * names, fsynced and renamed, and the manifest is written last. dir is opened
 * once; every file in it is then created, renamed and deleted relative to
 * that descriptor without following symlinks (temporary files O_EXCL under
 * random names), so a directory other users can write is safe to write into.
 * The writer holds dir's lock (the file ".tokenfeed.lock", flock) until
 * tf_writer_free: a second writer or merge into dir fails with -EBUSY naming
 * the holder, and never touches this writer's files. */
TF_API int tf_writer_create(const char *dir, const tf_writer_options *opt, tf_writer **out);

/* Append one document of n tokens of dtype src_dtype (copied). Ids that are
 * negative or >= vocab_size fail with -TF_EVOCAB naming the document number. */
TF_API int tf_writer_add_document(tf_writer *w, const void *tokens, uint64_t n, tf_dtype src_dtype);

/* Flush the last shard and publish the manifest. */
TF_API int tf_writer_finish(tf_writer *w);

/* Documents and tokens written so far. */
TF_API uint64_t tf_writer_num_documents(const tf_writer *w);
TF_API uint64_t tf_writer_num_tokens(const tf_writer *w);

/* Free; if not finished, removes temporary files and leaves any previous
 * dataset in dir untouched. */
TF_API void tf_writer_free(tf_writer *w);

/* Join datasets written independently (the "parts", e.g. one per conversion
 * task) into one dataset: writes dir's manifest naming every shard of
 * parts[0], then parts[1], ... in that order (format version 2, shard names
 * are paths relative to dir). No token data is read or copied: the cost is
 * reading each part's manifest. Each part is a dataset directory given as a
 * path relative to dir (no "..", no leading '/'); all must have the same dtype
 * and vocab_size (-TF_EFORMAT naming the odd part otherwise; a part without a
 * manifest is refused, as unfinished). The manifest is published atomically;
 * merging the same parts again leaves it unchanged. A previous merge's
 * manifest is replaced; a dataset written by tf_writer in dir is replaced
 * only with overwrite (-EEXIST otherwise), and its shards are then removed
 * once the merged manifest is in place. A merge that writes holds dir's
 * lock, as a writer does (-EBUSY while another writer or merge holds it); one
 * that finds the manifest already equal to its result writes nothing and
 * takes no lock (so it succeeds on read-only storage). */
TF_API int tf_dataset_merge(const char *dir, const char *const *parts, uint64_t nparts, int overwrite);

/* ------------------------------------------------------------------------ */
/* Sources: remote objects — transport and node-local chunk cache            */
/* ------------------------------------------------------------------------ */

/* The C core has no network client. Remote bytes (object storage, HTTP) arrive
 * through a transport: callbacks the embedder provides. tokenfeed retries,
 * caches and schedules on top of it; see docs/remote.md.
 *
 * Error codes a transport returns (negative), and what tokenfeed does:
 *   -EAGAIN      throttled (HTTP 503 SlowDown, 429)          retried with backoff
 *   -ETIMEDOUT   no answer in time                           retried with backoff
 *   -ECONNRESET  connection reset or closed mid-body         retried with backoff
 *   -EPROTO      malformed or short response                 retried with backoff
 *   -EIO         server error (5xx) or other transient       retried with backoff
 *   -ENOENT      no such object                              fails at once
 *   -EACCES      credentials refused                         fails at once
 *   -ESTALE      the object is no longer at the expected version (HTTP 412):
 *                the chunk is fetched once more, then the read fails
 *   anything else                                            fails at once
 * A transport may describe its failure with tf_transport_set_error(); the
 * message is included in the error tokenfeed reports. It must never contain
 * credentials. */

/* Largest version string (ETag, generation) kept for an object, with NUL. */
#define TF_OBJECT_VERSION_MAX 160

typedef struct tf_object_info {
    uint64_t size;                         /* bytes */
    char version[TF_OBJECT_VERSION_MAX];   /* ETag or generation; "" when the store has none */
} tf_object_info;

/* Called by a transport's list callback once per object; return non-zero to
 * stop the listing. */
typedef int (*tf_list_emit_fn)(void *emit_ctx, const char *url, const tf_object_info *info);

typedef struct tf_transport {
    void *ctx; /* passed to every callback */
    /* Size and version of the object at url (a full URL: "s3://bucket/key",
     * "file:///path", whatever the transport understands). Returns 0 or a
     * negative code (-ENOENT when there is none). Called from any thread. */
    int (*stat)(void *ctx, const char *url, tf_object_info *info);
    /* Read bytes [off, off + len) of the object into buf. The object must
     * still be at version expect->version (when not ""; a store with
     * conditional requests sends If-Match) and of size expect->size.
     * Returns the number of bytes placed at buf (1 to len: fewer than len is
     * allowed, the rest is asked for again) or a negative code (see above).
     * Called concurrently from several threads. */
    int64_t (*read)(void *ctx, const char *url, const tf_object_info *expect, uint64_t off, void *buf,
                    size_t len);
    /* Optional (may be NULL): called once when the last tf_remote using this
     * transport is freed: by tf_remote_free, or later from a fetch thread
     * when an interrupted open left a call in flight (tf_remote_free). */
    void (*release)(void *ctx);
    /* Optional (may be NULL): call emit for every object whose URL starts with
     * prefix (any order). Opening a dataset of many shards uses it to learn
     * every size and version in a few requests instead of one per shard.
     * Returns 0 or a negative code, like stat. */
    int (*list)(void *ctx, const char *prefix, tf_list_emit_fn emit, void *emit_ctx);
} tf_transport;

/* For transport callbacks: record a message describing the failure about to
 * be returned (thread-local; printf-style; truncated to 512 bytes). */
TF_API void tf_transport_set_error(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

/* A remote store as tokenfeed uses it: a transport, a node-local chunk cache
 * directory, and a pool of fetch threads. Datasets and loaders opened through
 * it hold a reference; tf_remote_free drops the caller's. (The type is
 * declared with tf_dataset_open_remote above.) */

/* Every member but cache_dir is a row of the settings table (scope
 * TF_SCOPE_REMOTE, the row named as the member): its default, which 0 also
 * means, and its bounds come from the row (tf_setting_find). */
typedef struct tf_remote_config {
    const char *cache_dir;   /* required; created 0700 if missing. Refused when another
                                user owns it or the group or others can write it. */
    uint64_t cache_limit;    /* bytes of chunks kept (0: the cache's default, fixed when it is
                                created: 10% of what its file system can hold, at least 1 GB
                                but at most half of it) */
    uint64_t chunk_bytes;    /* bytes per chunk (0: 8 MiB); a multiple of 4096 */
    uint64_t prefetch_bytes; /* distinct chunk bytes requested ahead (0: min(limit / 2, 2 GiB)) */
    int fetch_threads;       /* concurrent range requests (0: 16; at most TF_MAX_THREADS) */
    int max_attempts;        /* tries per range before failing (0: 8; at most 1000) */
    uint32_t backoff_ms;     /* first retry delay (0: 100); doubles, full jitter */
    uint32_t backoff_max_ms; /* cap of the delay (0: 5000) */
    uint32_t deadline_ms;    /* give up on a request after this long (0: 30000): no
                                attempt is started that, as long as the slowest failed
                                one, would end past it */
} tf_remote_config;

/* Zero, then the rows' defaults (cache_limit and prefetch_bytes stay 0: they
 * depend on the cache). */
TF_API void tf_remote_config_init(tf_remote_config *cfg);

/* Create a remote store. The transport table is copied; t->ctx must stay valid
 * until t->release is called (or forever, without release). Opens (creating it
 * if needed) the cache directory and takes a process slot in it. Errors:
 * -EINVAL (bad config), -EPERM (the cache directory is not private to this
 * user), -errno from the file system. */
TF_API int tf_remote_create(const tf_transport *t, const tf_remote_config *cfg, tf_remote **out);

/* Drop the caller's reference (accepts NULL). The fetch threads stop and the
 * process slot is given back when the last reference goes. Threads still
 * inside a transport call for an open that was interrupted (-EINTR) are not
 * waited for: the last of them frees the store, and calls release, once its
 * call returns. */
TF_API void tf_remote_free(tf_remote *r);

/* Stat an object through the transport, with the same retries as reads. */
TF_API int tf_remote_stat(tf_remote *r, const char *url, tf_object_info *info);

/* Read bytes [off, off + len) of an object, as described by info (from
 * tf_remote_stat), through the chunk cache: chunks already cached on this node
 * are read from disk (verified first), missing ones are fetched, checked and
 * cached. -ERANGE past the end; -ESTALE when the object changed; -ENOSPC when
 * the cache disk is full; transport errors after the retries. */
TF_API int tf_remote_read(tf_remote *r, const char *url, const tf_object_info *info, uint64_t off,
                          uint64_t len, void *out);

typedef struct tf_remote_stats {
    uint64_t requests;       /* range requests sent (retries included) */
    uint64_t bytes_fetched;  /* bytes received from the transport */
    uint64_t retries;        /* requests that were retries */
    uint64_t chunks_fetched; /* chunks fetched and landed by this process */
    uint64_t chunk_hits;     /* chunk uses served from the cache without waiting */
    uint64_t chunk_waits;    /* chunk uses that waited for a fetch (this or another process) */
    uint64_t refetches;      /* chunks fetched again after a mismatch or a changed object */
    uint64_t evictions;      /* chunks this process evicted */
    uint64_t bytes_evicted;
    uint64_t wait_ns;        /* time readers spent waiting for chunks */
    uint64_t small_reads;    /* reads served by a direct range request while their chunk was
                                still on its way (the first batches after a start or a seek) */
    uint64_t cache_bytes;    /* bytes of chunks in the cache now (all processes) */
    uint64_t cache_limit;
    uint64_t chunk_bytes;
} tf_remote_stats;

TF_API void tf_remote_get_stats(tf_remote *r, tf_remote_stats *st);

/* A cache directory as a whole, without a transport (tokenfeed cache show). */
typedef struct tf_cache_info {
    uint64_t bytes;     /* bytes of chunks present */
    uint64_t chunks;    /* chunks present */
    uint64_t fetching;  /* chunks being fetched by live processes */
    uint64_t objects;   /* objects with at least one chunk */
    uint64_t processes; /* processes attached now */
    uint64_t temp_bytes; /* bytes in temporary files (chunks being written) */
} tf_cache_info;

/* Describe the cache in dir (which must exist and pass the ownership checks).
 * -ENOENT when dir is not a tokenfeed cache. */
TF_API int tf_cache_info_get(const char *dir, tf_cache_info *info);

/* Evict chunks until at most keep_bytes remain: chunks no attached process
 * needs first, then those needed farthest away. keep_bytes == 0 empties the
 * cache, and is refused with -EBUSY while a process is attached. */
TF_API int tf_cache_prune(const char *dir, uint64_t keep_bytes);

/* ------------------------------------------------------------------------ */
/* Order: packing, shuffle, partition                                        */
/* ------------------------------------------------------------------------ */

/* ------------------------------------------------------------------------ */
/* Settings                                                                   */
/* ------------------------------------------------------------------------ */

/* Every setting of the order (tf_order_config), the engine (tf_loader_config),
 * the device stage (tf_device_config) and remote reading (tf_remote_config) is one row of one table: its name
 * (as the Python API spells it), type, default, bounds, enum names, whether it
 * changes the stream, and a one-line description. Defaults, checks, the
 * fingerprint and the loader state come from the rows; callers query them. */
typedef enum tf_setting_scope {
    TF_SCOPE_ORDER = 0,
    TF_SCOPE_ENGINE = 1,
    TF_SCOPE_DEVICE = 2,
    TF_SCOPE_REMOTE = 3 /* tf_remote_config: where 0 (none) means the row's default */
} tf_setting_scope;
/* TF_SETTING_PATH: a file or directory name (const char *, borrowed until the
 * configuration is used; NULL: none). It has no integer value: tf_config_get
 * reads 0, and tf_config_set_path sets it. A path names where data is, not
 * what it is: it never enters a fingerprint, and what the order reads there
 * is identified by the order's own fingerprint of it. */
typedef enum tf_setting_type {
    TF_SETTING_INT = 0,
    TF_SETTING_BOOL = 1,
    TF_SETTING_ENUM = 2,
    TF_SETTING_PATH = 3
} tf_setting_type;

typedef struct tf_setting {
    const char *name;
    tf_setting_scope scope;
    tf_setting_type type;
    int64_t def;              /* the default tf_*_config_init writes */
    int64_t min;              /* bounds, inclusive (ENUM: 0 .. names - 1) */
    uint64_t max;
    int nullable;             /* none_value means "none" or "the default" (None in Python) */
    int64_t none_value;
    const char *const *names; /* ENUM: names by value, NULL-terminated; else NULL */
    const char *stream;       /* when it changes the stream: "always", "never", or a
                                 condition ("shuffle=block", "packing!=concat",
                                 "packing=best_fit", "mixture") */
    const char *description;
} tf_setting;

TF_API size_t tf_settings_count(void);
TF_API const tf_setting *tf_setting_get(size_t i);        /* NULL past the end */
TF_API const tf_setting *tf_setting_find(const char *name); /* NULL: no such setting */
/* Bounds of a setting (as ZSTD_cParam_getBounds): -ENOENT for an unknown name. */
TF_API int tf_setting_bounds(const char *name, int64_t *min, uint64_t *max);
/* Set or read a setting by name in a configuration of scope (a
 * tf_order_config, tf_loader_config or tf_device_config; a tf_loader_config
 * also takes the order's settings, into its `order` member). A value above
 * INT64_MAX is passed as its two's complement. -ENOENT: no such setting
 * there; -EINVAL: outside its bounds (the message names the setting and
 * them). none_value is always accepted where the setting is nullable. */
TF_API int tf_config_set(tf_setting_scope scope, void *cfg, const char *name, int64_t value);
TF_API int tf_config_get(tf_setting_scope scope, const void *cfg, const char *name, int64_t *value);
/* Set a TF_SETTING_PATH setting by name (path borrowed: it must outlive the
 * calls that read the configuration, such as tf_order_create; NULL: none).
 * -ENOENT: no such setting there; -EINVAL: not a path setting. */
TF_API int tf_config_set_path(tf_setting_scope scope, void *cfg, const char *name, const char *path);
/* Read one: *path is the configuration's pointer (NULL: none). */
TF_API int tf_config_get_path(tf_setting_scope scope, const void *cfg, const char *name, const char **path);

typedef enum tf_packing {
    TF_PACK_CONCAT = 0,   /* documents concatenated, cut every seq_len tokens */
    TF_PACK_BEST_FIT = 1, /* chunks of <= L + 1 tokens, best-fit-decreasing into samples
                             within windows of pack_window documents, rest pad_id */
    TF_PACK_DOCUMENT = 2, /* one non-empty document per sample, truncated to L + 1
                             tokens or padded with pad_id */
} tf_packing;

typedef enum tf_shuffle {
    TF_SHUFFLE_NONE = 0,
    TF_SHUFFLE_FULL = 1,  /* one keyed bijection over all samples of an epoch */
    TF_SHUFFLE_BLOCK = 2, /* two-level: permute blocks, then samples in windows */
} tf_shuffle;

/* Which loader's order tf_order_create builds. TOKENFEED is tokenfeed's own
 * (the documents as one stream, cut and shuffled as above). The others
 * reproduce another loader's samples and their order exactly, so that a run
 * begun on it continues on tokenfeed:
 *   TF_ORDER_LLMC  llm.c's data loader (see tf_order_create_llmc, which this
 *                  builds with num_processes = cfg->llmc_processes)
 *   TF_ORDER_OLMO  OLMo-core's NumpyFSLDataset with its NumpyFSLDataLoader:
 *                  each file cut on its own into instances of seq_len tokens
 *                  (its tail dropped); instance k is sample k, seq_len tokens
 *                  then one pad_id token (its label is never trained: the
 *                  loss mask is 0 there). Epoch e (0-based) is OLMo's epoch
 *                  e + 1: with shuffle FULL, the instances permuted as
 *                  numpy.random.Generator(PCG64(seed + e + 1)).shuffle does,
 *                  with NONE in order; either way only the first
 *                  floor(instances / global_batch) * global_batch of them,
 *                  as OLMo drops the rest of every epoch. packing must be
 *                  CONCAT without separator; BLOCK shuffle is refused. With
 *                  FULL, 8 bytes per instance (per run of olmo_chunk) are
 *                  held for two epochs' permutations. OLMo gives data-parallel rank r the rows
 *                  r, r + R, ... of every global batch: balance
 *                  TF_BALANCE_STRIDED. olmo_chunk c > 1 is OLMo's
 *                  max_target_sequence_length = c x seq_len (its loader's
 *                  chunk_size): each file holds c x floor(tokens / (c x
 *                  seq_len)) instances, and the shuffle permutes runs of c
 *                  consecutive instances, which stay in order.
 *   TF_ORDER_MEGATRON  Megatron-core's GPTDataset, read from the index cache
 *                  it wrote (megatron_cache: its path_to_cache directory,
 *                  where megatron_split's cache is found, or one of that
 *                  cache's files): position i is GPTDataset[i mod N], as
 *                  tf_order_create_megatron describes. The three .npy
 *                  files are mapped and checked (shapes, dtypes, sizes; the
 *                  cache's description.txt against seq_len); packing CONCAT,
 *                  separator_id -1, shuffle NONE and pad_id 0. The state
 *                  records a fingerprint of the cache. */
typedef enum tf_order_kind {
    TF_ORDER_TOKENFEED = 0,
    TF_ORDER_LLMC = 1,
    TF_ORDER_OLMO = 2,
    TF_ORDER_MEGATRON = 3,
} tf_order_kind;

/* Megatron-core's dataset splits (GPTDataset's Split): which cache of a
 * path_to_cache directory TF_ORDER_MEGATRON reads. */
typedef enum tf_megatron_split {
    TF_MEGATRON_TRAIN = 0,
    TF_MEGATRON_VALID = 1,
    TF_MEGATRON_TEST = 2,
} tf_megatron_split;

typedef struct tf_order_config {
    uint64_t seq_len;       /* L >= 1; a sample is L + 1 tokens */
    tf_packing packing;
    int64_t separator_id;   /* >= 0: inserted after every document; -1: none */
    uint64_t seed;
    tf_shuffle shuffle;
    uint64_t block_size;    /* TF_SHUFFLE_BLOCK: samples per block (>= 1 in every mode) */
    uint64_t window_blocks; /* TF_SHUFFLE_BLOCK: blocks per window (>= 1 in every mode) */
    uint64_t global_batch;  /* G: samples per global batch (all ranks) */
    uint64_t epochs;        /* 0 = infinite stream */
    /* BEST_FIT / DOCUMENT (docs/packing.md) */
    int64_t pad_id;         /* >= 0: fills the rest of a sample (default 0) */
    uint64_t pack_window;   /* BEST_FIT: documents per packing window (default 1024;
                               1 to 2^24 in every mode) */
    /* mixtures (tf_order_create_mix) */
    uint64_t mix_window;    /* positions per schedule window before reduction (default 1000) */
    /* another loader's order, to continue a run begun on it (tf_order_kind) */
    tf_order_kind order;    /* TF_ORDER_TOKENFEED (default), TF_ORDER_LLMC, TF_ORDER_OLMO or TF_ORDER_MEGATRON */
    uint32_t llmc_processes; /* TF_ORDER_LLMC: llm.c's number of processes (default 1; 0: the
                                data-parallel size, which tf_loader_create(_mix) takes from
                                world_size and tf_order_create, not knowing it, refuses) */
    uint64_t olmo_chunk;    /* TF_ORDER_OLMO: consecutive instances shuffled as one (default 1) */
    /* TF_ORDER_MEGATRON (set with tf_config_set_path / tf_config_set, or directly) */
    const char *megatron_cache;        /* GPTDataset's path_to_cache, or one of its cache's files
                                          (borrowed until tf_order_create returns; the order
                                          keeps a copy) */
    tf_megatron_split megatron_split;  /* the split whose cache a directory holds (default TRAIN) */
    int32_t megatron_add_extra_token;  /* add_extra_token_to_sequence: 1 (default) or 0; the cache
                                          does not record it */
} tf_order_config;

TF_API void tf_order_config_init(tf_order_config *cfg);

typedef struct tf_order tf_order;

/* Build the order over ds (borrowed: must outlive the order). O(1) memory in
 * the number of samples. -EINVAL (with a message) when the dataset is shorter
 * than one sample or the config is inconsistent; every setting is checked,
 * including those the chosen modes do not use. Build it once and share it:
 * tf_loader_create_from_order borrows it. */
TF_API int tf_order_create(const tf_dataset *ds, const tf_order_config *cfg, tf_order **out);
TF_API void tf_order_free(tf_order *o);

/* N: samples per epoch. */
TF_API uint64_t tf_order_num_samples(const tf_order *o);

/* Positions per epoch: N, or fewer for an order that leaves samples out of
 * every epoch (TF_ORDER_OLMO drops the instances past whole global batches). */
TF_API uint64_t tf_order_epoch_positions(const tf_order *o);

/* Total positions in the stream: epochs * N rounded down to whole global
 * batches, or UINT64_MAX when infinite. */
TF_API uint64_t tf_order_num_positions(const tf_order *o);

/* 64-bit fingerprint of the configuration (everything that changes the
 * stream; not the dataset). */
TF_API uint64_t tf_order_fingerprint(const tf_order *o);

/* The configuration the order was built with. */
TF_API int tf_order_get_config(const tf_order *o, tf_order_config *cfg);

/* The sample (index into the unshuffled sample sequence) at global stream
 * position pos: epoch = pos / N, permuted within the epoch. */
TF_API uint64_t tf_order_sample_at(const tf_order *o, uint64_t pos);

/* Optional per-sample outputs. Any pointer may be NULL. */
typedef struct tf_sample_extras {
    int32_t *position_ids; /* L entries: restart at 0 at the sample start and at each document start */
    int32_t *cu_seqlens;   /* L + 1 entries: 0, ends of the documents inside the
                              input window ..., L, then filled with L */
    int32_t *num_seqs;     /* 1 entry: number of segments in cu_seqlens */
    uint8_t *loss_mask;    /* L entries: 1 = train on labels[t]; 0 when
                              labels[t] is the first token of a new document */
} tf_sample_extras;

/* Write sample `sample` (L + 1 tokens, out_dtype) into out and the extras. */
TF_API int tf_order_fill_sample(const tf_order *o, uint64_t sample, void *out, tf_dtype out_dtype,
                                const tf_sample_extras *extras);

/* A weighted mixture of n >= 1 datasets (all borrowed: they must outlive the
 * order), every source packed with cfg (seq_len, packing, separator, pad) and
 * shuffled over its own epochs with its own seed mix64(seed ^ mix64(s + C)).
 * Weights (finite, > 0, any scale) become integer counts c_s per window of
 * mix_window positions (largest remainder, then divided by their gcd, so 0.7 /
 * 0.3 gives a window of 10 with 7 and 3); every window of positions
 * [k*W, (k+1)*W) holds exactly c_s samples of source s, interleaved smoothly
 * (a fixed table, the same in every window). Position pos is the
 * (k*c_s + rank)-th position of source s's own stream, computed in O(1).
 * A sample index (tf_order_sample_at) of a mixture is prefix(s) + the source's
 * sample, prefix(s) = sum of N of the sources before s; N of the mixture is the
 * sum of the sources' N (an "epoch" of the mixture for cfg->epochs).
 * -EINVAL when a weight rounds to 0 (raise mix_window). */
TF_API int tf_order_create_mix(const tf_dataset *const *ds, const double *weights, size_t n,
                               const tf_order_config *cfg, tf_order **out);

/* A weighted mixture whose weights change at given global steps (curricula,
 * annealing phases): point m's weights (sch->weights[m*n .. m*n + n), finite,
 * >= 0, at least one > 0) apply from global step sch->steps[m] (step k starts
 * at position k * cfg->global_batch; steps[0] == 0, increasing). Each point's
 * weights become counts per mix_window positions as in tf_order_create_mix.
 * TF_MIX_CONSTANT: a point's counts hold until the next point, windows
 * restarting at each point, every full window exact. TF_MIX_LINEAR: between
 * two points the counts move one unit at a time, window by window, along the
 * straight line (docs/packing.md gives the rule); after the last point its
 * counts hold. Seeking costs O(log runs of windows with equal counts); building
 * costs O(points x mix_window x n), never O(steps).
 *
 * anchor_counts (n entries, or NULL): a hand-over from another schedule at
 * anchor_position: from there on, source s continues from its own sample
 * anchor_counts[s] (the samples it had delivered there under the schedule a
 * saved state was made with), so nothing consumed is repeated or skipped. The
 * anchor does not enter the fingerprint: the state that carries it resumes. */
typedef enum tf_mix_interpolation {
    TF_MIX_CONSTANT = 0,
    TF_MIX_LINEAR = 1,
} tf_mix_interpolation;

typedef struct tf_mix_schedule {
    size_t num_points;             /* >= 1 */
    const uint64_t *steps;         /* num_points global steps, steps[0] == 0, increasing */
    const double *weights;         /* num_points x n, row-major */
    tf_mix_interpolation interpolation;
    uint64_t anchor_position;      /* with anchor_counts */
    const uint64_t *anchor_counts; /* n, or NULL: no hand-over */
} tf_mix_schedule;

TF_API int tf_order_create_mix_schedule(const tf_dataset *const *ds, size_t n, const tf_mix_schedule *sch,
                                        const tf_order_config *cfg, tf_order **out);

/* The source (0 for a plain order) of position pos, and the index of that
 * position in the source's own stream. -ENOMEM when a schedule table cannot
 * be allocated. A mixture whose weights were changed (tf_order_mix_set_weights,
 * or a state listing weights_history) answers a position before the last
 * change from the weights in force there; -TF_ESTATE, with tf_last_error()
 * saying why, when the weights it began with do not lead to the recorded
 * hand-over (another base than the run's) or the position is before an
 * unrecorded hand-over. */
TF_API int tf_order_mix_source_at(const tf_order *o, uint64_t pos, size_t *source, uint64_t *index);

/* Positions of source i among positions [0, pos) (with a hand-over anchor, as
 * delivered): the index of source i's next position at or after pos. A plain
 * order: pos for i == 0. UINT64_MAX when a schedule table cannot be allocated
 * or the position cannot be told (tf_order_mix_source_at then says why). */
TF_API uint64_t tf_order_mix_source_count(const tf_order *o, size_t i, uint64_t pos);

/* Counts per window at position pos: counts[i] of every source (n entries;
 * a plain order: 1) in a window of the returned size. */
TF_API uint64_t tf_order_mix_counts_at(const tf_order *o, uint64_t pos, uint64_t *counts);

/* ------------------------------------------------------------------------ */
/* Loader state                                                               */
/* ------------------------------------------------------------------------ */

/* The state a checkpoint keeps to resume a stream exactly: a JSON object
 * (format version, dataset and configuration fingerprints, position, the
 * configuration, a mixture's hand-over anchor, the world size), the same
 * Python's Loader.state_dict() returns; docs/design.md lists its keys. Every
 * key is always present, and every value is a number, a string, null or a
 * list, so that every checkpointer keeps it. */
#define TF_STATE_FORMAT_VERSION 2
enum { TF_STATE_LENIENT = 1 }; /* accept a changed configuration, keep the position */
/* What a state may hold. A state is refused (-TF_ESTATE naming the limit)
 * past any of these, and tf_order_skip / tf_order_mix_set_weights refuse a
 * range or a change that would take an order past them, so that every state
 * the library writes loads again. Reading a state is linear in its size. */
#define TF_STATE_MAX_BYTES (64u << 20)       /* the JSON text */
#define TF_STATE_MAX_SKIPS (1u << 20)        /* skipped: [start, stop] ranges */
#define TF_STATE_MAX_WEIGHTS_HISTORY 65536u  /* weights_history: entries */
#define TF_STATE_MAX_EXCLUDED 4096u        /* excluded: takedowns (entries) */
#define TF_STATE_MAX_EXCLUDED_IDS (1u << 22) /* excluded: document ids, all entries together */
#define TF_STATE_MAX_MEMBERS 1024u           /* members of one JSON object (known or not) */

/* Write the state of order o at global position pos (saved by a loader with
 * world_size data-parallel ranks) as NUL-terminated JSON into buf (cap
 * bytes). *len (may be NULL) receives the length without the NUL; -ENOSPC
 * when cap <= that length (call with cap 0 to size the buffer). */
TF_API int tf_order_state_save(const tf_order *o, uint64_t pos, uint32_t world_size, char *buf, size_t cap,
                               size_t *len);

/* Check a state against order o and give the position to seek to. Every field
 * is checked for its type; a key that appears twice in one object, NaN and
 * Infinity (not JSON) and a state past the TF_STATE_MAX_* limits are refused;
 * flags other than TF_STATE_LENIENT are refused (-EINVAL). A setting refuses the state (without
 * TF_STATE_LENIENT) only where it changes the stream. -TF_ESTATE with a
 * sentence naming what differs. A mixture resumed under other weights (or
 * from a state that carries an anchor) continues each source from where it
 * was: *handover then receives a new order, owned by the caller, to use in
 * place of o; NULL when o itself resumes. The state's skipped ranges
 * (tf_order_skip) replace those of the order that reads on: *handover, or o
 * itself (which is modified for that alone). */
TF_API int tf_order_state_load(const tf_order *o, const char *state, size_t len, unsigned flags, uint64_t *pos,
                               tf_order **handover);

/* Live mixture weights: a new order, owned by the caller, that reads o's
 * stream up to global position pos (a multiple of the global batch) and the
 * given weights (n, one per source; a weight may be 0, not all) from there.
 * Each source continues from where it was at pos, so within a source nothing
 * repeats and nothing is lost. The change is recorded in the new order's
 * weight history, which its state lists (weights_history), so that a resume
 * (any world size) continues with these weights. The positions before pos
 * are not reproduced by the new order: read them from o. */
TF_API int tf_order_mix_set_weights(const tf_order *o, uint64_t pos, const double *weights, size_t n,
                                    tf_order **out);

/* Skipping: the positions [start, stop) (whole global batches: the data of
 * steps start / G to stop / G - 1) are left out of the stream a loader
 * delivers: a loader whose position reaches start continues at stop. The
 * order itself is unchanged (its sample at each position, explain); the
 * ranges are kept with the order, listed in its state (skipped) and restored
 * by tf_order_state_load on the order that reads on, so that a resume, with
 * any world size, skips the same data. Ranges that overlap or touch merge.
 * Not thread-safe against a tf_loader_next on a loader reading o. */
TF_API int tf_order_skip(tf_order *o, uint64_t start, uint64_t stop);
/* The skipped ranges (ascending, disjoint): their number; up to cap of them
 * are copied to ranges as [start, stop] pairs (2 * cap values). */
TF_API size_t tf_order_skips(const tf_order *o, uint64_t *ranges, size_t cap);
/* Where a loader at position pos reads: the end of the skipped range that
 * holds pos, else pos. */
TF_API uint64_t tf_order_skip_to(const tf_order *o, uint64_t pos);

/* Taking documents down mid-run: from global position pos on, a loader
 * serves no tokens of documents ids[0, n) of source `source` (document ids of
 * the dataset a view selects from, below its document count; any order,
 * repeats merge). The order itself is unchanged; each call is kept with the
 * order as one entry, listed in its state (excluded: [[position, source,
 * [ids]], ...], ids ascending and distinct) and restored by
 * tf_order_state_load on the order that reads on, so that a C trainer and a
 * Python loader resuming the state leave out the same documents. At most
 * TF_STATE_MAX_EXCLUDED entries and TF_STATE_MAX_EXCLUDED_IDS ids in all.
 * Not thread-safe against a tf_loader_next on a loader reading o. */
TF_API int tf_order_exclude(tf_order *o, uint64_t pos, size_t source, const uint64_t *ids, size_t n);
/* The number of exclude entries of o. */
TF_API size_t tf_order_num_excluded(const tf_order *o);
/* Entry i (in the order they were made): its position, source and ids
 * (borrowed from o, ascending, valid until o changes or is freed). */
TF_API int tf_order_excluded(const tf_order *o, size_t i, uint64_t *pos, size_t *source, const uint64_t **ids,
                             size_t *n);

/* Sources of a mixture (1 for a plain order) and source i's own order
 * (borrowed from o; for a plain order, i == 0 gives o itself). */
TF_API size_t tf_order_num_sources(const tf_order *o);
TF_API const tf_order *tf_order_source(const tf_order *o, size_t i);

/* Schedule of a mixture at position 0: window size W and count of source i
 * per window (plain order: 1 and 1). */
TF_API uint64_t tf_order_mix_window(const tf_order *o);
TF_API uint64_t tf_order_mix_count(const tf_order *o, size_t i);

/* The dataset the order reads: ds for a plain order; for a mixture, a
 * read-only view concatenating the sources' files (fingerprint = hash of the
 * sources' fingerprints in order). Borrowed from o. */
TF_API const tf_dataset *tf_order_dataset(const tf_order *o);

/* Packing efficiency of one epoch of the order (a mixture: the sum over its
 * sources, each over its own epoch). O(documents) for CONCAT; free for
 * BEST_FIT / DOCUMENT (gathered when the plan counts were built). */
typedef struct tf_packing_stats {
    uint64_t samples;             /* N */
    uint64_t documents;
    uint64_t empty_documents;     /* no tokens (and no separator) */
    uint64_t token_slots;         /* N * (L + 1) */
    uint64_t pad_tokens;          /* slots holding pad_id */
    uint64_t documents_split;     /* documents whose tokens land in more than one sample */
    uint64_t documents_truncated; /* documents with tokens in no sample (DOCUMENT mode:
                                     longer than L + 1; CONCAT: the dropped tail) */
    uint64_t tokens_dropped;      /* dataset tokens (with separators) in no sample */
    double padding_fraction;      /* pad_tokens / token_slots */
} tf_packing_stats;

TF_API int tf_order_packing_stats(const tf_order *o, tf_packing_stats *st);

/* Provenance: which documents, and which of their tokens, make a sample.
 * A segment is tokens [start, stop) of document `document` of dataset
 * `source` (the index among a mixture's datasets; 0 for a plain order), placed
 * at token `offset` of the sample (0 .. seq_len). Tokens of the sample that no
 * segment covers are separators (with separator_id) or padding
 * (BEST_FIT / DOCUMENT). */
typedef struct tf_segment {
    uint64_t source;
    uint64_t document; /* index of the document in dataset `source` */
    uint64_t start;    /* offsets in the document, in tokens */
    uint64_t stop;
    uint64_t offset;   /* where the segment begins in the sample */
} tf_segment;

/* The segments, in sample order, of the sample at global stream position pos
 * (< tf_order_num_positions). Reads no tokens: O(spans x log documents), the
 * same at any position. Writes up to cap segments and sets *n to their number;
 * -ENOBUFS when there are more than cap (cap = seq_len + 1 always suffices);
 * -ERANGE past the end of the stream. */
TF_API int tf_order_segments_at(const tf_order *o, uint64_t pos, tf_segment *out, size_t cap, size_t *n);

/* The positions in [begin, end) (end clamped to the stream) whose sample holds
 * tokens of document `document` of dataset `source`, ascending. Writes up to
 * cap of them and sets *n to their number; -ENOBUFS when there are more than
 * cap; -ERANGE for a source or document that does not exist. Computed by
 * running the order backwards (the samples that can hold the document, then
 * the inverse of the shuffle and of the mixture's schedule): O(samples of the
 * document's packing window + positions found x log positions), not
 * O(positions of the range); reads no tokens. */
TF_API int tf_order_find_document(const tf_order *o, size_t source, uint64_t document, uint64_t begin,
                                  uint64_t end, uint64_t *out, size_t cap, size_t *n);

/* Balancing the work of a step across data-parallel ranks (docs/balance.md).
 * The rows of a step (micro_batches consecutive global batches: positions
 * [step * M * G, (step + 1) * M * G), fewer at the end of a finite stream)
 * are the same whatever the rule; the rule only decides which rank, and which
 * of its micro-batches, takes each row. It is computed from the step's rows
 * alone, identically on every rank, without communication.
 *   TF_BALANCE_NONE       rank r takes the contiguous slice r*B .. (r+1)*B - 1
 *                         of each global batch (the global order contract)
 *   TF_BALANCE_TOKENS     cost of a row = its non-padding input tokens
 *   TF_BALANCE_ATTENTION  cost of a row = sum over the segments of its
 *                         cu_seqlens of length^2 (causal attention work; every
 *                         position of a row is computed, so the linear work is
 *                         the same L on every row and every rank)
 * Rows are given to the M x R (micro-batch, rank) bins of B rows each by
 * longest-processing-time first (costs descending, ties by position; each
 * row to the least loaded bin with room, ties by lower bin) followed by
 * pairwise swaps that lower the busiest bin; should the plain slices have a
 * less loaded busiest bin, they are kept. A bin's rows are delivered in
 * position order.
 *   TF_BALANCE_STRIDED    rank r takes rows r, r + R, r + 2R, ... of each
 *                         global batch, in that order (no cost: OLMo-core's
 *                         data loader splits its global batches this way) */
typedef enum tf_balance {
    TF_BALANCE_NONE = 0,
    TF_BALANCE_TOKENS = 1,
    TF_BALANCE_ATTENTION = 2,
    TF_BALANCE_STRIDED = 3,
} tf_balance;

/* The cost of the row at stream position pos under `mode` (TOKENS or
 * ATTENTION; NONE and STRIDED give 0): see tf_balance. */
TF_API int tf_order_row_cost(const tf_order *o, uint64_t pos, tf_balance mode, uint64_t *cost);

/* The rows of the step that starts at position `start` (a multiple of
 * micro_batches x global_batch), as world_size x micro_batches bins of
 * global_batch / world_size positions: out[(m * world_size + r) * B + j] is row j
 * of rank r's micro-batch m (B = global_batch / world_size). out holds
 * micro_batches x global_batch entries; *n receives the entries written (fewer
 * at the end of a finite stream: whole global batches only). world_size must
 * divide the order's global batch. */
TF_API int tf_order_balance(const tf_order *o, uint64_t start, uint32_t world_size, uint32_t micro_batches,
                            tf_balance mode, uint64_t *out, size_t cap, size_t *n);

/* Which rows a rank reads, and who reads a row: the map every reader of a
 * balanced order uses (the engine, the chunk scheduler, explain/where). The
 * B = global_batch / world_size positions rank `rank` reads as its rows of
 * global batch `batch` (with TF_BALANCE_NONE its contiguous slice; otherwise
 * its bin of the balancing step of `micro_batches` global batches that holds
 * it), in row order, into out (cap >= B; *n = B); and the inverse: the global
 * batch, rank and row that read position pos. -ERANGE past the end of the
 * stream. */
TF_API int tf_order_rank_rows(const tf_order *o, tf_balance mode, uint32_t world_size, uint32_t micro_batches,
                              uint64_t batch, uint32_t rank, uint64_t *out, size_t cap, size_t *n);
TF_API int tf_order_row_of(const tf_order *o, tf_balance mode, uint32_t world_size, uint32_t micro_batches,
                           uint64_t pos, uint64_t *batch, uint32_t *rank, uint64_t *row);

/* ------------------------------------------------------------------------ */
/* Engine: loader and batches                                                */
/* ------------------------------------------------------------------------ */

enum { TF_WANT_POSITION_IDS = 1, TF_WANT_CU_SEQLENS = 2, TF_WANT_LOSS_MASK = 4 };

typedef enum tf_backend {
    TF_BACKEND_AUTO = 0,
    TF_BACKEND_MMAP = 1,
    TF_BACKEND_PREAD = 2,
    TF_BACKEND_IO_URING = 3,
} tf_backend;

/* "auto", "mmap", "pread", "io_uring". */
TF_API const char *tf_backend_name(tf_backend b);

/* Largest num_threads and prefetch a loader accepts (-EINVAL past them). */
#define TF_MAX_THREADS 256
#define TF_MAX_PREFETCH 4096
/* Largest balance_micro_batches (batches per optimizer step balanced together). */
#define TF_MAX_BALANCE_MICRO_BATCHES 4096

typedef struct tf_loader_config {
    tf_order_config order; /* tf_loader_create(_mix) only; see tf_loader_create_from_order */
    uint64_t batch_size;  /* B: samples per rank per batch; order.global_batch = B * world_size */
    uint32_t rank;
    uint32_t world_size;
    tf_dtype out_dtype;   /* TF_DTYPE_INVALID = the widest dtype of the order's sources */
    unsigned want;        /* TF_WANT_* bits */
    int num_threads;      /* 0 = default: mmap min(cores - 1, 4) (at least 1);
                             pread/io_uring 4 (I/O-bound: keeps reads in flight);
                             at most TF_MAX_THREADS */
    union {               /* ring depth in batches; 0 = default (2 x threads + 2);
                             at most TF_MAX_PREFETCH. The settings table's name;
                             `prefetch` is its older name, the same member. */
        int prefetch_batches;
        int prefetch;
    };
    tf_backend backend;   /* TF_BACKEND_AUTO: $TOKENFEED_BACKEND, else mmap */
    int direct_io;        /* io_uring: open with O_DIRECT (aligned reads) */
    uint64_t zstd_cache_bytes; /* decompressed zstd blocks the workers share; 0 = sized
                                  from the shuffle (a block-shuffle window, at most
                                  1 GiB). Never changes the stream, only the decoding. */
    /* Context parallelism (docs/packing.md): the ranks of a group of cp_size
     * share their data-parallel rank's samples, and rank cp_rank takes its
     * load-balanced share of each: chunks cp_rank and 2*cp_size-1-cp_rank of
     * 2*cp_size (seq_len must be divisible by 2*cp_size), or with
     * TF_WANT_CU_SEQLENS the THD layout (every sequence padded to a multiple
     * of 2*cp_size and split the same way). The batch then has input_ids and
     * labels of their own (tf_batch_view) and no tokens. 0 or 1: no split.
     * The stream, and so the state, does not depend on these. */
    uint32_t cp_rank;
    uint32_t cp_size;
    /* Which rows of a step each data-parallel rank takes (tf_balance): NONE
     * (default) keeps the contiguous slices. balance_micro_batches (M, 1 to
     * TF_MAX_BALANCE_MICRO_BATCHES; default 1) is the number of batches
     * (tf_loader_next calls) per optimizer step:
     * the M x G rows of a step are balanced across ranks and across each
     * rank's M micro-batches. Neither changes the global stream (the rows of
     * a step), so neither enters the fingerprint nor the state. */
    tf_balance balance;
    uint32_t balance_micro_batches;
    /* Sequence-length warmup (tf_seq_len_warmup; 0 steps: none): for the
     * first warmup_steps global batches every sample is delivered cut into
     * rows of seq_len / 2^m tokens (at least warmup_min_seq_len, itself
     * seq_len / 2^m), so the batch is rows x k by seq_len / k + 1 (the view's
     * rows and seq_len say which). The concatenated inputs and labels are the
     * unwarmed stream's; positions, and so the state, do not change. Not with
     * context parallelism. */
    uint64_t warmup_steps;
    uint64_t warmup_min_seq_len;
} tf_loader_config;

/* The row length at global step `step` of a warmup from min_seq_len to
 * seq_len over warmup_steps steps: the largest seq_len / 2^m not above
 * min_seq_len + (seq_len - min_seq_len) * step / warmup_steps, at least
 * min_seq_len; seq_len from step warmup_steps on (or when warmup_steps is 0). */
TF_API uint64_t tf_seq_len_warmup(uint64_t seq_len, uint64_t min_seq_len, uint64_t warmup_steps, uint64_t step);

TF_API void tf_loader_config_init(tf_loader_config *cfg);

typedef struct tf_loader tf_loader;
typedef struct tf_batch tf_batch;

/* A loader over an order built by the caller (tf_order_create or
 * tf_order_create_mix), borrowed: the order, and the datasets it reads, must
 * outlive the loader. The order decides the stream; cfg gives the engine's
 * settings (its `order` member is not used). The order's global_batch must
 * equal cfg->batch_size * cfg->world_size (-EINVAL otherwise). This is the
 * way to build an order once and both query it (sample_at, packing stats,
 * fingerprint) and load from it: several loaders (ranks of a test, say) may
 * share one order. Threads start lazily on the first tf_loader_next. */
TF_API int tf_loader_create_from_order(const tf_order *order, const tf_loader_config *cfg, tf_loader **out);

/* Build an order over ds (borrowed; must outlive the loader) from cfg->order
 * with global_batch = batch_size * world_size, and a loader over it that owns
 * it. Threads start lazily on the first tf_loader_next. */
TF_API int tf_loader_create(const tf_dataset *ds, const tf_loader_config *cfg, tf_loader **out);

/* The plain context-parallel split of a sample of seq_len input positions:
 * rank cp_rank of cp_size takes positions [first[k], first[k] + *chunk) for
 * k = 0, 1 (chunks cp_rank and 2*cp_size-1-cp_rank of 2*cp_size), as the
 * engine cuts every batch. -EINVAL, saying what to change, when seq_len is
 * not a multiple of 2*cp_size or cp_rank >= cp_size. */
TF_API int tf_cp_chunks(uint64_t seq_len, uint32_t cp_size, uint32_t cp_rank, uint64_t first[2], uint64_t *chunk);
/* The THD context-parallel split (TF_WANT_CU_SEQLENS with cp_size > 1) of one
 * sample whose sequences (its cu_seqlens without context parallelism) have
 * seg[0, n) input positions: for each entry rank cp_rank receives of it, in
 * order, the sample's input position the entry holds, or -1 for padding
 * (every sequence padded to a multiple of 2*cp_size and cut into 2*cp_size
 * chunks, chunks cp_rank and 2*cp_size-1-cp_rank of each taken), as the
 * engine cuts every batch; a trainer places per-token values (loss weights)
 * the way the engine placed the tokens. Writes up to cap entries, *len their
 * number; -ENOBUFS when more (the padded lengths' sum / cp_size always fit). */
TF_API int tf_cp_thd_positions(const uint64_t *seg, size_t n, uint32_t cp_size, uint32_t cp_rank, int64_t *out,
                               size_t cap, size_t *len);
/* The same over a weighted mixture (see tf_order_create_mix); datasets
 * borrowed. */
TF_API int tf_loader_create_mix(const tf_dataset *const *ds, const double *weights, size_t n,
                                const tf_loader_config *cfg, tf_loader **out);
TF_API void tf_loader_free(tf_loader *l);
/* The engine's settings as the loader was created with them (a nullable
 * row's none value stays none), with the settings of the order it reads in
 * the `order` member: what tf_config_get(TF_SCOPE_ENGINE, ...) then reads by
 * name is what reached the engine. -EINVAL if l or cfg is NULL. */
TF_API int tf_loader_get_config(const tf_loader *l, tf_loader_config *cfg);

/* Next batch for this rank, in order. Blocks until it is ready. Returns 0 and a
 * batch the caller owns (release with tf_batch_release), or -TF_EEOF at the end
 * of a finite stream. The loader's position advances by one global batch. */
TF_API int tf_loader_next(tf_loader *l, tf_batch **out);

/* Like tf_loader_next, but gives up after timeout_ns nanoseconds with
 * -TF_ENOTREADY, "no batch yet, call again" (the binding waits in short slices
 * so that Ctrl-C stays responsive). Every other negative code is the failure
 * of the batch (-ETIMEDOUT, for one, is a remote fetch that ran out of
 * retries) and is never returned for a batch still being assembled. */
TF_API int tf_loader_next_timed(tf_loader *l, tf_batch **out, uint64_t timeout_ns);

/* Global stream position (in samples) of the next batch this rank will receive:
 * always a multiple of the global batch. */
TF_API uint64_t tf_loader_position(const tf_loader *l);
/* The order the loader reads now (borrowed: valid until the loader is freed or
 * a tf_loader_state_load hands over to another order). A C trainer reads the
 * state's takedowns from it (tf_order_num_excluded, tf_order_excluded). */
TF_API const tf_order *tf_loader_order(const tf_loader *l);

/* Take documents down from the loader's position on (tf_loader_position):
 * tf_order_exclude on the order the loader reads, then a seek to the same
 * position, so that no batch assembled ahead serves them. From then on (and
 * after a tf_loader_state_load of a state that lists takedowns) every batch
 * of tf_loader_next has each taken-down document's tokens replaced by pad_id
 * and its labels' loss_mask 0; boundaries, position_ids and cu_seqlens stay
 * those of the order (the other documents keep their places), with context
 * parallelism too. A takedown made with tf_order_exclude directly on the
 * order reaches the loader's batches at its next seek. Call it between
 * tf_loader_next calls (not concurrently with them). */
TF_API int tf_loader_exclude(tf_loader *l, size_t source, const uint64_t *ids, size_t n);

/* Move to global position pos (a multiple of global_batch). O(1). Batches
 * prefetched for the old position are discarded; batches already handed out
 * stay valid. */
TF_API int tf_loader_seek(tf_loader *l, uint64_t pos);

/* The loader's state at its position (tf_order_state_save with the loader's
 * order, position and world size). */
TF_API int tf_loader_state_save(const tf_loader *l, char *buf, size_t cap, size_t *len);

/* Resume from a state (tf_order_state_load), seeking to its position; a
 * mixture's hand-over replaces the order the loader reads (the loader owns
 * the new one; an order it borrowed is left as it was). Prefetched batches
 * are discarded. */
TF_API int tf_loader_state_load(tf_loader *l, const char *state, size_t len, unsigned flags);

typedef struct tf_batch_view {
    void *tokens;          /* rows x (seq_len + 1), out dtype */
    tf_dtype dtype;
    uint64_t rows;         /* B (B x L / l during a sequence-length warmup) */
    uint64_t seq_len;      /* L (the warmup's row length l) */
    int32_t *position_ids; /* rows x L, or NULL */
    int32_t *cu_seqlens;   /* rows x (L + 1), or NULL */
    int32_t *num_seqs;     /* rows, or NULL */
    uint8_t *loss_mask;    /* rows x L, or NULL */
    uint64_t position;     /* global position of this batch's first sample (with
                              balancing, its rows are those tf_order_balance gives) */
    /* Context parallelism (cp_size > 1; tokens is NULL). input_ids and labels
     * hold this rank's share, and position_ids / loss_mask are split alike:
     * rows x (L / cp_size) each, or in the THD layout (thd = 1) num_tokens
     * entries for the whole batch (its rows end to end), with cu_seqlens and
     * cu_seqlens_padded of num_seqs[0] + 1 entries (whole-sequence
     * coordinates) and max_seqlen the longest padded sequence. */
    uint32_t cp_size;
    int thd;
    void *input_ids;
    void *labels;
    uint64_t num_tokens;         /* entries of input_ids, labels, position_ids, loss_mask */
    int32_t *cu_seqlens_padded;  /* THD, or NULL */
    int32_t max_seqlen;          /* THD */
} tf_batch_view;

TF_API void tf_batch_get_view(const tf_batch *b, tf_batch_view *view);

/* Return the batch's buffers to the loader. The loader may be freed first:
 * buffers are reference-counted and the last release frees them. */
TF_API void tf_batch_release(tf_batch *b);

typedef struct tf_loader_stats {
    uint64_t batches;
    uint64_t tokens;
    uint64_t bytes_read;
    uint64_t wait_ns;      /* time the consumer spent blocked in tf_loader_next */
    uint64_t ring_ready;   /* batches ready and waiting right now */
    uint64_t ring_slots;
    tf_backend backend;    /* backend in use after any fallback */
    int num_threads;
    char backend_note[160]; /* why a requested backend fell back ("" if none) */
    /* zstd-compressed files (all 0 when the dataset has none). Decoded and used
     * count the workers' work, prefetched batches included. */
    uint64_t zstd_cache_bytes;     /* capacity of the shared decompressed-block cache */
    uint64_t zstd_cache_allocated; /* bytes of it allocated so far (grows on use) */
    uint64_t zstd_blocks_decoded;
    uint64_t zstd_tokens_decoded;  /* tokens decompressed */
    uint64_t zstd_tokens_used;     /* tokens copied from decompressed blocks into batches */
    uint64_t zstd_cache_hits, zstd_cache_misses;
    uint64_t zstd_cache_waits;     /* lookups that waited for another worker's decode */
    double zstd_decode_ratio;      /* tokens_decoded / tokens_used so far (0 before any) */
    double zstd_decode_model;      /* predicted ratio for this configuration (cost model) */
    char zstd_note[200];           /* "" or why this configuration decodes far more than it
                                      delivers (ratio > 8) / the cache is capped */
} tf_loader_stats;

TF_API void tf_loader_get_stats(const tf_loader *l, tf_loader_stats *st);

/* What the consumer has received from source i of a mixture since the
 * loader was created: samples, tokens (input tokens that are not padding)
 * and documents (documents whose first token was among them; one split over
 * several samples counts once). Under context parallelism every rank of the
 * group counts its data-parallel rank's whole samples. -ERANGE past the
 * sources; -EINVAL for a loader over a plain order (tf_loader_get_stats
 * covers its one source; the per-row accounting is kept for mixtures only). */
typedef struct tf_source_stats {
    uint64_t samples;
    uint64_t tokens;
    uint64_t documents;
} tf_source_stats;

TF_API int tf_loader_get_source_stats(const tf_loader *l, size_t i, tf_source_stats *st);

/* The data-wait meter: over the last `window` batches the consumer received
 * (0 or more than kept: the last TF_METER_MAX_WINDOW), how much of its wall
 * time went into waiting for data. The consumer's time is cut into one cycle
 * per batch, from the return of one batch to the return of the next; the
 * wait is the part spent inside next() for that batch (across timed-out
 * calls). wait_fraction = wait_seconds / window_seconds. ready_ahead: batches
 * already assembled behind the one delivered, when it was delivered (0 while
 * the consumer outruns the engine). The first batch is the engine's start-up
 * (threads starting, the first reads): its wait is startup_seconds, and it is
 * not a cycle of the window, which measures the steady state only. Readable
 * from any thread. */
#define TF_METER_MAX_WINDOW 4096
typedef struct tf_meter {
    uint64_t batches;         /* cycles in the window (< window before that many batches after the first) */
    uint64_t total_batches;   /* batches delivered since the loader was made, the first included */
    double window_seconds;    /* wall time the window covers */
    double wait_seconds;      /* of it, waiting in next() */
    double wait_fraction;
    double wait_p50_seconds;  /* per-batch wait: median, 99th percentile, largest */
    double wait_p99_seconds;
    double wait_max_seconds;
    double ready_ahead_mean;
    uint64_t ready_ahead_min;
    double startup_seconds;   /* the first batch's wait (0 before it): start-up, outside the window */
} tf_meter;

TF_API void tf_loader_get_meter(const tf_loader *l, uint32_t window, tf_meter *m);

/* ------------------------------------------------------------------------ */
/* Device: CUDA runtime loaded at run time, pinned host memory               */
/* ------------------------------------------------------------------------ */

/* The CUDA runtime (libcudart) is never linked: it is loaded with dlopen the
 * first time any function below needs it, once per process. $TOKENFEED_CUDART
 * (a path) overrides the search; otherwise a libcudart already loaded in the
 * process (PyTorch's, say) is preferred, then the usual sonames. Without it
 * every function here fails with -TF_ECUDA and a message saying why, and the
 * rest of the library is unaffected. Device pointers and streams are passed as
 * plain integers/pointers so that no CUDA header is needed.
 *
 * Streams (uintptr_t) are cudaStream_t values: 0 (legacy default stream),
 * 1 (cudaStreamLegacy), 2 (cudaStreamPerThread) or a created stream. */

/* No consumer stream: for tf_device_slot_release of a slot nobody used. */
#define TF_DEVICE_STREAM_NONE ((uintptr_t)-1)
/* Segments packed into a slot start at multiples of this many bytes. */
#define TF_DEVICE_ALIGN 256

/* Whether the CUDA runtime loads and sees at least one device. Returns 1 or 0;
 * why (may be NULL) receives what was loaded ("CUDA runtime 12.4 from
 * libcudart.so.12 (already loaded), 2 device(s)") or why not. */
TF_API int tf_cuda_available(char *why, size_t why_len);

/* Number of CUDA devices visible to this process. 0, or -TF_ECUDA when the
 * runtime cannot be loaded or initialised (tf_last_error says why). */
TF_API int tf_cuda_device_count(int *count);

/* Page-locked host memory for the host side of transfers: an anonymous,
 * page-aligned mapping registered with cudaHostRegister once, here, never per
 * transfer. If registration fails (memlock limit, no CUDA) the memory is still
 * returned, pageable, with *pinned = 0 (may be NULL) and the reason in
 * tf_last_error(); copies from it are then correct but slower. The caller owns
 * the memory and frees it with tf_pinned_free(ptr, bytes) (same bytes).
 * Returns 0, -EINVAL for bytes == 0, or -ENOMEM. */
TF_API int tf_pinned_alloc(size_t bytes, void **out, int *pinned);
TF_API void tf_pinned_free(void *ptr, size_t bytes);

/* ------------------------------------------------------------------------ */
/* Device loader: batches copied to the GPU ahead of the training step       */
/* ------------------------------------------------------------------------ */

/* A device loader puts a loader's batches on a CUDA device ahead of the
 * consumer. Its own thread takes batch k from the loader as soon as the
 * engine has assembled it and issues the host-to-device copy at once, on the
 * device ring's non-blocking stream, into a device slot, recording the slot's
 * "ready" event; it runs up to `prefetch` batches ahead of the consumer.
 * tf_device_loader_next() hands out the oldest such batch and makes the
 * consumer's stream wait on its event (cudaStreamWaitEvent: the host does not
 * wait for the copy, nothing synchronises the device or a stream). A slot is
 * reused only after an event recorded on the consumer's stream at
 * tf_device_batch_release has completed. See docs/gpu.md.
 *
 * Position and seek count what the consumer received: batches copied ahead
 * are not part of the state and are dropped by a seek. While a device loader
 * exists, its loader belongs to it: call tf_loader_next/seek only through the
 * device loader. */

typedef struct tf_device_loader tf_device_loader;
typedef struct tf_device_batch tf_device_batch;

/* Caller-owned device buffers that every batch is delivered into (for
 * training steps captured in CUDA graphs, whose addresses must not change).
 * Each array the loader produces needs a buffer of at least
 *   tokens        rows x (seq_len + 1) x dtype size
 *   position_ids  rows x seq_len x 4          (TF_WANT_POSITION_IDS)
 *   cu_seqlens    rows x (seq_len + 1) x 4    (TF_WANT_CU_SEQLENS)
 *   num_seqs      rows x 4                    (TF_WANT_CU_SEQLENS)
 *   loss_mask     rows x seq_len              (TF_WANT_LOSS_MASK)
 * bytes, on the device loader's device. Context-parallel loaders (cp_size =
 * cp > 1) produce no tokens; with N = rows x seq_len they need
 *   input_ids, labels  N / cp x dtype size each
 *   position_ids       N / cp x 4             (TF_WANT_POSITION_IDS)
 *   loss_mask          N / cp                 (TF_WANT_LOSS_MASK)
 * or in the THD layout (TF_WANT_CU_SEQLENS), room for the most a batch can
 * hold (each batch fills a prefix: tf_device_batch_view.num_tokens entries)
 *   input_ids, labels  2 N x dtype size each
 *   position_ids       2 N x 4                (TF_WANT_POSITION_IDS)
 *   loss_mask          2 N                    (TF_WANT_LOSS_MASK)
 *   cu_seqlens, cu_seqlens_padded  (N + 1) x 4 each
 * The first next() says which buffer is missing or short, and its size. */
typedef struct tf_device_static {
    void *tokens;
    size_t tokens_bytes;
    int32_t *position_ids;
    size_t position_ids_bytes;
    int32_t *cu_seqlens;
    size_t cu_seqlens_bytes;
    int32_t *num_seqs;
    size_t num_seqs_bytes;
    uint8_t *loss_mask;
    size_t loss_mask_bytes;
    void *input_ids; /* context parallelism */
    size_t input_ids_bytes;
    void *labels;
    size_t labels_bytes;
    int32_t *cu_seqlens_padded; /* THD */
    size_t cu_seqlens_padded_bytes;
} tf_device_static;

typedef struct tf_device_config {
    int device;        /* CUDA device index */
    union {            /* batches whose copy is issued ahead of the consumer;
                          0 = default (2). The settings table's name; `prefetch`
                          is its older name, the same member. */
        int prefetch_batches;
        int prefetch;
    };
    union {            /* device slots in all; 0 = prefetch_batches + 2, so that
                          the consumer can hold two batches at once. At least
                          prefetch_batches + 1. (`slots`: its older name.) */
        int device_slots;
        int slots;
    };
    const tf_device_static *static_buffers;
                       /* NULL: each batch in a slot of its own. Else every
                          batch is delivered into these buffers (copied once).
                          Copied at create time; the buffers are borrowed. */
    int alloc_static;  /* 1 (with static_buffers NULL): static buffers too, but
                          allocated by the device loader, at the first next(),
                          sized for any batch of the loader; the batch view
                          gives their addresses (the same for every batch).
                          They are freed with the last batch handle, after
                          tf_device_loader_free. */
} tf_device_config;

TF_API void tf_device_config_init(tf_device_config *cfg);

/* A device loader over l (borrowed: must outlive the device loader). Checks
 * now that CUDA is usable and the device exists (-TF_ECUDA / -EINVAL with
 * the reason); device memory is allocated when the first batch's shape is
 * known, on the first tf_device_loader_next (its errors, -ENOMEM for a full
 * GPU among them, come from there). Threads start on the first next. From
 * now on l assembles its batches in page-locked buffers (each registered
 * once, when the engine makes it), which the copies read in place; after
 * tf_device_loader_free it goes back to ordinary memory. */
TF_API int tf_device_loader_create(tf_loader *l, const tf_device_config *cfg, tf_device_loader **out);

/* Stop the copy thread and drop the batches copied ahead (waiting, on
 * events, for copies in flight). Batches the consumer holds stay valid; the
 * device memory goes with the last of them. Accepts NULL. */
TF_API void tf_device_loader_free(tf_device_loader *d);

/* The next batch, on the device. `stream` (a cudaStream_t: 1 = legacy
 * default, 2 = per-thread default, or a created stream) is made to wait for
 * the batch's copy; TF_DEVICE_STREAM_NONE makes nothing wait (use
 * tf_device_batch_wait or the view's ready_event). With static buffers the
 * batch is copied into them on `stream` (which must then be a stream), after
 * the work already queued there. Returns 0, -TF_EEOF at the end of a finite
 * stream, -EBUSY when every slot is held by the consumer (release old
 * batches, or create with more slots), or an error of the loader or of CUDA:
 * after an error the position has not advanced and the next call retries the
 * same batch. */
TF_API int tf_device_loader_next(tf_device_loader *d, uintptr_t stream, tf_device_batch **out);

/* Like tf_device_loader_next, but gives up with -TF_ENOTREADY after
 * timeout_ns (no message; call again). Other negative codes are failures. */
TF_API int tf_device_loader_next_timed(tf_device_loader *d, uintptr_t stream, tf_device_batch **out,
                                       uint64_t timeout_ns);

/* Global position of the next batch the consumer will receive (never counts
 * the batches copied ahead). */
TF_API uint64_t tf_device_loader_position(const tf_device_loader *d);

/* Move to position pos (a multiple of the global batch): the batches copied
 * ahead are dropped; batches the consumer holds stay valid. */
TF_API int tf_device_loader_seek(tf_device_loader *d, uint64_t pos);

/* Start the copy thread now instead of at the first next (so that the first
 * batches are on the device before the training loop asks). Optional. */
TF_API int tf_device_loader_start(tf_device_loader *d);

typedef struct tf_device_batch_view {
    void *tokens;          /* device: rows x (seq_len + 1), dtype */
    tf_dtype dtype;
    uint64_t rows;
    uint64_t seq_len;
    int32_t *position_ids; /* device: rows x seq_len, or NULL */
    int32_t *cu_seqlens;   /* device: rows x (seq_len + 1), or NULL */
    int32_t *num_seqs;     /* device: rows, or NULL */
    uint8_t *loss_mask;    /* device: rows x seq_len, or NULL */
    uint64_t position;     /* global position of this batch's first sample (with
                              balancing, its rows are those tf_order_balance gives) */
    int device;
    uintptr_t ready_event; /* cudaEvent_t: the data is in place once it has
                              completed (owned by the loader; valid until the
                              batch is released) */
    /* Context parallelism (cp_size > 1; tokens is NULL), as tf_batch_view
     * gives it on the host: input_ids and labels (device) hold this rank's
     * share, and position_ids / loss_mask are split alike: rows x (seq_len /
     * cp_size) each; or in the THD layout (thd = 1), num_tokens entries for
     * the whole batch, with cu_seqlens and cu_seqlens_padded (device) of
     * thd_seqs + 1 entries, and num_seqs NULL. num_tokens, max_seqlen and
     * thd_seqs are host values: no need to wait for the copy to read them. */
    uint32_t cp_size;
    int thd;
    void *input_ids;
    void *labels;
    uint64_t num_tokens;         /* entries of input_ids, labels, position_ids, loss_mask */
    int32_t *cu_seqlens_padded;  /* THD, else NULL */
    int32_t max_seqlen;          /* THD: the longest padded sequence */
    int32_t thd_seqs;            /* THD: sequences in the batch */
} tf_device_batch_view;

TF_API void tf_device_batch_get_view(const tf_device_batch *b, tf_device_batch_view *view);

/* Make another stream wait (on the device) for the batch's data. */
TF_API int tf_device_batch_wait(tf_device_batch *b, uintptr_t stream);

/* Block the calling thread until the batch's data is in place (an event
 * synchronize on its ready event; for CPU-side checks and tests, not for a
 * training loop, which uses the stream waits above). */
TF_API int tf_device_batch_synchronize(tf_device_batch *b);

/* Give the batch back. `stream` is the stream of the last work that reads
 * it (TF_DEVICE_STREAM_NONE if nothing did): an event recorded there gates
 * the slot's reuse. The batch pointer is invalid afterwards, whatever the
 * result. Thread-safe; may outlive the device loader; accepts NULL. */
TF_API int tf_device_batch_release(tf_device_batch *b, uintptr_t stream);

typedef struct tf_device_stats {
    uint64_t batches;           /* delivered to the consumer */
    uint64_t issued_ahead;      /* of those, batches whose copy had been issued
                                   before next() asked for them */
    double copies_issued_ahead; /* issued_ahead / batches (0 before the first) */
    uint64_t copies;            /* batches whose host-to-device copy was issued */
    uint64_t h2d_bytes;         /* bytes of those copies */
    uint64_t h2d_timed_bytes;   /* bytes of the copies timed so far */
    double h2d_seconds;         /* device time of the timed copies (events) */
    double h2d_gbps;            /* h2d_timed_bytes / h2d_seconds / 1e9 */
    uint64_t direct_copies;     /* copies read straight from a page-locked engine buffer */
    uint64_t staging_copies;    /* host memcpys of an engine buffer into pinned staging
                                   (only for buffers made before the device loader) */
    uint64_t staging_bytes;
    uint64_t engine_buffers_locked; /* engine buffers page-locked so far (each once) */
    double wait_mean_s;         /* consumer time in next() waiting for a batch */
    double wait_p99_s;          /* over the last 4096 batches */
    double wait_total_s;
    uint64_t release_waits;     /* the copy thread waited on a release event */
    uint64_t slot_full_waits;   /* ... or for the consumer to release a batch */
    int prefetch;
    int slots;
    int queued;                 /* batches copied ahead, not yet delivered */
    int held;                   /* batches delivered, not yet released */
    int host_pinned;            /* every copy read page-locked memory (-1: no copy yet) */
    int static_buffers;
    char note[160];             /* why staging is pageable, "" otherwise */
} tf_device_stats;

TF_API void tf_device_loader_get_stats(const tf_device_loader *d, tf_device_stats *st);

/* The data-wait meter (tf_meter) of the consumer of a device loader: its
 * wait in tf_device_loader_next for a batch whose copy has been issued, and
 * ready_ahead the batches whose copy was issued behind it. */
TF_API void tf_device_loader_get_meter(const tf_device_loader *d, uint32_t window, tf_meter *m);

/* The same meter read on the GPU's clock: what the consumer's stream stood
 * still for at each hand-off. At every tf_device_loader_next given a stream,
 * the stage records a timing event on that stream before making it wait on
 * the batch's copy and one after: the time between them is the GPU's wait for
 * that batch (about 0 when the copy was done before the stream got there), and
 * the time between one hand-off's second event and the next's is the GPU's
 * cycle (the training step, wait included). Events are read when they have
 * completed, never waited for, so the last hand-offs (*pending, may be NULL)
 * are not in the figures yet. In *m: batches, wait_seconds, wait_fraction (of
 * the GPU's time), wait_p50/p99/max_seconds, window_seconds (GPU time the
 * window covers) and startup_seconds (the first batch's GPU wait);
 * total_batches counts the batches read (a batch handed over without a
 * stream is not measured, nor the one after it, whose cycle spans two);
 * ready_ahead_* are 0. Hand-offs made
 * with TF_DEVICE_STREAM_NONE are not measured. Returns 0, or -TF_ECUDA (with
 * what the figures hold so far) when a CUDA call of the meter failed and it
 * stopped; the batches are delivered either way. */
TF_API int tf_device_loader_get_gpu_meter(const tf_device_loader *d, uint32_t window, tf_meter *m,
                                          uint64_t *pending);

/* Optional, for a consumer with work of its own around tf_device_loader_next
 * (a binding converting the batch to its framework's tensors, say), so that
 * the GPU-clock meter counts that work as the wait it is for the stream: mark
 * the request on `stream` before anything else for the batch, and the
 * hand-off once the batch is in the consumer's hands. next() then records
 * neither mark itself; a request whose hand-off is never marked leaves that
 * batch unmeasured. Return 0 (a CUDA failure stops the meter, see above). */
TF_API int tf_device_loader_gpu_request(tf_device_loader *d, uintptr_t stream);
TF_API int tf_device_loader_gpu_handoff(tf_device_loader *d, uintptr_t stream);

/* ======================================================================== */
/* Experimental API (TF_EXPERIMENTAL_API)                                    */
/* ======================================================================== */

/* Declared only when the including file defines TF_EXPERIMENTAL_API (see the
 * top of this header): these interfaces may change in any release. The shared
 * library exports their symbols under a version node of their own
 * (TOKENFEED_EXPERIMENTAL_0 in csrc/tokenfeed.map), renamed when they change. */
/* ---- views: metadata columns and selections of documents (docs/views.md) ---
 *
 * A column file (docs/format.md, "Metadata columns") holds typed values, one
 * per document of a dataset, beside its token files. tf_columns_open maps it
 * and checks its header and directory; a column's payload is checked
 * (checksum, offsets, codes) the first time it is used. */
typedef struct tf_columns tf_columns;
typedef enum tf_column_type {
    TF_COLUMN_INT64 = 1,    /* int64; INT64_MIN is a missing value */
    TF_COLUMN_FLOAT64 = 2,  /* float64; NaN is a missing value */
    TF_COLUMN_STRING = 3,   /* UTF-8 bytes per document */
    TF_COLUMN_CATEGORY = 4  /* a code per document into a dictionary of strings; 0xFFFFFFFF missing */
} tf_column_type;
typedef struct tf_column_value {
    tf_column_type type;
    int is_null;
    int64_t i;     /* INT64 (a CATEGORY's code) */
    double f;      /* FLOAT64 */
    const char *s; /* STRING / CATEGORY bytes (not NUL-terminated), valid while the columns are open */
    size_t len;
} tf_column_value;
TF_API int tf_columns_open(const char *path, tf_columns **out);
/* The same over bytes the caller keeps alive until tf_columns_free. */
TF_API int tf_columns_from_memory(const void *buf, size_t len, tf_columns **out);
TF_API void tf_columns_free(tf_columns *c);
TF_API uint64_t tf_columns_num_documents(const tf_columns *c);
/* The fingerprint of the dataset the columns were written for (0: none recorded). */
TF_API uint64_t tf_columns_dataset_fingerprint(const tf_columns *c);
TF_API size_t tf_columns_count(const tf_columns *c);
TF_API int tf_columns_get(const tf_columns *c, size_t i, const char **name, tf_column_type *type);
TF_API const char *tf_column_type_name(tf_column_type t);
/* mask[d] = 1 where document d satisfies the filter `where` (the language of
 * docs/views.md), else 0; mask holds tf_columns_num_documents bytes. -EINVAL
 * naming the offset for a malformed expression, -ENOENT for an unknown column. */
TF_API int tf_columns_eval(const tf_columns *c, const char *where, uint8_t *mask);
/* mask[d] = 1 where the value of column is one of values[0, n) (strings; for
 * a number column, numbers written as text). */
TF_API int tf_columns_match(const tf_columns *c, const char *column, const char *const *values, size_t n,
                            uint8_t *mask);
TF_API int tf_columns_value(const tf_columns *c, const char *column, uint64_t doc, tf_column_value *v);

/* A view: the documents ids[0, n) (ascending, distinct, below the dataset's
 * document count) of ds, in that order. It reads ds's files (ds must outlive
 * it) and is a dataset like any other: orders over it (concat, best-fit,
 * document packing, mixtures) see only its documents, and its fingerprint
 * hashes ds's with the selection. A view of a view selects among the
 * view's documents. Files split at an eos id without a document index cannot
 * be selected from (-EINVAL naming the command that builds the index). */
TF_API int tf_dataset_select(const tf_dataset *ds, const uint64_t *ids, uint64_t n, tf_dataset **out);
/* 1 for a view (*num_documents and *num_tokens: what it selects), 0 for a
 * dataset (its totals). */
TF_API int tf_dataset_selection(const tf_dataset *ds, uint64_t *num_documents, uint64_t *num_tokens);
/* Document i of a view as a document id of the dataset it selects from (i itself for a dataset). */
TF_API int tf_dataset_document_id(const tf_dataset *ds, uint64_t i, uint64_t *id);
/* The index in the view of that dataset's document id: -ENOENT when the view leaves it out. */
TF_API int tf_dataset_document_index(const tf_dataset *ds, uint64_t id, uint64_t *i);

#ifdef TF_EXPERIMENTAL_API

/* ------------------------------------------------------------------------ */
/* Order: the keyed permutation itself                                       */
/* ------------------------------------------------------------------------ */

/* The bijection the shuffles are built from. Its struct layout and key
 * schedule are exposed for tests and tools; orders (tf_order_*) are the stable
 * way to get shuffled samples. */

#define TF_PERM_ROUNDS 10

/* A keyed bijection on [0, n): a balanced Feistel network over the smallest
 * even number of bits that covers n, with cycle-walking. Plain value; no free. */
typedef struct tf_perm {
    uint64_t n;
    uint32_t half_bits;
    uint64_t half_mask;
    uint64_t keys[TF_PERM_ROUNDS];
} tf_perm;

/* n >= 1 (n == 0 is -EINVAL). */
TF_API int tf_perm_init(tf_perm *p, uint64_t n, uint64_t key);
TF_API uint64_t tf_perm_apply(const tf_perm *p, uint64_t i);   /* i < n */
TF_API uint64_t tf_perm_inverse(const tf_perm *p, uint64_t j); /* j < n */

/* 64-bit mixer used to derive keys (splitmix64 finalizer). */
TF_API uint64_t tf_mix64(uint64_t x);

/* ------------------------------------------------------------------------ */
/* Order: llm.c's data loader order                                          */
/* ------------------------------------------------------------------------ */

/* The order of llm.c's training data loader (karpathy/llm.c,
 * llmc/dataloader.h), so that a run begun on llm.c's loader continues on
 * tokenfeed with the same batches. The dataset's files are llm.c's shards,
 * in the order llm.c lists them (its glob, sorted by name). Each file is cut
 * on its own from its token 0 into global batches of cfg->global_batch rows
 * of seq_len + 1 tokens (consecutive rows overlap by one token); its tail of
 * (tokens - 1) mod (global_batch x seq_len) tokens is never read, and no
 * batch spans two files. An epoch reads every file once.
 *
 * num_processes is llm.c's number of processes R; global_batch is R x B
 * (llm.c's B), and a loader over this order with world_size R and
 * batch_size B gives rank r what llm.c's process r reads. cfg->shuffle
 * NONE reads files and batches in order; FULL is llm.c's shuffle (its
 * permute_train_loader, on in train_gpt2.c): process r shuffles the file
 * order every epoch and each file's batches with its own MT19937 seeded
 * cfg->seed + r, as llm.c does with 42 + r, so set cfg->seed = 42 to
 * continue an llm.c run. Processes then read different files at the same
 * step, and a state resumes only with the same num_processes (it enters the
 * fingerprint). packing must be CONCAT without separator; block_size and
 * window_blocks are not used. Extras (position_ids, ...) follow the
 * documents as CONCAT's do.
 *
 * Every file must hold at least one global batch plus one token (-EINVAL
 * naming it: llm.c refuses such a shard too). Memory: O(files + batches per
 * epoch) integers per process with shuffle. The order borrows ds. */
TF_API int tf_order_create_llmc(const tf_dataset *ds, const tf_order_config *cfg, uint32_t num_processes,
                                tf_order **out);

/* ------------------------------------------------------------------------ */
/* Device ring: preallocated device slots with pinned staging                */
/* ------------------------------------------------------------------------ */

/* The building block of tf_device_loader, for embedders that move their own
 * host buffers to the GPU (the Python DeviceFeeder does). Conventions of the
 * device section above (streams, the CUDA runtime loaded at run time). */

typedef struct tf_device_ring tf_device_ring;
typedef struct tf_device_slot tf_device_slot;

/* A ring of `slots` preallocated device buffers of slot_bytes each on
 * `device`, each with pinned host staging of the same size, one non-blocking
 * copy stream and two events per slot ("copied", "released"). Everything is
 * allocated here; nothing is allocated per transfer. Slot life cycle:
 *
 *   free -> filling (acquired) -> in use (copy issued on the ring's stream;
 *   consumers wait on its "copied" event) -> released (a "released" event was
 *   recorded on the consumer stream) -> free once that event has completed
 *   (found with cudaEventQuery; nothing device-synchronises).
 *
 * Errors: -EINVAL (bad sizes, device index out of range: the message gives the
 * number of devices), -ENOMEM (device or host out of memory: the message says
 * how much was asked for), -TF_ECUDA (runtime missing or failing). The caller
 * owns *out and frees it with tf_device_ring_free. */
TF_API int tf_device_ring_create(int device, size_t slot_bytes, int slots, tf_device_ring **out);

/* Drop the caller's reference. Slots still held (in use) stay valid; the
 * device memory goes when the last of them is released. Accepts NULL. May
 * wait (on events, never the device) for copies and releases in flight. */
TF_API void tf_device_ring_free(tf_device_ring *r);

typedef struct tf_device_ring_info {
    int device;
    int slots;
    size_t slot_bytes;
    int host_pinned;        /* staging is page-locked (0: pageable fallback) */
    int free_slots;         /* free right now (released slots not yet polled count as not free) */
    int in_use;             /* acquired or handed out, not yet released */
    int lost;               /* slots withdrawn after a CUDA error on release */
    uint64_t uploads;       /* copies issued */
    uint64_t release_waits; /* acquisitions that had to wait on a "released" event */
    char note[160];         /* why staging is pageable, "" otherwise */
} tf_device_ring_info;

TF_API void tf_device_ring_get_info(tf_device_ring *r, tf_device_ring_info *info);

/* Take a free slot for filling (state filling). Released slots whose event has
 * completed are recycled first-released first. If none is free: with wait = 0
 * returns -EAGAIN; with wait != 0 blocks on the oldest "released" event
 * (cudaEventSynchronize on that event, not the device). -EBUSY when every slot
 * is held by the consumer (no release pending): release tensors of old batches
 * or create the ring with more slots. The slot belongs to the caller until it
 * passes it to tf_device_slot_release. */
TF_API int tf_device_ring_acquire(tf_device_ring *r, int wait, tf_device_slot **out);

/* Pinned host staging of a slot in state filling: slot_bytes writable bytes.
 * Fill it (an embedder can read or decode straight into it), then commit. */
TF_API void *tf_device_slot_host(tf_device_slot *s);

/* Start the host-to-device copy of the first `bytes` of the staging on the
 * ring's copy stream and record the slot's "copied" event (state in use).
 * Does not wait for the copy. The staging must not be written again until the
 * slot is released. On failure the slot stays in state filling (commit again
 * or release it with TF_DEVICE_STREAM_NONE). -EINVAL if bytes > slot_bytes. */
TF_API int tf_device_slot_commit(tf_device_slot *s, size_t bytes);

/* One host buffer to upload (borrowed for the duration of the call). */
typedef struct tf_device_seg {
    const void *host;
    size_t bytes;
} tf_device_seg;

/* Bytes a slot needs for these segments, each placed at the next multiple of
 * TF_DEVICE_ALIGN; offsets (may be NULL) receives each segment's offset. */
TF_API size_t tf_device_packed_size(const tf_device_seg *segs, int nsegs, size_t *offsets);

/* Acquire (as tf_device_ring_acquire), copy the segments into the staging at
 * their packed offsets, commit. The host buffers may be reused as soon as this
 * returns. -EINVAL when they do not fit slot_bytes. */
TF_API int tf_device_ring_upload(tf_device_ring *r, const tf_device_seg *segs, int nsegs, int wait,
                                 tf_device_slot **out);

/* Device address of the slot's buffer (segment i is at ptr + offset i). Valid
 * until the slot is released; to be read only on streams ordered after the
 * slot's "copied" event (tf_device_slot_wait). */
TF_API void *tf_device_slot_ptr(const tf_device_slot *s);

/* Hand-off: make `stream` wait (cudaStreamWaitEvent) on the slot's "copied"
 * event, so work queued on it afterwards sees the data. Returns immediately. */
TF_API int tf_device_slot_wait(tf_device_slot *s, uintptr_t stream);

/* Block the calling thread until the slot's copy has completed (an event
 * synchronize, for CPU-side checks and tests; consumers use
 * tf_device_slot_wait instead). */
TF_API int tf_device_slot_synchronize(tf_device_slot *s);

/* Give the slot back. Records its "released" event on `stream`, the stream of
 * the last work that reads the slot (or TF_DEVICE_STREAM_NONE when nobody
 * read it: the event goes on the copy stream); the slot is reused only after
 * that event has completed. The slot pointer is invalid afterwards, whatever
 * the result. On a CUDA error the slot is withdrawn from the ring (counted in
 * `lost`) rather than risk reuse while still read, and -TF_ECUDA is returned.
 * Thread-safe against the ring's other functions; accepts NULL. */
TF_API int tf_device_slot_release(tf_device_slot *s, uintptr_t stream);

/* ------------------------------------------------------------------------ */
/* Order: Megatron-core GPTDataset's order, from its index cache             */
/* ------------------------------------------------------------------------ */

/* The three arrays Megatron-core's GPTDataset writes into its cache
 * directory (path_to_cache) as HASH-GPTDataset-SPLIT-document_index.npy,
 * -sample_index.npy and -shuffle_index.npy, mapped by the caller (borrowed:
 * they must outlive the order). Each is a C-contiguous little-endian array of
 * TF_INT32, TF_UINT32, TF_INT64 or TF_UINT64 (GPTDataset writes int32 or
 * int64, and uint32 or int64 for the shuffle). */
typedef struct tf_megatron_index {
    const void *document_index;    /* the dataset's documents in Megatron's shuffled order, every epoch */
    tf_dtype document_index_dtype;
    uint64_t document_index_len;
    const void *sample_index;      /* rows of (document_index position, token offset): sample s
                                      runs from row s to row s + 1 */
    tf_dtype sample_index_dtype;
    uint64_t sample_index_rows;    /* N + 1 rows of two entries */
    const void *shuffle_index;     /* N samples in training order */
    tf_dtype shuffle_index_dtype;
    uint64_t shuffle_index_len;    /* N */
    int add_extra_token;           /* GPTDatasetConfig.add_extra_token_to_sequence: 1 (Megatron's
                                      default) or 0; the cache does not record it */
} tf_megatron_index;

/* The order of Megatron-core's GPTDataset over ds (the .bin/.idx data the
 * cache was built from: its documents are Megatron's sequences), so that a
 * run begun on Megatron continues on tokenfeed sample for sample: position i
 * holds GPTDataset[i mod N]'s text (tokens then the last label: seq_len + 1
 * tokens). With add_extra_token 0 the last token is 0, the label Megatron
 * pads; a final partial sample (a validation split built without
 * drop_last_partial_validation_sequence) is padded with 0 as GPTDataset
 * returns it. Megatron's MegatronPretrainingSampler gives data-parallel rank r
 * of D the r-th micro-batch of each D x micro_batch_size samples: a loader
 * with batch_size = micro_batch_size and world_size = D gives rank r the same
 * rows (a position is Megatron's consumed_train_samples).
 *
 * cfg: seq_len is the cache's sequence_length; packing CONCAT, separator_id
 * -1, shuffle NONE and pad_id 0 (the cache holds the order); epochs = 1 ends
 * the stream where the cache ends. Extras: a document starts at each piece
 * of another document. Opening is O(1) in the cache's size: it checks the
 * shapes and 64 samples spread over the cache, and every sample read is
 * checked (-TF_EFORMAT naming the sample when the cache does not fit the
 * dataset or seq_len). The state records a fingerprint of the cache, so a
 * state saved on one cache is refused on another. */
TF_API int tf_order_create_megatron(const tf_dataset *ds, const tf_order_config *cfg, const tf_megatron_index *index,
                                    tf_order **out);

/* ------------------------------------------------------------------------ */
/* Sources: what a local path names                                          */
/* ------------------------------------------------------------------------ */

/* What an open of the local path with this format (TF_FORMAT_AUTO: any)
 * reads, decided by the very rules and file-system looks the open uses
 * (docs/format.md, "What a path names"), so that an embedder asking where a
 * dataset's companions live (its metadata columns, docs/views.md) gets the
 * open's answer:
 *   TF_PATH_DATASET: a tokenfeed dataset directory (out: the directory,
 *     without trailing '/');
 *   TF_PATH_PAIR: a pair such as Megatron's P.bin + P.idx, named by P, P.bin
 *     or P.idx, its companion's magic checked (out: the prefix P);
 *   TF_PATH_FILE: a single file (out: path as given).
 * 0, or -errno with tf_last_error() saying why: -ENOENT (nothing there: the
 * message names what was looked for), -EINVAL (not a regular file or
 * directory, such as a FIFO, which is never opened; a URL: remote names are
 * resolved by the remote open, against the store), -TF_EFORMAT (a directory
 * without a manifest, a pair whose companion has another magic, or no pair
 * where the format is a pair's), -ENAMETOOLONG (out_cap too small for the
 * answer: PATH_MAX bytes always do). A shard set (a glob, a directory of
 * foreign files) is no single target: open it with tf_dataset_open. The
 * answer is what the file system says now; the open decides again. */
typedef enum tf_path_kind { TF_PATH_DATASET = 1, TF_PATH_PAIR = 2, TF_PATH_FILE = 3 } tf_path_kind;
TF_API int tf_path_resolve(const char *path, tf_format format, tf_path_kind *kind, char *out, size_t out_cap);

/* Shard sets from the node's catalog (docs/format.md, "The node's catalog").
 * A shard set is what open was given before it was expanded into files:
 * directories of foreign files and globs (the Python package expands them).
 * tf_dataset_open_set opens the set spec names from its catalog entry when
 * every directory holding its files is unchanged since it was listed: no
 * listing, no file read or stat at open (each file is checked on first
 * touch). -ENOENT when the catalog has no usable entry (then expand the set
 * and open its files; tf_dataset_catalog_set records them). */
TF_API int tf_dataset_open_set(const char *const *spec, size_t nspec, const tf_open_options *opt, tf_dataset **out);

/* Shard sets named by a path spec (docs/format.md, "Shard sets"). Every open
 * of local paths (tf_dataset_open, tf_dataset_open_many) accepts, for any
 * path, a directory of foreign files without a manifest ("data/") or a glob
 * (the pattern "*.bin" in data, or a wildcard in a directory part too; a
 * wildcard never crosses '/'), opened as its
 * files in sorted name order. Each directory the spec reaches is listed
 * once, and companion files (a Megatron .idx, a datatrove .index, an eos_id
 * .tfdocs, OLMo's .csv.gz) are found in that listing, never probed per file.
 * The node's catalog records the set under the spec and the identity of each
 * directory listed; a later open of the same spec whose directories are
 * unchanged reads neither a directory nor a file (each file is checked on
 * first touch). tf_dataset_open_spec is that open with flags:
 * TF_OPEN_CATALOG_ONLY opens the set from the node's catalog or fails with
 * -ENOENT (tf_dataset_open_set); TF_OPEN_IMMUTABLE trusts the catalog's
 * entry without looking at the directories: the caller vouches that no file
 * was added, removed or renamed since the set was recorded (a file added is
 * not seen; a file replaced or modified is still an error naming it at its
 * first touch). */
#define TF_OPEN_IMMUTABLE 1u
#define TF_OPEN_CATALOG_ONLY 2u
TF_API int tf_dataset_open_spec(const char *const *spec, size_t nspec, const tf_open_options *opt, unsigned flags,
                                tf_dataset **out);

/* Record ds, opened from the files that spec expanded to, as that shard set.
 * dirs are the ndirs directories that hold every file, dir_ids their
 * identities when they were listed, before the expansion (4 per directory:
 * st_dev, st_ino, st_size, st_mtime in ns). 0 when recorded; 1 when not (a
 * directory changed since, or was modified in the last seconds; a file lies
 * outside them; the catalog is off or not private). Errors only for bad
 * arguments. */
TF_API int tf_dataset_catalog_set(const tf_dataset *ds, const char *const *spec, size_t nspec,
                                  const tf_open_options *opt, const char *const *dirs, const uint64_t *dir_ids,
                                  size_t ndirs);

/* A shard set's catalog beside the data (`tokenfeed index DIR` or `GLOB`):
 * one file in the set's directory that any machine reading the data opens
 * the set from, without listing the directory or reading a file (each file
 * is checked by size and modification time on first touch). prefix is how
 * the set's files are named ("dir/", or "" for names in the working
 * directory), pattern the glob of names ("" for the directory's data files;
 * a tokenfeed dataset has a catalog of its own instead:
 * tf_dataset_write_dataset_catalog).
 * tf_dataset_write_data_catalog records ds, opened from those files, as that
 * set: 0, with the catalog's path in path (cap bytes); -EAGAIN when a file
 * or the directory was modified in the last 2 seconds or while writing.
 * tf_dataset_open_data_catalog: -ENOENT when there is none, -ESTALE when
 * the directory changed since it was written (a file added, removed or
 * renamed: the set must be listed, and the catalog rebuilt), -EPERM when
 * the file under the catalog's name is not to be read (not a regular file,
 * such as a FIFO, or not this user's nor the directory owner's, or writable
 * by others: it may have been put there by another user), decided before a
 * byte of it is read; the set must then be listed. */
TF_API int tf_dataset_write_data_catalog(const tf_dataset *ds, const char *prefix, const char *pattern,
                                         const tf_open_options *opt, char *path, size_t cap);
TF_API int tf_dataset_open_data_catalog(const char *prefix, const char *pattern, const tf_open_options *opt,
                                        tf_dataset **out);

/* A tokenfeed dataset's own catalog (`tokenfeed index DATASET_DIR`;
 * docs/format.md, "The dataset's catalog"): tokenfeed.catalog in the
 * dataset's directory, every shard's entry keyed by the manifest's bytes,
 * which a remote open reads instead of every shard's header (the dataset
 * writer writes it too). ds is the dataset opened from dataset_dir (a
 * directory, with or without a trailing '/'): its shards' headers, read when
 * ds was opened, are not read again. 0, with the catalog's path in path (cap
 * bytes; path may be NULL); -EINVAL when ds is not the dataset the manifest
 * in dataset_dir describes now (another dataset, a view, or one rewritten
 * since ds was opened); -EAGAIN when the dataset was rewritten while its
 * catalog was written; else -errno. */
TF_API int tf_dataset_write_dataset_catalog(const tf_dataset *ds, const char *dataset_dir, char *path, size_t cap);

/* Whether the node's cache of r holds a record of the metadata of opening
 * exactly urls with opt (docs/remote.md, "Metadata, once per node"): then
 * tf_dataset_open_remote of the same urls sends no request. 1 or 0. Lets a
 * caller that would list a directory URL to expand it (a tokenfeed dataset
 * or a set of files?) skip the listing when that URL opened before as it is. */
TF_API int tf_remote_has_record(tf_remote *r, const char *const *urls, size_t n, const tf_open_options *opt);

/* A remote shard set's catalog beside the data (`tokenfeed index
 * 's3://bucket/tokens/shard_[0-9]*.bin'`; docs/remote.md, "A catalog beside the data in
 * object storage"): an object under the set's prefix, named
 * tf_remote_set_catalog_name(pattern, opt) (at most 40 bytes with its NUL),
 * describing every object of the set (the objects prefix + a name matching
 * pattern, "" for every data object under the prefix) by its entry as a
 * catalog beside the data has it, its size and its version (ETag) as listed.
 *
 * tf_dataset_remote_set_catalog: the catalog's bytes for ds, opened from
 * the set's objects as listed (tf_dataset_open_remote), into buf; *len gets
 * their count; -ENOSPC when cap is smaller (call again with *len bytes).
 * The caller stores them as that object.
 *
 * tf_dataset_open_remote_set: open the set from it: urls are the set's
 * objects as its listing shows them now, in order. The catalog is read (one
 * request, with the listing the open makes when the node has no record of
 * it) instead of every object's header; each object is checked against its
 * entry on first touch. -ENOENT when there is no catalog; -ESTALE when it does
 * not describe the set as listed now (an object added, removed or rewritten
 * since: open the objects with tf_dataset_open_remote, and write the catalog
 * again). pattern may be NULL: no catalog, the objects are read as
 * tf_dataset_open_remote reads them. listing (may be NULL) is the listing
 * the caller expanded the set from (a glob or a directory URL), taken just
 * now: the open learns sizes and versions from it instead of listing the
 * prefix again. tf_remote_has_set_record: as tf_remote_has_record, for this
 * open. */
typedef struct tf_remote_listing {
    const char *prefix; /* every object whose URL starts with it is among the n below */
    const char *const *urls;
    const tf_object_info *infos;
    size_t n;
} tf_remote_listing;
TF_API int tf_remote_set_catalog_name(const char *pattern, const tf_open_options *opt, char *name, size_t cap);
TF_API int tf_dataset_remote_set_catalog(const tf_dataset *ds, const char *prefix, const char *pattern,
                                         const tf_open_options *opt, void *buf, size_t cap, size_t *len);
TF_API int tf_dataset_open_remote_set(const char *const *urls, size_t n, const char *prefix, const char *pattern,
                                      const tf_remote_listing *listing, const tf_open_options *opt,
                                      tf_remote *remote, tf_dataset **out);
TF_API int tf_remote_has_set_record(tf_remote *r, const char *const *urls, size_t n, const char *prefix,
                                    const char *pattern, const tf_open_options *opt);

/* Remote path specs (docs/remote.md, "Shard sets, listed once per node").
 * tf_dataset_open_remote_spec opens paths as tf_dataset_open_remote does,
 * where a URL may also be a glob (s3://bucket/tokens/shard_*.bin: a wildcard in
 * any segment of the key, never crossing '/') or a directory URL ending in
 * '/' that holds foreign files: each is expanded, by the rules of local
 * shard sets (tf_dataset_open_spec), from one listing of its prefix, which
 * the open also learns every size and version from. tf_dataset_open_remote
 * is this open with no flags.
 *
 * One listing per node: a prefix's listing is recorded in the cache
 * directory (meta/<key>.tflist, sealed like the metadata records), and a
 * process of the node that needs the same prefix waits for the one listing
 * it and reads its record. A recorded listing is used in place of a listing
 * when this process waited for it, or when it ended at most
 * $TOKENFEED_LISTING_MAX_AGE seconds ago (default 60; 0: never by age), or
 * with TF_OPEN_IMMUTABLE (any age: the caller vouches that no object under
 * the prefix was added, removed or rewritten since this node listed it; the
 * node's metadata record of the open is then used without asking the store
 * either, and every read stays conditional on the version recorded).
 * One open lists a prefix at most once, whatever the rule: the node's
 * metadata record is checked against the listing the spec was expanded from.
 * TF_OPEN_SET_CATALOG: when paths is one glob or directory URL under one
 * prefix whose listing shows the set's catalog beside the data for these
 * options, the set opens from it (tf_dataset_open_remote_set; -ESTALE when it
 * is out of date: open again without the flag); otherwise the objects are
 * read as without the flag (tf_remote_has_set_record tells which). */
#define TF_OPEN_SET_CATALOG 4u
TF_API int tf_dataset_open_remote_spec(const char *const *paths, size_t n, const tf_open_options *opt, unsigned flags,
                                       tf_remote *remote, tf_dataset **out);
/* Every object whose URL starts with prefix, by that same rule: from the
 * node's recorded listing when it is trusted (flags: TF_OPEN_IMMUTABLE or
 * 0), else listed (once per node) and recorded. emit runs on the calling
 * thread, in URL order. -TF_EUNSUPPORTED when the transport cannot list. */
TF_API int tf_remote_list_objects(tf_remote *r, const char *prefix, unsigned flags, tf_list_emit_fn emit,
                                  void *emit_ctx);

#endif /* TF_EXPERIMENTAL_API */

#ifdef __cplusplus
}
#endif
#endif /* TOKENFEED_H */
