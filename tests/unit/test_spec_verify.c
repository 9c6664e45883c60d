/* test_spec_verify.c — lossless speculative verification (spec/verify.h).
 *
 * With no arguments (ctest), unit checks:
 *   1. edges: bad arguments, k = 0 / n = 0, n_vocab 1, zero-probability
 *      entries never drawn, rows without mass, NaN/negative/inf entries, a
 *      residual with no mass (rounding) falls back to p, duplicate
 *      children (deterministic and sampled), drafts outside the vocabulary,
 *      parents out of order;
 *   2. uniforms: each call takes exactly the documented number;
 *   3. exactness: a one-hot (greedy) p gives greedy verification for the
 *      chain, the tree and typical acceptance; a chain equals the tree
 *      parent[i] = i - 1 with the same uniforms; hand-worked cases;
 *   4. the same seed reproduces the same tokens (a different one does not);
 *   5. a small losslessness experiment (2 * 10^5 tokens per case): the
 *      emitted sequence of a vocab-8 Markov target, drafted by a different
 *      Markov draft, passes a chi-square test of its transitions (split by
 *      the position in the step) for the correct rules and fails it for the
 *      deliberately wrong ones below (Wilson-Hilferty z; scipy's exact
 *      p-values are in tests/integration/test_spec_lossless.py).
 *
 * Modes for tests/integration/test_spec_lossless.py (JSON on stdout):
 *   --stats CASE [--tokens N] [--seed S]   one experiment's counts
 *   --list                                 the experiment names
 *   --draws N [--seed S]                   N random chain and tree calls with
 *                                          their inputs, uniforms and results,
 *                                          for a float64 NumPy transcription */
#include "spec/verify.h"
#include "test_util.h"

#include <float.h>
#include <string.h>

/* ---- uniforms: a seeded xoshiro256** stream that counts its draws ----------- */

typedef struct urng {
    uint64_t s[4];
    int64_t n;   /* draws taken */
    double *log; /* (log_cap) the draws, when non-NULL */
    int64_t log_cap;
} urng;

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void urng_seed(urng *r, uint64_t seed) {
    memset(r, 0, sizeof *r);
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static double urng_next(urng *r) {
    uint64_t *s = r->s;
    const uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0], s[3] ^= s[1], s[1] ^= s[2], s[0] ^= s[3], s[2] ^= t, s[3] = rotl(s[3], 45);
    return (double)(out >> 11) * 0x1.0p-53;
}

static double urng_fn(void *ctx) {
    urng *r = ctx;
    const double u = urng_next(r);
    if (r->log && r->n < r->log_cap) r->log[r->n] = u;
    r->n++;
    return u;
}

/* A fixed list of uniforms (then 0.5), counted. */
typedef struct ulist {
    const double *u;
    int n, at;
} ulist;

static double ulist_fn(void *ctx) {
    ulist *l = ctx;
    return l->at < l->n ? l->u[l->at++] : (l->at++, 0.5);
}

/* the test's own inverse-CDF draw (not verify.c's) */
static int32_t draw_row(const float *row, int nv, double u) {
    double s = 0, c = 0;
    for (int i = 0; i < nv; i++) s += row[i];
    int32_t last = 0;
    for (int i = 0; i < nv; i++) {
        if (row[i] <= 0) continue;
        c += row[i], last = i;
        if (c > u * s) return i;
    }
    return last;
}

static int32_t argmax_row(const float *row, int nv) {
    int32_t b = 0;
    for (int i = 1; i < nv; i++)
        if (row[i] > row[b]) b = i;
    return b;
}

/* a random distribution over nv ids with about zero_frac of them 0 (never all) */
static void random_row(urng *g, float *row, int nv, double zero_frac) {
    double s = 0;
    for (int i = 0; i < nv; i++) {
        const double u = urng_next(g);
        row[i] = urng_next(g) < zero_frac ? 0.0f : (float)exp(3.0 * u);
        s += row[i];
    }
    if (s == 0) row[(int)(urng_next(g) * nv)] = 1.0f, s = 1;
    for (int i = 0; i < nv; i++) row[i] = (float)(row[i] / s);
}

/* ==== 1. edges ================================================================ */

