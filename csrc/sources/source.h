/*
 * source.h — the sources layer's internal model, shared by the format parsers
 * (native.c, megatron.c, llmc.c, raw.c, npy.c), the file primitives (file.c),
 * the dataset (dataset.c) and the writer (writer.c).
 *
 * A dataset is an ordered list of files (tf_file). Each parser validates one
 * file's headers and sizes (never its whole payload: that is verify's job) and
 * fills a tf_file: where its tokens are (a mapping, or compressed blocks and
 * the function that reads one), its dtype and counts, and how to find its
 * documents. dataset.c then only deals with tf_file, whatever the format, and
 * file.c is the one place that knows how a file's bytes are obtained.
 *
 * Every offset read from disk is distrusted: parsers check it against the
 * mapped size with overflow-checked arithmetic before any pointer is formed.
 * Errors are -TF_EFORMAT with a message of the form
 *   "<path>: <field>: expected <x>, found <y>. <what to do>"
 */
#ifndef TF_SOURCE_H
#define TF_SOURCE_H

#include <stdatomic.h>

#include "../common/internal.h"

typedef enum tf_doc_kind {
    TF_DOCS_SINGLE = 0,  /* the whole file is one document */
    TF_DOCS_ENDS = 1,    /* doc_ends[j]: cumulative end (exclusive) of doc j, uint64 */
    TF_DOCS_FORMAT = 2   /* the format's own index (a Megatron .idx): its row's document ops */
} tf_doc_kind;

/* A file's identity when its metadata was taken (file.c, catalog.c). known:
 * 0 unknown, 1 all four fields, 2 size and mtime only (a catalog written on
 * another machine, where device and inode mean nothing). */
typedef struct tf__file_id {
    uint64_t dev, ino, size, mtime_ns;
    int known;
} tf__file_id;

#define TF__FORMAT_PRIV_BYTES 112

/* A format's own document index (TF_DOCS_FORMAT): document j's tokens
 * [*start, + *len) (checked against the file: -TF_EFORMAT naming it), and
 * the document that holds token pos (< num_tokens). */
struct tf_file;
typedef struct tf__doc_ops {
    int (*document)(const struct tf_file *f, uint64_t j, uint64_t *start, uint64_t *len);
    uint64_t (*find_document)(const struct tf_file *f, uint64_t pos);
} tf__doc_ops;

/* Tokens stored in compressed blocks of blocks.tokens tokens (the last one
 * shorter): read decodes block b into out (out_cap bytes); extent gives where
 * its stored bytes lie in the file's token section, [*off, + *size), checked
 * against the section (-TF_EFORMAT naming the file otherwise). */
typedef struct tf__block_ops {
    int (*read)(const struct tf_file *f, uint64_t b, void *out, size_t out_cap);
    int (*extent)(const struct tf_file *f, uint64_t b, uint64_t *off, uint64_t *size);
} tf__block_ops;
typedef struct tf__blocks {
    const tf__block_ops *ops; /* NULL: the tokens are not stored in blocks */
    uint64_t count;           /* blocks in the file */
    uint64_t tokens;          /* tokens per block (0 when not compressed) */
} tf__blocks;

/* Documents that end after each eos id (split): from the document index the
 * sources keep, or, with rows_only, found only inside the rows read. */
typedef struct tf__eos_docs {
    int split, rows_only;
    uint64_t id;
} tf__eos_docs;

typedef struct tf_file {
    char *path;           /* owned */
    tf_format format;
    tf_dtype dtype;
    uint64_t num_tokens;
    uint64_t num_docs;
    uint64_t vocab_size;  /* 0 = unknown */

    /* Token data: tokens points at the first token inside map (or owned). */
    void *map;            /* main file mapping (munmap on close), or NULL */
    size_t map_len;
    /* The identity of the file behind map, taken from the descriptor it was
     * mapped from (tf__map_file_main): what a descriptor opened later by path
     * must still be. Unknown (known 0) for files not mapped from a path. */
    tf__file_id map_id;
    /* 1 + the offset of the mapping's last byte that was not zero when it was
     * mapped (0: none in the last page, or not mapped from a path): a read
     * of the mapping proves the file still holds its bytes by finding a
     * non-zero byte at or past its end (file.c, check_tail). */
    size_t map_nz;
    const uint8_t *tokens; /* NULL when compressed */
    void *owned;          /* heap copy for memory datasets (free on close) */

    /* Documents. */
    tf_doc_kind doc_kind;
    const uint64_t *doc_ends;   /* TF_DOCS_ENDS (may be unaligned-safe: 8-aligned by parsers) */
    void *aux_map;        /* second mapping (Megatron .idx, datatrove .index) */
    size_t aux_len;
    char *aux_path;       /* owned; path of the second file, for messages */

    /* Tokens stored in compressed blocks (blocks.ops set), whatever the
     * format: shared, not the format's private state, because the engine's
     * block cache (engine/zcache.c) sizes itself by the blocks and decodes
     * them, file.c reads through them, and the remote stack fetches a block's
     * stored bytes (blocks.ops->extent) before it is decoded. */
    tf__blocks blocks;

    /* Documents defined by an end-of-document token (a file opened with an
     * eos id: raw files): shared, because the eos id is part of what the file
     * is (its re-parse, its catalog entry, the dataset fingerprint), and
     * because when no document index was found, documents are known only
     * inside the rows the engine reads (concat packing): order, select and
     * the engine refuse or adapt what needs documents up front. */
    tf__eos_docs eos;

    /* Contribution to the dataset fingerprint (computed by the parser in
     * O(1): checksums for native files; header + sizes + sampled bytes for
     * foreign ones). */
    uint64_t fingerprint;

    /* A file whose token bytes are not mapped (tokens NULL, and no pointer of
     * its format's private state into them): its byte provider (bytes_ops, e.g. the remote stack's, which reads the
     * object through the node-local chunk cache) serves the object's bytes
     * [data_off, + token bytes) and owns bytes_src. meta holds the metadata
     * (native document index and tables) the pointers of the document index
     * and of the format's private state point into. */
    const struct tf__byte_ops *bytes_ops;
    void *bytes_src;
    uint64_t data_off;
    void *meta;

    /* A file of a multi-file local dataset (file.c): mapped on first touch
     * and unmapped again under the process's bound. The pointers above are
     * then NULL: readers go through tf__file_acquire / tf__file_release.
     * Shared by the views that copy this tf_file; freed by its owner. */
    struct tf__lazy *lazy;

    /* TF_DOCS_FORMAT: the format's document ops (its row's doc_ops), which
     * its parser installs as it installs blocks.ops. */
    const tf__doc_ops *doc_ops;
    /* The format's ops on its private state (its row's ops), which its parser
     * installs as it installs doc_ops, and a catalog's entry with the rest of
     * the file's metadata: file.c, which the format table sits above, reaches
     * them here. NULL: a format that keeps no such state. */
    const struct tf__format_ops *format_ops;
    /* The format's private state: its parser's own struct (native.c's section
     * offsets, checksums and tables, megatron.c's .idx arrays), kept in the
     * file so that a tf_file still copies by value, and read only by the
     * format's parser and its row's ops (tf__format_priv); other layers ask
     * the format (its row's ops, tf__native_info). It may hold pointers into
     * the mappings above: when they go, format_ops->forget_maps clears those. */
    _Alignas(8) unsigned char format_priv[TF__FORMAT_PRIV_BYTES];

    /* When set, path, aux_path and lazy live in this arena (a catalog's
     * files, allocated together), which the file holds one reference to:
     * tf__file_close releases it instead of freeing them. */
    struct tf__arena *arena;
} tf_file;

