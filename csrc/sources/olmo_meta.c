/*
 * olmo_meta.c — OLMo's per-document metadata, read in C.
 *
 * OLMo's tokenizer (dolma) writes beside each token file x.npy (headerless
 * tokens despite the name) a gzip'd CSV x.csv.gz with one row per document:
 * "start,end,..." in tokens, end exclusive, then fields of its own (an id,
 * the source, ...) that are not interpreted here. OLMo-core's
 * iter_document_indices reads the same rows; there is no header line. The
 * document index of such a file (docindex.c) is built from these rows
 * rather than by scanning for the eos id, so that a C trainer and Python get
 * the same documents.
 *
 * Decompression uses zlib loaded at run time (dlopen "libz.so.1", or
 * $TOKENFEED_ZLIB), so neither the build nor the wheels depend on it; the
 * z_stream below is zlib's ABI (the same in zlib 1.2, 1.3 and zlib-ng's
 * compat build). Without zlib the build of such an index fails with a
 * message saying so and what to do.
 *
 * These are bytes from disk and are checked as they are read: a field that
 * is not a decimal number or overflows 64 bits, start > end, an empty
 * document, a document that overlaps the previous one or ends past the token
 * count, an empty file, a truncated or corrupt gzip stream (every member of
 * a multi-member file is read; bytes after the last member must be another
 * member), a lone carriage return (CRLF line ends are accepted), a blank
 * line. Rows may leave gaps: as with the end column alone, tokens between
 * two documents belong to the next one. The decompressed text is bounded
 * by the data file's token count (olmo_meta.h), so a small file that
 * inflates without end is refused early.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "olmo_meta.h"

typedef unsigned long long ull;

/* ---- zlib, loaded at run time ------------------------------------------ */

/* zlib's z_stream (zlib.h), field for field. */
typedef struct tf__z_stream {
    const unsigned char *next_in;
    unsigned int avail_in;
    unsigned long total_in;
    unsigned char *next_out;
    unsigned int avail_out;
    unsigned long total_out;
    const char *msg;
    void *state;
    void *(*zalloc)(void *, unsigned int, unsigned int);
    void (*zfree)(void *, void *);
    void *opaque;
    int data_type;
    unsigned long adler;
    unsigned long reserved;
} tf__z_stream;

#define TF__Z_OK 0
#define TF__Z_STREAM_END 1
#define TF__Z_NEED_DICT 2
#define TF__Z_BUF_ERROR (-5)
#define TF__Z_NO_FLUSH 0

static struct {
    const char *(*zlibVersion)(void);
    int (*inflateInit2_)(tf__z_stream *, int, const char *, int);
    int (*inflate)(tf__z_stream *, int);
    int (*inflateReset)(tf__z_stream *);
    int (*inflateEnd)(tf__z_stream *);
} tf_z;
static int tf_z_ok;
static char tf_z_why[512];
static pthread_once_t tf_z_once = PTHREAD_ONCE_INIT;

static void zlib_load_once(void) {
    const char *env = getenv("TOKENFEED_ZLIB");
    const char *from = env && *env ? env : "libz.so.1";
    void *h = dlopen(from, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        if (env && *env)
            snprintf(tf_z_why, sizeof tf_z_why,
                     "TOKENFEED_ZLIB=%s could not be loaded (%s); point it at zlib's libz.so.1, or unset it to use the system's",
                     env, e ? e : "unknown error");
        else
            snprintf(tf_z_why, sizeof tf_z_why,
                     "zlib (libz.so.1) could not be loaded (%s); install zlib (apt install zlib1g, dnf install zlib) "
                     "or set TOKENFEED_ZLIB to libz.so.1's path",
                     e ? e : "unknown error");
        return;
    }
    *(void **)&tf_z.zlibVersion = dlsym(h, "zlibVersion");
    *(void **)&tf_z.inflateInit2_ = dlsym(h, "inflateInit2_");
    *(void **)&tf_z.inflate = dlsym(h, "inflate");
    *(void **)&tf_z.inflateReset = dlsym(h, "inflateReset");
    *(void **)&tf_z.inflateEnd = dlsym(h, "inflateEnd");
    if (!tf_z.zlibVersion || !tf_z.inflateInit2_ || !tf_z.inflate || !tf_z.inflateReset || !tf_z.inflateEnd) {
        memset(&tf_z, 0, sizeof tf_z);
        dlclose(h);
        snprintf(tf_z_why, sizeof tf_z_why,
                 "%s is not zlib (it lacks inflateInit2_, inflate, inflateReset, inflateEnd or zlibVersion); "
                 "set TOKENFEED_ZLIB to zlib's libz.so.1", from);
        return;
    }
    const char *v = tf_z.zlibVersion();
    if (!v || v[0] != '1') {
        snprintf(tf_z_why, sizeof tf_z_why, "%s reports zlib version %.32s; version 1.x is needed (set TOKENFEED_ZLIB to one)",
                 from, v ? v : "(none)");
        memset(&tf_z, 0, sizeof tf_z);
        dlclose(h);
        return;
    }
    snprintf(tf_z_why, sizeof tf_z_why, "zlib %.32s from %s", v, from);
    tf_z_ok = 1; /* h stays open for the life of the process */
}