static void test_edges(void) {
    float p[3 * 4], q[3 * 4], scratch[2 * 4];
    int32_t next, path[4];
    urng g;
    urng_seed(&g, 1);
    for (int i = 0; i < 12; i++) p[i] = q[i] = 0.25f;
    const int32_t d[2] = {1, 2}, par[2] = {-1, 0};

    /* bad arguments: -1, *next = -1, no uniform */
    CHECK(li_spec_verify_chain(p, q, 0, d, 2, urng_fn, &g, scratch, &next) == -1 && next == -1, "n_vocab 0");
    CHECK(li_spec_verify_chain(p, q, 4, d, -1, urng_fn, &g, scratch, &next) == -1, "k < 0");
    CHECK(li_spec_verify_chain(p, q, 4, NULL, 2, urng_fn, &g, scratch, &next) == -1, "d NULL");
    CHECK(li_spec_verify_chain(NULL, q, 4, d, 2, urng_fn, &g, scratch, &next) == -1, "p NULL");
    CHECK(li_spec_verify_chain(p, q, 4, d, 2, NULL, &g, scratch, &next) == -1, "uniform NULL");
    CHECK(li_spec_verify_tree(p, q, 4, d, par, -1, urng_fn, &g, scratch, path, &next) == -1 && next == -1, "n < 0");
    CHECK(li_spec_verify_tree(p, q, 4, d, NULL, 2, urng_fn, &g, scratch, path, &next) == -1, "parent NULL");
    CHECK(li_spec_verify_tree(p, q, 4, d, par, 2, urng_fn, &g, NULL, path, &next) == -1, "scratch NULL");
    CHECK(li_spec_verify_typical(p, 0, d, par, 2, 0.09f, 0.3f, NULL, NULL, path, &next) == -1, "typical n_vocab 0");
    CHECK(g.n == 0, "bad arguments take no uniform (took %lld)", (long long)g.n);

    /* k = 0 / n = 0: one uniform, the token from p_0 */
    const float p0[4] = {0.0f, 0.5f, 0.0f, 0.5f};
    const double u_lo[1] = {0.25}, u_hi[1] = {0.75};
    ulist l = {u_lo, 1, 0};
    CHECK(li_spec_verify_chain(p0, NULL, 4, NULL, 0, ulist_fn, &l, scratch, &next) == 0 && next == 1 && l.at == 1,
          "k = 0 draws from p_0 (next %d, %d uniforms)", next, l.at);
    l = (ulist){u_hi, 1, 0};
    CHECK(li_spec_verify_tree(p0, NULL, 4, NULL, NULL, 0, ulist_fn, &l, scratch, NULL, &next) == 0 && next == 3 &&
              l.at == 1,
          "n = 0 draws from p_0 (next %d)", next);

    /* n_vocab 1: every draft of id 0 survives, the bonus is 0 */
    const float one[5] = {1, 1, 1, 1, 1};
    const int32_t zeros[4] = {0, 0, 0, 0}, line[4] = {-1, 0, 1, 2};
    CHECK(li_spec_verify_chain(one, one, 1, zeros, 4, urng_fn, &g, scratch, &next) == 4 && next == 0, "vocab 1");
    CHECK(li_spec_verify_chain(one, NULL, 1, zeros, 4, urng_fn, &g, scratch, &next) == 4 && next == 0, "vocab 1 det");
    CHECK(li_spec_verify_tree(one, one, 1, zeros, line, 4, urng_fn, &g, scratch, path, &next) == 4 && next == 0,
          "vocab 1 tree");

    /* a draft outside the vocabulary, or of probability 0 under p, is always
     * rejected, and the token never has probability 0 */
    const float pz[2 * 4] = {0.0f, 0.6f, 0.4f, 0.0f, 0.25f, 0.25f, 0.25f, 0.25f};
    const float qz[1 * 4] = {0.1f, 0.2f, 0.3f, 0.4f};
    int bad = 0;
    for (int t = 0; t < 2000; t++) {
        const int32_t dd[1] = {t % 3 == 0 ? 3 : t % 3 == 1 ? 7 : -2};
        const int32_t a = li_spec_verify_chain(pz, t & 1 ? qz : NULL, 4, dd, 1, urng_fn, &g, scratch, &next);
        if (a != 0 || next < 0 || next > 3 || pz[next] == 0.0f) bad++;
    }
    CHECK(bad == 0, "impossible drafts rejected, next has p > 0 (%d bad)", bad);

    /* the residual's zeros are never drawn: p = {.5,.5,0,0}, q = {.7,.1,.2,0}:
     * after a rejection only id 1 (0.5 - 0.1) has mass */
    const float pr[2 * 4] = {0.5f, 0.5f, 0.0f, 0.0f, 0.25f, 0.25f, 0.25f, 0.25f};
    const float qr[1 * 4] = {0.7f, 0.1f, 0.2f, 0.0f};
    int n_rej = 0, wrong = 0;
    for (int t = 0; t < 4000; t++) {
        const int32_t dd[1] = {t & 1 ? 0 : 2};
        if (li_spec_verify_chain(pr, qr, 4, dd, 1, urng_fn, &g, scratch, &next) == 0) n_rej++, wrong += next != 1;
    }
    CHECK(n_rej > 2000 && wrong == 0, "the residual draws only id 1 (%d rejections, %d wrong)", n_rej, wrong);

    /* p == q but for rounding (p short of 1 by one float step at the draft):
     * a uniform close to 1 rejects the draft, the residual max(p - q, 0)
     * has no mass, and the token comes from p itself */
    const float pe[2 * 4] = {0.125f, 0.125f, 0.25f, nextafterf(0.5f, 0.0f), 0.25f, 0.25f, 0.25f, 0.25f};
    const float qe[2 * 4] = {0.125f, 0.125f, 0.25f, 0.5f, 0.25f, 0.25f, 0.25f, 0.25f};
    const double u_top[2] = {nextafter(1.0, 0.0), 0.9}; /* 0.9 of p: id 3 (of the empty residual: id 0) */
    l = (ulist){u_top, 2, 0};
    const int32_t d3[1] = {3};
    const int32_t a3 = li_spec_verify_chain(pe, qe, 4, d3, 1, ulist_fn, &l, scratch, &next);
    CHECK(a3 == 0 && next == 3 && l.at == 2, "p == q at u -> 1: rejected, the token from p (a %d next %d)", a3,
          next);
    const int32_t pe_par[1] = {-1};
    l = (ulist){u_top, 2, 0};
    const int32_t t3 = li_spec_verify_tree(pe, qe, 4, d3, pe_par, 1, ulist_fn, &l, scratch, path, &next);
    CHECK(t3 == 0 && next == 3 && l.at == 2, "the tree agrees (len %d next %d)", t3, next);

    /* a deterministic child whose p is everything: accepted at any u */
    const float pone[2 * 3] = {0, 1, 0, 0.2f, 0.3f, 0.5f};
    const int32_t d1[1] = {1};
    l = (ulist){u_top, 2, 0};
    CHECK(li_spec_verify_chain(pone, NULL, 3, d1, 1, ulist_fn, &l, scratch, &next) == 1, "p(x) = 1 accepts");

    /* duplicate deterministic children: the second copy is always rejected,
     * the first's rejection removes its mass. p0 = {.5, .3, .2}:
     * children {0, 0, 1}: u .9 rejects 0 (mass .5 left), u 0 rejects the
     * duplicate (p 0), u .7 rejects 1 (.3 / .5 = .6 < .7); the token then
     * comes from {0, 0, .2}: id 2 */
    const float pd[4 * 3] = {0.5f, 0.3f, 0.2f, 1, 0, 0, 1, 0, 0, 1, 0, 0};
    const int32_t dup_tok[3] = {0, 0, 1}, dup_par[3] = {-1, -1, -1};
    const double u_dup[4] = {0.9, 0.0, 0.7, 0.3};
    l = (ulist){u_dup, 4, 0};
    CHECK(li_spec_verify_tree(pd, NULL, 3, dup_tok, dup_par, 3, ulist_fn, &l, scratch, path, &next) == 0 &&
              next == 2 && l.at == 4,
          "duplicate children (next %d, %d uniforms)", next, l.at);
    /* u .55 on the third child accepts it: .3 / .5 = .6 > .55 */
    const double u_dup2[4] = {0.9, 0.0, 0.55, 0.3};
    l = (ulist){u_dup2, 4, 0};
    CHECK(li_spec_verify_tree(pd, NULL, 3, dup_tok, dup_par, 3, ulist_fn, &l, scratch, path, &next) == 1 &&
              path[0] == 2 && next == 0,
          "the renormalised residual accepts the third child (path %d next %d)", path[0], next);

    /* sampled siblings, hand-worked: p0 = {.5,.3,.2}, q0 = {.2,.6,.2},
     * children {1, 1}: u .6 rejects 1 (.3/.6 = .5); r = max(p - q, 0) =
     * {.3, 0, 0} / .3 = {1, 0, 0}: the second 1 has r 0, rejected at any u;
     * the token is then id 0 */
    const float qd[3 * 3] = {0.2f, 0.6f, 0.2f, 1, 0, 0, 1, 0, 0};
    const int32_t sib_tok[2] = {1, 1}, sib_par[2] = {-1, -1};
    const double u_sib[3] = {0.6, 0.0, 0.99};
    l = (ulist){u_sib, 3, 0};
    CHECK(li_spec_verify_tree(pd, qd, 3, sib_tok, sib_par, 2, ulist_fn, &l, scratch, path, &next) == 0 &&
              next == 0 && l.at == 3,
          "sampled siblings against the residual (next %d)", next);

    /* a node whose parent is not before it is never reached */
    const int32_t bad_par[2] = {1, -1}, bt[2] = {0, 1};
    const float pb[3 * 3] = {0, 1, 0, 1, 0, 0, 1, 0, 0};
    CHECK(li_spec_verify_tree(pb, NULL, 3, bt, bad_par, 2, urng_fn, &g, scratch, path, &next) == 1 && path[0] == 1,
          "a bad parent is unreachable");

    /* a row without any mass (a caller's bug): drafts rejected, id 0, no crash */
    const float pzero[3 * 3] = {0};
    const int32_t dz[2] = {1, 2}, zpar[2] = {-1, 0};
    CHECK(li_spec_verify_chain(pzero, pzero, 3, dz, 2, urng_fn, &g, scratch, &next) == 0 && next == 0,
          "an all-zero row (sampled): id 0");
    CHECK(li_spec_verify_chain(pzero, NULL, 3, dz, 2, urng_fn, &g, scratch, &next) == 0 && next == 0,
          "an all-zero row (deterministic): id 0");
    CHECK(li_spec_verify_tree(pzero, NULL, 3, dz, zpar, 2, urng_fn, &g, scratch, path, &next) == 0 && next == 0,
          "an all-zero row (tree): id 0");
    CHECK(li_spec_verify_typical(pzero, 3, dz, zpar, 2, 0.09f, 0.3f, urng_fn, &g, path, &next) == 0 && next == 0,
          "an all-zero row (typical): id 0");

    /* NaN, negative and infinite entries count as 0 */
    const float pn[2 * 3] = {NAN, 0.5f, -1.0f, INFINITY, 0.5f, 0.5f};
    int bad_n = 0;
    for (int t = 0; t < 200; t++) {
        const int32_t dn[1] = {t % 3};
        li_spec_verify_chain(pn, NULL, 3, dn, 1, urng_fn, &g, scratch, &next);
        bad_n += next != 1 && next != 2;
    }
    CHECK(bad_n == 0, "malformed entries are never drawn (%d)", bad_n);
}