/* A format's parser (tf__open_native, ...): fills *f from path. */
typedef int (*tf__parse_fn)(const char *path, const tf_open_options *opt, tf_file *f);

typedef struct tf__format_ops tf__format_ops;

/* Bytes of a catalog entry that hold a format's private state (catalog.c). */
#define TF__CATALOG_PRIV_BYTES 24u

/* What a format does with its private state (format_priv) beyond its parser,
 * so that other layers never read its fields: each member may be NULL. */
struct tf__format_ops {
    /* Its tokens may be stored in compressed blocks: the block ops its parser
     * installs (f->blocks.ops), which a catalog's entry installs too when it
     * says a file is compressed. */
    const tf__block_ops *blocks;
    /* verify(): a full check of the checksums the file stores (runs under the
     * caller's SIGBUS guard; scratch holds one decoded block, cap bytes; stops
     * with -ECANCELED when *cancel becomes non-zero). NULL: the file stores
     * none, so verify checks only what every format has. */
    int (*verify)(const tf_file *f, _Atomic uint64_t *progress, _Atomic int *cancel, void *scratch,
                  size_t cap);
    /* The private state a catalog keeps of a file (TF__CATALOG_PRIV_BYTES
     * bytes), written from a parsed file and read into one described without
     * parsing it (what its first touch checks the parsed file against). */
    void (*catalog_pack)(const tf_file *f, uint8_t *out);
    void (*catalog_unpack)(tf_file *f, const uint8_t *in);
    /* The file's mappings are gone, its metadata kept (file.c): clear the
     * pointers into them, keep the rest. NULL: clear all of format_priv. */
    void (*forget_maps)(tf_file *f);
};

/* ---- formats.c: the format table ------------------------------------------
 * One row per on-disk format the sources layer reads. Detection (local and
 * remote), the open switch, the re-parse of a file known from a catalog, the
 * names open(format=) and the CLI take, and catalog eligibility all read this
 * table: a new format is its parser file and one row. */
/* A companion file: a name beside a data file that belongs to it. Its name
 * is the data file's with suffix appended (data_ext ""), or with the data
 * file's last extension replaced by suffix (data_ext the extension the data
 * file has: "x.bin" -> "x.idx", "x.npy" -> "x.csv.gz"), as pathlib's
 * with_suffix. A shard-set listing groups it with its data file; a remote
 * open asks for it beside each object it opens only when fetch is set (the
 * others are read by features that never run on objects, or, for a pair's
 * second half, are asked for by the resolution of what a URL names). */
typedef struct tf__companion {
    const char *suffix;
    const char *data_ext;
    int fetch;
    const char *what;             /* a few words for messages */
    /* The second half of a pair opened by its prefix (its row's first
     * companion): the pair's name for messages ("Megatron"), else NULL. */
    const char *pair;
} tf__companion;

typedef struct tf__format_row {
    tf_format format;
    const char *name;             /* tf_format_name, open(format=), --format */
    const char *alias;            /* another name open(format=) takes, or NULL */
    /* Whether a file's first n bytes (n may be short, 0 to 512) are this
     * format's magic. NULL: never detected from its own bytes. Rows are tried
     * in table order; a file no row claims is headerless (raw). */
    int (*magic)(const uint8_t *head, size_t n);
    /* The parser: opens path (a file, or for a pair the common prefix). */
    tf__parse_fn parse;
    /* Parses a file again from its path (f->path) on first touch, when it
     * was known from a catalog or mapped on demand. */
    tf__parse_fn reparse;
    /* Its companion files (a list ended by a NULL suffix, or NULL): see
     * tf__companion. Every companion tokenfeed knows is in some row's list,
     * so that one table says them all (tf__companion_at). */
    const struct tf__companion *companions;
    tf_doc_kind docs;             /* how its documents are stored */
    /* TF_DOCS_FORMAT: the format's document ops (its parser installs them
     * in each file it opens: file.c reads documents through them). */
    const tf__doc_ops *doc_ops;
    /* Its private state's ops beyond the parser (blocks, verify, catalog,
     * unmapping), or NULL when it keeps none that outlives its mappings. */
    const tf__format_ops *ops;
    /* A pair opened by its common prefix (Megatron's P.bin + P.idx, the .idx
     * its first companion, which names the pair): the data file's suffix, and
     * a few words for messages ("a Megatron pair"); NULL for a single file. */
    const char *pair_data_suffix;
    const char *pair;
    /* A pair: whether its companion (the row's first) starts with its magic,
     * and that magic as messages write it. */
    int (*pair_magic)(const uint8_t *head, size_t n);
    const char *pair_magic_what;
    /* Bytes of document index per document a file keeps at its end (a remote
     * open fetches that much tail with its head), 0 for none. */
    unsigned tail_per_doc;
    /* From a file's first bytes head[0, n) (n >= 8) and its size: the byte
     * range [*off, *end) its parse needs beyond them (a native shard's
     * document index and tables, a long .npy header); 0 with it set, 1 for
     * nothing more (or NULL: never). */
    int (*needs)(const char *path, const uint8_t *head, size_t n, uint64_t size, uint64_t *off, uint64_t *end);
    /* Headerless: the open's dtype says what the bytes are (nothing in the
     * file does), so a file is read again, or described by a catalog, only
     * with that dtype. */
    int headerless;
    /* Its files are a dataset's shards, each checked against the dataset's
     * manifest (counts and checksums): a catalog adds to that manifest and
     * never re-parses one of them alone. */
    int manifest;
    /* Whether a shard set's catalog may describe its files (the first touch
     * reads the file alone; a file with a companion present never is). */
    int catalog;
    const char *what;             /* a few words for messages */
} tf__format_row;