int tf__zlib_available(const char **why) {
    pthread_once(&tf_z_once, zlib_load_once);
    if (why) *why = tf_z_why;
    return tf_z_ok;
}

/* ---- the CSV rows ------------------------------------------------------- */

void tf__olmo_csv_init(tf__olmo_csv *c, const char *path, uint64_t num_tokens) {
    memset(c, 0, sizeof *c);
    c->path = path;
    c->num_tokens = num_tokens;
    c->line = 1;
    c->row_line = 1;
    c->at_field_start = 1;
}

void tf__olmo_csv_free(tf__olmo_csv *c) {
    free(c->ends);
    c->ends = NULL;
    c->n = c->cap = 0;
}

static const char *field_name(int field) { return field == 0 ? "start" : "end"; }

static int bad(tf__olmo_csv *c, uint64_t line, const char *field, const char *what) {
    return tf__seterr(-TF_EFORMAT,
                      "%s: line %llu, field %s: %s. Each row of OLMo's document metadata is start,end,... in tokens "
                      "(no header line); rewrite the file with the tokenizer, or delete it to index the documents by "
                      "the eos id",
                      c->path, (ull)line, field, what);
}

static int row_done(tf__olmo_csv *c) {
    char why[200];
    uint64_t s = c->start, e = c->val;
    if (s > e) {
        snprintf(why, sizeof why, "start %llu is past end %llu", (ull)s, (ull)e);
        return bad(c, c->row_line, "start", why);
    }
    if (s == e) {
        snprintf(why, sizeof why, "a document of no tokens (start = end = %llu)", (ull)s);
        return bad(c, c->row_line, "end", why);
    }
    if (s < c->prev_end) {
        snprintf(why, sizeof why, "start %llu overlaps the previous document, which ends at %llu", (ull)s,
                 (ull)c->prev_end);
        return bad(c, c->row_line, "start", why);
    }
    if (e > c->num_tokens) {
        snprintf(why, sizeof why, "end %llu is past the %llu tokens of the data file (the metadata is another file's)",
                 (ull)e, (ull)c->num_tokens);
        return bad(c, c->row_line, "end", why);
    }
    uint64_t *p = tf__grow(c->ends, &c->cap, (size_t)c->n, sizeof *p, 1024);
    if (!p) return tf__seterr(-ENOMEM, "%s: out of memory for %llu document ends", c->path, (ull)c->n + 1);
    c->ends = p;
    c->ends[c->n++] = e;
    c->prev_end = e;
    c->field = 0;
    c->ndig = 0;
    c->val = c->start = 0;
    c->row_len = 0;
    c->at_field_start = 1;
    c->quoted = c->quote_seen = 0;
    return 0;
}

/* The end of a row (its newline, or the end of the text): the numeric
 * fields must both be there. */
static int end_row(tf__olmo_csv *c) {
    if (c->field == 0 && c->ndig == 0) return bad(c, c->row_line, "start", "a blank line");
    if (c->field < 1) return bad(c, c->row_line, "end", "missing: the row has one field");
    if (c->field == 1 && c->ndig == 0) return bad(c, c->row_line, "end", "empty: expected a number of tokens");
    return row_done(c);
}