/* ==== 2. uniforms, 3. exactness ================================================ */

#define RV 12
#define RK 5

static void test_counts_and_exactness(void) {
    urng g, u;
    urng_seed(&g, 7);
    float p[(RK + 1) * RV], q[(RK + 1) * RV], scratch[2 * RV];
    int bad_count = 0, bad_line = 0, bad_greedy = 0, bad_tree_count = 0, bad_typ = 0;
    for (int t = 0; t < 3000; t++) {
        const int nv = 1 + t % RV, k = t % (RK + 1);
        const bool sampled = t & 1;
        for (int j = 0; j <= k; j++) random_row(&g, p + j * nv, nv, 0.3), random_row(&g, q + j * nv, nv, 0.3);
        int32_t d[RK], par[RK], path[RK], next, next2;
        for (int j = 0; j < k; j++) {
            d[j] = sampled ? draw_row(q + j * nv, nv, urng_next(&g)) : (int32_t)(urng_next(&g) * nv);
            par[j] = j - 1;
        }
        /* documented count: min(a + 1, k) + 1 */
        urng_seed(&u, (uint64_t)t);
        const int32_t a = li_spec_verify_chain(p, sampled ? q : NULL, nv, d, k, urng_fn, &u, scratch, &next);
        const int64_t want = (a + 1 < k ? a + 1 : k) + 1;
        bad_count += u.n != want || a < 0 || a > k || next < 0 || next >= nv || p[a * nv + next] <= 0;
        if (a >= 0 && a < k && next >= 0 && next < nv) {
            /* the residual never yields a token with max(p - q, 0) == 0 unless it fell back to p */
            const float r = sampled ? p[a * nv + next] - q[a * nv + next] : (next == d[a] ? 0 : p[a * nv + next]);
            bool fallback = true;
            for (int i = 0; i < nv; i++)
                if ((sampled ? p[a * nv + i] - q[a * nv + i] : (i == d[a] ? 0 : p[a * nv + i])) > 0) fallback = false;
            bad_count += r <= 0 && !fallback;
        }
        /* the chain is the line tree */
        urng_seed(&u, (uint64_t)t);
        const int32_t b = li_spec_verify_tree(p, sampled ? q : NULL, nv, d, par, k, urng_fn, &u, scratch, path, &next2);
        bad_line += a != b || next != next2 || u.n != want;
        for (int j = 0; j < b; j++) bad_line += path[j] != j;

        /* a one-hot p: exactly greedy verification */
        int32_t am[RK + 1];
        for (int j = 0; j <= k; j++) {
            am[j] = (int32_t)(urng_next(&g) * nv);
            for (int i = 0; i < nv; i++) p[j * nv + i] = i == am[j] ? 1.0f : 0.0f;
        }
        for (int j = 0; j < k; j++)
            if (urng_next(&g) < 0.7) d[j] = am[j]; /* mostly right drafts */
        int match = 0;
        while (match < k && d[match] == am[match]) match++;
        urng_seed(&u, (uint64_t)t + 1000003);
        const int32_t c = li_spec_verify_chain(p, sampled ? q : NULL, nv, d, k, urng_fn, &u, scratch, &next);
        bad_greedy += c != match || next != am[match];
        const int32_t c2 = li_spec_verify_tree(p, sampled ? q : NULL, nv, d, par, k, urng_fn, &u, scratch, path, &next);
        bad_greedy += c2 != match || next != am[match];
        const int32_t c3 = li_spec_verify_typical(p, nv, d, par, k, 0.09f, 0.3f, NULL, NULL, path, &next);
        bad_typ += c3 != match || next != am[match];
    }
    CHECK(bad_count == 0, "chain uniforms = min(a + 1, k) + 1, next valid (%d bad)", bad_count);
    CHECK(bad_line == 0, "chain == line tree with the same uniforms (%d bad)", bad_line);
    CHECK(bad_greedy == 0, "one-hot p: greedy verification (%d bad)", bad_greedy);
    CHECK(bad_typ == 0, "one-hot p: typical acceptance is greedy (%d bad)", bad_typ);

    /* trees: one uniform per child tried + one; random shapes */
    for (int t = 0; t < 2000; t++) {
        const int nv = 2 + t % 7, n = t % 9;
        const bool sampled = t & 1;
        float tp[10 * 8], tq[10 * 8], ts[2 * 8];
        int32_t tok[9], par[9], path[9], next;
        for (int i = 0; i <= n; i++) random_row(&g, tp + i * nv, nv, 0.3), random_row(&g, tq + i * nv, nv, 0.3);
        for (int i = 0; i < n; i++) par[i] = (int32_t)(urng_next(&g) * (i + 1)) - 1, tok[i] = (int32_t)(urng_next(&g) * nv);
        /* count the children tried: replay the path */
        urng_seed(&u, (uint64_t)t);
        const int32_t len = li_spec_verify_tree(tp, sampled ? tq : NULL, nv, tok, par, n, urng_fn, &u, ts, path, &next);
        int64_t tried = 0;
        int32_t c = -1;
        for (int32_t j = 0; j <= len; j++) {
            const int32_t stop = j < len ? path[j] : n;
            for (int i = c + 1; i < n; i++)
                if (par[i] == c && i <= stop) tried++;
            if (j < len) {
                bad_tree_count += par[path[j]] != c;
                c = path[j];
            }
        }
        bad_tree_count += u.n != tried + 1 || next < 0 || next >= nv || tp[(c + 1) * nv + next] <= 0;
    }
    CHECK(bad_tree_count == 0, "tree uniforms = children tried + 1, a valid path (%d bad)", bad_tree_count);

    /* typical acceptance by hand: p0 = {.6,.3,.1} has H = .898 nats, delta
     * e^-H = .3 * .407 = .122, so the threshold is min(.09, .122) = .09:
     * ids 0 and 1 pass, 2 fails. Node 0 (id 2) fails; node 1 (id 1) passes,
     * node 2 (child of 1, id 0 under one-hot row 2 at id 0) passes. */
    const float pt[4 * 3] = {0.6f, 0.3f, 0.1f, 1, 0, 0, 1, 0, 0, 0.2f, 0.1f, 0.7f};
    const int32_t tt[3] = {2, 1, 0}, tpar[3] = {-1, -1, 1};
    int32_t path[3], next;
    const int32_t tl = li_spec_verify_typical(pt, 3, tt, tpar, 3, 0.09f, 0.3f, NULL, NULL, path, &next);
    CHECK(tl == 2 && path[0] == 1 && path[1] == 2 && next == 2, "typical by hand (len %d next %d)", tl, next);
    /* epsilon .05 lets id 2 (p .1) pass too; the deeper path still wins */
    const int32_t tl2 = li_spec_verify_typical(pt, 3, tt, tpar, 3, 0.05f, 0.3f, NULL, NULL, path, &next);
    CHECK(tl2 == 2 && path[0] == 1, "typical: the deepest path wins");
    /* with a uniform: one draw for next */
    urng_seed(&u, 3);
    li_spec_verify_typical(pt, 3, tt, tpar, 3, 0.09f, 0.3f, urng_fn, &u, path, &next);
    CHECK(u.n == 1, "typical with a uniform takes one");
}