/* The row of fmt, or NULL (TF_FORMAT_AUTO, unknown codes). */
TF_HIDDEN const tf__format_row *tf__format_row_of(tf_format fmt);
/* The i-th row (NULL past the last). */
TF_HIDDEN const tf__format_row *tf__format_at(size_t i);
/* What a file's first bytes head[0, n) say it is: the first row whose magic
 * matches, else TF_FORMAT_RAW (a headerless token file, read only with a
 * dtype). The one detection from bytes, for local files and remote objects. */
TF_HIDDEN tf_format tf__format_sniff(const uint8_t *head, size_t n);
/* Whether head[0, n) starts a Megatron .idx ("MMIDIDX\0\0"). */
TF_HIDDEN int tf__megatron_idx_magic(const uint8_t *head, size_t n);
/* The k-th of the companions a remote open asks for beside a file of fmt
 * at path (those with fetch set; malloc'ed), or NULL past the last (or on
 * ENOMEM: *oom set). */
TF_HIDDEN char *tf__format_companion(tf_format fmt, const char *path, size_t k, int *oom);
/* companions.c: the rows' companion lists (data only, so that the shard-set
 * listing reads them without calling up into the parsers), and the k-th
 * companion of them all, NULL past the last. A listing's companion mask
 * (tf__listed_companions) has bit k for it. */
TF_HIDDEN extern const tf__companion tf__megatron_companions[];
TF_HIDDEN extern const tf__companion tf__raw_companions[];
TF_HIDDEN extern const tf__companion tf__nemo_nanogpt_companions[];
TF_HIDDEN const tf__companion *tf__companion_at(size_t k);
/* The index k of companion c in tf__companion_at's order (-1: not one). */
TF_HIDDEN int tf__companion_index(const tf__companion *c);
/* The name of companion c of the data file path (malloc'ed, NULL on ENOMEM). */
TF_HIDDEN char *tf__companion_name(const tf__companion *c, const char *path);

/* ---- resolve.c: what a path or URL names ----------------------------------
 * One decision for local paths and remote URLs: a dataset directory (a
 * manifest inside, for the row with .manifest), a pair opened by its common
 * prefix (the row with pair_data_suffix: P + data suffix and P + its first
 * companion, given by the prefix or either name, the companion's magic
 * confirming), or a single file whose bytes say its format. The caller
 * answers questions about names through a probe: from the file system or a
 * shard set's listing (dataset.c), from the sizes of the objects it asked
 * for (remote_open.c). */
enum { TF__NAME_NONE = 0, TF__NAME_FILE = 1, TF__NAME_DIR = 2, TF__NAME_OTHER = 3 };
typedef struct tf__probe {
    void *ctx;
    /* What name is: TF__NAME_FILE (a regular file, an object), TF__NAME_DIR,
     * TF__NAME_OTHER (a FIFO, a device...), or TF__NAME_NONE. */
    int (*kind)(void *ctx, const char *name);
    /* Up to cap of the first bytes of name into buf: how many, or -1 when
     * they are not known yet (then the caller confirms the pair once they
     * are, with tf__resolve_confirm). */
    long (*head)(void *ctx, const char *name, uint8_t *buf, size_t cap);
    /* "file" or "object", for messages; whether a directory is written with
     * a trailing '/' (object storage: a name without one is never a
     * directory unless a manifest lies under it). */
    const char *noun;
    int slash_dirs;
} tf__probe;
typedef enum { TF__TARGET_DATASET = 1, TF__TARGET_PAIR = 2, TF__TARGET_FILE = 3 } tf__target_kind;
typedef struct tf__target {
    tf__target_kind kind;
    /* DATASET: the manifest row's; PAIR: the pair's; FILE: the open's
     * format's row, or NULL when its bytes decide (tf__format_sniff). */
    const tf__format_row *row;
    char *path;      /* the directory (no trailing '/'), the pair's prefix, or the file (malloc'ed) */
    /* PAIR: the name given is a file of its own too, opened as that when the
     * companion's magic says it is not the pair's (no error). */
    int else_file;
} tf__target;
/* Decide what path names for an open of format fmt: 0 with *t filled (free
 * t->path), or -errno with the error set: -ENOENT (nothing there), -EINVAL (not
 * a regular file or directory), -TF_EFORMAT (no manifest, no pair, a pair
 * whose companion is not the format's). */
TF_HIDDEN int tf__resolve_target(const char *path, tf_format fmt, const tf__probe *pr, tf__target *t);
/* A pair resolved before its companion's bytes were known: given those
 * (head[0, n)), keep it (0), turn it into the given name's file (0, t->kind
 * FILE), or refuse it (-TF_EFORMAT naming the companion). */
TF_HIDDEN int tf__resolve_confirm(tf__target *t, const char *path, const uint8_t *head, size_t n);
/* The names the resolution of path may ask the probe about, each passed to
 * add (manifest set for a dataset directory's manifest), in the order a
 * remote open asks for them: path, the manifest, each pair's two names.
 * 0, or add's error. */
TF_HIDDEN int tf__resolve_names(const char *path, tf_format fmt,
                                int (*add)(void *ctx, const char *name, int manifest), void *ctx);
/* A file whose bytes said fmt (tf__format_sniff): 0 when it can be read,
 * -TF_EFORMAT when they are no format's magic and the open names no dtype
 * (why: what the bytes look like instead, or ""). */