int tf__olmo_csv_feed(tf__olmo_csv *c, const uint8_t *b, size_t n) {
    uint64_t limit = TF__OLMO_SLACK;
    uint64_t per;
    if (tf__mul_overflow(c->num_tokens, TF__OLMO_BYTES_PER_TOKEN, &per) || tf__add_overflow(limit, per, &limit))
        limit = UINT64_MAX;
    if (n > limit - c->total)
        return tf__seterr(-TF_EFORMAT,
                          "%s: decompresses to more than %llu bytes, more than the metadata of %llu tokens can be "
                          "(%u bytes a token): a damaged or hostile file. Rewrite it with the tokenizer, or delete it "
                          "to index the documents by the eos id",
                          c->path, (ull)limit, (ull)c->num_tokens, TF__OLMO_BYTES_PER_TOKEN);
    c->total += n;
    for (size_t i = 0; i < n; i++) {
        uint8_t ch = b[i];
        if (c->cr && ch != '\n') /* (set outside quotes only: inside them a CR is the field's) */
            return bad(c, c->line, c->field < 2 ? field_name(c->field) : "(after end)",
                       "a carriage return not followed by a line feed");
        if (++c->row_len > TF__OLMO_MAX_LINE) {
            char why[120];
            snprintf(why, sizeof why, "the row is longer than %u bytes", TF__OLMO_MAX_LINE);
            return bad(c, c->row_line, c->field < 2 ? field_name(c->field) : "(after end)", why);
        }
        if (c->field < 2) {
            if (ch >= '0' && ch <= '9') {
                uint64_t v;
                if (tf__mul_overflow(c->val, 10, &v) || tf__add_overflow(v, (uint64_t)(ch - '0'), &v))
                    return bad(c, c->line, field_name(c->field), "the number overflows 64 bits");
                c->val = v;
                c->ndig++;
                continue;
            }
            if (ch == '\r') {
                c->cr = 1;
                continue;
            }
            if (ch == '\n') {
                c->cr = 0;
                int rc = end_row(c);
                c->line++;
                c->row_line = c->line;
                if (rc) return rc;
                continue;
            }
            if (ch == ',') {
                if (c->ndig == 0) return bad(c, c->line, field_name(c->field), "empty: expected a number of tokens");
                if (c->field == 0) { /* (the end's value stays in val for the row's checks) */
                    c->start = c->val;
                    c->val = 0;
                    c->ndig = 0;
                }
                c->field++;
                c->at_field_start = 1;
                continue;
            }
            char why[120];
            if (ch == '-') snprintf(why, sizeof why, "negative: a number of tokens is 0 or more");
            else if (ch >= 0x20 && ch < 0x7f)
                snprintf(why, sizeof why, "'%c' where a digit was expected%s", ch,
                         c->line == 1 && c->n == 0 ? " (OLMo's metadata has no header line)" : "");
            else snprintf(why, sizeof why, "byte 0x%02x where a digit was expected", ch);
            return bad(c, c->line, field_name(c->field), why);
        }
        /* fields after end: skipped, with RFC 4180 quoting so that a quoted
         * comma or newline stays inside its field */
        if (c->quoted) {
            if (c->quote_seen) {
                c->quote_seen = 0;
                if (ch == '"') continue; /* an escaped quote */
                c->quoted = 0;           /* the closing quote: ch is after the field */
            } else {
                if (ch == '"') c->quote_seen = 1;
                else if (ch == '\n') c->line++;
                continue;
            }
        }
        if (ch == '"' && c->at_field_start) {
            c->quoted = 1;
            c->at_field_start = 0;
            continue;
        }
        c->at_field_start = 0;
        if (ch == ',') {
            c->at_field_start = 1;
            continue;
        }
        if (ch == '\r') {
            c->cr = 1;
            continue;
        }
        if (ch == '\n') {
            c->cr = 0;
            int rc = row_done(c);
            c->line++;
            c->row_line = c->line;
            if (rc) return rc;
        }
    }
    return 0;
}

int tf__olmo_csv_finish(tf__olmo_csv *c, uint64_t **ends, uint64_t *n) {
    *ends = NULL;
    *n = 0;
    if (c->quoted && !c->quote_seen)
        return bad(c, c->row_line, "(after end)", "the text ends inside a quoted field (truncated)");
    if (c->cr) return bad(c, c->line, c->field < 2 ? field_name(c->field) : "(after end)",
                          "a carriage return not followed by a line feed");
    if (c->row_len > 0 || c->field > 0 || c->ndig > 0) TF_TRY(c->field < 2 ? end_row(c) : row_done(c));
    if (c->n == 0 && c->num_tokens > 0)
        return tf__seterr(-TF_EFORMAT,
                          "%s: no document rows for the %llu tokens of the data file. Rewrite it with the tokenizer, or "
                          "delete it to index the documents by the eos id",
                          c->path, (ull)c->num_tokens);
    if (c->n && c->prev_end < c->num_tokens) { /* tokens after the last row form a last document */
        uint64_t *p = tf__grow(c->ends, &c->cap, (size_t)c->n, sizeof *p, 1024);
        if (!p) return tf__seterr(-ENOMEM, "%s: out of memory for %llu document ends", c->path, (ull)c->n + 1);
        c->ends = p;
        c->ends[c->n++] = c->num_tokens;
    }
    *ends = c->ends;
    *n = c->n;
    c->ends = NULL;
    c->n = c->cap = 0;
    return 0;
}

/* ---- the file ----------------------------------------------------------- */

char *tf__olmo_meta_path(const char *data_path) {
    size_t l = strlen(data_path);
    if (l < 5 || strcmp(data_path + l - 4, ".npy") != 0 || data_path[l - 5] == '/') return NULL;
    char *out = malloc(l + 4);
    if (!out) return NULL;
    memcpy(out, data_path, l - 4);
    memcpy(out + l - 4, ".csv.gz", 8);
    return out;
}

