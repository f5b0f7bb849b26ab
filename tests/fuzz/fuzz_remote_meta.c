/* Fuzz target: the node's record of what a remote open fetched
 * (remote/remote_meta.c), as parsed once its seal holds. The seal keeps out
 * records that another user wrote; a record of this user's may still be cut
 * short or damaged in ways the seal cannot see if a bug wrote it, and the
 * parser must then refuse it (the open fetches instead): never read or write
 * out of bounds, never leak, never hand an object a range outside it.
 *
 * Input: the record's bytes before the seal. The key the parser expects is
 * the one the record itself names (bytes 16-23), so that inputs get past the
 * header; the bound on the bytes kept is 1 MiB.
 */
#include "fuzz_util.h"
#include "remote/remote.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint64_t key = size >= 24 ? tf__le64(data + 16) : 0;
    tf__preg g;
    memset(&g, 0, sizeof g);
    g.record_max = 1u << 20;
    if (tf__meta_parse(data, size, key, &g) == 0) {
        for (size_t i = 0; i < g.n; i++) {
            const tf__pobj *p = &g.o[i];
            if (!p->known || (!p->exists && p->ngot)) abort();
            for (size_t k = 0; k < p->ngot; k++)
                if (p->got[k].off > p->info.size || p->got[k].len > p->info.size - p->got[k].off) abort();
            if (tf__preg_find(&g, p->url) != p) abort();
        }
    }
    tf__preg_free(&g);
    tf__clearerr();
    return 0;
}