TF_HIDDEN int tf__resolve_sniffed(const char *path, tf_format fmt, tf_dtype dtype, const char *why);
/* The name of the pair's data file or companion for prefix (which 0: data,
 * 1: companion; malloc'ed, NULL on ENOMEM). */
TF_HIDDEN char *tf__pair_name(const tf__format_row *row, const char *prefix, int which);
/* The row of the format whose shards a manifest lists (dataset directories). */
TF_HIDDEN const tf__format_row *tf__format_manifest_row(void);

/* A byte provider: where the bytes of a file that is not mapped come from.
 * The provider fills in f->bytes_ops and f->bytes_src when it opens the file;
 * the parsers and file.c read through this table only, so that the sources
 * layer never names a provider (csrc/remote/ sits above it). */
typedef struct tf__byte_ops {
    /* Bytes [off, off + len) of the file (offsets in the whole object). */
    int (*read)(const void *src, uint64_t off, uint64_t len, void *out);
    /* Tokens [start, start + count) of an uncompressed file, converted to
     * out_dtype (range already checked). */
    int (*read_tokens)(const tf_file *f, uint64_t start, uint64_t count, void *out, tf_dtype out_dtype);
    void (*free)(void *src);
} tf__byte_ops;

/* While a provider opens files whose metadata it prepared (per thread, for
 * the duration of one open): tf__map_file and tf__file_exists ask it about
 * URLs. enter(NULL) leaves. */
typedef struct tf__open_hooks {
    int (*map_take)(const char *url, void **map, size_t *len);
    int (*exists)(const char *url);
} tf__open_hooks;
TF_HIDDEN int tf__open_hooks_enter(const tf__open_hooks *h);

/* Opens a run of URLs (a provider's), appending files. */
typedef int (*tf__url_open_fn)(void *ctx, const char *const *urls, size_t n, const tf_open_options *opt,
                               tf_file **files, uint64_t *nfiles, uint64_t *cap);
/* tf_dataset_open_many, with URLs handed to open_urls (NULL: refused). */
TF_HIDDEN int tf__dataset_open_paths(const char *const *paths, size_t n, const tf_open_options *opt,
                                     tf__url_open_fn open_urls, void *ctx, tf_dataset **out);

/* The format's private state of f, as its parser's struct (format_priv). */
#define tf__format_priv(f, type) ((type *)(void *)(f)->format_priv)

/* Format parsers. Each fills *f (zeroed by the caller) or returns an error;
 * on error the caller runs tf__file_close(f), so parsers may leave partial
 * state in f. opt is never NULL. */
TF_HIDDEN int tf__open_native(const char *path, const tf_open_options *opt, tf_file *f);
TF_HIDDEN int tf__open_megatron(const char *prefix, const tf_open_options *opt, tf_file *f);
/* Its row's document ops (TF_DOCS_FORMAT). */
TF_HIDDEN extern const tf__doc_ops tf__megatron_doc_ops;
TF_HIDDEN int tf__open_llmc(const char *path, const tf_open_options *opt, tf_file *f);
TF_HIDDEN int tf__open_raw(const char *path, const tf_open_options *opt, tf_file *f);
TF_HIDDEN int tf__open_npy(const char *path, const tf_open_options *opt, tf_file *f);

/* docindex.c: the document index of a raw file opened with an eos id
 * (f already holds its tokens): maps it into f, or marks f eos.rows_only
 * when there is none. */
TF_HIDDEN int tf__docindex_open(const char *path, const tf_open_options *opt, tf_file *f);

/* A native dataset directory: reads the manifest and opens each shard,
 * checking the shard headers against the manifest. Appends to *files. */
TF_HIDDEN int tf__open_native_dir(const char *dir, const tf_open_options *opt, tf_file **files,
                                  uint64_t *nfiles, uint64_t *cap);

/* Pure parsers of in-memory bytes, shared by the openers and the fuzz targets.
 * They never read past len. */
TF_HIDDEN int tf__parse_native_header(const char *path, const uint8_t *buf, size_t len,
                                      uint64_t file_size, tf_file *f);

/* Native shard layout constants (docs/format.md), shared with the writer. */
#define TF_NATIVE_MAGIC "TFSHARD\0"
#define TF_NATIVE_VERSION 1u
#define TF_NATIVE_HEADER_SIZE 256u
#define TF_NATIVE_TOKENS_ALIGN 4096u
#define TF_NATIVE_FLAG_ZSTD 1u
#define TF_NATIVE_FLAG_CHUNKS 2u /* a table of per-chunk checksums follows the other sections */
#define TF_NATIVE_CHUNK_BYTES (64u << 10) /* default bytes per chunk checksum */
#define TF_NATIVE_HDR_CHECKSUM_AT 248u
/* Largest accepted block_tokens * itemsize: readers allocate one block. */
#define TF_NATIVE_MAX_BLOCK_BYTES (1ull << 30)
#define TF_MANIFEST_NAME "tokenfeed.manifest"

/* Native dtype codes <-> tf_dtype (0 / TF_DTYPE_INVALID when unknown). */
TF_HIDDEN tf_dtype tf__native_dtype_from_code(uint32_t code);
TF_HIDDEN uint32_t tf__native_dtype_code(tf_dtype dt);

/* A parsed manifest (docs/format.md, "Manifest"). */
typedef struct tf_manifest_shard {
    char *name; /* owned; a plain file name, or in version 2 a relative path (tf__manifest_name_ok) */
    uint64_t num_tokens, num_docs;
    uint64_t tokens_checksum, docs_checksum;
} tf_manifest_shard;
typedef struct tf_manifest {
    uint32_t version; /* 1, or 2 when shard names may name subdirectories */
    tf_dtype dtype;
    uint64_t vocab_size;
    uint64_t num_shards;
    tf_manifest_shard *shards; /* owned */
} tf_manifest;
/* Parse manifest text buf[0, len). path is only used in messages. On success
 * *m owns its shards (free with tf__manifest_free); on error *m is empty. */
TF_HIDDEN int tf__parse_manifest(const char *path, const uint8_t *buf, size_t len, tf_manifest *m);
TF_HIDDEN void tf__manifest_free(tf_manifest *m);
/* Whether name[0, n) is a valid shard NAME: a plain file name (no '/', no
 * whitespace or control characters, not "." or ".."), or with allow_dirs a
 * relative path of such names joined by single '/' (no leading '/', no "..",
 * at most TF_MANIFEST_MAX_PATH bytes). */
