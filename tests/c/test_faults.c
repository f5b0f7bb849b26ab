/* Faults: a file truncated while mapped and being read gives -EIO naming the
 * file (the SIGBUS guard of common/sigbus.c) from tf_dataset_read,
 * tf_dataset_document, verify and the mmap engine; the loader can be freed
 * afterwards; and a SIGBUS that is not ours still reaches the handler that was
 * installed before tokenfeed's (chaining), for a sent signal and for a real
 * fault outside any guard; and a handler installed after tokenfeed's keeps
 * the guard working by calling tf_sigbus_handle, or by chaining to the
 * handler it replaced.
 *
 * Passes under ASan+UBSan too (their runtime lets our sigaction through).
 * Skipped (77) when $TOKENFEED_NO_SIGBUS_GUARD turns the guard off (a test
 * build, TF_TEST_HOOKS, reads it). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helpers.h"

#define NTOK (1u << 20) /* uint16 tokens: 2 MiB, 512 pages */
#define KEEP 4096u      /* bytes left after the truncation */

static char path[256];
static char mpath[300], mbin[310], midx[310];

static int write_tokens(const char *p, uint32_t n) {
    uint16_t *t = malloc((size_t)n * 2);
    if (!t) return -1;
    for (uint32_t i = 0; i < n; i++) t[i] = (uint16_t)(i * 7u % 50000u);
    FILE *f = fopen(p, "wb");
    int ok = f && fwrite(t, 2, n, f) == n;
    if (f) fclose(f);
    free(t);
    return ok ? 0 : -1;
}

static int open_raw(tf_dataset **ds) {
    tf_open_options o = {.format = TF_FORMAT_AUTO, .raw_dtype = TF_UINT16};
    return tf_dataset_open(path, &o, ds);
}

static int names_file(const char *p) {
    const char *m = tf_last_error();
    int ok = m && strstr(m, p) && strstr(m, "changed while mapped");
    if (!ok) fprintf(stderr, "message does not name %s: %s\n", p, m ? m : "(none)");
    return ok;
}

/* ---- chaining: a handler installed before tokenfeed's ------------------- */

static volatile sig_atomic_t prev_calls;
static sigjmp_buf prev_jmp;
static volatile int prev_jump;
static void prev_handler(int sig, siginfo_t *si, void *uc) {
    (void)sig;
    (void)si;
    (void)uc;
    prev_calls++;
    if (prev_jump) siglongjmp(prev_jmp, 1);
}

static void test_read_document_verify(void) {
    CHECK(write_tokens(path, NTOK) == 0);
    tf_dataset *ds = NULL;
    CHECK_OK(open_raw(&ds));
    if (!ds) return;
    uint16_t buf[64];
    CHECK_OK(tf_dataset_read(ds, NTOK - 64, 64, buf, TF_UINT16));
    CHECK(truncate(path, KEEP) == 0);
    /* inside the kept page: fine */
    CHECK_OK(tf_dataset_read(ds, 0, 64, buf, TF_UINT16));
    CHECK(buf[3] == 21);
    /* past it: -EIO naming the file, twice (the guard is reusable) */
    for (int k = 0; k < 2; k++) {
        CHECK_RC(tf_dataset_read(ds, NTOK - 64, 64, buf, TF_UINT16), -EIO);
        CHECK(names_file(path));
    }
    CHECK_RC(tf_dataset_verify(ds, 2, NULL, NULL), -EIO);
    CHECK(names_file(path));
    tf_dataset_free(ds);
}

static void test_loader(tf_backend backend) {
    CHECK(write_tokens(path, NTOK) == 0);
    tf_dataset *ds = NULL;
    CHECK_OK(open_raw(&ds));
    if (!ds) return;
    tf_loader_config c;
    tf_loader_config_init(&c);
    c.order.seq_len = 1023;
    c.order.global_batch = 4;
    c.order.seed = 1;
    c.batch_size = 4;
    c.num_threads = 2;
    c.backend = backend;
    tf_loader *l = NULL;
    CHECK_OK(tf_loader_create(ds, &c, &l));
    if (!l) {
        tf_dataset_free(ds);
        return;
    }
    tf_batch *b = NULL;
    CHECK_OK(tf_loader_next(l, &b));
    tf_batch_release(b);
    CHECK(truncate(path, KEEP) == 0);
    /* Every later batch (shuffled samples of 1024 tokens, 4 per batch) reaches
     * past the kept 2048 tokens: EIO with the file's name, never a crash. The
     * batches prefetched before the truncation may still come through. */
    int got_eio = 0;
    for (int i = 0; i < 40 && !got_eio; i++) {
        b = NULL;
        int rc = tf_loader_next(l, &b);
        if (rc == 0) {
            tf_batch_release(b);
            continue;
        }
        CHECK_RC(rc, -EIO);
        if (rc == -EIO) CHECK(backend != TF_BACKEND_MMAP || names_file(path));
        if (rc != -EIO) break;
        got_eio = 1;
    }
    CHECK(got_eio);
    tf_loader_free(l);
    tf_dataset_free(ds);
}

/* A Megatron .idx (the mapped document index) truncated: document lookups
 * fail with -EIO naming the .idx. */
