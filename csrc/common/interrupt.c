/*
 * interrupt.c — the embedder's interrupt check (tf_interrupt_set_check):
 * blocking waits that a caller's thread makes inside the library (a remote
 * open waiting for its requests, a read waiting for a chunk) wake every
 * TF__INTERRUPT_SLICE_NS and ask it whether to give up, so that Ctrl-C in an
 * interpreter that called in is answered within that slice instead of after
 * every retry. Threads of the library's own (fetch pool, engine workers)
 * block signals and never see an interrupt: the check is the embedder's to
 * restrict to the threads it cares about. The one exception is a thread that
 * names a stop flag of its own (tf__thread_cancel_on: the chunk scheduler,
 * whose first touches of shards wait for requests): its waits end with
 * -EINTR once the flag is set, so that whoever stops it is not kept waiting
 * for a request in flight.
 *
 * Notices (tf_notice_set_fn): a wait that goes on longer than
 * TF__NOTICE_NS says what it waits for through the embedder's function, so
 * that a store that does not answer is visible long before its error.
 */
#include <stdatomic.h>
#include <stdio.h>

#include "internal.h"

static _Atomic(tf_interrupt_check_fn) check_fn;

void tf_interrupt_set_check(tf_interrupt_check_fn fn) { atomic_store(&check_fn, fn); }

/* The calling thread's stop flag (tf__thread_cancel_on), or NULL. */
static _Thread_local const volatile int *cancel_flag;

void tf__thread_cancel_on(const volatile int *flag) { cancel_flag = flag; }

int tf__interrupted(void) {
    if (cancel_flag && __atomic_load_n(cancel_flag, __ATOMIC_ACQUIRE)) return 1;
    tf_interrupt_check_fn fn = atomic_load(&check_fn);
    return fn && fn() != 0;
}

static _Atomic(tf_notice_fn) notice_fn;

void tf_notice_set_fn(tf_notice_fn fn) { atomic_store(&notice_fn, fn); }

void tf__notice(const char *fmt, ...) {
    tf_notice_fn fn = atomic_load(&notice_fn);
    if (!fn) return;
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fn(msg);
}