TF_HIDDEN int tf__manifest_name_ok(const char *name, size_t n, int allow_dirs);
#define TF_MANIFEST_MAX_PATH 4096

/* A parsed .npy header. */
typedef struct tf_npy_header {
    tf_dtype dtype;
    uint64_t num_items;   /* shape[0] */
    uint64_t data_offset; /* first data byte */
    int ndim;             /* 1, or 2 (tf__parse_npy_header_2d) */
    uint64_t dim1;        /* shape[1] of a 2-D array */
} tf_npy_header;
/* Parse the .npy header at the start of buf[0, len) (1-D little-endian
 * integer arrays only). Does not check the data size against the file. */
TF_HIDDEN int tf__parse_npy_header(const char *path, const uint8_t *buf, size_t len, tf_npy_header *h);
/* The same for an array of one or two dimensions (C order); shape[1] in dim1. */
TF_HIDDEN int tf__parse_npy_header_2d(const char *path, const uint8_t *buf, size_t len, tf_npy_header *h);

/* ---- file.c: one file's bytes, whatever its format ---------------------- */

/* Whether path names an existing regular file (a remote object during a
 * remote open: see remote_open.c). */
TF_HIDDEN int tf__file_exists(const char *path);


/* Map a whole file read-only. Empty files are mapped as NULL with len 0.
 * Returns -errno with a message naming the path. */
TF_HIDDEN int tf__map_file(const char *path, void **map, size_t *len);
/* tf__map_file of a file's main (token) file into f->map and f->map_len,
 * with f->map_id, the identity of the file mapped, from the descriptor it was
 * mapped from (known 0 for a remote object's map), and f->map_nz. */
TF_HIDDEN int tf__map_file_main(const char *path, tf_file *f);
/* A parser's first step: f->path set to a copy of path, the file mapped
 * (tf__map_file_main), and at least header bytes in it, else -TF_EFORMAT
 * "<path>: header: expected <header> bytes (<layout>), found <n>. <fix>". */
TF_HIDDEN int tf__open_main(const char *path, tf_file *f, uint64_t header, const char *layout, const char *fix);
TF_HIDDEN void tf__unmap(void *map, size_t len);
/* Drop the pages of a mapping from this process's RSS after the header
 * checks at open (the data stays in the page cache). */
TF_HIDDEN void tf__release_pages(const void *map, uint64_t len);
/* O(1) fingerprint of a foreign file: its size and its first and last page
 * (hashing everything would make open O(tokens)). */
TF_HIDDEN uint64_t tf__sampled_fingerprint(const uint8_t *buf, uint64_t len, uint64_t seed);
/* The name of a companion file of path: path + suffix, or with replace_ext
 * the last extension of its last name replaced by suffix (as pathlib's
 * with_suffix: "a/x.bin" -> "a/x.bos.idx"); malloc'ed, NULL on ENOMEM. */
TF_HIDDEN char *tf__companion_path(const char *path, const char *suffix, int replace_ext);
/* dir + "/" + name, malloc'ed (NULL on ENOMEM). */
TF_HIDDEN char *tf__path_join(const char *dir, const char *name);
/* a followed by b, malloc'ed (NULL on ENOMEM). */
TF_HIDDEN char *tf__cat2(const char *a, const char *b);
/* Close one file: unmap, free. Safe on a zeroed or partially filled file. */
TF_HIDDEN void tf__file_close(tf_file *f);
/* Grow *files by one zeroed entry; returns it or NULL (-ENOMEM). */
TF_HIDDEN tf_file *tf__files_push(tf_file **files, uint64_t *nfiles, uint64_t *cap);

/* Document j of file f (local coordinates). */
TF_HIDDEN int tf__file_document(const tf_file *f, uint64_t j, uint64_t *start, uint64_t *len);
/* Document of f containing local token pos (pos < num_tokens). */
TF_HIDDEN int tf__file_find_document(const tf_file *f, uint64_t pos, uint64_t *doc);
/* Decompressed block b of a compressed file (f->blocks.ops->read), into out;
 * *stored (when not NULL) gets the block's stored bytes. */
TF_HIDDEN int tf__file_read_block(const tf_file *f, uint64_t b, void *out, size_t out_cap, uint64_t *stored);
/* Copy local tokens [start, start+count) converted to out_dtype. */
TF_HIDDEN int tf__file_read(const tf_file *f, uint64_t start, uint64_t count, void *out,
                            tf_dtype out_dtype);

/* Run fn(arg) under the SIGBUS guard (common/sigbus.c): a bus error on a
 * mapped page gives -EIO with a message naming the file among
 * files[0, nfiles) whose mapping holds the address. */
TF_HIDDEN int tf__files_guard(const tf_file *files, uint64_t nfiles, int (*fn)(void *), void *arg);

/* ---- file.c: files mapped on first touch, under a process-wide bound ---- */

/* reopen: the format's parser, called with the file's path (f->path). */

/* The bound on files mapped this way ($TOKENFEED_MAX_OPEN_SHARDS, default
 * 256), and how many are mapped now. */
TF_HIDDEN uint64_t tf__lazy_limit(void);
TF_HIDDEN uint64_t tf__lazy_mapped(void);
/* stat(path) into *id (-errno). */
TF_HIDDEN int tf__file_id_get(const char *path, tf__file_id *id);
/* Turn a parsed local file into one mapped on demand: its mapping goes under
 * the bound (and may be unmapped at once), f keeps its metadata. No-op for
 * memory datasets and remote files. */
TF_HIDDEN int tf__file_make_lazy(tf_file *f, const tf_open_options *opt, tf__parse_fn reopen);
/* Memory for many files' paths and lazy records at once, freed when the last
 * reference goes: faults and allocations per file were most of opening 10^4
 * files from a catalog. Allocation is single-threaded (while the files are
 * built); references are atomic. tf__arena_new holds one reference. */
