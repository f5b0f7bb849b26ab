/*
 * safe_fs.c — files reached relative to a directory descriptor, never
 * through a symlink (safe_fs.h says why and what each function promises).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "safe_fs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "source.h"

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif

int tf__dir_open(const char *dir, int create, int *dfd) {
    *dfd = -1;
    if (create) {
        char *p = strdup(dir);
        if (!p) return -ENOMEM;
        size_t n = strlen(p);
        for (size_t i = 1; i <= n; i++) {
            if (p[i] != '/' && p[i] != '\0') continue;
            char c = p[i];
            p[i] = '\0';
            /* (mkdir's mode is only ever narrowed by the umask: 0700 stays 0700) */
            if (mkdir(p, create == TF_DIR_PRIVATE ? 0700 : 0777) != 0 && errno != EEXIST) {
                int e = errno;
                tf__seterr(-e, "%s: cannot create directory %s: %s", dir, p, strerror(e));
                free(p);
                return -e;
            }
            p[i] = c;
        }
        free(p);
    }
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        if (e == ENOTDIR) TF_FAIL(-ENOTDIR, "%s: not a directory", dir);
        TF_FAIL(-e, "%s: cannot open the directory: %s", dir, strerror(e));
    }
    *dfd = fd;
    return 0;
}

void tf__random_bytes(void *p, size_t n) {
    uint8_t *b = p;
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom(b + got, n - got, GRND_NONBLOCK);
        if (r <= 0) break;
        got += (size_t)r;
    }
    if (got == n) return;
    /* no entropy yet (early boot): names need only be hard to guess ahead */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t s = (uint64_t)ts.tv_nsec ^ (uint64_t)ts.tv_sec << 30 ^ (uint64_t)getpid() << 48 ^ (uint64_t)(uintptr_t)p;
    for (size_t i = got; i < n; i++) {
        s = tf_mix64(s + 0x9e3779b97f4a7c15ull);
        b[i] = (uint8_t)s;
    }
}

#ifdef TF_TEST_HOOKS
/* Test-only ($TOKENFEED_FAULT_TMP_NAME, test builds only): the random part
 * of the first temporary name of the process, so that a test can plant a
 * symlink under exactly that name (tests/sources/test_security.py). */
static int fixed_suffix(char out[17]) {
    static int used;
    const char *s = getenv("TOKENFEED_FAULT_TMP_NAME");
    if (!s || strlen(s) != 16 || __atomic_exchange_n(&used, 1, __ATOMIC_SEQ_CST)) return 0;
    memcpy(out, s, 17);
    return 1;
}
#endif

int tf__tmp_create(int dfd, const char *dir, const char *stem, char *name, size_t cap, int *fd) {
    *fd = -1;
    for (int tries = 0; tries < 32; tries++) {
        char hex[17];
        int fixed = 0;
#ifdef TF_TEST_HOOKS
        fixed = fixed_suffix(hex);
#endif
        if (!fixed) {
            uint64_t r;
            tf__random_bytes(&r, sizeof r);
            snprintf(hex, sizeof hex, "%016llx", (unsigned long long)r);
        }
        int n = snprintf(name, cap, ".%s.%s.tmp", stem, hex);
        if (n < 0 || (size_t)n >= cap) return -ENAMETOOLONG;
        int f = openat(dfd, name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (f >= 0) {
            *fd = f;
            return 0;
        }
        if (errno == EEXIST || errno == ELOOP) continue; /* taken (or planted): another name */
        int e = errno;
        TF_FAIL(-e, "%s/%s: cannot create: %s", dir, name, strerror(e));
    }
    TF_FAIL(-EEXIST, "%s: cannot create a temporary file: 32 random names were all taken. Check who writes into this directory.",
            dir);
}

/* What the entry name of dfd is and who owns it, for a message: "a symbolic
 * link, owned by user nobody". The entry itself, never what a link names. */
static void describe_entry(int dfd, const char *name, char *out, size_t cap) {
    struct stat st;
    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        snprintf(out, cap, "gone again");
        return;
    }
    const char *kind = S_ISLNK(st.st_mode)   ? "a symbolic link"
                       : S_ISREG(st.st_mode) ? "a file"
                       : S_ISDIR(st.st_mode) ? "a directory"
                                             : "a special file";
    if (st.st_uid == geteuid()) {
        snprintf(out, cap, "%s, owned by this user", kind);
        return;
    }
    struct passwd pw, *found = NULL;
    char buf[1024];
    if (getpwuid_r(st.st_uid, &pw, buf, sizeof buf, &found) == 0 && found)
        snprintf(out, cap, "%s, owned by user %s", kind, found->pw_name);
    else
        snprintf(out, cap, "%s, owned by uid %u", kind, (unsigned)st.st_uid);
}

