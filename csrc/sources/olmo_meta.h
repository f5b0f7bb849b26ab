/*
 * olmo_meta.h — OLMo's per-document metadata (olmo_meta.c): the gzip'd CSV
 * x.csv.gz that dolma writes beside a token file x.npy, one "start,end,..."
 * row per document, read into cumulative document ends.
 */
#ifndef TF_OLMO_META_H
#define TF_OLMO_META_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "source.h"

/* Bounds on what the decompressed metadata may be, so that a small hostile
 * file cannot make the reader decompress or hold without end: a row is at
 * most TF__OLMO_MAX_LINE bytes, and the whole text at most
 * TF__OLMO_SLACK + TF__OLMO_BYTES_PER_TOKEN bytes a token of the data file
 * (a document has at least one token, and dolma's rows are ~100-200 bytes). */
#define TF__OLMO_MAX_LINE (64u * 1024)
#define TF__OLMO_SLACK (64u * 1024)
#define TF__OLMO_BYTES_PER_TOKEN 1024u

/* The CSV parser, fed the decompressed bytes in pieces of any size. */
typedef struct tf__olmo_csv {
    const char *path;     /* named in messages */
    uint64_t num_tokens;  /* of the data file */
    uint64_t line;        /* 1-based line of the byte being read */
    uint64_t row_line;    /* line the current row started on */
    uint64_t total;       /* decompressed bytes so far */
    uint64_t row_len;     /* bytes of the current row so far */
    uint64_t val, start;  /* the numeric field being read; the row's start */
    uint64_t prev_end;    /* end of the previous row (0 before the first) */
    uint64_t *ends;
    uint64_t n;
    size_t cap;
    int field;            /* 0 start, 1 end, 2+ the rest (not interpreted) */
    int ndig;             /* digits of the numeric field so far */
    int quoted;           /* inside a quoted field of the rest */
    int quote_seen;       /* a '"' inside a quoted field: an escape or its end */
    int cr;               /* the previous byte was '\r' */
    int at_field_start;   /* no byte of the current field read yet */
} tf__olmo_csv;

TF_HIDDEN void tf__olmo_csv_init(tf__olmo_csv *c, const char *path, uint64_t num_tokens);
/* 0, or a negative code with tf_last_error() naming the file, line and field. */
TF_HIDDEN int tf__olmo_csv_feed(tf__olmo_csv *c, const uint8_t *b, size_t n);
/* End of input: the last row (without its newline), the checks on the whole,
 * and a last document for tokens after the last row. On 0, *ends (malloc'd,
 * the caller frees; NULL when *n is 0) holds *n cumulative ends, the last ==
 * num_tokens. */
TF_HIDDEN int tf__olmo_csv_finish(tf__olmo_csv *c, uint64_t **ends, uint64_t *n);
TF_HIDDEN void tf__olmo_csv_free(tf__olmo_csv *c);

/* The metadata name for a data path: "x.csv.gz" for "x.npy" (malloc'd), or
 * NULL when path does not end in ".npy" (or no memory). */
TF_HIDDEN char *tf__olmo_meta_path(const char *data_path);

/* Read and check the metadata file meta_path for a data file of num_tokens
 * tokens (never through a symlink; a regular file; unchanged while read).
 * 1: there is none. 0: *ends and *n as tf__olmo_csv_finish gives them and *st
 * the identity of the file read. Negative: an error naming the file, and
 * what to do (zlib missing included). */
TF_HIDDEN int tf__olmo_meta_read(const char *meta_path, uint64_t num_tokens, uint64_t **ends, uint64_t *n,
                                 struct stat *st);

/* Whether zlib could be loaded (1) or not (0, with *why the reason). */
TF_HIDDEN int tf__zlib_available(const char **why);

#endif