typedef struct tf__arena tf__arena;
TF_HIDDEN tf__arena *tf__arena_new(void);
/* n bytes, 16-aligned, uninitialised; NULL when out of memory. */
TF_HIDDEN void *tf__arena_alloc(tf__arena *a, size_t n);
TF_HIDDEN void tf__arena_ref(tf__arena *a);
TF_HIDDEN void tf__arena_release(tf__arena *a);
/* A file known from metadata only (a catalog): f holds the metadata;
 * id its identity and its index file's; tok_off the first token's byte
 * offset (-1: none, e.g. compressed). Nothing is mapped until first touch.
 * The lazy record goes into f->arena (set, and referenced by f, before the
 * call); index_dir is the open options' index directory, copied into the
 * arena once for all its files (or NULL). */
TF_HIDDEN int tf__file_lazy_from_meta(tf_file *f, const char *index_dir, tf__parse_fn reopen,
                                      const tf__file_id id[2], int64_t tok_off);

/* f was described by the trusted catalog of key, its identity unchecked at
 * open: if it turns out changed on first touch, forget(key) deletes that
 * catalog (catalog.c's, passed in: file.c does not call up into it); forget
 * NULL: a catalog beside the data, which the error tells to rebuild. */
TF_HIDDEN void tf__file_lazy_set_catalog(tf_file *f, uint64_t key, void (*forget)(uint64_t key));
/* A file known from metadata whose bytes come from elsewhere than its path
 * (a remote object, csrc/remote/): on first touch, open(ctx, meta, out)
 * fills *out with the parsed file instead of mapping meta->path; file.c then
 * checks it against meta as any other. free(ctx) runs when f is freed. */
typedef struct tf__lazy_src {
    int (*open)(void *ctx, const tf_file *meta, tf_file *out);
    void (*free)(void *ctx);
} tf__lazy_src;
/* Give the lazy file f that source (ctx owned from here on): no stat of its
 * path, and no token offset (no descriptor reads). */
TF_HIDDEN void tf__file_lazy_set_source(tf_file *f, const tf__lazy_src *src, void *ctx);
/* The context of f's source when it is src, else NULL. */
TF_HIDDEN void *tf__file_lazy_source(const tf_file *f, const tf__lazy_src *src);
/* 0 when the parsed file p is the one metadata m describes (counts, dtype,
 * vocabulary, fingerprint, compression, documents), else -TF_EFORMAT naming
 * m->path and the first field that differs. */
TF_HIDDEN int tf__file_check_same(const tf_file *m, const tf_file *p);
/* Identities of f (zeroed when not lazy); returns its token offset. */
TF_HIDDEN int64_t tf__file_lazy_ids(const tf_file *f, tf__file_id id[2]);
TF_HIDDEN void tf__file_lazy_free(tf_file *f);
/* The parsed file of f, mapped (mapping and checking it against f on first
 * touch: a file changed since gives -TF_EFORMAT naming it) and pinned until
 * tf__file_release. For a file that is not lazy, f itself. Reads mapped
 * bytes: call under the SIGBUS guard. */
TF_HIDDEN int tf__file_acquire(const tf_file *f, const tf_file **live);
TF_HIDDEN void tf__file_release(const tf_file *f);
/* Check f against its metadata if that was never done (a file known from a
 * catalog, read with pread): acquire and release once. */
TF_HIDDEN int tf__file_touch(const tf_file *f);
/* Whether addr lies in a mapping of f now: the file's path and the offset. */
TF_HIDDEN int tf__file_mapped_at(const tf_file *f, const void *addr, const char **path, size_t *off);
/* Byte offset of f's first token in its file, or -1 when f cannot be read
 * with a descriptor (compressed, memory dataset, remote); its size in bytes. */
TF_HIDDEN int64_t tf__file_token_offset(const tf_file *f);
TF_HIDDEN uint64_t tf__file_size(const tf_file *f);
/* 0 when the open descriptor fd is the file f's bytes were checked from
 * (device, inode, size, modification time as when it was mapped, or as its
 * catalog recorded them before its first touch; for a file whose mapping the
 * dataset holds, which pins its inode, device, inode and size): a file
 * replaced since, or changed, is -TF_EFORMAT naming it; the same file shorter
 * now, -EIO. */
TF_HIDDEN int tf__file_check_fd(const tf_file *f, int fd);

/* ---- pathspec.c: a shard set named by a directory or a glob --------------- */

/* What a local path names: a file or dataset opened as itself, a glob (has
 * '*', '?' or '[' and no such name exists), or a directory (expanded unless
 * its listing shows a manifest). */
enum { TF__SPEC_PATH = 0, TF__SPEC_GLOB = 1, TF__SPEC_DIR = 2 };
TF_HIDDEN int tf__pathspec_kind(const char *path);
/* The directories an open listed, each once, with their identity taken from
 * the descriptor listed. */
typedef struct tf__listing tf__listing;
TF_HIDDEN tf__listing *tf__listing_new(void);
TF_HIDDEN void tf__listing_free(tf__listing *l);
/* The files path (of kind TF__SPEC_GLOB or TF__SPEC_DIR) names, sorted,
 * each malloc'ed in a malloc'ed array; 1 for a directory that is not a shard
 * set (a manifest, an unfinished native write, nothing: open it as a path);
 * -errno with the error set. */
TF_HIDDEN int tf__pathspec_expand(tf__listing *l, const char *path, int kind, char ***files, size_t *nfiles);
/* The listed directories ("." for the working directory) and identities
 * (arrays malloc'ed, strings borrowed from l): their count. */
TF_HIDDEN size_t tf__listing_dirs(const tf__listing *l, const char ***paths, tf__file_id **ids);
/* Companions of path in the listing (bit k: the format table's companion k,
 * tf__companion_at), and whether path is a directory there (-1: not listed). */
TF_HIDDEN unsigned tf__listed_companions(const tf__listing *l, const char *path);
TF_HIDDEN int tf__listed_is_dir(const tf__listing *l, const char *path);
/* What path is in the listing (TF__NAME_NONE, _FILE or _DIR: a name absent
 * from a listed directory is NONE), or -1 when its directory is not listed. */
TF_HIDDEN int tf__listed_kind(const tf__listing *l, const char *path);
/* While l is active on this thread (NULL: none), whether a file exists in a
 * listed directory is answered from it: 1 or 0, or -1 when path lies in no
 * listed directory (then ask the file system). */