static int same_file(const struct stat *a, const struct stat *b) {
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

int tf__olmo_meta_read(const char *mp, uint64_t num_tokens, uint64_t **ends, uint64_t *n, struct stat *st) {
    *ends = NULL;
    *n = 0;
    /* never through a symlink; O_NONBLOCK so that a FIFO planted under the
     * name does not hold the open */
    int fd = open(mp, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT) return 1;
        if (e == ELOOP)
            TF_FAIL(-ELOOP, "%s: a symlink: OLMo's document metadata is never read through one. Replace it with the "
                            "file, or remove it to index the documents by the eos id", mp);
        TF_FAIL(-e, "%s: cannot open: %s", mp, strerror(e));
    }
    if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) {
        close(fd);
        TF_FAIL(-EINVAL, "%s: not a regular file (OLMo's document metadata is a gzip'd CSV). Remove it to index the "
                         "documents by the eos id", mp);
    }
    if (st->st_size == 0) {
        close(fd);
        TF_FAIL(-TF_EFORMAT, "%s: empty (0 bytes): expected a gzip'd CSV of start,end,... rows. Rewrite it with the "
                             "tokenizer, or delete it to index the documents by the eos id", mp);
    }
    const char *why;
    if (!tf__zlib_available(&why)) {
        close(fd);
        TF_FAIL(-ENOSYS, "%s: OLMo's document metadata is gzip'd and reading it needs zlib at run time: %s. (Or delete "
                         "the metadata to index the documents by the eos id.)", mp, why);
    }
    tf__z_stream z;
    memset(&z, 0, sizeof z);
    if (tf_z.inflateInit2_(&z, 15 + 16, "1.2.11", (int)sizeof z) != TF__Z_OK) { /* 15+16: gzip only */
        close(fd);
        TF_FAIL(-ENOMEM, "%s: zlib could not start decompressing (inflateInit2_ failed; %s)", mp, why);
    }
    tf__olmo_csv c;
    tf__olmo_csv_init(&c, mp, num_tokens);
    static const size_t IN = 1 << 16, OUT = 1 << 18;
    uint8_t *in = malloc(IN), *out = malloc(OUT);
    int rc = in && out ? 0 : tf__seterr(-ENOMEM, "%s: out of memory", mp);
    uint64_t consumed = 0, members = 0;
    int in_member = 0, eof = 0;
    while (!rc) {
        if (tf__interrupted()) {
            rc = tf__seterr(-EINTR, "%s: interrupted while reading OLMo's document metadata", mp);
            break;
        }
        if (z.avail_in == 0 && !eof) {
            ssize_t k = read(fd, in, IN);
            if (k < 0) {
                if (errno == EINTR) continue;
                rc = tf__seterr(-errno, "%s: read failed: %s", mp, strerror(errno));
                break;
            }
            if (k == 0) eof = 1;
            z.next_in = in;
            z.avail_in = (unsigned)k;
        }
        if (z.avail_in == 0 && eof) {
            if (in_member)
                rc = tf__seterr(-TF_EFORMAT, "%s: truncated: the gzip stream (member %llu) ends before its end, after "
                                             "%llu bytes. Rewrite it with the tokenizer, or delete it to index the "
                                             "documents by the eos id", mp, (ull)members + 1, (ull)consumed);
            break;
        }
        if (!in_member && members > 0) tf_z.inflateReset(&z); /* another member of the file */
        in_member = 1;
        z.next_out = out;
        z.avail_out = (unsigned)OUT;
        unsigned before = z.avail_in;
        int zr = tf_z.inflate(&z, TF__Z_NO_FLUSH);
        consumed += before - z.avail_in;
        if (zr != TF__Z_OK && zr != TF__Z_STREAM_END && !(zr == TF__Z_BUF_ERROR && z.avail_in == 0)) {
            rc = tf__seterr(-TF_EFORMAT, "%s: not a valid gzip stream at byte %llu (member %llu: %s). Rewrite it with "
                                         "the tokenizer, or delete it to index the documents by the eos id",
                            mp, (ull)consumed, (ull)members + 1,
                            zr == TF__Z_NEED_DICT ? "needs a dictionary" : z.msg ? z.msg : "corrupt data");
            break;
        }
        rc = tf__olmo_csv_feed(&c, out, OUT - z.avail_out);
        if (zr == TF__Z_STREAM_END) {
            members++;
            in_member = 0;
        }
    }
    tf_z.inflateEnd(&z);
    free(in);
    free(out);
    struct stat st2;
    if (!rc && (fstat(fd, &st2) != 0 || !same_file(st, &st2)))
        rc = tf__seterr(-EAGAIN, "%s: changed while it was read; build the document index again once the file is "
                                 "written", mp);
    close(fd);
    if (!rc) rc = tf__olmo_csv_finish(&c, ends, n);
    tf__olmo_csv_free(&c);
    return rc;
}
