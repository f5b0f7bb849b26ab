/* Fuzz target: the node-local chunk cache of remote datasets
 * (remote/remote_cache.c). Everything in a cache directory may have been
 * left in any state by another process, a crash or a bad disk: the shared
 * index file (a header checked at open, then fixed-size records used as they
 * are), the chunk files with their 40-byte keyed trailer, and the names of the
 * temporary files and object directories that the cleanup and the rebuild
 * parse. The cache must give an error or carry on; it must never crash, hang,
 * leak, or hand out a chunk whose bytes are wrong.
 *
 * Input: 4 control bytes, then chunks (fuzz_split):
 *   ctl[0]  bits 0-1  index: 0 = header fields fixed up (magic, version,
 *                     record size, nslots = 16 << bits 3-4, file size),
 *                     1 = magic/version/record size fixed, nslots and the
 *                     records as given, 2 = chunks 0 and 1 verbatim,
 *                     3 = no index file (a new cache)
 *           bit 2     keep the header's dirty word (else cleared, so that
 *                     the records are used instead of rebuilt)
 *   ctl[1]  the byte limit (small: evictions happen)
 *   ctl[2]  chunk_bytes that size a new index
 *   ctl[3]  bit 0: write the tokenfeed-cache marker first; bits 1-7: prune
 *           target
 *   chunk 0 header bytes (the start of the index, up to its 16 KiB header)
 *   chunk 1 record bytes (64 each)
 *   chunk 2 operations, 3 bytes each (at most 40): op, key, argument
 *   chunk 3 data that commits land (slices of it)
 *   chunk 4 names of files to create before the open, one per line: first
 *           byte 't' tmp/NAME, 'p' procs/NAME, 'o' objects/DIR/NAME,
 *           'k' a well-formed chunk file name of key NAME[0], else a file
 *           NAME at the top of the directory
 *   chunk 5 bytes of those files, and of chunk files overwritten by the
 *           corrupt operation
 * Each input gets a fresh private directory, removed afterwards.
 */
#include <ftw.h>

#include "fuzz_util.h"
#include "remote/remote.h"

#define MAXC 6
#define HDR_BYTES 16384u /* the index layout (remote_cache.c) */
#define REC_BYTES 64u
#define MAX_OPS 40

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st;
    (void)ftw;
    if (flag == FTW_DP) rmdir(p);
    else unlink(p);
    return 0;
}

static void rm_tree(const char *dir) { nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

/* The 32 keys the operations use: a few objects, a few chunks each. */
static tf__ckey key_of(uint8_t b) {
    tf__ckey k = {1 + (b & 3), (b >> 2) & 1 ? 0x5eedull : 0, (uint32_t)((b >> 3) & 3)};
    return k;
}

static void key_path(const char *dir, const tf__ckey *k, char *out, size_t cap) {
    snprintf(out, cap, "%s/objects/%016llx%016llx/%08x.c", dir, (unsigned long long)k->oid_hi,
             (unsigned long long)k->oid_lo, k->chunk);
}

/* A mapping the cache handed out must hold the chunk of that key: check its
 * trailer's fields here (layout in docs/remote.md) and its keyed tag. */
static void check_chunk(const tf__cache *c, const tf__ckey *k, const uint8_t *m, size_t len, size_t map_len) {
    if (map_len != len + TF__CHUNK_TRAILER) abort();
    const uint8_t *t = m + len;
    if (memcmp(t, TF__CHUNK_MAGIC, 8) != 0 || tf__le64(t + 8) != (k->oid_lo ^ k->oid_hi) ||
        tf__le64(t + 16) != k->chunk || tf__le64(t + 24) != len)
        abort();
    if (!tf__cache_trailer_ok(c, k, m, len)) abort();
}

static void write_index(const char *dir, uint8_t mode, const fuzz_chunk *hd, const fuzz_chunk *rc) {
    char p[600];
    snprintf(p, sizeof p, "%s/index", dir);
    if ((mode & 3) == 3) return;
    if ((mode & 3) == 2) {
        int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0) return;
        if (hd->n && write(fd, hd->p, hd->n) < 0) {
        }
        if (rc->n && write(fd, rc->p, rc->n) < 0) {
        }
        close(fd);
        return;
    }
    uint64_t nslots = (mode & 3) == 0 ? 16u << ((mode >> 3) & 3) : 0;
    size_t recs = (mode & 3) == 0 ? (size_t)nslots * REC_BYTES : rc->n;
    uint8_t *b = calloc(1, HDR_BYTES + recs);
    if (!b) return;
    memcpy(b, hd->p, hd->n < HDR_BYTES ? hd->n : HDR_BYTES);
    memcpy(b, "TFCIDX02", 8);
    tf__put_le32(b + 8, 2);
    tf__put_le32(b + 12, REC_BYTES);
    if ((mode & 3) == 0) tf__put_le64(b + 16, nslots);
    if (!(mode & 4)) tf__put_le64(b + 56, 0); /* dirty */
    memcpy(b + HDR_BYTES, rc->p, rc->n < recs ? rc->n : recs);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd >= 0) {
        if (write(fd, b, HDR_BYTES + recs) < 0) {
        }
        close(fd);
    }
    free(b);
}

