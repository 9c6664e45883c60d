/* ngram.c — n-gram drafting: the tokens that followed the latest earlier
 * occurrence of a sequence's tail. */
#include "spec/ngram.h"

#include <string.h>

int32_t li_spec_ngram_draft(const int32_t *toks, int64_t n_toks, int n_max, int n_min, int32_t k, int32_t *out) {
    if (k <= 0) return 0;
    for (int n = n_max; n >= n_min && n > 0; n--) {
        if (n >= n_toks) continue;
        const int32_t *tail = toks + n_toks - n;
        /* the latest match ending before the tail: its continuation is the
         * most recent evidence of what follows these n tokens */
        for (int64_t at = n_toks - n - 1; at >= 0; at--) {
            if (toks[at] != tail[0] || memcmp(toks + at, tail, (size_t)n * sizeof *toks)) continue;
            const int64_t from = at + n; /* <= n_toks - 1: at least one token follows */
            const int64_t m = k < n_toks - from ? k : n_toks - from;
            memcpy(out, toks + from, (size_t)m * sizeof *out);
            return (int32_t)m;
        }
    }
    return 0;
}
