/*
 * interrupt.c — the embedder's interrupt check (tf_interrupt_set_check):
 * blocking waits that a caller's thread makes inside the library (a remote
 * open waiting for its requests, a read waiting for a chunk) wake every
 * TF__INTERRUPT_SLICE_NS and ask it whether to give up, so that Ctrl-C in an
 * interpreter that called in is answered within that slice instead of after
 * every retry. Threads of the library's own (fetch pool, engine workers)
 * block signals and never see an interrupt: the check is the embedder's to
 * restrict to the threads it cares about.
 */
#include <stdatomic.h>

#include "internal.h"

static _Atomic(tf_interrupt_check_fn) check_fn;

void tf_interrupt_set_check(tf_interrupt_check_fn fn) { atomic_store(&check_fn, fn); }

int tf__interrupted(void) {
    tf_interrupt_check_fn fn = atomic_load(&check_fn);
    return fn && fn() != 0;
}