/* ==== the Markov experiment ==================================================== */

#define MV 8
#define MAX_SLOTS 6
static float TP[MV][MV], TQ[MV][MV]; /* target p(y | x), draft q(y | x) */

/* Fixed, known distributions: p and q differ everywhere, each has its own
 * zeros (q proposes ids p never emits; p emits ids q never proposes). */
static void model_init(void) {
    urng g;
    urng_seed(&g, 20230518);
    for (int a = 0; a < MV; a++) {
        double sp = 0, sq = 0;
        for (int y = 0; y < MV; y++) { /* q leans towards p (drafts get accepted), not too much */
            const double gp = urng_next(&g), gq = urng_next(&g);
            TP[a][y] = (float)exp(3.0 * gp);
            TQ[a][y] = (float)exp(3.0 * (0.5 * gp + 0.5 * gq));
        }
        TP[a][(a + 3) % MV] = 0; /* p: impossible, q: proposes it */
        TQ[a][(a + 5) % MV] = 0; /* q: never proposes, p: needs the residual */
        for (int y = 0; y < MV; y++) sp += TP[a][y], sq += TQ[a][y];
        for (int y = 0; y < MV; y++) TP[a][y] = (float)(TP[a][y] / sp), TQ[a][y] = (float)(TQ[a][y] / sq);
    }
}

