/*
 * safe_fs.h — files created, replaced, deleted and locked inside a directory
 * that other users may be able to write (a shared team directory), without
 * following a symlink anyone planted there.
 *
 * The directory is opened once (tf__dir_open); every later operation is
 * relative to that descriptor (openat, renameat2, unlinkat), with O_NOFOLLOW
 * on every path component, so swapping a component of the path or planting a
 * symlink under a predictable name changes nothing: temporary files are
 * created O_EXCL|O_NOFOLLOW under unpredictable names, renames never replace
 * what they did not expect to, and only regular files are deleted.
 *
 * All functions return 0 or -errno and set the library's last error with a
 * sentence naming `dir` (the path the caller opened, for messages only).
 */
#ifndef TF_SAFE_FS_H
#define TF_SAFE_FS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "../common/internal.h"

/* Create dir (and its parents) when create, then open it as a directory:
 * TF_DIR_CREATE makes them mode 0777 less the umask (a dataset's directory,
 * which its readers share), TF_DIR_PRIVATE mode 0700 whatever the umask (a
 * directory of tokenfeed's own, such as the node's catalog, which is refused
 * when anyone else may write it: under umask 002 the first mode would make it
 * group-writable and so never used). The path itself is resolved once, here,
 * as the caller gave it. */
#define TF_DIR_CREATE 1
#define TF_DIR_PRIVATE 2
TF_HIDDEN int tf__dir_open(const char *dir, int create, int *dfd);

/* Fill p[0, n) with random bytes (getrandom; a time- and pid-derived
 * fallback when the kernel has no entropy to give yet). */
TF_HIDDEN void tf__random_bytes(void *p, size_t n);

/* Create a new temporary file ".<stem>.<16 random hex>.tmp" in dfd, opened
 * O_RDWR|O_CREAT|O_EXCL|O_NOFOLLOW (mode 0644 less the umask). name receives
 * the name (cap >= strlen(stem) + 24). A name that exists (whatever it is)
 * is never opened: another random name is tried. */
TF_HIDDEN int tf__tmp_create(int dfd, const char *dir, const char *stem, char *name, size_t cap, int *fd);

/* Rename from to to inside dfd. With noreplace, fails with -EEXIST when to
 * exists (renameat2 RENAME_NOREPLACE, or link + unlink where the file system
 * lacks it); without, replaces to (a symlink named to is replaced, never
 * followed). */
TF_HIDDEN int tf__rename_at(int dfd, const char *dir, const char *from, const char *to, int noreplace);

/* Delete the regular file at the relative path rel ("a/b/c") under dfd:
 * each directory component opened O_NOFOLLOW|O_DIRECTORY, the last one
 * checked with fstatat(AT_SYMLINK_NOFOLLOW). Refuses absolute paths, empty
 * components, "." and ".." (-EINVAL), symlinks anywhere (-ELOOP / -ENOTDIR)
 * and anything but a regular file (-EPERM). -ENOENT when absent. Sets no
 * error message (callers decide whether a refusal matters). */
TF_HIDDEN int tf__unlink_regular(int dfd, const char *rel);

/* Read the regular file name (a plain name in dfd, opened O_NOFOLLOW) into a
 * malloc'ed buffer of *len bytes (at most max). -ENOENT when absent, with no
 * message. */
/* n bytes (zeroed when zero) that free() releases. From TF_TABLE_HUGE / 2
 * to TF_TABLE_HUGE_MAX bytes they are aligned to and advised onto transparent
 * huge pages where the kernel allows it: a table of 10^4 files then costs a
 * page fault per 2 MiB, not one per 4 KiB page (those faults were most of
 * opening a set from its catalog). Not above: where the kernel compacts
 * memory for advised regions synchronously (its "madvise" defrag mode), each
 * huge page of a fragmented machine costs a compaction; at 10^6 files (a
 * 360 MB table, a 161 MB catalog) that was 2 s of a cold open against 0.5 s
 * on small pages; up to 32 huge pages cost tens of ms at worst. */
#define TF_TABLE_HUGE ((size_t)2 << 20)
#define TF_TABLE_HUGE_MAX ((size_t)64 << 20)
TF_HIDDEN void *tf__table_alloc(size_t n, int zero);

TF_HIDDEN int tf__read_file_at(int dfd, const char *dir, const char *name, size_t max, uint8_t **buf, size_t *len);
/* The same, with the file's stat (of the descriptor read) in *st. Opened
 * O_NONBLOCK, so a FIFO under the name never blocks the caller; anything but
 * a regular file, and one over max bytes, is refused (-EPERM, -EFBIG) from
 * the descriptor's fstat, before a byte is read. */
struct stat;
TF_HIDDEN int tf__read_file_st(int dfd, const char *dir, const char *name, size_t max, uint8_t **buf, size_t *len,
                               struct stat *st);
/* tf__read_file_st for a file tokenfeed wrote for itself (a catalog, a set
 * record): with check_owner, also refused (-EPERM, with a message naming the
 * owner or the mode and what to do) unless it belongs to this user (or to
 * also, when not (uid_t)-1: the owner of the data directory holding it) and
 * no one else may write it. Checked in that order, all before reading. */
TF_HIDDEN int tf__read_file_trusted(int dfd, const char *dir, const char *name, size_t max, int check_owner,
                                    uid_t also, uint8_t **buf, size_t *len, struct stat *st);

/* fsync the directory dfd (after a rename, for durability). */
TF_HIDDEN int tf__fsync_dir(int dfd, const char *dir);

/* The lock held by a process writing into a directory: an exclusive flock on
 * the file ".tokenfeed.lock" in dfd (created O_NOFOLLOW, holding the holder's
 * pid and host for the message). The kernel drops it when its holder dies, so
 * a killed writer never leaves the directory locked. -EBUSY, with a sentence
 * naming the holder and `what`, when another open file holds it (another
 * process, or another writer of this one). The file is removed on unlock.
 * On a file system without flock (ENOLCK: NFS without a lock manager) it
 * succeeds with *lock_fd = -1: nothing is locked there. */
#define TF_DIR_LOCK_NAME ".tokenfeed.lock"
TF_HIDDEN int tf__dir_lock(int dfd, const char *dir, const char *what, int *lock_fd);
TF_HIDDEN void tf__dir_unlock(int dfd, int lock_fd);

/* With the lock held and no manifest in dfd: remove what writers killed
 * before they published left behind (shard-*.tfs and this library's
 * temporary files). Regular files only; errors are ignored (it is garbage). */
TF_HIDDEN void tf__clean_unpublished(int dfd);

/* Write all n bytes to fd, retrying short writes and EINTR: at off with pwrite,
 * or at the file position when off is TF_AT_POS. path names the file in the
 * message of a failure. */
#define TF_AT_POS UINT64_MAX
/* Keep the regular files of dfd whose names end with one of suffixes (a
 * NULL-terminated list) within max bytes with need more to come: delete the
 * least recently modified first, never keep (a name, or NULL). Best effort. */
TF_HIDDEN void tf__dir_trim(int dfd, const char *const *suffixes, const char *keep, uint64_t need, uint64_t max);

TF_HIDDEN int tf__pwrite_all(int fd, const void *buf, size_t n, uint64_t off, const char *path);

#endif
