/* test_sampler.c — the sampling chain: greedy, top-k/p, min-p, penalties,
 * seeds, logprobs, and that draws follow the softmax they should. */
#include "sample/sampler.h"
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NV 50

/* the candidate tests' draws per set: a third under the sanitizers (the
 * same code paths and checks; the plain build draws them all) */
#if defined(__SANITIZE_ADDRESS__)
#define CAND_DRAWS 1002
#else
#define CAND_DRAWS 3000
#endif

static void fill(float *l, int n, unsigned seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        l[i] = (float)((seed >> 8) % 2000) / 200.0f - 5.0f;
    }
}

/* the n largest of l (nv), sorted by value descending then id ascending, as
 * a device's top-k returns them: a plain reference (insertion into a sorted
 * list, every element compared) */
static void largest(const float *l, int nv, int n, float *vals, int32_t *ids) {
    int have = 0;
    for (int i = 0; i < nv; i++) {
        int at = have;
        while (at > 0 && (l[i] > vals[at - 1])) at--; /* ties: the earlier (lower) id stays first */
        if (at >= n) continue;
        for (int j = (have < n ? have : n - 1); j > at; j--) {
            vals[j] = vals[j - 1];
            ids[j] = ids[j - 1];
        }
        vals[at] = l[i];
        ids[at] = i;
        if (have < n) have++;
    }
}

/* b's draw from the k largest of l (v) and the raw logits of the ids it
 * edits, as a device's fetch gives them */
static int32_t draw_cand(li_sampler *b, const float *l, int v, int k, float *vals, int32_t *ids,
                         li_token_logprob *top, float *lp) {
    int32_t eids[LI_SAMPLER_EDIT_MAX];
    float ev[LI_SAMPLER_EDIT_MAX];
    largest(l, v, k, vals, ids);
    const int32_t ne = li_sampler_edit_ids(b, eids, LI_SAMPLER_EDIT_MAX);
    if (ne < 0) return -1;
    for (int j = 0; j < ne; j++) ev[j] = l[eids[j]];
    const float sc = li_sampler_cand_scale(b);
    const li_sampler_cands cd = {vals, ids, k, li_sampler_lse(l, v), sc > 0 ? li_sampler_lse_scaled(l, v, sc) : NAN,
                                 eids, ev, ne};
    return li_sampler_sample_cand(b, &cd, top, lp);
}

/* one draw's logits (v), by family: d % 3 == 0 peaked as a model's (a few
 * far above the rest, on a grid of 1/16 so the peak has ties too), 1 on a
 * grid of 0.25 (many ties), 2 flat on a fine grid */
static void cand_logits(float *l, int v, int d, unsigned *seed) {
    for (int i = 0; i < v; i++) {
        *seed = *seed * 1103515245u + 12345u;
        const double uu = (double)((*seed >> 8) % 65536) / 65536.0;
        l[i] = d % 3 == 1   ? (float)((*seed >> 8) % 64) * 0.25f - 8.0f
               : d % 3 == 2 ? (float)((*seed >> 8) % 65536) / 4096.0f - 8.0f
                            : (float)floor(16 * 24 * pow(uu, 12)) / 16.0f - 6.0f;
    }
}

/* One draw by three samplers of one seed: a by the full chain (a reference
 * sampler: sorts every kept logit), f by li_sampler_sample, by sample_u
 * with a's uniform and no distribution and with it (their paths from the
 * largest logits: the same token, the same distribution's bits), b from
 * the k largest of l and the
 * raw logits it edits (its logits when they cannot decide; d % 3, the
 * logits' family, counts the fallbacks). Returns a's token. */
typedef struct {
    int same, lp_same, fast_same, fallbacks, fam[3];
} draws3;

/* draw3's samplers of one setting: a marked reference (the full chain) */
static void samplers3(li_sampler *a, li_sampler *b, li_sampler *f, const li_sampling_params *p, int v) {
    li_error err = {0};
    CHECK(li_sampler_init(a, p, v, &err) == 0 && li_sampler_init(b, p, v, &err) == 0 &&
              li_sampler_init(f, p, v, &err) == 0,
          "%s", err.msg);
    a->reference = true;
}

static int32_t draw3(li_sampler *a, li_sampler *b, li_sampler *f, const float *l, int v, int k, int d, int n_lp,
                     draws3 *st) {
    float vals[LI_SAMPLER_CAND_WIDE], la, lb, lf;
    int32_t ids[LI_SAMPLER_CAND_WIDE];
    li_token_logprob ta[20], tb[20], tf[20];
    static float probs[4096], probs_f[4096];
    const double u = li_sampler_uniform(a);
    const int32_t want = li_sampler_sample_u(a, l, u, probs, ta, &la);
    st->fast_same &= li_sampler_sample_u(f, l, u, NULL, NULL, NULL) == want; /* leaves f's RNG as it was */
    st->fast_same &= li_sampler_sample_u(f, l, u, probs_f, NULL, NULL) == want &&
                     !memcmp(probs, probs_f, (size_t)v * sizeof *probs);
    st->fast_same &= li_sampler_sample(f, l, tf, &lf) == want && lf == la && !memcmp(ta, tf, (size_t)n_lp * sizeof *ta);
    int32_t got = draw_cand(b, l, v, k, vals, ids, tb, &lb);
    if (got < 0) {
        st->fallbacks++;
        st->fam[d % 3]++;
        got = li_sampler_sample(b, l, tb, &lb);
    }
    st->same &= got == want;
    st->lp_same &= la == lb && !memcmp(ta, tb, (size_t)n_lp * sizeof *ta);
    return want;
}