/* id of rank r (0: most likely) in a row; ties: lower id first */
static int32_t rank_row(const float *row, int nv, int r) {
    bool used[MV] = {0};
    int32_t b = 0;
    for (int k = 0; k <= r; k++) {
        b = -1;
        for (int i = 0; i < nv; i++)
            if (!used[i] && (b < 0 || row[i] > row[b])) b = i;
        used[b] = true;
    }
    return b;
}

/* ---- deliberately wrong rules (test-only) ---- */

typedef enum rule {
    RULE_OK,
    RULE_RESIDUAL_P,    /* chain: on rejection draw from p, not max(p - q, 0) */
    RULE_BONUS_PREV,    /* chain: the bonus from p_{k-1} instead of p_k */
    RULE_NO_RESIDUAL,   /* tree, sampled: every sibling against p, not the residual */
    RULE_NO_RENORM,     /* tree, deterministic: accept with p(x), not r(x) renormalised */
    RULE_TYPICAL,       /* Medusa's typical acceptance: not lossless */
} rule;

static int32_t wrong_chain(rule rl, const float *p, const float *q, int nv, const int32_t *d, int k, urng *u,
                           int32_t *next) {
    for (int j = 0; j < k; j++) {
        const double px = p[j * nv + d[j]], qx = q ? q[j * nv + d[j]] : 1.0;
        if (urng_fn(u) * qx < px) continue;
        if (rl == RULE_RESIDUAL_P) {
            *next = draw_row(p + j * nv, nv, urng_fn(u));
        } else { /* the correct residual */
            float r[MV];
            for (int i = 0; i < nv; i++) r[i] = fmaxf(p[j * nv + i] - (q ? q[j * nv + i] : i == d[j]), 0.0f);
            *next = draw_row(r, nv, urng_fn(u));
        }
        return j;
    }
    *next = draw_row(p + (rl == RULE_BONUS_PREV && k > 0 ? k - 1 : k) * nv, nv, urng_fn(u));
    return k;
}

static int32_t wrong_tree(rule rl, const float *p, const float *q, int nv, const int32_t *tok, const int32_t *par,
                          int n, urng *u, int32_t *path, int32_t *next) {
    int32_t len = 0, c = -1;
    for (;;) {
        const float *pc = p + (c + 1) * nv, *qc = q ? q + (c + 1) * nv : NULL;
        float r[MV];
        for (int i = 0; i < nv; i++) r[i] = pc[i];
        int32_t acc = -1;
        for (int i = c + 1; i < n && acc < 0; i++) {
            if (par[i] != c) continue;
            const int32_t x = tok[i];
            const double uu = urng_fn(u);
            if (qc) { /* RULE_NO_RESIDUAL: min(1, p/q) for every sibling */
                if (uu * qc[x] < pc[x]) acc = i;
                else
                    for (int v = 0; v < nv; v++) r[v] = fmaxf(pc[v] - qc[v], 0.0f);
            } else { /* RULE_NO_RENORM: p(x) for every sibling */
                if (uu < r[x]) acc = i;
                else r[x] = 0;
            }
        }
        if (acc >= 0) {
            path[len++] = c = acc;
            continue;
        }
        double s = 0;
        for (int v = 0; v < nv; v++) s += r[v];
        *next = draw_row(s > 0 ? r : pc, nv, urng_fn(u));
        return len;
    }
}

/* ---- the tree of the experiment: width 3, depth 4 ----
 *   root -> 0, 1, 2;  0 -> 3, 4;  1 -> 5;  3 -> 6, 7;  6 -> 8 */
#define TN 9
static const int32_t TREE_PAR[TN] = {-1, -1, -1, 0, 0, 1, 3, 3, 6};
static const int32_t TREE_SIB[TN] = {0, 1, 2, 0, 1, 0, 0, 1, 0}; /* index among siblings */
static const int32_t RANK_DUP[3] = {0, 0, 1}; /* deterministic with a duplicate: ranks 0, 0, 1 */

typedef struct exp_case {
    const char *name;
    bool tree, sampled, dup;
    int k;
    rule rl;
    bool lossless; /* the chi-square test must pass (else: must fail) */
} exp_case;

static const exp_case CASES[] = {
    {"chain-sampled-k1", false, true, false, 1, RULE_OK, true},
    {"chain-sampled-k2", false, true, false, 2, RULE_OK, true},
    {"chain-sampled-k3", false, true, false, 3, RULE_OK, true},
    {"chain-sampled-k4", false, true, false, 4, RULE_OK, true},
    {"chain-det-k1", false, false, false, 1, RULE_OK, true},
    {"chain-det-k2", false, false, false, 2, RULE_OK, true},
    {"chain-det-k3", false, false, false, 3, RULE_OK, true},
    {"chain-det-k4", false, false, false, 4, RULE_OK, true},
    {"tree-sampled", true, true, false, 0, RULE_OK, true},
    {"tree-det", true, false, false, 0, RULE_OK, true},
    {"tree-det-dup", true, false, true, 0, RULE_OK, true},
    {"wrong-chain-residual-p", false, true, false, 2, RULE_RESIDUAL_P, false},
    {"wrong-chain-det-residual-p", false, false, false, 3, RULE_RESIDUAL_P, false},
    {"wrong-chain-bonus", false, true, false, 3, RULE_BONUS_PREV, false},
    {"wrong-tree-no-residual", true, true, false, 0, RULE_NO_RESIDUAL, false},
    {"wrong-tree-no-renorm", true, false, false, 0, RULE_NO_RENORM, false},
    {"typical-k3", false, true, false, 3, RULE_TYPICAL, false},
};
#define N_CASES ((int)(sizeof CASES / sizeof *CASES))