TF_HIDDEN void tf__listing_activate(const tf__listing *l);
TF_HIDDEN int tf__listed_exists(const char *path);
/* realpath(path) for a file of the active listing that is not a symbolic
 * link, from its directory's realpath (resolved once per directory, not one
 * readlink per path component per file); NULL when unknown. */
TF_HIDDEN char *tf__listed_realpath(const char *path);

/* Remote path specs (pathspec.c): what a URL names (TF__SPEC_GLOB: a
 * wildcard in its key; TF__SPEC_DIR: it ends in '/'), the prefix to list for
 * it (malloc'ed: the directories before the first wildcard, or the directory
 * URL), and for a set under one prefix its catalog's (prefix, pattern): 0, or
 * 1 when it has none (a wildcard in a directory part, or not a set). */
TF_HIDDEN int tf__pathspec_url_kind(const char *url);
TF_HIDDEN char *tf__pathspec_url_prefix(const char *url);
TF_HIDDEN int tf__pathspec_url_set(const char *url, char **prefix, char **pattern);
/* Make l list objects: the directories implied by urls[0, n) under prefix
 * (ending in '/'), each with the names directly in it; a directory not among
 * them is -ENOENT, never looked for on disk. */
TF_HIDDEN int tf__listing_add_objects(tf__listing *l, const char *prefix, const char *const *urls, size_t n);

/* ---- catalog.c: what open needs, in one file per set of paths ------------- */

/* The parser that maps a file of format fmt again from its path (NULL for
 * none). */
TF_HIDDEN tf__parse_fn tf__parser_of(tf_format fmt);
/* 0, or -EINVAL naming $TOKENFEED_CATALOG_MAX when it is set (and the node
 * has a catalog directory) but is not a size: opens of several local files
 * refuse it rather than read it as another bound. */
TF_HIDDEN int tf__catalog_check_settings(void);
/* The files of paths from the node's catalog, each mapped on demand: 0 with
 * *files (nfiles, owned) filled, 1 when there is no usable catalog (open by
 * parsing). Files whose identity changed are parsed again and the catalog
 * rewritten. */
TF_HIDDEN int tf__catalog_load(const char *const *paths, size_t n, const tf_open_options *opt, tf_file **files,
                               uint64_t *nfiles);
/* Write the catalog of files opened from paths (best effort: nothing on
 * failure, and nothing for a dataset a catalog cannot describe). */
TF_HIDDEN void tf__catalog_save(const char *const *paths, size_t n, const tf_open_options *opt,
                                const tf_file *files, uint64_t nfiles);
/* The same for paths that are all files (a shard set's, from its listing):
 * no path is looked at again to find a directory among them. */
TF_HIDDEN void tf__catalog_save_files(const char *const *paths, size_t n, const tf_open_options *opt,
                                      const tf_file *files, uint64_t nfiles);
/* The files of the shard set spec names (directories of foreign files and
 * globs, as open was given them) from the node's catalog, when the
 * directories holding them are unchanged (immutable: not looked at, the
 * caller vouches that nothing was added, removed or renamed): 0 with *files
 * filled, else 1. */
TF_HIDDEN int tf__catalog_load_set(const char *const *spec, size_t nspec, const tf_open_options *opt,
                                   int immutable, tf_file **files, uint64_t *nfiles);
/* A shard set's catalog beside the data: in the directory prefix names
 * ("dir/", or "" for the working directory), for the files of pattern there
 * (a glob of names, or "" for the directory's data files), in a file named
 * TF_DATA_CATALOG_STEM + its key. Load: 0 with *files filled, 1 when there is
 * none (or it does not parse), 2 when the directory changed since it was
 * written. Write: 0, or -errno with the error set (-EAGAIN: a file or the
 * directory was modified in the last seconds). */
#define TF_DATA_CATALOG_STEM ".tokenfeed-catalog-"
/* The directory a prefix ("dir/", "dir" or "" for the working directory)
 * names, without trailing '/' ("/" and "." kept), malloc'ed; NULL on ENOMEM. */
TF_HIDDEN char *tf__prefix_dir(const char *prefix);
TF_HIDDEN int tf__catalog_load_beside(const char *prefix, const char *pattern, const tf_open_options *opt,
                                      tf_file **files, uint64_t *nfiles);
TF_HIDDEN int tf__catalog_write_beside(const char *prefix, const char *pattern, const tf_open_options *opt,
                                       const tf_file *files, uint64_t nfiles, char *written, size_t cap);
/* A remote shard set's catalog beside the data in object storage (catalog.c):
 * its name under the set's prefix (cap >= 40); the hash of an object's version
 * that an entry records; the catalog's bytes for files opened from the
 * objects prefix + names matching pattern, each of sizes[i] bytes at
 * versions[i] (*out malloc'ed), or -errno with the error set; its entries,
 * lazily (each with its identity: size, and the version's hash as mtime_ns):
 * 0, or 1 when buf is not such a catalog of this set and options. */
TF_HIDDEN void tf__catalog_objects_name(const char *pattern, const tf_open_options *opt, char *name, size_t cap);
TF_HIDDEN uint64_t tf__catalog_version_hash(const char *version);
TF_HIDDEN int tf__catalog_pack_objects(const char *prefix, const char *pattern, const tf_open_options *opt,
                                       const tf_file *files, const uint64_t *sizes, const char *const *versions,
                                       uint64_t nfiles, uint8_t **out, size_t *len);
TF_HIDDEN int tf__catalog_parse_objects(const char *prefix, const char *pattern, const tf_open_options *opt,
                                        const uint8_t *buf, size_t len, tf_file **files, uint64_t *nfiles);
/* Catalog files as the shard set spec, held by dirs whose identities were
 * dir_ids when they were listed: 0 when written, 1 when not (a directory
 * changed or was modified in the last seconds, a file lies elsewhere, no
 * catalog directory). */
TF_HIDDEN int tf__catalog_save_set(const char *const *spec, size_t nspec, const tf_open_options *opt,
                                   const tf_file *files, uint64_t nfiles, const char *const *dirs,
                                   const tf__file_id *dir_ids, size_t ndirs);

