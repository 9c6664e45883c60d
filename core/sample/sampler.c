/* sampler.c — the sampling chain. See sampler.h for the order. */
#include "sample/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- RNG: splitmix64 seeding, xoshiro256** draws --------------------------- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(uint64_t s[4]) {
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

/* uniform in [0, 1) with 53 random bits */
static double rng_uniform(uint64_t s[4]) { return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0); }

/* ---- params ---------------------------------------------------------------- */

void li_sampling_params_default(li_sampling_params *p) {
    *p = (li_sampling_params){
        .temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .repeat_penalty = 1.0f,
        .presence_penalty = 0.0f, .frequency_penalty = 0.0f, .penalty_last_n = 64, .seed = 0, .n_logprobs = 0,
    };
}

int li_sampling_params_validate(const li_sampling_params *p, li_error *err) {
    if (!(p->temperature >= 0 && p->temperature <= 100))
        return li_error_set(err, LI_EINVAL, "temperature must be in [0, 100], got %g", p->temperature);
    if (p->top_k < 0) return li_error_set(err, LI_EINVAL, "top_k must be >= 0, got %d", p->top_k);
    if (!(p->top_p > 0 && p->top_p <= 1))
        return li_error_set(err, LI_EINVAL, "top_p must be in (0, 1], got %g", p->top_p);
    if (!(p->min_p >= 0 && p->min_p <= 1))
        return li_error_set(err, LI_EINVAL, "min_p must be in [0, 1], got %g", p->min_p);
    if (!(p->repeat_penalty > 0 && p->repeat_penalty <= 10))
        return li_error_set(err, LI_EINVAL, "repetition penalty must be in (0, 10], got %g", p->repeat_penalty);
    if (!(p->presence_penalty >= -2 && p->presence_penalty <= 2))
        return li_error_set(err, LI_EINVAL, "presence penalty must be in [-2, 2], got %g", p->presence_penalty);
    if (!(p->frequency_penalty >= -2 && p->frequency_penalty <= 2))
        return li_error_set(err, LI_EINVAL, "frequency penalty must be in [-2, 2], got %g", p->frequency_penalty);
    if (p->penalty_last_n < -1 || p->penalty_last_n > (1 << 20))
        return li_error_set(err, LI_EINVAL, "penalty window must be in [-1, 1048576], got %d", p->penalty_last_n);
    if (p->n_logprobs < 0 || p->n_logprobs > 20)
        return li_error_set(err, LI_EINVAL, "logprobs must be in [0, 20], got %d", p->n_logprobs);
    if (p->n_logit_bias < 0 || p->n_logit_bias > LI_LOGIT_BIAS_MAX || (p->n_logit_bias && !p->logit_bias))
        return li_error_set(err, LI_EINVAL, "logit_bias must have at most %d entries, got %d", LI_LOGIT_BIAS_MAX,
                            p->n_logit_bias);
    for (int32_t i = 0; i < p->n_logit_bias; i++) {
        const li_logit_bias *b = &p->logit_bias[i];
        if (b->id < 0) return li_error_set(err, LI_EINVAL, "logit_bias: token id %d is negative", b->id);
        if (!(b->bias >= -LI_LOGIT_BIAS_RANGE && b->bias <= LI_LOGIT_BIAS_RANGE))
            return li_error_set(err, LI_EINVAL, "logit_bias: the bias of token %d must be in [-100, 100], got %g",
                                b->id, b->bias);
    }
    return 0;
}

/* ---- sampler state --------------------------------------------------------- */

static bool penalties_on(const li_sampling_params *p) {
    return p->penalty_last_n != 0 &&
           (p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f);
}