typedef struct exp_result {
    int64_t counts[MAX_SLOTS][MV][MV]; /* [slot][x][y]: y emitted after x at position slot of its step */
    int64_t tokens, steps, drafted, accepted, uniforms;
    int slots;
    uint64_t hash; /* of the emitted sequence */
} exp_result;

/* One speculative step from context x: writes the emitted tokens to out,
 * returns how many. */
static int exp_step(const exp_case *ec, int32_t x, urng *gd, urng *gu, exp_result *res, int32_t *out) {
    float p[(TN + 1) * MV], q[(TN + 1) * MV], scratch[2 * MV];
    int32_t tok[TN], path[TN], next, n;
    const int32_t *par;
    int32_t lin[TN];
    if (!ec->tree) {
        n = ec->k;
        for (int j = 0; j < n; j++) {
            const int32_t ctx = j ? tok[j - 1] : x;
            tok[j] = ec->sampled ? draw_row(TQ[ctx], MV, urng_next(gd)) : argmax_row(TQ[ctx], MV);
            lin[j] = j - 1;
        }
        par = lin;
    } else {
        n = TN;
        par = TREE_PAR;
        for (int i = 0; i < n; i++) {
            const int32_t ctx = par[i] < 0 ? x : tok[par[i]];
            tok[i] = ec->sampled ? draw_row(TQ[ctx], MV, urng_next(gd))
                                 : rank_row(TQ[ctx], MV, ec->dup ? RANK_DUP[TREE_SIB[i]] : TREE_SIB[i]);
        }
    }
    /* row 0 at the root, row i + 1 after node i (for a chain: after draft i) */
    for (int i = 0; i <= n; i++) {
        const int32_t ctx = i ? tok[i - 1] : x;
        memcpy(p + i * MV, TP[ctx], sizeof TP[ctx]);
        memcpy(q + i * MV, TQ[ctx], sizeof TQ[ctx]);
    }
    const int64_t before = gu->n;
    int32_t a, m = 0;
    if (!ec->tree) {
        if (ec->rl == RULE_OK)
            a = li_spec_verify_chain(p, ec->sampled ? q : NULL, MV, tok, n, urng_fn, gu, scratch, &next);
        else if (ec->rl == RULE_TYPICAL)
            a = li_spec_verify_typical(p, MV, tok, lin, n, 0.09f, 0.3f, urng_fn, gu, path, &next);
        else
            a = wrong_chain(ec->rl, p, ec->sampled ? q : NULL, MV, tok, n, gu, &next);
        for (int j = 0; j < a; j++) out[m++] = tok[j];
    } else {
        if (ec->rl == RULE_OK)
            a = li_spec_verify_tree(p, ec->sampled ? q : NULL, MV, tok, par, n, urng_fn, gu, scratch, path, &next);
        else
            a = wrong_tree(ec->rl, p, ec->sampled ? q : NULL, MV, tok, par, n, gu, path, &next);
        for (int j = 0; j < a; j++) out[m++] = tok[path[j]];
    }
    out[m++] = next;
    res->steps++, res->drafted += ec->tree ? 0 : n, res->accepted += a, res->uniforms += gu->n - before;
    return m;
}

static void exp_run(const exp_case *ec, int64_t n_tokens, uint64_t seed, exp_result *res) {
    memset(res, 0, sizeof *res);
    urng gd, gu;
    urng_seed(&gd, seed);
    urng_seed(&gu, seed ^ 0x5bd1e995ull);
    res->slots = ec->tree ? 5 : ec->k + 1;
    res->hash = 1469598103934665603ull;
    int32_t x = 0, out[TN + 1];
    while (res->tokens < n_tokens) {
        const int m = exp_step(ec, x, &gd, &gu, res, out);
        for (int s = 0; s < m; s++) {
            res->counts[s][x][out[s]]++;
            res->hash = (res->hash ^ (uint64_t)out[s]) * 1099511628211ull;
            x = out[s];
        }
        res->tokens += m;
    }
}

/* The chi-square statistic of the transitions against TP: rows (slot, x)
 * with an expected count >= 5 in every possible cell stand alone, the rest
 * of each x is pooled (a pool still too small is left out); every emitted
 * transition of probability 0 is counted in *impossible. */
static double exp_chi2(const exp_result *res, int *df, int64_t *impossible) {
    double chi = 0;
    *df = 0, *impossible = 0;
    for (int x = 0; x < MV; x++) {
        double pmin = 1;
        int support = 0;
        for (int y = 0; y < MV; y++)
            if (TP[x][y] > 0) pmin = fmin(pmin, TP[x][y]), support++;
        int64_t pool[MV] = {0};
        for (int s = 0; s <= res->slots; s++) {
            const int64_t *row = s < res->slots ? res->counts[s][x] : pool;
            int64_t nrow = 0;
            for (int y = 0; y < MV; y++) nrow += row[y];
            if (s < res->slots) /* in every row, pooled or dropped */
                for (int y = 0; y < MV; y++) *impossible += TP[x][y] <= 0 ? row[y] : 0;
            if (s < res->slots && nrow * pmin < 5) {
                for (int y = 0; y < MV; y++) pool[y] += row[y];
                continue;
            }
            if (nrow * pmin < 5) continue; /* a small pool: dropped */
            for (int y = 0; y < MV; y++) {
                if (TP[x][y] <= 0) continue;
                const double e = (double)nrow * TP[x][y];
                chi += (row[y] - e) * (row[y] - e) / e;
            }
            *df += support - 1;
        }
    }
    return chi;
}

/* Wilson-Hilferty: chi2(df) as a standard normal z */
static double chi2_z(double chi, int df) {
    const double v = 2.0 / (9.0 * df);
    return (cbrt(chi / df) - (1 - v)) / sqrt(v);
}

/* ==== 4. the same seed, 5. a small experiment ================================== */

/* The verifiers with rows on demand (li_spec_verify_chain_rows, _tree_rows)
 * against the dense ones on the same uniforms: the same result, token and
 * uniforms, and the rows asked for are exactly the ones the rule reads, each
 * once: a chain's 0..a (0..k when every draft passed), in order; a tree's
 * root and then each accepted node's. */