/* li_sampler_sample_cand against li_sampler_sample, draw for draw: two
 * samplers of one seed, one on the full logits, one on the 64 largest
 * (falling back to the logits when it says it cannot decide). The draws'
 * logits take turns: on a grid of 0.25 (many ties, some at the top_k
 * boundary), on a fine grid (flat: the 64 largest hold little of the
 * mass), and peaked as a model's (a few far above the rest, on a grid of
 * 1/16 so the peak has ties too); 3,000 draws a setting. Settings whose
 * kept set can reach past the 64 (top_k off or larger) bound the rest by
 * the row's lse. */
static void test_cand(void) {
    enum { V = 700, K = 64, DRAWS = CAND_DRAWS };
    const struct { float t, top_p, min_p; int32_t top_k, n_logprobs; bool logprob; } sets[] = {
        {0.0f, 1.0f, 0.0f, 40, 0, false}, {0.7f, 0.95f, 0.05f, 40, 0, false}, {1.3f, 1.0f, 0.0f, 1, 0, false},
        {1.0f, 0.9f, 0.0f, 63, 0, false}, {0.8f, 1.0f, 0.1f, 10, 0, false}, {2.0f, 0.5f, 0.0f, 25, 0, false},
        /* wide: top_k 64 or more, or off */
        {0.7f, 0.95f, 0.05f, 64, 0, false}, {0.7f, 0.95f, 0.05f, 0, 0, false}, {1.0f, 1.0f, 0.0f, 0, 0, false},
        {0.7f, 1.0f, 0.0f, 0, 0, false}, {1.5f, 1.0f, 0.0f, 0, 0, false}, {0.7f, 0.9f, 0.0f, 0, 0, false},
        {1.0f, 1.0f, 0.05f, 0, 0, false}, {0.9f, 0.99f, 0.0f, 100, 0, false}, {1.2f, 1.0f, 0.0f, 200, 0, false},
        {0.3f, 1.0f, 0.0f, 0, 0, false}, {3.0f, 0.8f, 0.0f, 0, 0, false},
        /* logprobs: the top 5 (or the chosen alone) reported from the candidates and the row's lse */
        {0.0f, 1.0f, 0.0f, 40, 5, false}, {0.8f, 0.95f, 0.05f, 40, 5, false}, {0.8f, 0.95f, 0.05f, 3, 20, false},
        {0.8f, 1.0f, 0.0f, 40, 0, true}, {1.0f, 0.9f, 0.0f, 0, 3, true},
    };
    float *l = malloc(V * sizeof(float)), vals[K];
    int32_t ids[K];
    li_error err = {0};
    for (size_t si = 0; si < sizeof sets / sizeof sets[0]; si++) {
        li_sampling_params p;
        li_sampling_params_default(&p);
        p.temperature = sets[si].t;
        p.top_p = sets[si].top_p;
        p.min_p = sets[si].min_p;
        p.top_k = sets[si].top_k;
        p.n_logprobs = sets[si].n_logprobs;
        p.logprob = sets[si].logprob;
        p.seed = 1000 + si;
        li_sampler a, b, f;
        samplers3(&a, &b, &f, &p, V);
        bool lse_need;
        const int32_t need = li_sampler_cand_need(&b, &lse_need);
        draws3 st = {.same = 1, .lp_same = 1, .fast_same = 1};
        unsigned seed = 77 + (unsigned)si;
        for (int d = 0; d < DRAWS; d++) {
            cand_logits(l, V, d, &seed);
            draw3(&a, &b, &f, l, V, K, d, p.n_logprobs, &st);
        }
        const int same = st.same, lp_same = st.lp_same, fast_same = st.fast_same, fallbacks = st.fallbacks;
        const int *fam = st.fam;
        const bool wide = p.temperature > 0 && !(p.top_k > 0 && p.top_k < K);
        CHECK(same && lp_same, "top_k %d, T %.1f, top_p %.2f, min_p %.2f, logprobs %d%s: %d draws from the %d largest "
              "(need %d, %d fell back) equal the full logits' draws and logprobs", p.top_k, (double)p.temperature,
              (double)p.top_p, (double)p.min_p, p.n_logprobs, p.logprob ? " and the chosen" : "", DRAWS, K, need,
              fallbacks);
        CHECK(fast_same, "li_sampler_sample and sample_u with and without the distribution (their paths from the "
              "largest logits) draw, report and distribute as the full chain, %d draws", DRAWS);
        CHECK(lse_need == (p.n_logprobs > 0 || p.logprob || wide), "the row's lse asked for exactly when logprobs "
              "are, or the candidates may not hold the kept set");
        const int32_t draw = p.temperature <= 0 ? 1 : p.top_k + 1;
        if (p.temperature <= 0) CHECK(need == LI_MAX(1, p.n_logprobs) && fallbacks == 0, "greedy: never the logits");
        else if (!wide) CHECK(need == LI_MAX(draw, p.n_logprobs) && fallbacks < DRAWS,
                              "top_k %d: candidates used (%d of %d fell back)", p.top_k, fallbacks, DRAWS);
        if (wide && getenv("LUAINFER_TEST_VERBOSE"))
            printf("  wide T %.1f top_p %.2f min_p %.2f top_k %d: fell back on %d peaked, %d tied, %d flat of %d "
                   "each\n", (double)p.temperature, (double)p.top_p, (double)p.min_p, p.top_k, fam[0], fam[1],
                   fam[2], DRAWS / 3);
        if (!wide) (void)fam;
        else CHECK(need == K && lse_need && fallbacks < DRAWS * 2 / 3 && fallbacks > 0,
                   "wide: the 64 largest and the lse decide most peaked and tied rows, not every flat one (%d of %d "
                   "fell back)", fallbacks, DRAWS);
        li_sampler_free(&a);
        li_sampler_free(&f);
        li_sampler_free(&b);
    }
    /* a NaN among the candidates, or a row flagged (ids[0] < 0): the logits */
    li_sampling_params p;
    li_sampling_params_default(&p);
    li_sampler s;
    CHECK(li_sampler_init(&s, &p, V, &err) == 0, "%s", err.msg);
    for (int i = 0; i < K; i++) vals[i] = 10.0f - (float)i, ids[i] = i;
    vals[3] = NAN;
    li_sampler_cands cd = {vals, ids, K, 0.0f, NAN, NULL, NULL, 0};
    CHECK(li_sampler_sample_cand(&s, &cd, NULL, NULL) == -1, "a NaN among the candidates: -1");
    vals[3] = 7.0f;
    ids[0] = -1;
    CHECK(li_sampler_sample_cand(&s, &cd, NULL, NULL) == -1, "a flagged row: -1");
    li_sampler_free(&s);
    /* a top value that is not finite (a device's argmax over a row of NaN
     * or Inf), greedy and sampled: the logits decide, not the id */
    ids[0] = 0;
    for (int greedy = 0; greedy < 2; greedy++) {
        li_sampling_params_default(&p);
        if (greedy) p.temperature = 0;
        CHECK(li_sampler_init(&s, &p, V, &err) == 0, "%s", err.msg);
        const float tops[3] = {-INFINITY, INFINITY, NAN};
        for (int t = 0; t < 3; t++) {
            vals[0] = tops[t];
            if (t == 0) for (int i = 1; i < K; i++) vals[i] = -INFINITY;
            CHECK(li_sampler_sample_cand(&s, &cd, NULL, NULL) == -1, "%s: a top candidate of %g: -1",
                  greedy ? "greedy" : "sampled", (double)tops[t]);
        }
        li_sampler_free(&s);
    }
    free(l);
}