/* Files with odd names (chunk 4) where the cleanup and the rebuild look. */
static void make_files(const char *dir, const fuzz_chunk *names, const fuzz_chunk *body) {
    const uint8_t *s = names->p, *end = names->p + names->n;
    int count = 0;
    while (s < end && count < 16) {
        const uint8_t *e = memchr(s, '\n', (size_t)(end - s));
        if (!e) e = end;
        size_t n = (size_t)(e - s);
        char name[128], p[800];
        if (n >= 2) {
            size_t m = n - 1 < 100 ? n - 1 : 100;
            int slash = 0;
            for (size_t i = 0; i < m; i++) {
                char ch = (char)s[1 + i];
                if (ch == '/' && s[0] == 'o' && !slash && i > 0) slash = 1;
                else if (ch == '/' || ch == 0) ch = '_';
                name[i] = ch;
            }
            name[m] = 0;
            if (strcmp(name, ".") && strcmp(name, "..")) {
                p[0] = 0;
                if (s[0] == 't') snprintf(p, sizeof p, "%s/tmp/%s", dir, name);
                else if (s[0] == 'p') snprintf(p, sizeof p, "%s/procs/%s", dir, name);
                else if (s[0] == 'k') {
                    tf__ckey k = key_of((uint8_t)name[0]);
                    char d[700];
                    snprintf(d, sizeof d, "%s/objects/%016llx%016llx", dir, (unsigned long long)k.oid_hi,
                             (unsigned long long)k.oid_lo);
                    mkdir(d, 0700);
                    key_path(dir, &k, p, sizeof p);
                } else if (s[0] == 'o') {
                    char *sl = strchr(name, '/');
                    if (sl) {
                        *sl = 0;
                        if (strcmp(name, ".") && strcmp(name, "..") && strcmp(sl + 1, ".") && strcmp(sl + 1, "..")) {
                            snprintf(p, sizeof p, "%s/objects/%s", dir, name);
                            mkdir(p, 0700);
                            snprintf(p, sizeof p, "%s/objects/%s/%s", dir, name, sl + 1);
                        } else {
                            p[0] = 0;
                        }
                    } else {
                        snprintf(p, sizeof p, "%s/objects/%s", dir, name);
                        mkdir(p, 0700);
                        p[0] = 0;
                    }
                } else {
                    snprintf(p, sizeof p, "%s/%s", dir, name);
                }
                if (p[0]) fuzz_write(p, body->p, body->n);
            }
        }
        count++;
        s = e + 1;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1u << 18) || size < 4) return 0;
    const uint8_t *ctl = data;
    fuzz_chunk c[MAXC];
    fuzz_split(data + 4, size - 4, c, MAXC);
    static const uint8_t none[1];
    for (int i = 0; i < MAXC; i++)
        if (!c[i].p) c[i].p = none;

    char dir[400];
    snprintf(dir, sizeof dir, "%s/c-XXXXXX", fuzz_dir());
    if (!mkdtemp(dir)) abort();
    char p[700];
    static const char *subs[3] = {"objects", "tmp", "procs"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, subs[i]);
        mkdir(p, 0700);
    }
    if (ctl[3] & 1) {
        snprintf(p, sizeof p, "%s/tokenfeed-cache", dir);
        fuzz_write(p, (const uint8_t *)"tokenfeed-cache 2\n", 18);
    }
    write_index(dir, ctl[0], &c[0], &c[1]);
    make_files(dir, &c[4], &c[5]);

    uint64_t limit = 1 + (uint64_t)ctl[1] * 8;
    uint64_t chunk_bytes = ctl[2] ? (uint64_t)ctl[2] << 4 : 0;
    tf__cache *cs[2] = {NULL, NULL};
    int rc = tf__cache_open(dir, limit, chunk_bytes, 1, &cs[0]);
    if (rc > 0) abort();
    if (rc == 0) {
        tf_object_info info = {0, "v1"};
        const uint8_t *ops = c[2].p;
        size_t nops = c[2].n / 3 < MAX_OPS ? c[2].n / 3 : MAX_OPS;
        for (size_t i = 0; i < nops; i++) {
            uint8_t op = ops[3 * i], arg = ops[3 * i + 2];
            tf__ckey k = key_of(ops[3 * i + 1]);
            tf__cache *cc = (op & 0x40) && cs[1] ? cs[1] : cs[0];
            int urgent = op >> 7;
            /* a slice of chunk 3 as this key's data */
            size_t off = c[3].n ? arg % c[3].n : 0, len = c[3].n - off < 1u + (arg & 63) ? c[3].n - off : 1u + (arg & 63);
            const uint8_t *d = c[3].n ? c[3].p + off : none;
            void *m;
            size_t ml;
            uint64_t b, l;
            switch (op & 15) {
            case 0:
                tf__cache_present(cc, &k);
                break;
            case 1: {
                uint64_t ec = 0, eb = 0;
                int r = tf__cache_begin(cc, &k, len, arg, urgent, &ec, &eb);
                if (r < 0 ? 0 : r > TF__BEGIN_NOSPACE) abort();
                break;
            }
            case 2:
            case 3: {
                int r = tf__cache_commit(cc, &k, "fuzz://obj", &info, d, len, (op & 1) ? arg : TF__NO_NEED,
                                         (op & 0x20) ? &m : NULL, &ml);
                if (r > 0) abort();
                if (r == 0 && (op & 0x20)) {
                    if (!m || memcmp(m, d, len) != 0) abort();
                    check_chunk(cc, &k, m, len, ml);
                    tf__cache_unmap(m, ml);
                }
                if (r == 0) {
                    /* just landed, nobody else in this directory: it maps */
                    if (tf__cache_map(cc, &k, len, NULL, 0, 0, &m, &ml) != 0) abort();
                    if (memcmp(m, d, len) != 0) abort();
                    check_chunk(cc, &k, m, len, ml);
                    tf__cache_unmap(m, ml);
                }
                break;
            }
            case 4:
                tf__cache_abort(cc, &k);
                break;
            case 5:
            case 6: {
                /* with granule checksums from chunk 3 when op bit 0 */
                uint64_t sums[4];
                size_t ns = 0;
                for (; (op & 1) && ns < 4 && (ns + 1) * 8 <= c[3].n; ns++) sums[ns] = tf__le64(c[3].p + 8 * ns);
                int r = tf__cache_map(cc, &k, len, ns ? sums : NULL, ns, 1 + (arg & 15), &m, &ml);
                if (r == 0) {
                    check_chunk(cc, &k, m, len, ml);
                    tf__cache_unmap(m, ml);
                } else if (r != -ENOENT && r != -TF_ECHECKSUM && r >= 0) {
                    abort();
                }
                break;
            }
            case 7:
                tf__cache_forget(cc, &k);
                break;
            case 8: {
                tf__ckey keys[3] = {k, key_of(arg), key_of((uint8_t)(arg * 7 + 1))};
                uint64_t nu[3] = {arg, (uint64_t)arg << 1, urgent ? TF__NO_NEED : 5};
                tf__cache_publish(cc, keys, nu, 1 + arg % 3, (op >> 4) & 3);
                break;
            }
            case 9:
                tf__cache_usage(cc, &b, &l);
                (void)tf__cache_evictions(cc);
                break;
            case 10: {
                /* the chunk file rewritten behind the cache's back: maps
                 * only if it still is the right chunk */
                key_path(dir, &k, p, sizeof p);
                struct stat st;
                if (stat(p, &st) != 0 || !S_ISREG(st.st_mode)) break;
                size_t clen = st.st_size > TF__CHUNK_TRAILER ? (size_t)st.st_size - TF__CHUNK_TRAILER : 0;
                int fd = open(p, O_WRONLY | O_CLOEXEC | ((op & 0x20) ? O_TRUNC : 0));
                if (fd < 0) break;
                if (c[5].n && pwrite(fd, c[5].p, c[5].n, (op & 0x20) ? 0 : arg % (st.st_size + 1)) < 0) {
                }
                close(fd);
                int r = tf__cache_map(cc, &k, clen, NULL, 0, 0, &m, &ml);
                if (r == 0) {
                    check_chunk(cc, &k, m, clen, ml);
                    tf__cache_unmap(m, ml);
                } else if (r != -TF_ECHECKSUM && r != -ENOENT) {
                    abort();
                }
                break;
            }
            case 11:
                /* a second process on the same directory, or its exit */
                if (cs[1]) {
                    tf__cache_close(cs[1]);
                    cs[1] = NULL;
                } else if (tf__cache_open(dir, limit + arg, chunk_bytes, 1, &cs[1]) > 0) {
                    abort();
                }
                break;
            default:
                break;
            }
        }
        tf__cache_close(cs[1]);
        tf__cache_close(cs[0]);
        tf_cache_info ci;
        if (tf_cache_info_get(dir, &ci) > 0) abort();
        if (tf_cache_prune(dir, (uint64_t)(ctl[3] >> 1) * 16) > 0) abort();
    } else {
        /* an admin look at a directory the open refused */
        tf_cache_info ci;
        if (tf_cache_info_get(dir, &ci) > 0) abort();
    }
    rm_tree(dir);
    return 0;
}
