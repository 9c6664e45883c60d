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

/* The longest suffix li_spec_ngram_draft measures a match by (n_max) is
 * also where a speculate policy reads how far a copy goes: the match at
 * the same occurrence, measured back to at most this many tokens. */
#define LI_SPEC_NGRAM_MATCH_MAX 64

/* li_spec_ngram_draft, and in *match (not NULL) how many of the last tokens
 * the occurrence it copies from matches, up to LI_SPEC_NGRAM_MATCH_MAX
 * (>= n_max when the n_max-gram matched; 0 without a match): a copy 40
 * tokens long goes on more often than a 2-gram that happens to recur. */
int32_t li_spec_ngram_lookup(const int32_t *toks, int64_t n_toks, int n_max, int n_min, int32_t k, int32_t *out,
                             int32_t *match);

#endif
