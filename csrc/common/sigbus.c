/*
 * sigbus.c — turn a SIGBUS from a mapped file that shrank into -EIO.
 *
 * A file mapped with mmap can be truncated (or rewritten in place) by another
 * process while we read it; touching a page past the new end raises SIGBUS,
 * whose default action kills the whole training job. As LMDB and SQLite do for
 * their mmap modes, library code that reads mapped memory runs under a guard:
 *
 *   - A process-wide SIGBUS handler is installed once (pthread_once), the first
 *     time a file is mapped (tf__map_file). It is installed with
 *     SA_SIGINFO | SA_ONSTACK and remembers the previous disposition.
 *   - Each thread has a stack of guard frames (a sigjmp_buf each; guards
 *     nest: the innermost catches). tf__sigbus_run(fn, arg, &fault) pushes a
 *     frame, sigsetjmp(env, 0)s, calls fn(arg) and pops.
 *   - The handler (its first half is tf_sigbus_handle, public so that a
 *     program that replaces our handler can call it from its own): if this
 *     thread is inside a guard and the fault is a real memory fault (si_code BUS_ADRERR / BUS_OBJERR / BUS_MCEERR_AR, not a
 *     kill()), it records si_addr and siglongjmps to the innermost frame.
 *     A SIGBUS this process raised at itself while the thread is inside a
 *     guard is the re-raise of a handler installed over ours that restored
 *     ours first (Python's faulthandler): the handler returns, the read runs
 *     again and its fault is caught as above.
 *   - Every outermost guard checks that a handler able to serve it is
 *     installed (ours, or a SA_SIGINFO one that calls tf_sigbus_handle) and
 *     otherwise puts ours back in front (reassert, below).
 *     Otherwise the fault is not ours: it calls the previous handler, or for
 *     SIG_DFL/SIG_IGN restores the default disposition and lets the fault
 *     happen again (or re-raises a sent signal), so SIGBUS behaves as before.
 *   - Back in tf__sigbus_run, the frame is popped, SIGBUS unblocked (the
 *     kernel blocked it for the handler and siglongjmp(…, 0-mask) does not
 *     restore the mask), and the fault becomes -EIO with the faulting address
 *     reported to the caller. This file knows nothing of files: the sources
 *     layer (tf__files_guard, sources/file.c) turns the address into a
 *     message naming the file whose mapping holds it and the byte offset.
 *
 * Rules for code run under a guard: it may be abandoned at any load from a
 * mapping, so it must not hold a lock, or have an allocation not yet stored
 * where its owner frees it, across such a load. The engine's fill, the
 * dataset's reads and lookups and verify's hashing follow this (allocations
 * are stored before mapped bytes are touched; no locks are taken inside).
 *
 * Not covered: zero-copy NumPy views of a mapping handed to Python
 * (Dataset.tokens/document): Python code reading them runs outside any guard,
 * and a fault there kills the process as before. In test builds
 * (TF_TEST_HOOKS), TOKENFEED_NO_SIGBUS_GUARD=1 never installs the handler.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

#include "internal.h"

typedef struct sigbus_frame {
    sigjmp_buf env;
    struct sigbus_frame *prev;
    void *volatile addr;
} sigbus_frame;

/* initial-exec: the handler reads it, and a dynamic TLS access may allocate. */
static _Thread_local sigbus_frame *tl_top __attribute__((tls_model("initial-exec")));

static pthread_once_t install_once = PTHREAD_ONCE_INIT;
static struct sigaction prev_sa;
static volatile sig_atomic_t installed;

static int is_memory_fault(const siginfo_t *si) {
    if (!si) return 0;
    switch (si->si_code) {
    case BUS_ADRERR: /* page past the end of the file */
    case BUS_OBJERR: /* object-specific hardware error */
#ifdef BUS_MCEERR_AR
    case BUS_MCEERR_AR: /* memory error on a page we touched */
#endif
        return 1;
    default: return 0;
    }
}

static void restore_default(void) {
    struct sigaction d;
    memset(&d, 0, sizeof d);
    d.sa_handler = SIG_DFL;
    sigemptyset(&d.sa_mask);
    sigaction(SIGBUS, &d, NULL);
}

/* Ours: a memory fault on a thread inside a guard. Jumps to the innermost
 * frame; returns 0 otherwise. Also the public entry point for a handler that
 * replaced ours (tokenfeed.h). */
