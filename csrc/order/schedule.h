/*
 * schedule.h — which source, and which sample of that source's own stream,
 * each position of a mixture takes: plain weights, or weights that change at
 * given global steps (piecewise constant or linearly interpolated). Pure
 * functions of (spec, position); see schedule.c for the rules.
 */
#ifndef TF_SCHEDULE_H
#define TF_SCHEDULE_H

#include "../common/internal.h"

typedef struct tf__sched tf__sched;

typedef struct tf__sched_spec {
    size_t K;                      /* sources, >= 1 */
    uint64_t M;                    /* positions per mixing window before reduction */
    uint64_t G;                    /* global batch: step k starts at position k * G */
    size_t npoints;                /* >= 1 */
    const uint64_t *steps;         /* npoints, steps[0] == 0, strictly increasing */
    const double *weights;         /* npoints x K, row-major */
    int linear;                    /* interpolate between consecutive points */
    int allow_zero;                /* a weight may be 0 (schedules); else every weight > 0 */
    /* Hand-over point of a resume with another schedule: from anchor_pos on,
     * source s continues from anchor_counts[s] (its count under the schedule
     * the state was saved with). NULL: none. */
    uint64_t anchor_pos;
    const uint64_t *anchor_counts; /* K, or NULL */
} tf__sched_spec;

/* Build the runs (O(points x M x K) time, never O(steps)). -EINVAL with a
 * message naming the point and source for a bad spec. */
TF_HIDDEN int tf__sched_create(const tf__sched_spec *spec, tf__sched **out);
TF_HIDDEN void tf__sched_free(tf__sched *s);

/* Source of position pos; *j = its index in that source's stream. O(log runs). */
TF_HIDDEN uint32_t tf__sched_at(const tf__sched *s, uint64_t pos, uint64_t *j);

/* Positions of source k in [0, pos): the j the next position of source k at
 * or after pos takes (with the anchor, from anchor_pos on). UINT64_MAX when
 * a table cannot be allocated. */
TF_HIDDEN uint64_t tf__sched_count(const tf__sched *s, size_t k, uint64_t pos);

/* Counts per window at position pos (w[K], summing to the returned window). */
TF_HIDDEN uint64_t tf__sched_counts_at(const tf__sched *s, uint64_t pos, uint64_t *w);

/* Hash of everything that changes the assignment (not the anchor, which the
 * saved state carries). A single point hashes as the plain-weights mixture
 * always did, so states saved before schedules existed still match. */
TF_HIDDEN uint64_t tf__sched_fingerprint(const tf__sched *s);

/* Number of runs (windows of equal counts), for tests. */
TF_HIDDEN size_t tf__sched_num_runs(const tf__sched *s);

#endif
