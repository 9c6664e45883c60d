/* ngram.h — n-gram drafting (prompt lookup) for speculative decoding.
 *
 * A pure function over a request's tokens: no engine, no KV. The engine
 * decides when a request drafts and verifies the drafts itself. */
#ifndef LI_SPEC_NGRAM_H
#define LI_SPEC_NGRAM_H

#include <stdint.h>

/* Finds the latest earlier occurrence of the last n tokens of toks, for n
 * from n_max down to n_min (the longest match wins), and copies up to k of
 * the tokens that followed it into out (k). Returns how many (0: no match,
 * k <= 0, or n_toks <= n for every n). The occurrence must start before the
 * tail itself; it may overlap it. */
int32_t li_spec_ngram_draft(const int32_t *toks, int64_t n_toks, int n_max, int n_min, int32_t k, int32_t *out);

#endif