int tf_sigbus_handle(int sig, void *info, void *ucontext) {
    const siginfo_t *si = info;
    sigbus_frame *f = tl_top;
    if (sig == SIGBUS && f && is_memory_fault(si)) {
        f->addr = si->si_addr;
        /* Back to the signal mask of the read that faulted: a handler that
         * called us may have blocked more than SIGBUS (its sa_mask), and
         * siglongjmp(…, 0-mask) would leave those blocked. */
        if (ucontext) pthread_sigmask(SIG_SETMASK, &((const ucontext_t *)ucontext)->uc_sigmask, NULL);
        siglongjmp(f->env, 1);
    }
    return 0;
}

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
    tf_sigbus_handle(sig, si, uc);
    /* A handler installed over ours that, on a fault, restores ours and
     * raises the signal again (Python's faulthandler does, which PyTorch's
     * elastic @record enables): the fault's address is gone, but this thread
     * is inside a guard, so return: the read that faulted runs again and
     * faults again, now with ours installed, and is caught. */
    if (tl_top && si && (si->si_code == SI_TKILL || si->si_code == SI_USER) && si->si_pid == getpid()) return;
    /* Not ours: behave as if we were never installed. */
    if (prev_sa.sa_flags & SA_SIGINFO) {
        if (prev_sa.sa_sigaction) {
            prev_sa.sa_sigaction(sig, si, uc);
            return;
        }
    } else if (prev_sa.sa_handler == SIG_IGN) {
        if (!si || si->si_code <= 0) return; /* a sent signal, ignored as before */
    } else if (prev_sa.sa_handler != SIG_DFL) {
        prev_sa.sa_handler(sig);
        return;
    }
    /* Default action: a real fault re-executes and faults again, now fatal; a
     * sent signal is re-raised (pending until this handler returns). */
    restore_default();
    if (!si || si->si_code <= 0) raise(sig);
}

static void install(void) {
#ifdef TF_TEST_HOOKS
    const char *e = getenv("TOKENFEED_NO_SIGBUS_GUARD");
    if (e && *e && strcmp(e, "0") != 0) return;
#endif
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, &prev_sa) == 0) installed = 1;
}

void tf__sigbus_install(void) { pthread_once(&install_once, install); }

int tf__sigbus_installed(void) { return installed; }

/* Put ours back where what took its place cannot be serving the guard: the
 * default disposition, or a handler without SA_SIGINFO, which has no siginfo
 * to hand to tf_sigbus_handle. That happens when a handler set over ours is
 * taken away again and restores what it found before ours (Python's
 * faulthandler: enabled before tokenfeed, as pytest does, then disabled and
 * enabled again, as a framework may, leaves the default or itself), and a
 * guarded read would end the process. The handler found there becomes the
 * one ours passes other faults to. A SA_SIGINFO handler installed over ours is
 * left alone: it is the documented way to keep a handler of one's own, calling
 * tf_sigbus_handle first. Checked at every outermost guard: one sigaction
 * call. */
static pthread_mutex_t reassert_mu = PTHREAD_MUTEX_INITIALIZER;
static int cannot_serve(const struct sigaction *cur) { return !(cur->sa_flags & SA_SIGINFO); }
static void reassert(void) {
    struct sigaction cur;
    if (sigaction(SIGBUS, NULL, &cur) != 0 || !cannot_serve(&cur)) return;
    pthread_mutex_lock(&reassert_mu);
    if (sigaction(SIGBUS, NULL, &cur) == 0 && cannot_serve(&cur)) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_sigbus;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&sa.sa_mask);
        prev_sa = cur;
        sigaction(SIGBUS, &sa, NULL);
    }
    pthread_mutex_unlock(&reassert_mu);
}

int tf__sigbus_run(int (*fn)(void *), void *arg, tf__sigbus_fault *fault) {
    fault->hit = 0;
    fault->addr = NULL;
    if (!installed) return fn(arg);
    if (!tl_top) reassert();
    sigbus_frame fr;
    fr.prev = tl_top;
    fr.addr = NULL;
    if (sigsetjmp(fr.env, 0)) {
        tl_top = fr.prev;
        sigset_t s;
        sigemptyset(&s);
        sigaddset(&s, SIGBUS);
        pthread_sigmask(SIG_UNBLOCK, &s, NULL);
        fault->hit = 1;
        fault->addr = fr.addr;
        return -EIO;
    }
    tl_top = &fr;
    __atomic_signal_fence(__ATOMIC_SEQ_CST); /* the handler sees the frame before fn runs */
    int rc = fn(arg);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    tl_top = fr.prev;
    return rc;
}