typedef struct {
    const float *p;
    int32_t nv, asked[32], n_asked;
} row_log;

static const float *logged_row(void *ctx, int32_t j) {
    row_log *l = ctx;
    if (l->n_asked < 32) l->asked[l->n_asked] = j;
    l->n_asked++;
    return l->p + (size_t)j * l->nv;
}

static void test_rows_on_demand(void) {
    enum { NV = 6, K = 5 };
    static const int32_t tpar[K] = {-1, -1, 0, 0, 2};
    float p[(K + 1) * NV], q[(K + 1) * NV], scratch[2 * NV];
    int32_t d[K], path[K];
    urng g, u;
    urng_seed(&g, 77);
    int bad_chain = 0, bad_tree = 0, rejected_early = 0;
    for (int t = 0; t < 4000; t++) {
        const bool sampled = t & 1;
        for (int j = 0; j <= K; j++) {
            double sp = 0, sq = 0;
            for (int i = 0; i < NV; i++) {
                p[j * NV + i] = (float)urng_next(&g), q[j * NV + i] = (float)urng_next(&g);
                sp += p[j * NV + i], sq += q[j * NV + i];
            }
            for (int i = 0; i < NV; i++) p[j * NV + i] = (float)(p[j * NV + i] / sp), q[j * NV + i] = (float)(q[j * NV + i] / sq);
        }
        for (int j = 0; j < K; j++) d[j] = (int32_t)(urng_next(&g) * NV);
        /* chain */
        int32_t next = -1, next2 = -1;
        urng_seed(&u, (uint64_t)t);
        const int32_t a = li_spec_verify_chain(p, sampled ? q : NULL, NV, d, K, urng_fn, &u, scratch, &next);
        const int64_t used = u.n;
        row_log l = {p, NV, {0}, 0};
        urng_seed(&u, (uint64_t)t);
        const int32_t b = li_spec_verify_chain_rows(logged_row, &l, sampled ? q : NULL, NV, d, K, urng_fn, &u, scratch,
                                                    &next2);
        bad_chain += a != b || next != next2 || u.n != used || l.n_asked != (a < K ? a + 1 : K + 1);
        for (int j = 0; j < l.n_asked && j < 32; j++) bad_chain += l.asked[j] != j;
        rejected_early += a < K - 1;
        /* tree */
        urng_seed(&u, (uint64_t)t + 5000);
        const int32_t c = li_spec_verify_tree(p, sampled ? q : NULL, NV, d, tpar, K, urng_fn, &u, scratch, path, &next);
        const int64_t used_t = u.n;
        int32_t path2[K];
        l.n_asked = 0;
        urng_seed(&u, (uint64_t)t + 5000);
        const int32_t e = li_spec_verify_tree_rows(logged_row, &l, sampled ? q : NULL, NV, d, tpar, K, urng_fn, &u,
                                                   scratch, path2, &next2);
        bad_tree += c != e || next != next2 || u.n != used_t || l.n_asked != c + 1 || l.asked[0] != 0;
        for (int j = 0; j < c && j < K; j++) bad_tree += path[j] != path2[j] || l.asked[j + 1] != path[j] + 1;
    }
    CHECK(bad_chain == 0 && rejected_early > 100,
          "chain rows on demand: the dense result, rows 0..a only, in order (%d bad; %d rounds rejected early)",
          bad_chain, rejected_early);
    CHECK(bad_tree == 0, "tree rows on demand: the dense result, the root's and the accepted nodes' rows only (%d bad)",
          bad_tree);
    row_log l = {p, NV, {0}, 0};
    int32_t next = 0;
    CHECK(li_spec_verify_chain_rows(NULL, &l, NULL, NV, d, 1, urng_fn, &u, scratch, &next) == -1 && next == -1 &&
              li_spec_verify_tree_rows(NULL, &l, NULL, NV, d, tpar, 1, urng_fn, &u, scratch, path, &next) == -1,
          "a NULL row function is a bad argument");
}

static void test_seeds(void) {
    exp_result *a = calloc(3, sizeof *a);
    for (int c = 0; c < N_CASES; c++) {
        if (CASES[c].rl != RULE_OK) continue;
        exp_run(&CASES[c], 20000, 11, &a[0]);
        exp_run(&CASES[c], 20000, 11, &a[1]);
        exp_run(&CASES[c], 20000, 12, &a[2]);
        CHECK(a[0].hash == a[1].hash && a[0].uniforms == a[1].uniforms, "%s: the same seed, the same tokens",
              CASES[c].name);
        CHECK(a[0].hash != a[2].hash, "%s: another seed, other tokens", CASES[c].name);
    }
    free(a);
}

static void test_small_experiment(void) {
    exp_result *r = malloc(sizeof *r);
    for (int c = 0; c < N_CASES; c++) {
        const exp_case *ec = &CASES[c];
        exp_run(ec, 200000, 2024, r);
        int df;
        int64_t imp;
        const double chi = exp_chi2(r, &df, &imp), z = chi2_z(chi, df);
        const bool pass = imp == 0 && z < 4.75; /* one-sided p ~ 1e-6 */
        printf("%-28s chi2 %10.1f df %3d z %8.2f impossible %lld accept %.3f/step\n", ec->name, chi, df, z,
               (long long)imp, (double)r->accepted / (double)r->steps);
        if (ec->lossless) CHECK(pass, "%s: lossless (chi2 %.1f, df %d, z %.2f, impossible %lld)", ec->name, chi, df, z,
                                (long long)imp);
        else CHECK(!pass && (imp > 0 || z > 10), "%s: the wrong rule is caught (z %.2f)", ec->name, z);
    }
    free(r);
}

/* ==== modes for the pytest ======================================================= */

static void print_row(const float *row, int nv) {
    putchar('[');
    for (int i = 0; i < nv; i++) printf("%s%.9g", i ? "," : "", row[i]);
    putchar(']');
}

