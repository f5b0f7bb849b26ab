/*
 * select.c — views: a dataset's files with a selection of their documents
 * (docs/views.md).
 *
 * A view shares the files of the dataset it selects from (borrowed, never
 * closed here) and their token coordinates, so reads, the engine and every
 * read backend are unchanged; only the documents differ: view document k is
 * document ids[k] of the files. The orders enumerate documents through
 * tf_dataset_document and count them with tf_dataset_get_info, which answer
 * for the view; CONCAT packing, which treats the documents as one stream,
 * places positions with vstart (the lengths of the view's documents summed
 * in order), built here once in O(selected documents).
 *
 * The view's fingerprint hashes the dataset's and the selection (its count and
 * every id), so a state saved over one selection is refused over another.
 * Memory: 24 bytes per selected document (id, stream offset, token position:
 * CONCAT reads a document's place without a search in the files).
 */
#include <stdlib.h>
#include <string.h>

#include "source.h"

void tf__sel_free(tf__sel *s) {
    if (!s) return;
    free(s->ids);
    free(s->vstart);
    free(s->start);
    free(s);
}

typedef struct lens_call {
    const tf_dataset *base; /* the files, without selection */
    tf__sel *sel;
} lens_call;

/* vstart from the documents' lengths: files visited in order, a document
 * located by its file without a search per document. */
static int fill_lengths(void *p) {
    lens_call *lc = p;
    const tf_dataset *ds = lc->base;
    tf__sel *s = lc->sel;
    uint64_t file = 0, acc = 0;
    for (uint64_t k = 0; k < s->n; k++) {
        uint64_t id = s->ids[k];
        while (file + 1 < ds->nfiles && ds->doc_prefix[file + 1] <= id) file++;
        uint64_t st, len;
        TF_TRY(tf__file_document(&ds->files[file], id - ds->doc_prefix[file], &st, &len));
        s->vstart[k] = acc;
        s->start[k] = ds->tok_prefix[file] + st;
        if (tf__add_overflow(acc, len, &acc)) TF_FAIL(-EOVERFLOW, "selected tokens overflow 64 bits");
        if ((k & 0xFFFFF) == 0xFFFFF && tf__interrupted()) return -EINTR;
    }
    s->vstart[s->n] = acc;
    return 0;
}