int li_sampler_init(li_sampler *s, const li_sampling_params *p, int32_t n_vocab, li_error *err) {
    memset(s, 0, sizeof *s);
    int rc = li_sampling_params_validate(p, err);
    if (rc) return rc;
    for (int32_t i = 0; i < p->n_logit_bias; i++)
        if (p->logit_bias[i].id >= n_vocab)
            return li_error_set(err, LI_EINVAL, "logit_bias: token id %d is outside the vocabulary [0, %d)",
                                p->logit_bias[i].id, n_vocab);
    s->p = *p;
    s->n_vocab = n_vocab;
    if (p->n_logit_bias) {
        s->bias = li_xmalloc((size_t)p->n_logit_bias * sizeof *s->bias);
        memcpy(s->bias, p->logit_bias, (size_t)p->n_logit_bias * sizeof *s->bias);
    }
    s->p.logit_bias = s->bias;
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
    /* vocabulary-sized buffers (~0.5 MB at 49k tokens) only when used: the
     * candidate list at the first non-plain-greedy draw, the counts only
     * with penalties, so a queued request holds neither */
    s->cand = NULL;
    s->counts = penalties_on(p) ? li_xcalloc((size_t)n_vocab, sizeof *s->counts) : NULL;
    s->cap_recent = p->penalty_last_n < 0 ? 1024 : p->penalty_last_n;
    s->recent = li_xmalloc((size_t)(s->cap_recent ? s->cap_recent : 1) * sizeof *s->recent);
    return 0;
}

void li_sampler_free(li_sampler *s) {
    free(s->cand);
    free(s->counts);
    free(s->recent);
    free(s->bias);
    memset(s, 0, sizeof *s);
}


void li_sampler_ban(li_sampler *s, const int32_t *ids, int32_t n) {
    s->ban = n > 0 ? ids : NULL;
    s->n_ban = n > 0 ? n : 0;
}

void li_sampler_accept(li_sampler *s, int32_t t) {
    if (t < 0 || t >= s->n_vocab || !penalties_on(&s->p)) return;
    if (s->p.penalty_last_n < 0) { /* unbounded window: grow */
        if (s->n_recent == s->cap_recent) {
            s->cap_recent *= 2;
            s->recent = li_xrealloc(s->recent, (size_t)s->cap_recent * sizeof *s->recent);
        }
        s->recent[s->n_recent++] = t;
        if (s->counts[t] < UINT16_MAX) s->counts[t]++;
        return;
    }
    if (s->n_recent == s->cap_recent) { /* evict the oldest */
        int32_t old = s->recent[s->head_recent];
        if (s->counts[old] > 0) s->counts[old]--;
        s->recent[s->head_recent] = t;
        s->head_recent = (s->head_recent + 1) % s->cap_recent;
    } else {
        s->recent[(s->head_recent + s->n_recent) % s->cap_recent] = t;
        s->n_recent++;
    }
    if (s->counts[t] < UINT16_MAX) s->counts[t]++;
}

/* Largest value; 16 independent lanes so the compiler vectorizes it (max is
 * exact, so the lane order cannot change the result). */
static float max_of(const float *x, int32_t n) {
    float m[16];
    for (int j = 0; j < 16; j++) m[j] = -INFINITY;
    int32_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
    float r = -INFINITY;
    for (int j = 0; j < 16; j++) r = m[j] > r ? m[j] : r;
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}

/* Lowest index holding the largest value (greedy's tie rule). NaN logits
 * never win, as in the candidate loop below. */
static int32_t argmax_of(const float *x, int32_t n) {
    const float mx = max_of(x, n);
    for (int32_t i = 0; i < n; i++)
        if (x[i] == mx) return i;
    return 0;
}