/* The full chain's order over a large vocabulary (its radix sort): a row of
 * ties, -0 beside +0 among them, drawn with given uniforms, against a plain
 * transcription of the chain (insertion sort by value then id, the sum and
 * the walk in that order) at temperature 1 with nothing truncating */
/* li_sampler_logits_usable at odd lengths (the 16-lane loop and its tail):
 * a finite maximum, whatever NaNs lie beside it; not a row of NaNs, -Inf
 * or +Inf anywhere. */
static void test_logits_usable(void) {
    const int32_t sizes[] = {1, 15, 16, 17, 33, 49153};
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        const int32_t n = sizes[si];
        float *x = malloc((size_t)n * sizeof *x);
        for (int32_t i = 0; i < n; i++) x[i] = (float)((i * 37) % 101) - 50.0f;
        CHECK(li_sampler_logits_usable(x, n), "n %d: finite logits", n);
        for (int32_t at = 0; at < n; at += n > 40 ? 4999 : 1) {
            const float keep = x[at];
            x[at] = NAN;
            CHECK(n == 1 ? !li_sampler_logits_usable(x, n) : li_sampler_logits_usable(x, n),
                  "n %d: one NaN at %d (usable unless it is the only logit)", n, at);
            x[at] = INFINITY;
            CHECK(!li_sampler_logits_usable(x, n), "n %d: +Inf at %d", n, at);
            x[at] = keep;
        }
        for (int32_t i = 0; i < n; i++) x[i] = NAN;
        CHECK(!li_sampler_logits_usable(x, n), "n %d: every logit NaN", n);
        for (int32_t i = 0; i < n; i++) x[i] = -INFINITY;
        CHECK(!li_sampler_logits_usable(x, n), "n %d: every logit -Inf", n);
        free(x);
    }
    float one = 0.0f;
    CHECK(!li_sampler_logits_usable(&one, 0), "an empty row");
}

static void test_chain_order(void) {
    enum { V = 3000 };
    static float l[V], probs[V];
    static int32_t ord[V];
    unsigned seed = 5;
    for (int i = 0; i < V; i++) {
        seed = seed * 1103515245u + 12345u;
        const int k = (int)((seed >> 8) % 7);
        l[i] = k == 0 ? -0.0f : k == 1 ? 0.0f : (float)(k - 4) * 0.5f;
    }
    /* the reference order */
    for (int i = 0; i < V; i++) {
        int at = i;
        while (at > 0 && l[ord[at - 1]] < l[i]) { /* ties keep the lower id first */
            ord[at] = ord[at - 1];
            at--;
        }
        ord[at] = i;
    }
    li_sampling_params p;
    li_sampling_params_default(&p);
    p.temperature = 1.0f, p.top_k = 0, p.top_p = 1.0f, p.min_p = 0.0f;
    li_sampler s;
    li_error err = {0};
    CHECK(li_sampler_init(&s, &p, V, &err) == 0, "%s", err.msg);
    s.reference = true;
    const float mx = l[ord[0]];
    double z = 0;
    for (int i = 0; i < V; i++) z += exp((double)l[ord[i]] - mx);
    int bad = 0;
    for (int k = 0; k < 200; k++) {
        const double u = (k + 0.5) / 200.0;
        double acc = 0;
        int32_t want = ord[V - 1];
        for (int i = 0; i < V; i++) {
            acc += exp((double)l[ord[i]] - mx);
            if (u * z < acc) {
                want = ord[i];
                break;
            }
        }
        bad += li_sampler_sample_u(&s, l, u, probs, NULL, NULL) != want; /* the full chain */
        s.reference = false;
        bad += li_sampler_sample_u(&s, l, u, NULL, NULL, NULL) != want; /* and its unsorted path */
        s.reference = true;
    }
    CHECK(!bad, "the chain's order over %d logits of 7 values (-0 and +0 among them): the reference's draws, with the "
          "distribution and without (%d of 400 differ)", V, bad);
    li_sampler_free(&s);
    /* NaN logits (never kept by the chain) through li_sampler_sample's own
     * path: the full chain's draws */
    li_sampler a, f;
    CHECK(li_sampler_init(&a, &p, V, &err) == 0 && li_sampler_init(&f, &p, V, &err) == 0, "%s", err.msg);
    a.reference = true;
    for (int i = 0; i < V; i++) {
        seed = seed * 1103515245u + 12345u;
        l[i] = (float)((seed >> 8) % 65536) / 2048.0f - 16.0f;
    }
    l[7] = l[1500] = l[2999] = NAN;
    bad = 0;
    for (int k = 0; k < 200; k++)
        bad += li_sampler_sample(&f, l, NULL, NULL) != li_sampler_sample_u(&a, l, li_sampler_uniform(&a), probs, NULL,
                                                                           NULL);
    CHECK(!bad, "a row with NaN logits: li_sampler_sample draws as the full chain (%d of 200 differ)", bad);
    li_sampler_free(&a);
    li_sampler_free(&f);
}