int tf_dataset_select(const tf_dataset *ds, const uint64_t *ids, uint64_t n, tf_dataset **out) {
    TF_NEED_ARG(ds);
    TF_NEED_ARG(out);
    TF_NEED_BUF(ids, n);
    *out = NULL;
    if (ds->docs_from_rows)
        TF_FAIL(-EINVAL, "%s: a view selects documents, and the documents of this file, split at eos id %llu, are not indexed: build its index once with `tokenfeed index PATH --dtype DTYPE --eos-id %llu`, then filter.",
                ds->nfiles ? ds->files[0].path : "(dataset)", (unsigned long long)ds->eos_id,
                (unsigned long long)ds->eos_id);
    uint64_t have = ds->sel ? ds->sel->n : ds->num_docs;
    for (uint64_t k = 0; k < n; k++) {
        if (ids[k] >= have)
            TF_FAIL(-ERANGE, "selection: document id %llu (entry %llu) is out of range: the dataset has %llu documents",
                    (unsigned long long)ids[k], (unsigned long long)k, (unsigned long long)have);
        if (k && ids[k] <= ids[k - 1])
            TF_FAIL(-EINVAL, "selection: document ids must be ascending and distinct; entry %llu is %llu after %llu",
                    (unsigned long long)k, (unsigned long long)ids[k], (unsigned long long)ids[k - 1]);
    }
    if (n == 0)
        TF_FAIL(-EINVAL, "selection: no document is selected (the filter keeps none of the %llu documents). Check the filter against the columns' values.",
                (unsigned long long)have);
    tf_dataset *v = calloc(1, sizeof *v);
    tf__sel *s = calloc(1, sizeof *s);
    int rc = -ENOMEM;
    if (!v || !s) goto fail;
    v->sel = s;
    v->borrowed = 1;
    v->nfiles = ds->nfiles;
    s->n = n;
    s->ids = malloc(n * sizeof *s->ids);
    s->vstart = malloc((n + 1) * sizeof *s->vstart);
    s->start = malloc(n * sizeof *s->start);
    v->files = malloc((ds->nfiles ? ds->nfiles : 1) * sizeof *v->files);
    v->tok_prefix = malloc((ds->nfiles + 1) * sizeof *v->tok_prefix);
    v->doc_prefix = malloc((ds->nfiles + 1) * sizeof *v->doc_prefix);
    if (!s->ids || !s->vstart || !s->start || !v->files || !v->tok_prefix || !v->doc_prefix) goto fail;
    memcpy(v->files, ds->files, ds->nfiles * sizeof *v->files);
    memcpy(v->tok_prefix, ds->tok_prefix, (ds->nfiles + 1) * sizeof *v->tok_prefix);
    memcpy(v->doc_prefix, ds->doc_prefix, (ds->nfiles + 1) * sizeof *v->doc_prefix);
    for (uint64_t k = 0; k < n; k++) s->ids[k] = ds->sel ? ds->sel->ids[ids[k]] : ids[k];
    v->num_tokens = ds->num_tokens;
    v->num_docs = ds->num_docs;
    v->vocab_size = ds->vocab_size;
    v->dtype = ds->dtype;
    v->eos_id = ds->eos_id;
    lens_call lc = {v, s};
    v->sel = NULL; /* fill_lengths reads the files' own documents */
    rc = tf__files_guard(v->files, v->nfiles, fill_lengths, &lc);
    v->sel = s;
    if (rc) goto fail;
    /* the dataset without any selection, then the selection as ids of its files */
    tf__xxh64_state h;
    tf__xxh64_reset(&h, 0x53454C4543543176ULL); /* "SELECT1v" */
    uint8_t rec[16];
    /* a view of a view: the ids are the files' already, hashed with the original dataset's */
    uint64_t base_fp = ds->sel ? ds->sel->base_fp : ds->fingerprint;
    s->base_fp = base_fp;
    tf__put_le64(rec, base_fp);
    tf__put_le64(rec + 8, n);
    tf__xxh64_update(&h, rec, 16);
    tf__xxh64_update(&h, s->ids, n * sizeof *s->ids); /* little-endian hosts only (as the whole library) */
    v->fingerprint = tf__xxh64_digest(&h);
    *out = v;
    return 0;
fail:
    if (v) {
        v->sel = NULL;
        free(v->files);
        free(v->tok_prefix);
        free(v->doc_prefix);
        free(v);
    }
    tf__sel_free(s);
    return rc;
}

int tf_dataset_selection(const tf_dataset *ds, uint64_t *num_documents, uint64_t *num_tokens) {
    TF_NEED_ARG(ds);
    if (num_documents) *num_documents = ds->sel ? ds->sel->n : ds->num_docs;
    if (num_tokens) *num_tokens = ds->sel ? ds->sel->vstart[ds->sel->n] : ds->num_tokens;
    return ds->sel ? 1 : 0;
}

int tf_dataset_document_id(const tf_dataset *ds, uint64_t i, uint64_t *id) {
    TF_NEED_ARG(ds);
    TF_NEED_ARG(id);
    uint64_t have = ds->sel ? ds->sel->n : ds->num_docs;
    if (i >= have)
        TF_FAIL(-ERANGE, "document %llu out of range: the %s has %llu documents", (unsigned long long)i,
                ds->sel ? "view" : "dataset", (unsigned long long)have);
    *id = ds->sel ? ds->sel->ids[i] : i;
    return 0;
}

int tf_dataset_document_index(const tf_dataset *ds, uint64_t id, uint64_t *i) {
    TF_NEED_ARG(ds);
    TF_NEED_ARG(i);
    if (id >= ds->num_docs)
        TF_FAIL(-ERANGE, "document %llu out of range: the dataset has %llu documents", (unsigned long long)id,
                (unsigned long long)ds->num_docs);
    if (!ds->sel) {
        *i = id;
        return 0;
    }
    const uint64_t *v = ds->sel->ids;
    uint64_t lo = 0, hi = ds->sel->n;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (v[mid] < id) lo = mid + 1; else hi = mid;
    }
    if (lo == ds->sel->n || v[lo] != id)
        TF_FAIL(-ENOENT, "document %llu is not in the view (its filter or exclusion leaves it out)", (unsigned long long)id);
    *i = lo;
    return 0;
}
