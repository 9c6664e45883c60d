/* ngram.c — n-gram drafting: the tokens that followed the latest earlier
 * occurrence of a sequence's tail. */
#include "spec/ngram.h"

#include <string.h>

int32_t li_spec_ngram_draft(const int32_t *toks, int64_t n_toks, int n_max, int n_min, int32_t k, int32_t *out) {
    return li_spec_ngram_lookup(toks, n_toks, n_max, n_min, k, out, NULL);
}

int32_t li_spec_ngram_lookup(const int32_t *toks, int64_t n_toks, int n_max, int n_min, int32_t k, int32_t *out,
                             int32_t *match) {
    if (match) *match = 0;
    if (k <= 0) return 0;
    const int lo = n_min > 1 ? n_min : 1;
    const int hi = (int64_t)n_max < n_toks - 1 ? n_max : (int)(n_toks - 1); /* an n-gram shorter than the tokens */
    if (hi < lo) return 0;
    /* One pass from the end: at each earlier end position j of the tail's
     * last token, the match's length backwards (at most hi). The first j to
     * reach a longer match than any before is the latest occurrence of that
     * n-gram, so the longest n and its latest occurrence come out of one
     * scan, not one per n (a tail with no match read the tokens n_max -
     * n_min + 1 times). j <= n_toks - 2 keeps the occurrence before the
     * tail's own position; it may overlap the tail. */
    const int32_t *tail = toks + n_toks - 1;
    int best = lo - 1;
    int64_t from = -1;
    for (int64_t j = n_toks - 2; j >= 0; j--) {
        if (toks[j] != *tail) continue;
        int len = 1;
        while (len < hi && len <= j && toks[j - len] == tail[-len]) len++;
        if (len > best) {
            best = len;
            from = j + 1; /* <= n_toks - 1: at least one token follows */
            if (len == hi) break;
        }
    }
    if (from < 0) return 0;
    if (match) { /* the same occurrence, measured on past hi */
        int64_t len = best;
        while (len < LI_SPEC_NGRAM_MATCH_MAX && len < from && toks[from - 1 - len] == tail[-len]) len++;
        *match = (int32_t)len;
    }
    const int64_t m = k < n_toks - from ? k : n_toks - from;
    memcpy(out, toks + from, (size_t)m * sizeof *out);
    return (int32_t)m;
}