/* The same with the chain's edits: penalties over a window of the drawn
 * tokens (both samplers accept each), logit bias (an id twice, pushes up
 * and down), a ban; the candidates are the 64 largest raw logits, the row's
 * lse and the raw logits of li_sampler_edit_ids'. A window past
 * LI_SAMPLER_EDIT_MAX ids needs the logits; edited ids other than the
 * sampler's are refused. */
static void test_cand_edits(void) {
    enum { V = 700, K = 64, DRAWS = CAND_DRAWS };
    const li_logit_bias bias[] = {{650, 9.0f}, {3, -4.0f}, {650, 2.5f}, {17, 14.0f}, {400, -100.0f}, {222, 6.0f}};
    const int32_t ban[] = {17, 640, 641};
    const struct { float t, top_p, rp, pres, freq; int32_t top_k, window, n_bias, n_ban, n_logprobs; } sets[] = {
        {0.0f, 1.0f, 1.3f, 0.0f, 0.0f, 40, 64, 0, 0, 0},    {0.0f, 1.0f, 1.0f, 0.0f, 0.0f, 40, 64, 6, 0, 3},
        {0.0f, 1.0f, 1.1f, 0.4f, 0.2f, 40, 16, 6, 3, 0},    {0.8f, 0.95f, 1.0f, 0.5f, 0.3f, 40, 64, 0, 0, 0},
        {0.8f, 1.0f, 1.2f, 0.0f, 0.0f, 10, 32, 6, 0, 2},    {0.7f, 0.9f, 1.2f, 0.0f, 0.0f, 0, 64, 0, 0, 0},
        {1.0f, 1.0f, 1.0f, 0.0f, 0.0f, 0, 64, 6, 0, 0},     {0.7f, 0.9f, 1.0f, 0.0f, 0.0f, 0, 64, 0, 3, 4},
        {0.8f, 1.0f, 1.1f, 0.0f, 0.0f, 100, 64, 0, 0, 0},   {1.0f, 0.95f, 1.5f, 1.0f, 1.0f, 0, 200, 6, 3, 0},
        {0.7f, 1.0f, 0.8f, -0.5f, -0.5f, 0, 64, 0, 0, 0},   {0.0f, 1.0f, 1.2f, 0.0f, 0.0f, 40, 300, 0, 0, 0},
    };
    float *l = malloc(V * sizeof(float)), vals[K];
    int32_t ids[K];
    for (size_t si = 0; si < sizeof sets / sizeof sets[0]; si++) {
        li_sampling_params p;
        li_sampling_params_default(&p);
        p.temperature = sets[si].t, p.top_p = sets[si].top_p, p.top_k = sets[si].top_k, p.min_p = 0.0f;
        p.repeat_penalty = sets[si].rp, p.presence_penalty = sets[si].pres, p.frequency_penalty = sets[si].freq;
        p.penalty_last_n = sets[si].window, p.n_logprobs = sets[si].n_logprobs;
        p.logit_bias = bias, p.n_logit_bias = sets[si].n_bias;
        p.seed = 2000 + si;
        li_sampler a, b, f;
        samplers3(&a, &b, &f, &p, V);
        li_sampler_ban(&a, ban, sets[si].n_ban);
        li_sampler_ban(&f, ban, sets[si].n_ban);
        li_sampler_ban(&b, ban, sets[si].n_ban);
        draws3 st = {.same = 1, .lp_same = 1, .fast_same = 1};
        int full_window = 0;
        unsigned seed = 99 + (unsigned)si;
        for (int d = 0; d < DRAWS; d++) {
            cand_logits(l, V, d, &seed);
            bool lse;
            full_window += li_sampler_cand_need(&b, &lse) == 0;
            const int32_t want = draw3(&a, &b, &f, l, V, K, d, p.n_logprobs, &st);
            li_sampler_accept(&a, want);
            li_sampler_accept(&f, want);
            li_sampler_accept(&b, want);
        }
        const int same = st.same, lp_same = st.lp_same, fast_same = st.fast_same, fallbacks = st.fallbacks;
        const int *fam = st.fam;
        CHECK(same && lp_same, "edits (penalty %.1f/%.1f/%.1f over %d, %d biases, %d banned), top_k %d, T %.1f, "
              "top_p %.2f, logprobs %d: %d draws from the %d largest and the edited ids (%d fell back) equal the full "
              "logits' draws and logprobs", (double)p.repeat_penalty, (double)p.presence_penalty,
              (double)p.frequency_penalty, p.penalty_last_n, p.n_logit_bias, sets[si].n_ban, p.top_k,
              (double)p.temperature, (double)p.top_p, p.n_logprobs, DRAWS, K, fallbacks);
        CHECK(fast_same, "edits set %zu: li_sampler_sample draws and reports as the full chain, %d draws", si, DRAWS);
        if (getenv("LUAINFER_TEST_VERBOSE"))
            printf("  edits set %zu: fell back on %d peaked, %d tied, %d flat of %d each; %d needed the logits\n", si,
                   fam[0], fam[1], fam[2], DRAWS / 3, full_window);
        if (p.penalty_last_n > LI_SAMPLER_EDIT_MAX)
            CHECK(full_window > 0 && full_window < DRAWS, "a window past %d ids needs the logits once full (%d draws)",
                  LI_SAMPLER_EDIT_MAX, full_window);
        else CHECK(fam[0] < DRAWS / 3 / 4 && full_window == 0, "edited rows decided by their candidates: %d of %d "
                   "peaked rows fell back", fam[0], DRAWS / 3);
        /* edited ids other than the sampler's: refused */
        if (p.penalty_last_n <= LI_SAMPLER_EDIT_MAX) {
            int32_t eids[LI_SAMPLER_EDIT_MAX];
            float ev[LI_SAMPLER_EDIT_MAX];
            largest(l, V, K, vals, ids);
            const int32_t ne = li_sampler_edit_ids(&b, eids, LI_SAMPLER_EDIT_MAX);
            for (int j = 0; j < ne; j++) ev[j] = l[eids[j]];
            li_sampler_cands cd = {vals, ids, K, li_sampler_lse(l, V), NAN, eids, ev, ne - 1};
            CHECK(ne >= 1 && li_sampler_sample_cand(&b, &cd, NULL, NULL) == -1, "set %zu: one edited id short of %d: "
                  "refused", si, ne);
        }
        li_sampler_free(&a);
        li_sampler_free(&f);
        li_sampler_free(&b);
    }
    free(l);
}

