/* test_ngram.c — li_spec_ngram_draft and li_spec_ngram_lookup at their edges:
 *  - no match, k <= 0, every n >= the token count: no draft;
 *  - a match at the very start (position 0) drafts what follows it;
 *  - the latest earlier occurrence wins over older ones;
 *  - the longest n wins over a later, shorter match; n_min is the floor;
 *  - k caps the draft; the draft stops at the end of the tokens (an
 *    occurrence overlapping the tail drafts the overlap);
 *  - the match lookup measures (how many last tokens the copied occurrence
 *    matches, past n_max, capped);
 *  - a brute-force reference agrees on random token strings (drafts and
 *    match lengths). */
#include "spec/ngram.h"
#include "test_util.h"

#include <string.h>

#define N(a) ((int64_t)(sizeof(a) / sizeof *(a)))

static int32_t draft(const int32_t *t, int64_t n, int nmax, int nmin, int32_t k, int32_t *out) {
    for (int i = 0; i < 32; i++) out[i] = -7; /* poison: a draft writes only its m tokens */
    return li_spec_ngram_draft(t, n, nmax, nmin, k, out);
}

static void test_edges(void) {
    int32_t out[32];
    const int32_t none[] = {1, 2, 3, 4, 5, 6};
    CHECK(draft(none, N(none), 4, 2, 8, out) == 0, "no repeated n-gram: no draft");
    CHECK(out[0] == -7, "nothing written without a match");

    const int32_t rep[] = {7, 8, 9, 7, 8};
    CHECK(draft(rep, N(rep), 4, 2, 0, out) == 0, "k = 0: no draft");
    CHECK(draft(rep, N(rep), 4, 2, -3, out) == 0, "k < 0: no draft");
    /* n >= length is skipped, not read past the start */
    CHECK(draft(rep, 2, 4, 2, 8, out) == 0, "n_toks == n_min: no draft");
    CHECK(draft(rep, 1, 4, 1, 8, out) == 0, "one token: no draft");
    CHECK(draft(rep, 0, 4, 1, 8, out) == 0, "no tokens: no draft");

    /* tail {7 8} matches at position 0: the draft is what followed it */
    int32_t m = draft(rep, N(rep), 4, 2, 8, out);
    CHECK(m == 3 && out[0] == 9 && out[1] == 7 && out[2] == 8, "match at the start: m = %d", m);
    CHECK(out[3] == -7, "no write past m");
    /* k caps it */
    m = draft(rep, N(rep), 4, 2, 1, out);
    CHECK(m == 1 && out[0] == 9 && out[1] == -7, "k = 1 caps the draft: m = %d", m);
    m = draft(rep, N(rep), 4, 2, 2, out);
    CHECK(m == 2 && out[0] == 9 && out[1] == 7, "k = 2: m = %d", m);

    /* the latest earlier occurrence wins: {5 6} at 0 (-> 1) and at 3 (-> 2) */
    const int32_t late[] = {5, 6, 1, 5, 6, 2, 5, 6};
    m = draft(late, N(late), 2, 2, 4, out);
    CHECK(m == 3 && out[0] == 2 && out[1] == 5 && out[2] == 6, "latest occurrence wins: m = %d, out[0] = %d", m,
          out[0]);

    /* the longest n wins: {3 5 6} occurs at 0 (-> 9), {5 6} last at 4 (-> 1) */
    const int32_t longest[] = {3, 5, 6, 9, 5, 6, 1, 3, 5, 6};
    m = draft(longest, N(longest), 3, 2, 1, out);
    CHECK(m == 1 && out[0] == 9, "n = 3 beats a later n = 2 match: out[0] = %d", out[0]);
    m = draft(longest, N(longest), 2, 2, 1, out);
    CHECK(m == 1 && out[0] == 1, "n_max = 2: the latest 2-gram: out[0] = %d", out[0]);
    /* n_min is a floor: the only repeat is a 1-gram */
    const int32_t one[] = {4, 1, 2, 3, 4};
    CHECK(draft(one, N(one), 4, 2, 4, out) == 0, "1-gram repeat below n_min = 2");
    m = draft(one, N(one), 4, 1, 4, out);
    CHECK(m == 4 && out[0] == 1 && out[3] == 4, "n_min = 1 finds it: m = %d", m);

    /* a run: the occurrence overlaps the tail, the draft ends at the last token */
    const int32_t run[] = {2, 2, 2, 2};
    m = draft(run, N(run), 2, 2, 8, out);
    CHECK(m == 1 && out[0] == 2, "overlapping occurrence at 1: m = %d", m);
    m = draft(run, N(run), 3, 3, 8, out);
    CHECK(m == 1 && out[0] == 2, "n = 3 in a run of 4: m = %d", m);
    CHECK(draft(run, N(run), 4, 4, 8, out) == 0, "n = 4 == length: no draft");
}