static int cmp_desc(const void *a, const void *b) {
    const li_token_logprob *x = a, *y = b;
    if (x->logprob > y->logprob) return -1;
    if (x->logprob < y->logprob) return 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* log(sum(exp(logits))), the one normalizer every reported logprob uses, so
 * a token's logprob is the same number wherever it is reported. The max is
 * taken 16 lanes wide; the sum stays in double, in index order, so the value
 * does not depend on the ISA. Only computed when a logprob is asked for. */
static float log_sum_exp(const float *logits, int32_t n_vocab) {
    float mx = max_of(logits, n_vocab);
    double sum = 0;
    for (int32_t i = 0; i < n_vocab; i++) sum += exp((double)logits[i] - mx);
    return mx + (float)log(sum);
}

/* The top n ids by logit (sorted); as logprobs when lse (the normalizer)
 * is given. */
static void logits_top(const float *logits, int32_t n_vocab, int32_t n, li_token_logprob *out, const float *lse) {
    if (n <= 0) return;
    if (n > n_vocab) n = n_vocab;
    int32_t k = 0; /* insertion into a small sorted array: n is tiny */
    for (int32_t i = 0; i < n_vocab; i++) {
        float v = logits[i];
        if (k == n && !(v > out[k - 1].logprob)) continue;
        int32_t j = k < n ? k++ : n - 1;
        while (j > 0 && out[j - 1].logprob < v) {
            out[j] = out[j - 1];
            j--;
        }
        out[j] = (li_token_logprob){i, v};
    }
    if (lse)
        for (int32_t i = 0; i < k; i++) out[i].logprob = logits[out[i].id] - *lse;
}

void li_logits_top(const float *logits, int32_t n_vocab, int32_t n, li_token_logprob *out, bool as_logprob) {
    const float lse = as_logprob && n > 0 ? log_sum_exp(logits, n_vocab) : 0.0f;
    logits_top(logits, n_vocab, n, out, as_logprob ? &lse : NULL);
}

/* What a sampled token reports: top-N logprobs and its own logprob, from one
 * normalizer, computed only when one of them is asked for. */
static void report_logprobs(const li_sampler *s, const float *logits, int32_t chosen, li_token_logprob *top,
                            float *chosen_logprob) {
    const li_sampling_params *p = &s->p;
    const bool want_top = top && p->n_logprobs > 0, want_lp = chosen_logprob && (p->logprob || p->n_logprobs > 0);
    if (chosen_logprob) *chosen_logprob = 0.0f;
    if (!want_top && !want_lp) return;
    const float lse = log_sum_exp(logits, s->n_vocab);
    if (want_top) logits_top(logits, s->n_vocab, p->n_logprobs, top, &lse);
    if (want_lp) *chosen_logprob = logits[chosen] - lse;
}

/* Keeps the k largest candidates at the front (quickselect), unsorted. */
static void select_top_k(li_token_logprob *c, int32_t n, int32_t k) {
    int32_t lo = 0, hi = n - 1;
    while (lo < hi) {
        float pivot = c[lo + (hi - lo) / 2].logprob;
        int32_t i = lo, j = hi;
        while (i <= j) {
            while (c[i].logprob > pivot) i++;
            while (c[j].logprob < pivot) j--;
            if (i <= j) {
                li_token_logprob t = c[i];
                c[i++] = c[j];
                c[j--] = t;
            }
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else break;
    }
}

/* ---- the chain ------------------------------------------------------------ */

/* probs (n_vocab) as a one-hot at `id`: greedy's distribution */
static void probs_one_hot(float *probs, int32_t n_vocab, int32_t id) {
    memset(probs, 0, (size_t)n_vocab * sizeof *probs);
    probs[id] = 1.0f;
}

static int32_t chain_tail(li_sampler *s, li_token_logprob *c, int32_t n, float mx, const double *u, float *probs);

/* The chain from logits to a token. The draw uses *u when given, else the
 * next seeded uniform (greedy draws none). probs (n_vocab), when non-NULL,
 * receives the distribution the draw was made from; it is the only extra
 * work, and only then. */
static int32_t sample_chain(li_sampler *s, const float *logits, const double *u, float *probs) {
    const li_sampling_params *p = &s->p;
    const int32_t nv = s->n_vocab;
    if (p->temperature <= 0 && !penalties_on(p) && !p->n_logit_bias && !s->n_ban) {
        /* plain greedy: the argmax, no candidate list */
        const int32_t chosen = argmax_of(logits, nv);
        if (probs) probs_one_hot(probs, nv, chosen);
        return chosen;
    }
    if (!s->cand) s->cand = li_xmalloc((size_t)nv * sizeof *s->cand);
    li_token_logprob *c = s->cand;
    /* llama.cpp's order: the bias first, so penalties see biased logits */
    const bool pre = p->n_logit_bias || s->n_ban;
    if (pre) {
        for (int32_t i = 0; i < nv; i++) c[i] = (li_token_logprob){i, logits[i]};
        for (int32_t k = 0; k < p->n_logit_bias; k++) c[p->logit_bias[k].id].logprob += p->logit_bias[k].bias;
        for (int32_t k = 0; k < s->n_ban; k++) c[s->ban[k]].logprob = -INFINITY;
    }
    float mx = -INFINITY;
    for (int32_t i = 0; i < nv; i++) {
        float v = pre ? c[i].logprob : logits[i];
        if (penalties_on(p) && s->counts[i]) {
            /* llama.cpp's rule: divide positive logits, multiply negative ones */
            v = v > 0 ? v / p->repeat_penalty : v * p->repeat_penalty;
            v -= (float)s->counts[i] * p->frequency_penalty + p->presence_penalty;
        }
        c[i] = (li_token_logprob){i, v};
        if (v > mx) mx = v;
    }
    if (p->temperature <= 0) {
        int32_t chosen = 0;
        for (int32_t i = 1; i < nv; i++) /* as argmax_of: a NaN never wins */
            if (c[i].logprob > c[chosen].logprob || isnan(c[chosen].logprob)) chosen = i;
        if (probs) probs_one_hot(probs, nv, chosen);
        return chosen;
    }
    int32_t n = nv;
    if (p->top_k > 0 && p->top_k < n) {
        select_top_k(c, n, p->top_k);
        n = p->top_k;
    } else {
        /* tokens 40 nats below the best carry < 1e-17 of the mass each at
         * temperature 1: dropping them first keeps the sort short and changes
         * nothing. Above temperature 1 the margin widens with it (40 T), since
         * a temperature T flattens a gap of 40 T nats to 40. */
        const float cut = mx - 40.0f * (p->temperature > 1.0f ? p->temperature : 1.0f);
        int32_t w = 0;
        for (int32_t i = 0; i < n; i++)
            if (c[i].logprob >= cut) c[w++] = c[i];
        n = w;
        if (n == 0) { /* every logit NaN: nothing to weigh, and c[n - 1] below would not exist */
            if (probs) probs_one_hot(probs, nv, 0);
            return 0;
        }
    }
    qsort(c, (size_t)n, sizeof *c, cmp_desc);
    return chain_tail(s, c, n, mx, u, probs);
}

/* The chain's end, from the kept candidates c[0, n) sorted by cmp_desc and
 * the largest logit mx: top-p and min-p on the temperature-1
 * distribution, then temperature and the draw. */
static int32_t chain_tail(li_sampler *s, li_token_logprob *c, int32_t n, float mx, const double *u, float *probs) {
    const li_sampling_params *p = &s->p;
    const int32_t nv = s->n_vocab;
    /* probabilities at temperature 1 for top-p and min-p */
    double sum = 0;
    for (int32_t i = 0; i < n; i++) sum += exp((double)c[i].logprob - mx);
    if (p->top_p < 1.0f) {
        double cum = 0;
        for (int32_t i = 0; i < n; i++) {
            cum += exp((double)c[i].logprob - mx) / sum;
            if (cum >= p->top_p) {
                n = i + 1;
                break;
            }
        }
    }
    if (p->min_p > 0.0f) {
        float cut = mx + logf(p->min_p);
        int32_t w = 1;
        while (w < n && c[w].logprob >= cut) w++;
        n = w;
    }
    /* temperature, then a draw */
    double z = 0;
    for (int32_t i = 0; i < n; i++) z += exp(((double)c[i].logprob - mx) / p->temperature);
    if (probs) {
        memset(probs, 0, (size_t)nv * sizeof *probs);
        for (int32_t i = 0; i < n; i++)
            probs[c[i].id] = (float)(exp(((double)c[i].logprob - mx) / p->temperature) / z);
    }
    double r = (u ? *u : rng_uniform(s->rng)) * z, acc = 0;
    int32_t chosen = c[n - 1].id;
    for (int32_t i = 0; i < n; i++) {
        acc += exp(((double)c[i].logprob - mx) / p->temperature);
        if (r < acc) {
            chosen = c[i].id;
            break;
        }
    }
    return chosen;
}

int32_t li_sampler_cand_need(const li_sampler *s, bool *lse) {
    const li_sampling_params *p = &s->p;
    *lse = p->logprob || p->n_logprobs > 0;
    if (penalties_on(p) || p->n_logit_bias || s->n_ban) return 0;
    /* greedy: the first; top_k: one past it (a tie there would leave the
     * choice of the kept set to the full logits' selection) */
    const int32_t draw = p->temperature <= 0 ? 1 : p->top_k > 0 && p->top_k < s->n_vocab ? p->top_k + 1 : 0;
    return draw ? LI_MAX(draw, p->n_logprobs) : 0;
}

int32_t li_sampler_sample_cand(li_sampler *s, const float *vals, const int32_t *ids, int32_t n, float lse,
                               li_token_logprob *top, float *chosen_logprob) {
    bool want_lse;
    const int32_t need = li_sampler_cand_need(s, &want_lse);
    if (!need || n < need || ids[0] < 0 || (want_lse && isnan(lse))) return -1;
    for (int32_t i = 0; i < need; i++)
        if (isnan(vals[i])) return -1;
    int32_t chosen;
    if (s->p.temperature <= 0) {
        chosen = ids[0]; /* the lowest id of the largest value: argmax_of's */
    } else {
        const int32_t k = s->p.top_k;
        if (!(vals[k - 1] > vals[k])) return -1; /* a tie at the boundary */
        if (!s->cand) s->cand = li_xmalloc((size_t)s->n_vocab * sizeof *s->cand);
        for (int32_t i = 0; i < k; i++) s->cand[i] = (li_token_logprob){ids[i], vals[i]};
        chosen = chain_tail(s, s->cand, k, vals[0], NULL, NULL);
    }
    /* what report_logprobs reports, from the candidates: the top n_logprobs
     * are the first (logits_top keeps the lower id of equal values, as the
     * candidates are sorted), the chosen one is among the first `need` */
    const li_sampling_params *p = &s->p;
    if (chosen_logprob) *chosen_logprob = 0.0f;
    if (top && p->n_logprobs > 0)
        for (int32_t i = 0; i < p->n_logprobs; i++) top[i] = (li_token_logprob){ids[i], vals[i] - lse};
    if (chosen_logprob && want_lse)
        for (int32_t i = 0; i < need; i++)
            if (ids[i] == chosen) {
                *chosen_logprob = vals[i] - lse;
                break;
            }
    return chosen;
}

float li_sampler_lse(const float *logits, int32_t n_vocab) { return log_sum_exp(logits, n_vocab); }

int32_t li_sampler_sample(li_sampler *s, const float *logits, li_token_logprob *top, float *chosen_logprob) {
    const int32_t chosen = sample_chain(s, logits, NULL, NULL);
    report_logprobs(s, logits, chosen, top, chosen_logprob);
    return chosen;
}

double li_sampler_uniform(li_sampler *s) { return rng_uniform(s->rng); }

int32_t li_sampler_sample_u(li_sampler *s, const float *logits, double u, float *probs, li_token_logprob *top,
                            float *chosen_logprob) {
    const int32_t chosen = sample_chain(s, logits, &u, probs);
    report_logprobs(s, logits, chosen, top, chosen_logprob);
    return chosen;
}

/* ---- for a speculative verifier (sampler.h) ---- */

void li_sampler_report(const li_sampler *s, const float *logits, int32_t chosen, li_token_logprob *top,
                       float *chosen_logprob) {
    report_logprobs(s, logits, chosen, top, chosen_logprob);
}

void li_sampler_window_reset(li_sampler *s, const int32_t *toks, int64_t n) {
    if (!penalties_on(&s->p)) return;
    for (int32_t i = 0; i < s->n_recent; i++) s->counts[s->recent[(s->head_recent + i) % s->cap_recent]] = 0;
    s->n_recent = 0;
    s->head_recent = 0;
    const int64_t from = s->p.penalty_last_n < 0 ? 0 : LI_MAX(0, n - s->p.penalty_last_n);
    for (int64_t i = from; i < n; i++) li_sampler_accept(s, toks[i]);
}