static li_sampling_params greedy(void) {
    li_sampling_params p;
    li_sampling_params_default(&p);
    p.temperature = 0;
    return p;
}

/* The row's lse (exps by the sampler's own series, summed in double in a
 * fixed order) against long double sums of libm's expl: within an ulp of
 * the float, and the same float for nearly every row; at scales 1, 1/0.7
 * and 1/1.5; rows of peaked, flat, -inf-holding and very wide logits */
static void test_lse(void) {
    enum { V = 1003, ROWS = 2000 };
    float *l = malloc(V * sizeof(float));
    int exact = 0, off = 0;
    const double scales[] = {1.0, 1.0 / 0.7, 1.0 / 1.5};
    for (int r = 0; r < ROWS; r++) {
        const float spread = r % 4 == 0 ? 2.0f : r % 4 == 1 ? 30.0f : r % 4 == 2 ? 800.0f : 8.0f;
        for (int i = 0; i < V; i++) l[i] = rng_f() * spread;
        if (r % 5 == 0) l[r % V] = -INFINITY;
        for (size_t si = 0; si < sizeof scales / sizeof scales[0]; si++) {
            const double sc = scales[si];
            float mx = -INFINITY;
            for (int i = 0; i < V; i++) mx = l[i] > mx ? l[i] : mx;
            long double sum = 0;
            for (int i = 0; i < V; i++) sum += expl(((long double)l[i] - mx) * sc);
            const float want = mx + (float)logl(sum);
            const float got = sc == 1.0 ? li_sampler_lse(l, V) : li_sampler_lse_scaled(l, V, sc);
            exact += got == want;
            off += got != want && nextafterf(got, want) != want;
        }
    }
    CHECK(!off && exact >= ROWS * 3 * 99 / 100, "lse: %d of %d rows the long double sum's float, the rest an ulp "
          "from it (%d further)", exact, ROWS * 3, off);
    free(l);
}

/* The host path's largest logits (host_cands) take the logits within 8
 * nats of the best, else 16, 32, 64: rows whose 256th largest lies 0.5 to
 * 80 nats down, and rows with fewer than 256 logits in all 64 nats (most at
 * -inf or far below), at a vocabulary whose tail is not a multiple of 16
 * (the vector loops' last partial block), a NaN in that tail: the full
 * chain's draws and distributions, for llama.cpp's chain and for top_k off. */