static int mode_stats(const char *name, int64_t n_tokens, uint64_t seed) {
    const exp_case *ec = NULL;
    for (int c = 0; c < N_CASES; c++)
        if (!strcmp(CASES[c].name, name)) ec = &CASES[c];
    if (!ec) {
        fprintf(stderr, "test_spec_verify: unknown case '%s' (see --list)\n", name);
        return 2;
    }
    exp_result *r = malloc(sizeof *r);
    exp_run(ec, n_tokens, seed, r);
    printf("{\"case\":\"%s\",\"lossless\":%s,\"tree\":%s,\"sampled\":%s,\"k\":%d,\"seed\":%llu,\"vocab\":%d,",
           ec->name, ec->lossless ? "true" : "false", ec->tree ? "true" : "false", ec->sampled ? "true" : "false",
           ec->k, (unsigned long long)seed, MV);
    printf("\"tokens\":%lld,\"steps\":%lld,\"drafted\":%lld,\"accepted\":%lld,\"uniforms\":%lld,\"slots\":%d,",
           (long long)r->tokens, (long long)r->steps, (long long)r->drafted, (long long)r->accepted,
           (long long)r->uniforms, r->slots);
    printf("\"hash\":\"%016llx\",\"target\":[", (unsigned long long)r->hash);
    for (int a = 0; a < MV; a++) printf("%s", a ? "," : ""), print_row(TP[a], MV);
    printf("],\"draft\":[");
    for (int a = 0; a < MV; a++) printf("%s", a ? "," : ""), print_row(TQ[a], MV);
    printf("],\"counts\":[");
    for (int s = 0; s < r->slots; s++) {
        printf("%s[", s ? "," : "");
        for (int x = 0; x < MV; x++) {
            printf("%s[", x ? "," : "");
            for (int y = 0; y < MV; y++) printf("%s%lld", y ? "," : "", (long long)r->counts[s][x][y]);
            putchar(']');
        }
        putchar(']');
    }
    printf("]}\n");
    free(r);
    return 0;
}

/* N random calls: chain and tree, sampled and deterministic, with zeros. */
static int mode_draws(int n_draws, uint64_t seed) {
    urng g;
    urng_seed(&g, seed);
    printf("[");
    for (int t = 0; t < n_draws; t++) {
        const bool tree = t & 2, sampled = t & 1;
        const int nv = 2 + (int)(urng_next(&g) * 9), n = (int)(urng_next(&g) * (tree ? 8 : 5));
        float p[9 * 10], q[9 * 10], scratch[2 * 10];
        int32_t tok[8], par[8], path[8], next;
        for (int i = 0; i <= n; i++) random_row(&g, p + i * nv, nv, 0.25), random_row(&g, q + i * nv, nv, 0.25);
        for (int i = 0; i < n; i++) {
            par[i] = tree ? (int32_t)(urng_next(&g) * (i + 1)) - 1 : i - 1;
            const float *qrow = q + (par[i] + 1) * nv;
            tok[i] = sampled ? draw_row(qrow, nv, urng_next(&g)) : (int32_t)(urng_next(&g) * nv);
        }
        double ulog[32];
        urng u;
        urng_seed(&u, seed * 1000 + (uint64_t)t);
        u.log = ulog, u.log_cap = 32;
        const int32_t a = tree ? li_spec_verify_tree(p, sampled ? q : NULL, nv, tok, par, n, urng_fn, &u, scratch,
                                                     path, &next)
                               : li_spec_verify_chain(p, sampled ? q : NULL, nv, tok, n, urng_fn, &u, scratch, &next);
        printf("%s{\"tree\":%s,\"sampled\":%s,\"vocab\":%d,\"n\":%d,\"p\":[", t ? ",\n" : "", tree ? "true" : "false",
               sampled ? "true" : "false", nv, n);
        for (int i = 0; i <= n; i++) printf("%s", i ? "," : ""), print_row(p + i * nv, nv);
        printf("],\"q\":[");
        for (int i = 0; i <= n; i++) printf("%s", i ? "," : ""), print_row(q + i * nv, nv);
        printf("],\"token\":[");
        for (int i = 0; i < n; i++) printf("%s%d", i ? "," : "", tok[i]);
        printf("],\"parent\":[");
        for (int i = 0; i < n; i++) printf("%s%d", i ? "," : "", par[i]);
        printf("],\"uniforms\":[");
        for (int64_t i = 0; i < u.n && i < 32; i++) printf("%s%.17g", i ? "," : "", ulog[i]);
        printf("],\"accepted\":%d,\"path\":[", a);
        for (int i = 0; tree && i < a; i++) printf("%s%d", i ? "," : "", path[i]);
        printf("],\"next\":%d}", next);
    }
    printf("]\n");
    return 0;
}

int main(int argc, char **argv) {
    model_init();
    const char *stats = NULL;
    int64_t n_tokens = 1000000, n_draws = -1;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--list")) {
            for (int c = 0; c < N_CASES; c++) printf("%s%s\n", CASES[c].name, CASES[c].lossless ? "" : " wrong");
            return 0;
        } else if (!strcmp(a, "--stats") && v) stats = v, i++;
        else if (!strcmp(a, "--tokens") && v) n_tokens = strtoll(v, NULL, 10), i++;
        else if (!strcmp(a, "--seed") && v) seed = strtoull(v, NULL, 10), i++;
        else if (!strcmp(a, "--draws") && v) n_draws = strtoll(v, NULL, 10), i++;
        else {
            fprintf(stderr, "usage: test_spec_verify [--stats CASE [--tokens N] [--seed S] | --draws N [--seed S] | --list]\n");
            return 2;
        }
    }
    if (n_tokens < 1 || n_tokens > 1000000000 || n_draws > 100000) {
        fprintf(stderr, "test_spec_verify: --tokens must be in [1, 1e9], --draws at most 1e5\n");
        return 2;
    }
    if (stats) return mode_stats(stats, n_tokens, seed);
    if (n_draws >= 0) return mode_draws((int)n_draws, seed);

    test_edges();
    test_counts_and_exactness();
    test_seeds();
    test_rows_on_demand();
    test_small_experiment();
    return t_summary("test_spec_verify");
}
