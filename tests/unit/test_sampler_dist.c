/* test_sampler_dist.c — the distribution the sampler hands out, and its
 * reusable uniform draws (sampler.h, "distributions and reusable draws"):
 *
 *   1. 10^5 seeded draws of li_sampler_sample follow the distribution
 *      li_sampler_sample_u returns (a chi-square test at alpha = 1e-6, with
 *      a check that the same test rejects a slightly distorted distribution);
 *   2. that distribution equals a plain double-precision recomputation of
 *      the chain written here from sampler.h's description;
 *   3. li_sampler_sample_u fed by li_sampler_uniform gives the tokens (and
 *      logprobs) li_sampler_sample gives on a twin sampler with the same
 *      seed, and a sample_u call with a caller's uniform leaves the RNG be;
 *   4. a uniform inside a kept id's cumulative interval draws that id.
 *
 * Every case combines parts of the chain: temperature, top-k, top-p, min-p,
 * repetition/presence/frequency penalties, logit bias and a ban. */
#include "sample/sampler.h"
#include "test_util.h"

#include <math.h>
#include <string.h>

#define NV 256
#define N_DRAWS 100000
#define MAX_HIST 64

typedef struct dist_case {
    const char *name;
    float temperature, top_p, min_p, repeat, presence, frequency, spread;
    int32_t top_k, last_n, n_bias, n_ban, n_hist;
    li_logit_bias bias[4];
    int32_t ban[4];
} dist_case;

/* ---- the chain recomputed in double (sampler.h's semantics) ---------------- */

typedef struct ref_cand {
    int32_t id;
    double v;
} ref_cand;