static void test_host_spans(void) {
    enum { V = 3001 };
    static float l[V], pa[V], pf[V];
    static const float spread[] = {0.02f, 0.1f, 0.4f, 1.0f, 3.0f, 8.0f, 30.0f};
    li_error err = {0};
    uint32_t seed = 99;
    for (int setting = 0; setting < 2; setting++) {
        li_sampling_params p;
        li_sampling_params_default(&p);
        p.temperature = 0.7f, p.seed = 5;
        if (setting) p.top_k = 0, p.top_p = 1.0f, p.min_p = 0.0f;
        li_sampler a, f;
        CHECK(li_sampler_init(&a, &p, V, &err) == 0 && li_sampler_init(&f, &p, V, &err) == 0, "%s", err.msg);
        a.reference = true;
        int bad = 0, rows = 0;
        for (int sp = 0; sp < (int)(sizeof spread / sizeof *spread); sp++)
            for (int shape = 0; shape < 4; shape++)
                for (int rep = 0; rep < 6; rep++, rows++) {
                    for (int i = 0; i < V; i++) {
                        seed = seed * 1103515245u + 12345u;
                        /* the 256th largest of V uniform draws sits ~ spread * 0.085 * range down */
                        l[i] = spread[sp] * ((float)((seed >> 8) % 65536) / 256.0f - 128.0f);
                    }
                    if (shape == 1) /* a few far above the rest */
                        for (int j = 0; j < 5; j++) l[(j * 613 + rep) % V] += 40.0f;
                    if (shape == 2) /* under 256 within 64 nats: the rest at -inf or 100 nats down */
                        for (int i = 0; i < V; i++)
                            if (i % 17 != 0) l[i] = i % 2 ? -INFINITY : l[i] - 100.0f - spread[sp] * 300.0f;
                    if (shape == 3) l[V - 1 - rep % 9] = NAN; /* in the last partial block */
                    const double u = li_sampler_uniform(&a);
                    const int32_t want = li_sampler_sample_u(&a, l, u, pa, NULL, NULL);
                    const int32_t got = li_sampler_sample_u(&f, l, u, pf, NULL, NULL);
                    bad += got != want || memcmp(pa, pf, sizeof pa) != 0;
                    (void)li_sampler_uniform(&f);
                }
        CHECK(!bad, "host path over %d rows of every spread (%s): the full chain's draws and distributions (%d differ)",
              rows, setting ? "top_k off" : "llama.cpp's chain", bad);
        li_sampler_free(&a);
        li_sampler_free(&f);
    }
}