int tf__rename_at(int dfd, const char *dir, const char *from, const char *to, int noreplace) {
    if (!noreplace) {
        if (renameat(dfd, from, dfd, to) == 0) return 0;
    } else {
        if (renameat2(dfd, from, dfd, to, RENAME_NOREPLACE) == 0) return 0;
        if (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) {
            /* no RENAME_NOREPLACE here: a hard link fails the same way on an existing name */
            if (linkat(dfd, from, dfd, to, 0) == 0) {
                unlinkat(dfd, from, 0);
                return 0;
            }
        }
    }
    int e = errno;
    if (e == EEXIST) {
        char what[200];
        describe_entry(dfd, to, what, sizeof what);
        TF_FAIL(-EEXIST, "%s: cannot rename %s to %s: %s/%s already exists (%s), and this writer did not create it: another process or user did. It was left as it is (not followed, not replaced). Check who else writes into this directory.",
                dir, from, to, dir, to, what);
    }
    TF_FAIL(-e, "%s: cannot rename %s to %s: %s", dir, from, to, strerror(e));
}

int tf__unlink_regular(int dfd, const char *rel) {
    if (!rel || !*rel || rel[0] == '/') return -EINVAL;
    int cur = dfd, rc = 0;
    const char *s = rel;
    for (;;) {
        const char *sl = strchr(s, '/');
        size_t n = sl ? (size_t)(sl - s) : strlen(s);
        if (n == 0 || n >= 256 || (n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.')) {
            rc = -EINVAL;
            break;
        }
        char comp[256];
        memcpy(comp, s, n);
        comp[n] = '\0';
        if (!sl) {
            struct stat st;
            if (fstatat(cur, comp, &st, AT_SYMLINK_NOFOLLOW) != 0) rc = -errno;
            else if (!S_ISREG(st.st_mode)) rc = S_ISLNK(st.st_mode) ? -ELOOP : -EPERM;
            else if (unlinkat(cur, comp, 0) != 0) rc = -errno;
            break;
        }
        int next = openat(cur, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (next < 0) {
            rc = -errno;
            break;
        }
        if (cur != dfd) close(cur);
        cur = next;
        s = sl + 1;
    }
    if (cur != dfd) close(cur);
    return rc;
}

int tf__read_file_at(int dfd, const char *dir, const char *name, size_t max, uint8_t **buf, size_t *len) {
    return tf__read_file_st(dfd, dir, name, max, buf, len, NULL);
}

void *tf__table_alloc(size_t n, int zero) {
#ifdef MADV_HUGEPAGE
    if (n >= TF_TABLE_HUGE / 2 && n <= TF_TABLE_HUGE_MAX) {
        size_t whole = (n + TF_TABLE_HUGE - 1) & ~(TF_TABLE_HUGE - 1); /* huge pages cover it all */
        void *p = NULL;
        if (posix_memalign(&p, TF_TABLE_HUGE, whole) != 0) return NULL;
        (void)madvise(p, whole, MADV_HUGEPAGE);
        if (zero) memset(p, 0, n);
        return p;
    }
#endif
    return zero ? calloc(1, n ? n : 1) : malloc(n ? n : 1);
}

/* What kind of file st is, for a message. */
static const char *kind_of(const struct stat *st) {
    return S_ISREG(st->st_mode)    ? "a regular file"
           : S_ISFIFO(st->st_mode) ? "a FIFO (named pipe)"
           : S_ISDIR(st->st_mode)  ? "a directory"
           : S_ISSOCK(st->st_mode) ? "a socket"
           : S_ISCHR(st->st_mode) || S_ISBLK(st->st_mode) ? "a device"
                                                          : "a special file";
}

static void owner_name(uid_t uid, char *out, size_t cap) {
    struct passwd pw, *found = NULL;
    char buf[1024];
    if (getpwuid_r(uid, &pw, buf, sizeof buf, &found) == 0 && found) snprintf(out, cap, "user %s", found->pw_name);
    else snprintf(out, cap, "uid %u", (unsigned)uid);
}

int tf__read_file_trusted(int dfd, const char *dir, const char *name, size_t max, int check_owner, uid_t also,
                          uint8_t **buf, size_t *len, struct stat *out_st) {
    *buf = NULL;
    *len = 0;
    /* O_NONBLOCK: a FIFO planted under the name must not hold the open (it
     * is refused below, as any file that is not a regular one); reads of a
     * regular file are not affected by it */
    int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT) return -ENOENT;
        if (e == ELOOP) TF_FAIL(-ELOOP, "%s/%s: is a symbolic link; refusing to follow it", dir, name);
        TF_FAIL(-e, "%s/%s: cannot open: %s", dir, name, strerror(e));
    }
    /* everything that decides whether to read is taken from the descriptor,
     * before a byte is read: its type, its owner and mode, its size */
    struct stat st;
    int rc = 0;
    char who[160];
    if (fstat(fd, &st) != 0) rc = tf__seterr(-errno, "%s/%s: cannot stat: %s", dir, name, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        rc = tf__seterr(-EPERM, "%s/%s: not used: it is %s, not a regular file. Remove it if it is not yours.", dir, name,
                        kind_of(&st));
    else if (check_owner && st.st_uid != geteuid() && (also == (uid_t)-1 || st.st_uid != also)) {
        owner_name(st.st_uid, who, sizeof who);
        rc = tf__seterr(-EPERM, "%s/%s: not used: it belongs to %s, not to this user%s, so another user may have put it there. Remove it, or ask its owner to.",
                        dir, name, who, also != (uid_t)-1 ? " or the directory's owner" : "");
    } else if (check_owner && (st.st_mode & (S_IWGRP | S_IWOTH)))
        rc = tf__seterr(-EPERM, "%s/%s: not used: its mode %04o lets others write it. Remove it (tokenfeed writes it again) or chmod go-w it.",
                        dir, name, (unsigned)(st.st_mode & 07777));
    else if ((uint64_t)st.st_size > max)
        rc = tf__seterr(-EFBIG, "%s/%s: not used: %llu bytes, more than the %zu expected of it. Remove it.", dir, name,
                        (unsigned long long)st.st_size, max);
    uint8_t *b = rc ? NULL : tf__table_alloc((size_t)st.st_size + 1, 0);
    if (!rc && !b) rc = -ENOMEM;
    size_t got = 0;
    while (!rc && got < (size_t)st.st_size) {
        ssize_t r = pread(fd, b + got, (size_t)st.st_size - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) rc = tf__seterr(-errno, "%s/%s: cannot read: %s", dir, name, strerror(errno));
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (rc) {
        free(b);
        return rc;
    }
    b[got] = 0;
    *buf = b;
    *len = got;
    if (out_st) *out_st = st;
    return 0;
}

int tf__read_file_st(int dfd, const char *dir, const char *name, size_t max, uint8_t **buf, size_t *len,
                     struct stat *out_st) {
    return tf__read_file_trusted(dfd, dir, name, max, 0, (uid_t)-1, buf, len, out_st);
}

int tf__fsync_dir(int dfd, const char *dir) {
    if (fsync(dfd) != 0 && errno != EINVAL) {
        int e = errno;
        TF_FAIL(-e, "%s: fsync of the directory failed: %s", dir, strerror(e));
    }
    return 0;
}

int tf__dir_lock(int dfd, const char *dir, const char *what, int *lock_fd) {
    *lock_fd = -1;
    for (int tries = 0; tries < 64; tries++) {
        int fd = openat(dfd, TF_DIR_LOCK_NAME, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd < 0) {
            int e = errno;
            TF_FAIL(-e, "%s/%s: cannot open the lock file: %s", dir, TF_DIR_LOCK_NAME,
                    e == ELOOP ? "it is a symbolic link (refusing to follow it)" : strerror(e));
        }
        struct stat st, now;
        if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
            close(fd);
            TF_FAIL(-EPERM, "%s/%s: the lock file is not a regular file", dir, TF_DIR_LOCK_NAME);
        }
        int r;
        while ((r = flock(fd, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {
        }
        if (r != 0 && (errno == ENOLCK || errno == ENOSYS || errno == EOPNOTSUPP)) {
            /* a file system without flock (NFS without a lock manager): write
             * unlocked, as before there was a lock; concurrent runs are then
             * not detected */
            close(fd);
            return 0;
        }
        if (r != 0) {
            int e = errno;
            char holder[128] = "";
            ssize_t n = pread(fd, holder, sizeof holder - 1, 0);
            holder[n > 0 ? n : 0] = '\0';
            holder[strcspn(holder, "\n")] = '\0';
            close(fd);
            if (e != EWOULDBLOCK) TF_FAIL(-e, "%s/%s: cannot lock: %s", dir, TF_DIR_LOCK_NAME, strerror(e));
            TF_FAIL(-EBUSY, "%s: another process is writing here (%s holds %s) and %s would collide with it. Wait for it to finish, or write somewhere else; nothing of the other run was touched.",
                    dir, holder[0] ? holder : "a process", TF_DIR_LOCK_NAME, what);
        }
        /* The previous holder removes the file when it unlocks: locked but
         * no longer the file of that name means a stale one; take the new. */
        if (fstatat(dfd, TF_DIR_LOCK_NAME, &now, AT_SYMLINK_NOFOLLOW) != 0 || now.st_ino != st.st_ino ||
            now.st_dev != st.st_dev) {
            close(fd);
            continue;
        }
        char text[128], host[64] = "";
        gethostname(host, sizeof host - 1);
        int n = snprintf(text, sizeof text, "pid %ld on %s\n", (long)getpid(), host[0] ? host : "?");
        if (ftruncate(fd, 0) == 0 && n > 0) {
            ssize_t w = pwrite(fd, text, (size_t)n, 0);
            (void)w;
        }
        *lock_fd = fd;
        return 0;
    }
    TF_FAIL(-EBUSY, "%s/%s: the lock file kept being replaced; another process is writing here", dir, TF_DIR_LOCK_NAME);
}

void tf__dir_unlock(int dfd, int lock_fd) {
    if (lock_fd < 0) return;
    struct stat a, b;
    /* remove it while holding it, and only if it still is ours */
    if (dfd >= 0 && fstat(lock_fd, &a) == 0 && fstatat(dfd, TF_DIR_LOCK_NAME, &b, AT_SYMLINK_NOFOLLOW) == 0 &&
        a.st_ino == b.st_ino && a.st_dev == b.st_dev)
        unlinkat(dfd, TF_DIR_LOCK_NAME, 0);
    close(lock_fd);
}

static int is_tmp_name(const char *n) {
    size_t l = strlen(n);
    return n[0] == '.' && l > 5 && strcmp(n + l - 4, ".tmp") == 0 &&
           (strncmp(n, ".shard-", 7) == 0 || strncmp(n, "." TF_MANIFEST_NAME ".", sizeof TF_MANIFEST_NAME + 1) == 0);
}

/* A name the writer gives shards: shard-<8 hex>-<5 or more digits>.tfs. */
static int is_shard_name(const char *n) {
    size_t l = strlen(n);
    if (strncmp(n, "shard-", 6) != 0 || l < 6 + 9 + 5 + 4 || strcmp(n + l - 4, ".tfs") != 0 || n[14] != '-') return 0;
    for (size_t i = 6; i < 14; i++)
        if (!strchr("0123456789abcdef", n[i])) return 0;
    for (size_t i = 15; i < l - 4; i++)
        if (n[i] < '0' || n[i] > '9') return 0;
    return 1;
}

void tf__clean_unpublished(int dfd) {
    struct stat st;
    int have_manifest = fstatat(dfd, TF_MANIFEST_NAME, &st, AT_SYMLINK_NOFOLLOW) == 0;
    int d2 = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = d2 >= 0 ? fdopendir(d2) : NULL;
    if (!d) {
        if (d2 >= 0) close(d2);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)))
        if (is_tmp_name(e->d_name) || (!have_manifest && is_shard_name(e->d_name))) tf__unlink_regular(dfd, e->d_name);
    closedir(d);
}

int tf__pwrite_all(int fd, const void *buf, size_t n, uint64_t off, const char *path) {
    const uint8_t *p = buf;
    while (n) {
        ssize_t w = off == TF_AT_POS ? write(fd, p, n) : pwrite(fd, p, n, (off_t)off);
        if (w < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            TF_FAIL(-e, "%s: write failed: %s", path, strerror(e));
        }
        p += w;
        n -= (size_t)w;
        if (off != TF_AT_POS) off += (uint64_t)w;
    }
    return 0;
}

typedef struct trim_entry {
    char name[64];
    uint64_t bytes, mtime_ns;
} trim_entry;

static int trim_older_first(const void *a, const void *b) {
    const trim_entry *x = a, *y = b;
    return x->mtime_ns < y->mtime_ns ? -1 : x->mtime_ns > y->mtime_ns;
}

void tf__dir_trim(int dfd, const char *const *suffixes, const char *keep, uint64_t need, uint64_t max) {
    int d = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *dp = d >= 0 ? fdopendir(d) : NULL;
    if (!dp) {
        if (d >= 0) close(d);
        return;
    }
    trim_entry *v = NULL;
    size_t n = 0, cap = 0;
    uint64_t total = 0;
    struct dirent *e;
    while ((e = readdir(dp))) {
        size_t l = strlen(e->d_name);
        int ours = 0;
        for (const char *const *sx = suffixes; *sx && !ours; sx++) {
            size_t k = strlen(*sx);
            ours = l > k && strcmp(e->d_name + l - k, *sx) == 0;
        }
        struct stat st;
        if (!ours || l >= sizeof v->name || (keep && strcmp(e->d_name, keep) == 0) ||
            fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
            continue;
        trim_entry *nv = tf__grow(v, &cap, n, sizeof *nv, 16);
        if (!nv) break;
        v = nv;
        memcpy(v[n].name, e->d_name, l + 1);
        v[n].bytes = (uint64_t)st.st_size;
        v[n].mtime_ns = (uint64_t)st.st_mtim.tv_sec * 1000000000ull + (uint64_t)st.st_mtim.tv_nsec;
        total += v[n++].bytes;
    }
    closedir(dp);
    if (v) qsort(v, n, sizeof *v, trim_older_first);
    for (size_t i = 0; i < n && total + need > max; i++)
        if (tf__unlink_regular(dfd, v[i].name) == 0) total -= v[i].bytes;
    free(v);
}