/* A tokenfeed dataset's own catalog, TF_DATASET_CATALOG_NAME in its
 * directory (docs/format.md, "The dataset's catalog"): every shard's entry,
 * keyed by the manifest's bytes. Write: the dataset in dir (without a
 * trailing '/') from files, its shards already opened (or described by the
 * writer that wrote them), one per shard of the manifest in its order, each
 * checked against it, none read again; 0 with the catalog's path in written
 * (cap bytes; may be NULL), or -errno with the error set. Parse: the catalog
 * buf[0, len) of the dataset in dir (a path or URL, without a trailing '/')
 * whose manifest is manifest[0, mlen), parsed as m: 0 with *files (nfiles,
 * owned) filled, lazily (tf__file_lazy_from_meta, with the native parser),
 * or 1 when it does not describe that manifest's dataset. */
#define TF_DATASET_CATALOG_NAME "tokenfeed.catalog"
TF_HIDDEN int tf__catalog_write_dataset(const char *dir, const tf_file *files, uint64_t nfiles, char *written,
                                        size_t cap);
/* A native shard as its writer wrote it: its name in the dataset's
 * directory, the TF_NATIVE_HEADER_SIZE bytes of its header, its size. */
typedef struct tf__written_shard {
    const char *name;
    const uint8_t *header;
    uint64_t size;
} tf__written_shard;
/* tf__catalog_write_dataset of the dataset a writer has just published in
 * dir, its shards described by the headers written into them (no shard is
 * read back). */
TF_HIDDEN int tf__catalog_write_written(const char *dir, const tf__written_shard *shards, uint64_t n);
TF_HIDDEN int tf__catalog_parse_dataset(const char *dir, const uint8_t *manifest, size_t mlen, const tf_manifest *m,
                                        const uint8_t *buf, size_t len, const tf_open_options *opt, tf_file **files,
                                        uint64_t *nfiles);

/* ---- native.c: the native format beyond its parsers --------------------- */

/* Its row's ops (blocks, verify, catalog, unmapping). */
TF_HIDDEN extern const tf__format_ops tf__native_ops;
/* What other layers may know of a native shard's private state: where its
 * sections lie in the file (the remote stack plans its fetches by them) and
 * the checksums its header stores (a manifest and a catalog are checked
 * against them). 0 with *out filled for a native file (the layout is zero for
 * one known only from a catalog, whose first touch parses it), -EINVAL with
 * *out zeroed for any other. */
typedef struct tf__native_info {
    uint64_t tokens_at, tokens_len; /* the stored token section */
    uint64_t index_at;             /* the document index, then the tables */
    uint64_t sum_tokens, sum_docs; /* the header's tokens and docs checksums */
    /* The per-chunk checksums of the stored token section (flag bit 1), or
     * NULL: chunk_table[i] is the XXH64 of bytes [i * chunk_bytes, +). */
    const uint64_t *chunk_table;
    uint64_t chunk_count, chunk_bytes;
} tf__native_info;
TF_HIDDEN int tf__native_info_of(const tf_file *f, tf__native_info *out);
/* The metadata of a native shard parsed from a sparse map m was copied from
 * m + from into to (remote_open.c, before the map goes): its private state's
 * pointers into [m + from, end of the map) move there, those before (into the
 * token section, no longer in memory) become NULL. */
TF_HIDDEN void tf__native_rebase(tf_file *f, const uint8_t *m, uint64_t from, const uint8_t *to);

/* ---- dataset.c ------------------------------------------------------------ */

/* Verify one file fully (format checksums, index, vocab): called from verify
 * threads. Adds bytes checked to *progress as it goes; stops early when
 * *cancel becomes non-zero. */
TF_HIDDEN int tf__file_verify(const tf_file *f, uint64_t vocab_size, _Atomic uint64_t *progress,
                              _Atomic int *cancel);

struct tf_dataset {
    tf_file *files;
    uint64_t nfiles;
    uint64_t *tok_prefix; /* nfiles + 1 */
    uint64_t *doc_prefix; /* nfiles + 1 */
    uint64_t num_tokens;
    uint64_t num_docs;
    uint64_t vocab_size;
    tf_dtype dtype;
    uint64_t fingerprint;
    int borrowed; /* a view: files belong to other datasets (never closed here) */
    /* Raw files opened with an eos id and no document index: rows find their
     * documents from the eos tokens in them (concat packing only). */
    int docs_from_rows;
    uint64_t eos_id;
    /* A view (select.c): its documents are sel->ids of the files' documents;
     * NULL for a dataset. Token coordinates stay the files'. */
    struct tf__sel *sel;
};

/* select.c: a view's documents. ids[k] is the files' document of view
 * document k (ascending); vstart[k] the sum of the lengths of view documents
 * before k (n + 1 entries). */
typedef struct tf__sel {
    uint64_t n;
    uint64_t *ids;
    uint64_t *vstart;
    uint64_t *start;  /* token position of each view document in the files' stream (n entries) */
    uint64_t base_fp; /* the fingerprint of the dataset without selection */
} tf__sel;
TF_HIDDEN void tf__sel_free(tf__sel *s);

/* Advise the kernel that the mapped files of ds are read at random
 * (MADV_RANDOM): a page fault then reads the pages it touches instead of a
 * readahead window around them. Pages already in the page cache are
 * unaffected. Best effort; nothing to report. */
TF_HIDDEN void tf__dataset_advise_random(const tf_dataset *ds);

/* Where token pos is mapped, for prefetching only (no pin: NULL for files
 * mapped on demand, compressed ones and past the end). */
TF_HIDDEN const void *tf__dataset_peek(const tf_dataset *ds, uint64_t pos);

/* Index of the file holding global token pos (pos < num_tokens): O(log files). */
TF_HIDDEN uint64_t tf__dataset_file_of(const tf_dataset *ds, uint64_t pos);

/* A read-only view concatenating the files of ds[0], ..., ds[n-1] (n >= 1),
 * in order, without copying or reopening anything: the datasets must outlive
 * the view; tf_dataset_free frees the view and leaves their files alone.
 * Counts, dtype and vocab_size follow the rules of a dataset of several files;
 * the fingerprint hashes n and the datasets' fingerprints in order (so it
 * names the list of datasets, not their files). */
TF_HIDDEN int tf__dataset_concat_view(const tf_dataset *const *ds, size_t n, tf_dataset **out);

#endif