static int ref_cmp(const void *a, const void *b) {
    const ref_cand *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* want (NV) = the distribution after bias, ban, penalties over the last
 * last_n tokens of hist, top-k, top-p, min-p and temperature. */
static void ref_dist(const dist_case *dc, const float *l, const int32_t *hist, double *want) {
    static ref_cand c[NV];
    int counts[NV] = {0};
    const int from = dc->last_n < 0 || dc->n_hist < dc->last_n ? 0 : dc->n_hist - dc->last_n;
    for (int i = from; i < dc->n_hist; i++) counts[hist[i]]++;
    for (int i = 0; i < NV; i++) c[i] = (ref_cand){i, l[i]};
    for (int k = 0; k < dc->n_bias; k++) c[dc->bias[k].id].v += dc->bias[k].bias;
    for (int k = 0; k < dc->n_ban; k++) c[dc->ban[k]].v = -INFINITY;
    const bool pen = dc->repeat != 1.0f || dc->presence != 0.0f || dc->frequency != 0.0f;
    for (int i = 0; i < NV; i++)
        if (pen && counts[i]) {
            double v = c[i].v;
            v = v > 0 ? v / dc->repeat : v * dc->repeat;
            c[i].v = v - counts[i] * (double)dc->frequency - dc->presence;
        }
    qsort(c, NV, sizeof *c, ref_cmp);
    for (int i = 0; i < NV; i++) want[i] = 0;
    if (dc->temperature <= 0) {
        want[c[0].id] = 1;
        return;
    }
    int n = dc->top_k > 0 && dc->top_k < NV ? dc->top_k : NV;
    const double mx = c[0].v;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += exp(c[i].v - mx);
    if (dc->top_p < 1.0f) {
        double cum = 0;
        for (int i = 0; i < n; i++) {
            cum += exp(c[i].v - mx) / sum;
            if (cum >= dc->top_p) {
                n = i + 1;
                break;
            }
        }
    }
    if (dc->min_p > 0.0f) {
        int w = 1;
        while (w < n && c[w].v >= mx + log((double)dc->min_p)) w++;
        n = w;
    }
    double z = 0;
    for (int i = 0; i < n; i++) z += exp((c[i].v - mx) / dc->temperature);
    for (int i = 0; i < n; i++) want[c[i].id] = exp((c[i].v - mx) / dc->temperature) / z;
}

/* ---- chi-square ------------------------------------------------------------ */

/* Upper critical value of chi-square with df degrees of freedom at alpha =
 * 1e-6, by Wilson-Hilferty (z = 4.753424, the normal's 1 - 1e-6 quantile);
 * conservative at small df, where the cube approximation runs high. */
static double chi2_crit(int df) {
    const double z = 4.753424, a = 2.0 / (9.0 * df), t = 1.0 - a + z * sqrt(a);
    return df * t * t * t;
}

/* Pearson's statistic of counts (NV) against probs (NV) over n draws.
 * Bins with expected count < 5 are pooled into one; a pool still under 5
 * joins the smallest regular bin. *df gets the degrees of freedom,
 * *zero_hits the draws of ids whose probability is 0. */
static double chi2_stat(const int *counts, const double *probs, int n, int *df, int *zero_hits) {
    double e[NV + 1], o[NV + 1], pool_e = 0, pool_o = 0;
    int bins = 0, smallest = -1;
    *zero_hits = 0;
    for (int i = 0; i < NV; i++) {
        const double ei = probs[i] * n;
        if (probs[i] == 0) {
            *zero_hits += counts[i];
        } else if (ei < 5) {
            pool_e += ei;
            pool_o += counts[i];
        } else {
            if (smallest < 0 || ei < e[smallest]) smallest = bins;
            e[bins] = ei;
            o[bins++] = counts[i];
        }
    }
    if (pool_e >= 5 || (pool_e > 0 && smallest < 0)) {
        e[bins] = pool_e;
        o[bins++] = pool_o;
    } else if (pool_e > 0) {
        e[smallest] += pool_e;
        o[smallest] += pool_o;
    }
    double stat = 0;
    for (int i = 0; i < bins; i++) stat += (o[i] - e[i]) * (o[i] - e[i]) / e[i];
    *df = bins - 1;
    return stat;
}

/* ---- one case -------------------------------------------------------------- */

static void case_params(const dist_case *dc, li_sampling_params *p, uint64_t seed) {
    li_sampling_params_default(p);
    p->temperature = dc->temperature;
    p->top_k = dc->top_k;
    p->top_p = dc->top_p;
    p->min_p = dc->min_p;
    p->repeat_penalty = dc->repeat;
    p->presence_penalty = dc->presence;
    p->frequency_penalty = dc->frequency;
    p->penalty_last_n = dc->last_n;
    p->logit_bias = dc->bias;
    p->n_logit_bias = dc->n_bias;
    p->seed = seed;
}

static void sampler_for(const dist_case *dc, li_sampler *s, const int32_t *hist, uint64_t seed) {
    li_sampling_params p;
    li_error err = {0};
    case_params(dc, &p, seed);
    if (li_sampler_init(s, &p, NV, &err) != 0) {
        CHECK(0, "%s: init: %s", dc->name, err.msg);
        exit(1);
    }
    for (int i = 0; i < dc->n_hist; i++) li_sampler_accept(s, hist[i]);
    li_sampler_ban(s, dc->ban, dc->n_ban);
}

static void run_case(const dist_case *dc, uint64_t seed) {
    float l[NV];
    int32_t hist[MAX_HIST];
    rng_seed(seed * 0x2545f4914f6cdd1dull + 1);
    for (int i = 0; i < NV; i++) l[i] = rng_f() * dc->spread;
    for (int i = 0; i < dc->n_hist; i++) hist[i] = (int32_t)(rng_u32() % 24); /* repeats among a few ids */

    li_sampler s;
    sampler_for(dc, &s, hist, seed);
    static float probs[NV];
    static double got[NV], want[NV];
    const int32_t first = li_sampler_sample_u(&s, l, 0.5, probs, NULL, NULL);

    /* 2. the distribution against the recomputation: same support, same values */
    ref_dist(dc, l, hist, want);
    int support_diff = 0, kept = 0;
    double worst = 0, total = 0;
    for (int i = 0; i < NV; i++) {
        got[i] = probs[i];
        total += got[i];
        kept += got[i] > 0;
        support_diff += (got[i] > 0) != (want[i] > 0);
        const double d = fabs(got[i] - want[i]) / (1e-7 + want[i]);
        if (d > worst) worst = d;
    }
    CHECK(support_diff == 0, "%s: %d ids differ in being kept", dc->name, support_diff);
    CHECK(worst < 1e-5, "%s: probabilities differ from the recomputation by %g (relative)", dc->name, worst);
    CHECK(fabs(total - 1) < 1e-5, "%s: probabilities sum to %.9f", dc->name, total);
    CHECK(got[first] > 0, "%s: the drawn id %d has probability 0", dc->name, first);

    /* 4. u inside a kept id's interval (most probable first, ties to the
     * lower id) draws that id; the midpoint keeps clear of rounding */
    {
        ref_cand order[NV];
        int n = 0;
        for (int i = 0; i < NV; i++)
            if (want[i] > 0) order[n++] = (ref_cand){i, want[i]};
        qsort(order, (size_t)n, sizeof *order, ref_cmp);
        double cum = 0;
        int bad = -1;
        for (int i = 0; i < n && bad < 0; i++) {
            if (order[i].v > 1e-4 && li_sampler_sample_u(&s, l, cum + order[i].v / 2, NULL, NULL, NULL) != order[i].id)
                bad = order[i].id;
            cum += order[i].v;
        }
        CHECK(bad < 0, "%s: the midpoint of id %d's interval drew another id", dc->name, bad);
    }

    /* 1. seeded draws against the returned distribution */
    static int counts[NV];
    memset(counts, 0, sizeof counts);
    for (int i = 0; i < N_DRAWS; i++) counts[li_sampler_sample(&s, l, NULL, NULL)]++;
    int df, zero_hits;
    const double stat = chi2_stat(counts, got, N_DRAWS, &df, &zero_hits);
    CHECK(zero_hits == 0, "%s: %d draws of ids with probability 0", dc->name, zero_hits);
    if (df < 1) {
        CHECK(counts[first] == N_DRAWS, "%s: one kept id, drawn %d of %d times", dc->name, counts[first], N_DRAWS);
    } else {
        CHECK(stat < chi2_crit(df), "%s: chi-square %.1f over %d df, critical %.1f", dc->name, stat, df, chi2_crit(df));
        /* the same test must see a small distortion: 2% of the mass moved
         * from the most to the least probable kept id */
        static double bent[NV];
        int hi = -1, lo = -1;
        for (int i = 0; i < NV; i++) {
            bent[i] = got[i];
            if (got[i] > 0 && (hi < 0 || got[i] > got[hi])) hi = i;
            if (got[i] > 0 && (lo < 0 || got[i] < got[lo])) lo = i;
        }
        bent[hi] -= 0.02;
        bent[lo] += 0.02;
        int dfb, zb_hits;
        const double sb = chi2_stat(counts, bent, N_DRAWS, &dfb, &zb_hits);
        CHECK(sb > chi2_crit(dfb), "%s: a distorted distribution passes (chi-square %.1f, critical %.1f)", dc->name,
              sb, chi2_crit(dfb));
    }
    li_sampler_free(&s);

    /* 3. twins: sample_u with li_sampler_uniform's draws against
     * li_sampler_sample, both accepting their tokens so penalties move */
    li_sampler a, b;
    sampler_for(dc, &a, hist, seed + 100);
    sampler_for(dc, &b, hist, seed + 100);
    a.p.n_logprobs = b.p.n_logprobs = 3;
    int mismatch = -1;
    for (int i = 0; i < 2000 && mismatch < 0; i++) {
        li_token_logprob ta[3], tb[3];
        float la = 0, lb = 0;
        /* a caller's uniform must leave the RNG untouched */
        (void)li_sampler_sample_u(&a, l, 0.25, i % 2 ? probs : NULL, NULL, NULL);
        const int32_t x = li_sampler_sample_u(&a, l, li_sampler_uniform(&a), i % 3 ? probs : NULL, ta, &la);
        const int32_t y = li_sampler_sample(&b, l, tb, &lb);
        if (x != y || la != lb || memcmp(ta, tb, sizeof ta) != 0) mismatch = i;
        li_sampler_accept(&a, x);
        li_sampler_accept(&b, y);
    }
    CHECK(mismatch < 0, "%s: twin samplers part at draw %d", dc->name, mismatch);
    li_sampler_free(&a);
    li_sampler_free(&b);
    printf("%-28s kept %3d ids, chi-square %7.1f over %3d df (critical %.1f)\n", dc->name, kept, stat, df,
           df >= 1 ? chi2_crit(df) : 0.0);
}

/* A case with everything off but the temperature: top_k 0, top_p 1,
 * min_p 0, neutral penalties over a 64-token window, logits in [-6, 6). */
static dist_case plain(const char *name, float temperature) {
    return (dist_case){.name = name, .temperature = temperature, .top_p = 1, .repeat = 1, .last_n = 64, .spread = 6};
}

int main(void) {
    uint64_t seed = 1000;
    dist_case c;
    c = plain("temperature 0.7", 0.7f);
    run_case(&c, seed++);
    c = plain("top-k 20, T 1.3", 1.3f);
    c.top_k = 20;
    run_case(&c, seed++);
    c = plain("top-p 0.9", 1.0f);
    c.top_p = 0.9f;
    run_case(&c, seed++);
    c = plain("min-p 0.1, T 0.8", 0.8f);
    c.min_p = 0.1f;
    run_case(&c, seed++);
    c = plain("penalties", 1.0f);
    c.repeat = 1.3f, c.presence = 0.5f, c.frequency = 0.3f, c.last_n = 16, c.n_hist = 40;
    run_case(&c, seed++);
    c = plain("bias and ban", 1.2f);
    c.n_bias = 3, c.bias[0] = (li_logit_bias){7, 4.0f}, c.bias[1] = (li_logit_bias){9, -2.5f};
    c.bias[2] = (li_logit_bias){7, 1.5f}; /* listed twice: both count */
    c.n_ban = 2, c.ban[0] = 3, c.ban[1] = 11;
    run_case(&c, seed++);
    c = plain("all combined", 1.5f);
    c.top_k = 60, c.top_p = 0.95f, c.min_p = 0.01f;
    c.repeat = 1.2f, c.presence = 0.4f, c.frequency = 0.2f, c.last_n = -1, c.n_hist = 30;
    c.n_bias = 2, c.bias[0] = (li_logit_bias){5, 3.0f}, c.bias[1] = (li_logit_bias){17, -1.0f};
    c.n_ban = 1, c.ban[0] = 2;
    run_case(&c, seed++);
    /* logits spanning 120 nats at temperature 5: ids far below the best
     * still carry mass after the temperature */
    c = plain("T 5 over a wide range", 5.0f);
    c.spread = 60;
    run_case(&c, seed++);
    c = plain("top-k 1", 2.0f);
    c.top_k = 1;
    run_case(&c, seed++);
    c = plain("greedy with penalties", 0.0f);
    c.repeat = 1.5f, c.frequency = 1.0f, c.n_hist = 20, c.n_bias = 1, c.bias[0] = (li_logit_bias){4, 2.0f};
    run_case(&c, seed++);
    c = plain("plain greedy", 0.0f);
    run_case(&c, seed++);

    /* all-NaN logits (a broken model) draw id 0 and say so, without reading
     * outside the candidate list */
    {
        float nan_l[NV];
        static float probs[NV];
        for (int i = 0; i < NV; i++) nan_l[i] = NAN;
        c = plain("all NaN", 1.0f);
        li_sampler s;
        sampler_for(&c, &s, NULL, 1);
        CHECK(li_sampler_sample(&s, nan_l, NULL, NULL) == 0, "all-NaN logits draw id 0");
        CHECK(li_sampler_sample_u(&s, nan_l, 0.5, probs, NULL, NULL) == 0 && probs[0] == 1.0f && probs[1] == 0.0f,
              "all-NaN logits: a one-hot at id 0");
        li_sampler_free(&s);
    }

    /* the critical values themselves: Wilson-Hilferty against exact ones
     * at alpha 1e-6 (df 1: 23.93, df 10: 46.86, df 100: 182.13), running high */
    CHECK(chi2_crit(1) > 23.93 && chi2_crit(1) < 28.0, "chi2_crit(1) = %.2f", chi2_crit(1));
    CHECK(chi2_crit(10) > 46.86 && chi2_crit(10) < 48.5, "chi2_crit(10) = %.2f", chi2_crit(10));
    CHECK(chi2_crit(100) > 182.12 && chi2_crit(100) < 183.0, "chi2_crit(100) = %.2f", chi2_crit(100));
    return t_summary("sampler_dist");
}
