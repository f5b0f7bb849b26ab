/*
 * file_runs.c — for orders that cut each file of the dataset on its own
 * (llmc_order.c, olmo_order.c): the files as runs of units (a global batch,
 * an instance), which run holds a unit, and the documents the cut truncates
 * or splits (kind.h, tf__runs).
 */
#include <stdlib.h>
#include <string.h>

#include "kind.h"

int tf__runs_init(tf__runs *r, const tf_dataset *ds, const char *who) {
    memset(r, 0, sizeof *r);
    if (tf_dataset_selection(ds, NULL, NULL) == 1)
        TF_FAIL(-EINVAL, "%s: this order reproduces another loader's over whole files and cannot read a view (a filtered dataset); use tokenfeed's own order (order=None) for a filter", who);
    tf_dataset_info info;
    TF_TRY(tf_dataset_get_info(ds, &info));
    if (info.num_files == 0) TF_FAIL(-EINVAL, "%s: the dataset has no file", who);
    if (info.num_files > INT32_MAX) TF_FAIL(-EINVAL, "%s: %llu files, at most %d", who, (unsigned long long)info.num_files, INT32_MAX);
    r->n = (size_t)info.num_files;
    r->first = calloc(3 * r->n + 1, sizeof *r->first);
    if (!r->first) return -ENOMEM;
    r->count = r->first + r->n;
    r->cum = r->count + r->n;
    for (size_t f = 0; f < r->n; f++) {
        tf_file_info fi;
        int rc = tf_dataset_get_file(ds, f, &fi);
        if (rc) {
            tf__runs_free(r);
            return rc;
        }
        r->first[f] = fi.first_token;
        r->count[f] = fi.num_tokens;
    }
    return 0;
}

void tf__runs_sum(tf__runs *r) {
    for (size_t f = 0; f < r->n; f++) r->cum[f + 1] = r->cum[f] + r->count[f];
}

void tf__runs_free(tf__runs *r) {
    free(r->first);
    memset(r, 0, sizeof *r);
}

size_t tf__runs_find(const tf__runs *r, uint64_t k) {
    size_t lo = 0, hi = r->n; /* the last f with cum[f] <= k (k < cum[n]) */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (r->cum[mid] <= k) lo = mid;
        else hi = mid;
    }
    return lo;
}

int tf__runs_doc_stats(const tf__runs *r, const tf_dataset *ds, uint64_t unit, uint64_t L, uint64_t overlap,
                       tf_packing_stats *st) {
    tf_dataset_info info;
    TF_TRY(tf_dataset_get_info(ds, &info));
    st->documents = info.num_documents;
    uint64_t read = 0;
    for (size_t f = 0; f < r->n; f++) read += r->count[f] * unit + overlap;
    st->tokens_dropped = info.num_tokens - read;
    size_t f = 0;
    for (uint64_t k = 0; k < info.num_documents; k++) {
        uint64_t s, len;
        TF_TRY(tf_dataset_document(ds, k, &s, &len));
        if (!len) {
            st->empty_documents++;
            continue;
        }
        while (f + 1 < r->n && r->first[f + 1] <= s) f++;
        uint64_t a = s - r->first[f];
        if (a + len > r->count[f] * unit + overlap) st->documents_truncated++;
        else if (a + len > a / L * L + L + overlap) st->documents_split++;
    }
    return 0;
}