/* The definition, written the slow way: every (n, at) pair scored; *match
 * the match at the chosen occurrence, extended backwards while the tokens
 * agree (up to LI_SPEC_NGRAM_MATCH_MAX). */
static int32_t reference(const int32_t *t, int64_t len, int nmax, int nmin, int32_t k, int32_t *out,
                         int32_t *match) {
    *match = 0;
    if (k <= 0) return 0;
    for (int n = nmax; n >= nmin; n--) {
        int64_t best = -1;
        for (int64_t at = 0; at + n < len; at++) {
            bool eq = true;
            for (int i = 0; i < n && eq; i++) eq = t[at + i] == t[len - n + i];
            if (eq) best = at;
        }
        if (best < 0) continue;
        int32_t L = 0;
        while (L < LI_SPEC_NGRAM_MATCH_MAX && best + n - 1 - L >= 0 && t[best + n - 1 - L] == t[len - 1 - L]) L++;
        *match = L;
        int32_t m = 0;
        for (int64_t p = best + n; p < len && m < k; p++) out[m++] = t[p];
        return m;
    }
    return 0;
}

static void test_random(void) {
    rng_seed(12345);
    int bad = 0, bad_match = 0;
    for (int it = 0; it < 20000; it++) {
        int32_t t[40], got[32], want[32];
        const int64_t len = rng_u32() % 40;
        const int32_t vocab = 2 + (int32_t)(rng_u32() % 4);
        for (int64_t i = 0; i < len; i++) t[i] = (int32_t)(rng_u32() % (uint32_t)vocab);
        const int nmin = 1 + (int)(rng_u32() % 4), nmax = nmin + (int)(rng_u32() % 4);
        const int32_t k = (int32_t)(rng_u32() % 18);
        int32_t got2[32], match, want_match;
        const int32_t m = draft(t, len, nmax, nmin, k, got);
        const int32_t mw = reference(t, len, nmax, nmin, k, want, &want_match);
        if (m != mw || memcmp(got, want, (size_t)m * sizeof *got)) bad++;
        /* the lookup drafts the same and measures the same match */
        const int32_t m2 = li_spec_ngram_lookup(t, len, nmax, nmin, k, got2, &match);
        if (m2 != m || memcmp(got2, got, (size_t)m * sizeof *got) || match != want_match) bad_match++;
    }
    CHECK(bad == 0, "%d of 20000 random cases differ from the reference", bad);
    CHECK(bad_match == 0, "%d of 20000 random cases: the lookup's draft or match differs", bad_match);
}

/* How far the copy goes: a 40-token passage seen before matches 40 back
 * (not n_max), a longer one stops at LI_SPEC_NGRAM_MATCH_MAX, a lone 2-gram
 * matches 2, no match 0. */
static void test_match(void) {
    int32_t t[300], out[16], match = -9;
    for (int i = 0; i < 40; i++) t[i] = 100 + i;
    t[40] = 7;
    for (int i = 0; i < 40; i++) t[41 + i] = 100 + i; /* the passage again, up to its last token */
    int32_t m = li_spec_ngram_lookup(t, 81, 4, 2, 8, out, &match);
    CHECK(m == 8 && out[0] == 7 && out[1] == 100 && match == 40, "a 40-token copy: m %d, match %d", m, match);
    for (int i = 0; i < 100; i++) t[i] = 1000 + i;
    t[100] = 7;
    for (int i = 0; i < 100; i++) t[101 + i] = 1000 + i;
    m = li_spec_ngram_lookup(t, 201, 4, 2, 8, out, &match);
    CHECK(m == 8 && match == LI_SPEC_NGRAM_MATCH_MAX, "a 100-token copy: match capped at %d, got %d",
          LI_SPEC_NGRAM_MATCH_MAX, match);
    const int32_t two[] = {9, 5, 6, 1, 2, 3, 8, 5, 6};
    m = li_spec_ngram_lookup(two, N(two), 4, 2, 8, out, &match);
    CHECK(m == 6 && out[0] == 1 && match == 2, "a lone 2-gram: m %d, match %d", m, match);
    const int32_t none[] = {1, 2, 3, 4};
    match = -9;
    CHECK(li_spec_ngram_lookup(none, N(none), 4, 2, 8, out, &match) == 0 && match == 0, "no match: 0, got %d",
          match);
    match = -9;
    CHECK(li_spec_ngram_lookup(two, N(two), 4, 2, 0, out, &match) == 0 && match == 0, "k = 0: match 0, got %d", match);
    CHECK(li_spec_ngram_lookup(two, N(two), 4, 2, 8, out, NULL) == 6, "match NULL: drafts only");
}

int main(void) {
    test_edges();
    test_match();
    test_random();
    return t_summary("test_ngram");
}