int main(void) {
    li_error err = {0};
    test_lse();
    test_host_spans();
    float l[NV];
    fill(l, NV, 7);
    int best = 0;
    for (int i = 1; i < NV; i++)
        if (l[i] > l[best]) best = i;

    /* greedy is argmax; ties go to the lowest id */
    li_sampler s;
    li_sampling_params p = greedy();
    CHECK(li_sampler_init(&s, &p, NV, &err) == 0, "%s", err.msg);
    CHECK(li_sampler_sample(&s, l, NULL, NULL) == best, "greedy picks argmax");
    float tie[4] = {1, 3, 3, 0};
    li_sampler_free(&s);
    CHECK(li_sampler_init(&s, &p, 4, &err) == 0, "%s", err.msg);
    CHECK(li_sampler_sample(&s, tie, NULL, NULL) == 1, "tie -> lowest id");
    li_sampler_free(&s);

    /* top_k = 1 at any temperature is greedy */
    li_sampling_params_default(&p);
    p.top_k = 1;
    p.temperature = 5;
    p.seed = 3;
    li_sampler_init(&s, &p, NV, &err);
    int ok = 1;
    for (int i = 0; i < 50; i++) ok &= li_sampler_sample(&s, l, NULL, NULL) == best;
    CHECK(ok, "top_k=1 always argmax");
    li_sampler_free(&s);

    /* the same seed gives the same draws; another seed differs somewhere */
    int a[64], b[64], c[64];
    li_sampling_params_default(&p);
    p.top_k = 0;
    p.top_p = 1;
    p.min_p = 0;
    p.temperature = 1.5f;
    for (int run = 0; run < 3; run++) {
        p.seed = run == 2 ? 99 : 42;
        li_sampler_init(&s, &p, NV, &err);
        for (int i = 0; i < 64; i++) (run == 0 ? a : run == 1 ? b : c)[i] = li_sampler_sample(&s, l, NULL, NULL);
        li_sampler_free(&s);
    }
    CHECK(!memcmp(a, b, sizeof a), "seeded draws reproducible");
    CHECK(memcmp(a, c, sizeof a) != 0, "different seeds differ");

    /* draws follow softmax(l / T): compare counts with expectations */
    p.seed = 1;
    p.temperature = 1.0f;
    float small[4] = {0.0f, 1.0f, 2.0f, -1.0f};
    li_sampler_init(&s, &p, 4, &err);
    int cnt[4] = {0};
    const int N = 40000;
    for (int i = 0; i < N; i++) cnt[li_sampler_sample(&s, small, NULL, NULL)]++;
    li_sampler_free(&s);
    double z = 0;
    for (int i = 0; i < 4; i++) z += exp(small[i]);
    for (int i = 0; i < 4; i++) {
        double e = N * exp(small[i]) / z, sd = sqrt(e);
        CHECK(fabs(cnt[i] - e) < 5 * sd, "token %d drawn %d times, expected %.0f", i, cnt[i], e);
    }

    /* top_p keeps the smallest set reaching p: {2} has 0.64 of the mass */
    p.top_p = 0.6f;
    li_sampler_init(&s, &p, 4, &err);
    ok = 1;
    for (int i = 0; i < 200; i++) ok &= li_sampler_sample(&s, small, NULL, NULL) == 2;
    CHECK(ok, "top_p=0.6 keeps only the top token");
    li_sampler_free(&s);
    p.top_p = 0.8f; /* 0.64 + 0.24 -> {2, 1} */
    li_sampler_init(&s, &p, 4, &err);
    int seen[4] = {0};
    for (int i = 0; i < 2000; i++) seen[li_sampler_sample(&s, small, NULL, NULL)]++;
    CHECK(seen[0] == 0 && seen[3] == 0 && seen[1] > 0 && seen[2] > 0, "top_p=0.8 keeps {2,1}: %d %d %d %d",
          seen[0], seen[1], seen[2], seen[3]);
    li_sampler_free(&s);

    /* min_p = 0.3: tokens below 0.3 * p_max (e^-1.2) drop: keep {2, 1} */
    p.top_p = 1;
    p.min_p = 0.3f;
    li_sampler_init(&s, &p, 4, &err);
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < 2000; i++) seen[li_sampler_sample(&s, small, NULL, NULL)]++;
    CHECK(seen[0] == 0 && seen[3] == 0 && seen[1] > 0, "min_p keeps {2,1}");
    li_sampler_free(&s);

    /* repetition penalty pushes a seen token below the next one */
    p = greedy();
    p.repeat_penalty = 3.0f;
    li_sampler_init(&s, &p, 4, &err);
    li_sampler_accept(&s, 2);
    CHECK(li_sampler_sample(&s, small, NULL, NULL) == 1, "penalised 2 (2/3 < 1)");
    li_sampler_free(&s);
    /* presence/frequency: subtract per occurrence, only inside the window */
    p = greedy();
    p.frequency_penalty = 0.6f;
    p.penalty_last_n = 2;
    li_sampler_init(&s, &p, 4, &err);
    li_sampler_accept(&s, 2);
    CHECK(li_sampler_sample(&s, small, NULL, NULL) == 2, "one occurrence: 2-0.6 > 1");
    li_sampler_accept(&s, 2);
    CHECK(li_sampler_sample(&s, small, NULL, NULL) == 1, "two occurrences: 2-1.2 < 1");
    li_sampler_accept(&s, 0);
    li_sampler_accept(&s, 0); /* window of 2 forgets both 2s */
    CHECK(li_sampler_sample(&s, small, NULL, NULL) == 2, "window slides");
    li_sampler_free(&s);

    /* logprobs: sorted, and exp sums to <= 1 with the top one right */
    p = greedy();
    p.n_logprobs = 3;
    li_sampler_init(&s, &p, 4, &err);
    li_token_logprob top[3];
    float clp;
    int id = li_sampler_sample(&s, small, top, &clp);
    CHECK(id == 2 && top[0].id == 2 && top[1].id == 1 && top[2].id == 0, "top logprob order");
    CHECK(fabs(top[0].logprob - log(exp(2) / z)) < 1e-5, "logprob value %f", top[0].logprob);
    CHECK(fabs(clp - top[0].logprob) < 1e-6, "chosen logprob");
    li_sampler_free(&s);

    /* the chosen logprob alone (logprobs=0 in the API) is computed on
     * request, and skipped (0) otherwise */
    p = greedy();
    p.logprob = true;
    li_sampler_init(&s, &p, 4, &err);
    clp = 1;
    CHECK(li_sampler_sample(&s, small, NULL, &clp) == 2 && fabs(clp - log(exp(2) / z)) < 1e-5,
          "chosen logprob on request: %f", clp);
    li_sampler_free(&s);
    p = greedy();
    li_sampler_init(&s, &p, 4, &err);
    clp = 1;
    CHECK(li_sampler_sample(&s, small, NULL, &clp) == 2 && clp == 0.0f, "no logprob unless asked");
    li_sampler_free(&s);

    /* greedy's one-pass argmax against a plain loop at odd sizes, with ties
     * placed at both ends of the 16-wide lanes and NaNs that must not win */
    for (int n = 1; n <= 100; n += 3) {
        float big[100];
        fill(big, n, 11u + (unsigned)n);
        if (n > 20) big[n - 1] = big[17] = 9.0f;   /* tie: 17 wins */
        if (n > 5) big[3] = NAN;
        int want = -1;
        for (int i = 0; i < n; i++)
            if (!isnan(big[i]) && (want < 0 || big[i] > big[want])) want = i;
        p = greedy();
        li_sampler_init(&s, &p, n, &err);
        int got = li_sampler_sample(&s, big, NULL, NULL);
        CHECK(got == (want < 0 ? 0 : want), "argmax n=%d: %d vs %d", n, got, want);
        li_sampler_free(&s);
    }

    /* logit_bias: added before everything else; greedy follows it, a draw
     * follows it, logprobs stay raw, the caller's array is copied */
    {
        li_logit_bias lb[3] = {{best, -100.0f}, {5, 0.5f}, {5, 0.25f}};
        int second = -1; /* argmax without `best` */
        for (int i = 0; i < NV; i++)
            if (i != best && (second < 0 || l[i] > l[second])) second = i;
        p = greedy();
        p.logit_bias = lb;
        p.n_logit_bias = 1;
        CHECK(li_sampler_init(&s, &p, NV, &err) == 0, "%s", err.msg);
        lb[0].bias = 0; /* the sampler holds its own copy */
        float lp = 1;
        p.logprob = true;
        CHECK(li_sampler_sample(&s, l, NULL, &lp) == second, "bias -100 bans the argmax");
        li_sampler_free(&s);
        lb[0].bias = -100.0f;

        /* +100 on a poor token forces it at any temperature */
        int worst = 0;
        for (int i = 1; i < NV; i++)
            if (l[i] < l[worst]) worst = i;
        li_logit_bias force = {worst, 100.0f};
        li_sampling_params_default(&p);
        p.temperature = 2.0f;
        p.seed = 5;
        p.logit_bias = &force;
        p.n_logit_bias = 1;
        p.logprob = true;
        li_sampler_init(&s, &p, NV, &err);
        ok = 1;
        for (int i = 0; i < 100; i++) {
            ok &= li_sampler_sample(&s, l, NULL, &lp) == worst;
            /* raw: the model's own logprob of that token, far below 0 */
            double zz = 0;
            for (int j = 0; j < NV; j++) zz += exp(l[j] - l[best]);
            ok &= fabs(lp - (l[worst] - l[best] - log(zz))) < 1e-4;
        }
        CHECK(ok, "bias +100 forces the worst token; its logprob is the raw one");
        li_sampler_free(&s);

        /* a token listed twice gets both biases: 0.75 lifts token 5 over
         * a neighbour 0.6 above it, 0.5 alone does not */
        float three[6] = {0, 0, 0, 0, 1.6f, 1.0f};
        p = greedy();
        p.logit_bias = lb + 1;
        p.n_logit_bias = 2;
        li_sampler_init(&s, &p, 6, &err);
        CHECK(li_sampler_sample(&s, three, NULL, NULL) == 5, "both entries of id 5 add up");
        li_sampler_free(&s);
        p.n_logit_bias = 1;
        li_sampler_init(&s, &p, 6, &err);
        CHECK(li_sampler_sample(&s, three, NULL, NULL) == 4, "one entry is not enough");
        li_sampler_free(&s);

        /* bias before penalties (llama.cpp's order): a positive logit made
         * negative by the bias is multiplied by the penalty, not divided */
        float two[2] = {1.0f, -1.9f};
        li_logit_bias neg = {0, -3.0f}; /* 1 - 3 = -2, then * 1.5 = -3 < -1.9 */
        p = greedy();
        p.repeat_penalty = 1.5f;
        p.logit_bias = &neg;
        p.n_logit_bias = 1;
        li_sampler_init(&s, &p, 2, &err);
        li_sampler_accept(&s, 0);
        CHECK(li_sampler_sample(&s, two, NULL, NULL) == 1, "penalty applies to the biased logit");
        li_sampler_free(&s);

        /* refused: an id outside the vocabulary, a negative id, a bias out
         * of range or NaN, too many entries */
        li_logit_bias bad = {NV, 1.0f};
        p = greedy();
        p.logit_bias = &bad;
        p.n_logit_bias = 1;
        CHECK(li_sampler_init(&s, &p, NV, &err) != 0 && strstr(err.msg, "outside the vocabulary"), "%s", err.msg);
        bad = (li_logit_bias){-1, 1.0f};
        CHECK(li_sampling_params_validate(&p, &err) != 0 && strstr(err.msg, "negative"), "%s", err.msg);
        bad = (li_logit_bias){1, 100.5f};
        CHECK(li_sampling_params_validate(&p, &err) != 0 && strstr(err.msg, "[-100, 100]"), "%s", err.msg);
        bad = (li_logit_bias){1, NAN};
        CHECK(li_sampling_params_validate(&p, &err) != 0, "NaN bias refused");
        bad = (li_logit_bias){1, -100.0f};
        CHECK(li_sampling_params_validate(&p, &err) == 0, "bias -100 is in range");
        p.n_logit_bias = LI_LOGIT_BIAS_MAX + 1;
        CHECK(li_sampling_params_validate(&p, &err) != 0 && strstr(err.msg, "at most"), "%s", err.msg);
        p.logit_bias = NULL;
        p.n_logit_bias = 1;
        CHECK(li_sampling_params_validate(&p, &err) != 0, "entries without an array refused");
    }

    /* a ban (min_tokens): banned ids are never drawn, greedy or not;
     * lifting it restores the argmax; logprobs stay raw */
    {
        p = greedy();
        p.logprob = true;
        li_sampler_init(&s, &p, NV, &err);
        const int32_t ban[1] = {best};
        li_sampler_ban(&s, ban, 1);
        float lp = 0;
        const int got = li_sampler_sample(&s, l, NULL, &lp);
        CHECK(got != best, "a banned argmax is not drawn (%d)", got);
        double zz = 0;
        for (int j = 0; j < NV; j++) zz += exp(l[j] - l[best]);
        CHECK(fabs(lp - (l[got] - l[best] - log(zz))) < 1e-4, "its logprob is the raw one");
        li_sampler_ban(&s, NULL, 0);
        CHECK(li_sampler_sample(&s, l, NULL, NULL) == best, "the ban lifted, greedy is argmax again");
        li_sampler_free(&s);
        li_sampling_params_default(&p);
        p.temperature = 3.0f;
        p.top_k = 0;
        p.top_p = 1;
        p.min_p = 0;
        p.seed = 9;
        li_sampler_init(&s, &p, 4, &err);
        const int32_t ban2[2] = {1, 2};
        li_sampler_ban(&s, ban2, 2);
        ok = 1;
        for (int i = 0; i < 500; i++) {
            const int t = li_sampler_sample(&s, small, NULL, NULL);
            ok &= t == 0 || t == 3;
        }
        CHECK(ok, "sampling at temperature 3 never draws a banned id");
        li_sampler_free(&s);
    }
    /* invalid parameters are refused with a message */
    p = greedy();
    p.top_p = 0;
    CHECK(li_sampler_init(&s, &p, 4, &err) != 0 && strstr(err.msg, "top_p"), "top_p=0 refused");
    p = greedy();
    p.temperature = -1;
    CHECK(li_sampling_params_validate(&p, &err) != 0 && strstr(err.msg, "temperature"), "negative temperature");
    p = greedy();
    p.temperature = NAN;
    CHECK(li_sampling_params_validate(&p, &err) != 0, "NaN temperature refused");
    test_cand();
    test_cand_edits();
    test_chain_order();
    test_logits_usable();
    return t_summary("sampler");
}