static void test_index_truncated(void) {
    enum { NDOC = 4096 };
    uint16_t *t = calloc(NDOC, 2);
    FILE *f = fopen(mbin, "wb");
    CHECK(t && f && fwrite(t, 2, NDOC, f) == NDOC);
    if (f) fclose(f);
    free(t);
    f = fopen(midx, "wb");
    CHECK(f != NULL);
    if (!f) return;
    uint8_t hdr[34] = "MMIDIDX\0\0";
    uint64_t one = 1, nseq = NDOC, ndoc = NDOC + 1;
    memcpy(hdr + 9, &one, 8);
    hdr[17] = 8; /* dtype code 8: uint16 */
    memcpy(hdr + 18, &nseq, 8);
    memcpy(hdr + 26, &ndoc, 8);
    fwrite(hdr, 1, 34, f);
    for (uint32_t j = 0; j < NDOC; j++) {
        int32_t s = 1;
        fwrite(&s, 4, 1, f);
    }
    for (uint64_t j = 0; j < NDOC; j++) {
        int64_t p = (int64_t)(2 * j);
        fwrite(&p, 8, 1, f);
    }
    for (uint64_t j = 0; j <= NDOC; j++) fwrite(&j, 8, 1, f);
    fclose(f);
    tf_dataset *ds = NULL;
    CHECK_OK(tf_dataset_open(mpath, NULL, &ds));
    if (!ds) return;
    uint64_t s = 0, n = 0;
    CHECK_OK(tf_dataset_document(ds, NDOC - 1, &s, &n));
    CHECK(s == NDOC - 1 && n == 1);
    CHECK(truncate(midx, 4096) == 0);
    CHECK_RC(tf_dataset_document(ds, NDOC - 1, &s, &n), -EIO);
    CHECK(names_file(midx));
    tf_dataset_free(ds);
}

/* Not ours: a sent SIGBUS and a real fault outside any guard reach the
 * handler installed before tokenfeed's. */
static void test_chaining(void) {
    CHECK(write_tokens(path, NTOK) == 0);
    tf_dataset *ds = NULL;
    CHECK_OK(open_raw(&ds));
    if (!ds) return;
    prev_calls = 0;
    prev_jump = 0;
    raise(SIGBUS);
    CHECK(prev_calls == 1);
    const void *p = NULL;
    tf_dtype dt;
    CHECK_OK(tf_dataset_view(ds, 0, NTOK, &p, &dt));
    CHECK(truncate(path, KEEP) == 0);
    prev_jump = 1;
    volatile uint16_t sink = 0;
    if (sigsetjmp(prev_jmp, 1) == 0) {
        sink = ((const volatile uint16_t *)p)[NTOK - 1]; /* unguarded: not ours */
        CHECK(!"the unguarded read of a truncated mapping did not fault");
    }
    (void)sink;
    CHECK(prev_calls == 2);
    prev_jump = 0;
    /* and the guard still works after a fault it passed on */
    uint16_t buf[8];
    CHECK_RC(tf_dataset_read(ds, NTOK - 8, 8, buf, TF_UINT16), -EIO);
    tf_dataset_free(ds);
}

/* ---- a handler installed after tokenfeed's ------------------------------ */

static struct sigaction replaced; /* tokenfeed's, as sigaction returned it */
static volatile sig_atomic_t later_calls;
static void later_calls_first(int sig, siginfo_t *si, void *uc) {
    later_calls++;
    tf_sigbus_handle(sig, si, uc); /* ours: does not return */
    _exit(3);                      /* a trainer's own SIGBUS handling */
}
static void later_chains(int sig, siginfo_t *si, void *uc) {
    later_calls++;
    replaced.sa_sigaction(sig, si, uc);
}

static void test_handler_installed_later(void (*handler)(int, siginfo_t *, void *)) {
    CHECK(write_tokens(path, NTOK) == 0);
    tf_dataset *ds = NULL;
    CHECK_OK(open_raw(&ds)); /* the guard is installed by now */
    if (!ds) return;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = handler;
    sa.sa_flags = SA_SIGINFO;
    sigfillset(&sa.sa_mask); /* blocks everything while it runs */
    CHECK(sigaction(SIGBUS, &sa, &replaced) == 0);
    CHECK(replaced.sa_flags & SA_SIGINFO);
    CHECK(truncate(path, KEEP) == 0);
    later_calls = 0;
    uint16_t buf[8];
    CHECK_RC(tf_dataset_read(ds, NTOK - 8, 8, buf, TF_UINT16), -EIO);
    CHECK(names_file(path));
    CHECK(later_calls == 1);
    /* the faulting thread's signal mask is the one it had before the fault */
    sigset_t now;
    CHECK(pthread_sigmask(SIG_SETMASK, NULL, &now) == 0);
    CHECK(!sigismember(&now, SIGUSR1) && !sigismember(&now, SIGBUS));
    CHECK(sigaction(SIGBUS, &replaced, NULL) == 0);
    tf_dataset_free(ds);
}

int main(void) {
#ifdef TF_TEST_HOOKS /* only a test build reads it */
    const char *off = getenv("TOKENFEED_NO_SIGBUS_GUARD");
    if (off && *off && strcmp(off, "0") != 0) {
        fprintf(stderr, "skip: TOKENFEED_NO_SIGBUS_GUARD turns the SIGBUS guard off\n");
        return T_EXIT_SKIP;
    }
#endif
    /* installed before tokenfeed maps anything, so tokenfeed chains to it */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = prev_handler;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, NULL);

    char tmpl[] = "/tmp/tf_faults_XXXXXX";
    if (!mkdtemp(tmpl)) return T_EXIT_FAIL;
    snprintf(path, sizeof path, "%s/tokens.bin", tmpl);
    snprintf(mpath, sizeof mpath, "%s/mg", tmpl);
    snprintf(mbin, sizeof mbin, "%s.bin", mpath);
    snprintf(midx, sizeof midx, "%s.idx", mpath);

    test_read_document_verify();
    test_loader(TF_BACKEND_MMAP);
    test_loader(TF_BACKEND_PREAD);
    test_index_truncated();
    test_chaining();
    test_handler_installed_later(later_calls_first);
    test_handler_installed_later(later_chains);

    unlink(path);
    unlink(mbin);
    unlink(midx);
    rmdir(tmpl);
    return T_DONE();
}
