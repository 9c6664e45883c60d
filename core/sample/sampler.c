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

/* top-k bounds the kept set (else every logit within 40 T nats is kept) */
static bool topk_on(const li_sampler *s) { return s->p.top_k > 0 && s->p.top_k < s->n_vocab; }

/* ... to fewer than the widest fetch: the first top_k + 1 decide a draw */
static bool topk_small(const li_sampler *s) { return topk_on(s) && s->p.top_k < LI_SAMPLER_CAND_WIDE; }


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
    s->cand2 = NULL;
    s->counts = penalties_on(p) ? li_xcalloc((size_t)n_vocab, sizeof *s->counts) : NULL;
    s->cap_recent = p->penalty_last_n < 0 ? 1024 : p->penalty_last_n;
    s->recent = li_xmalloc((size_t)(s->cap_recent ? s->cap_recent : 1) * sizeof *s->recent);
    return 0;
}

void li_sampler_free(li_sampler *s) {
    free(s->cand);
    free(s->cand2);
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

/* llama.cpp's penalty rule for a logit v of a token seen count times:
 * divide positive logits, multiply negative ones, then subtract */
static float penalize(const li_sampling_params *p, uint16_t count, float v) {
    v = v > 0 ? v / p->repeat_penalty : v * p->repeat_penalty;
    return v - ((float)count * p->frequency_penalty + p->presence_penalty);
}

/* Largest value; 16 independent lanes so the compiler vectorizes it (max is
 * exact, so the lane order cannot change the result). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
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

bool li_sampler_logits_usable(const float *logits, int32_t n_vocab) {
    return n_vocab > 0 && isfinite(max_of(logits, n_vocab));
}

/* Lowest index holding the largest value (greedy's tie rule). NaN logits
 * never win, as in the candidate loop below. */
static int32_t argmax_of(const float *x, int32_t n) {
    const float mx = max_of(x, n);
    for (int32_t i = 0; i < n; i++)
        if (x[i] == mx) return i;
    return 0;
}

/* a float's order as an unsigned key, descending: larger values smaller
 * keys (-0 as +0) */
static uint32_t sort_key(float v) {
    uint32_t u;
    if (v == 0.0f) v = 0.0f;
    memcpy(&u, &v, sizeof u);
    u = u & 0x80000000u ? ~u : u | 0x80000000u; /* ascending */
    return ~u;
}

static int cmp_desc(const void *a, const void *b) {
    const li_token_logprob *x = a, *y = b;
    if (x->logprob > y->logprob) return -1;
    if (x->logprob < y->logprob) return 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* exp(x) in double for x <= 0 (a logit less the row's max, times a
 * scale), 8 at a time in GCC/Clang vector types (each lane's arithmetic is
 * IEEE's own, so the same bits on every ISA; C11 fuses no multiply-add):
 * x = k ln2 + r, |r| <= ln2 / 2, e^r by its Taylor series to r^12
 * (relative error below 2e-16), 2^k by the exponent's bits. Below -708
 * (k < -1021) a lane is 0: such a term is under 1e-307 of a sum holding
 * exp(0) = 1. A NaN stays NaN. */
typedef double li_v8d __attribute__((vector_size(64)));
typedef int64_t li_v8l __attribute__((vector_size(64)));
typedef float li_v8f __attribute__((vector_size(32)));

static inline void exp_le0_v8(li_v8d *xp) { /* in place: a vector this wide is not passed by value */
    const li_v8d x = *xp;
    /* shifter: 1.5 * 2^52, so t's low bits hold k */
    const li_v8d zero = {0}, lo = zero - 708.0, shifter = zero + 6755399441055744.0;
    const li_v8l under = x < lo;
    const li_v8d xc = (li_v8d)(((li_v8l)x & ~under) | ((li_v8l)lo & under));
    const li_v8d t = xc * 1.4426950408889634 + shifter, k = t - shifter;
    const li_v8d r = (xc - k * 6.93147180369123816490e-01) - k * 1.90821492927058770002e-10;
    li_v8d p = r * (1.0 / 479001600.0) + 1.0 / 39916800.0;
    p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0;
    p = p * r + 1.0 / 40320.0;
    p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    const li_v8l e2k = ((li_v8l)t - 0x4338000000000000 + 1023) << 52; /* k + 1023 in the exponent */
    *xp = (li_v8d)((li_v8l)(p * (li_v8d)e2k) & ~under);
}

/* sum over i of exp((logits[i] - mx) * scale), in double: eight partial sums
 * (index i to lane i % 8, each in index order; the last few lanes of a row
 * not a multiple of 8 get exp(-inf) = 0), added 0..7 at the end: the same
 * value on every ISA */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
__attribute__((target_clones("avx512f", "avx2", "default"))) /* the same lanes' arithmetic, wider registers */
#endif
static double sum_exp(const float *logits, int32_t n, float mx, double scale) {
    li_v8d part = {0};
    for (int32_t i = 0; i < n; i += 8) {
        li_v8f l;
        if (i + 8 <= n) memcpy(&l, logits + i, sizeof l);
        else
            for (int j = 0; j < 8; j++) l[j] = i + j < n ? logits[i + j] : -INFINITY;
        li_v8d e = (__builtin_convertvector(l, li_v8d) - (double)mx) * scale;
        exp_le0_v8(&e);
        part += e;
    }
    double sum = 0;
    for (int j = 0; j < 8; j++) sum += part[j];
    return sum;
}

/* log(sum(exp(logits))), the one normalizer every reported logprob uses, so
 * a token's logprob is the same number wherever it is reported. The max is
 * taken 16 lanes wide; the sum stays in double in a fixed order (sum_exp),
 * so the value does not depend on the ISA. Computed when a logprob is asked
 * for, or when a draw from the largest logits needs the row's mass. */
static float log_sum_exp(const float *logits, int32_t n_vocab) {
    float mx = max_of(logits, n_vocab);
    return mx + (float)log(sum_exp(logits, n_vocab, mx, 1.0));
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

/* c (n, in id order, no NaN) sorted as cmp_desc sorts it (by value
 * descending, then id: a total order, so the one result), by a stable
 * radix sort of the values' keys, 11 bits a pass: qsort of a 49k
 * vocabulary took 8 ms a draw. -0 counts as +0, as cmp_desc's == does. */
static void sort_desc_radix(li_sampler *s, li_token_logprob *c, int32_t n) {
    if (!s->cand2) s->cand2 = li_xmalloc((size_t)s->n_vocab * sizeof *s->cand2);
    li_token_logprob *src = c, *dst = s->cand2;
    for (int pass = 0; pass < 3; pass++) {
        int32_t count[2049] = {0};
        const int shift = 11 * pass;
        for (int32_t i = 0; i < n; i++) count[1 + ((sort_key(src[i].logprob) >> shift) & 2047)]++;
        for (int b = 0; b < 2048; b++) count[b + 1] += count[b];
        for (int32_t i = 0; i < n; i++) dst[count[(sort_key(src[i].logprob) >> shift) & 2047]++] = src[i];
        li_token_logprob *t = src;
        src = dst, dst = t;
    }
    if (src != c) memcpy(c, src, (size_t)n * sizeof *c); /* three passes: the result is in the scratch */
}

/* ---- the chain ------------------------------------------------------------ */

/* probs (n_vocab) as a one-hot at `id`: greedy's distribution */
static void probs_one_hot(float *probs, int32_t n_vocab, int32_t id) {
    memset(probs, 0, (size_t)n_vocab * sizeof *probs);
    probs[id] = 1.0f;
}

static int32_t chain_tail(li_sampler *s, li_token_logprob *c, int32_t n, float mx, const double *u, float *probs);
static int32_t sample_fast(li_sampler *s, const float *logits, const double *u);
static int32_t sample_topk_probs(li_sampler *s, const float *logits, const double *u, float *probs);

/* The chain from logits to a token. The draw uses *u when given, else the
 * next seeded uniform (greedy draws none). probs (n_vocab), when non-NULL,
 * receives the distribution the draw was made from; it is the only extra
 * work, and only then: without it a kept set top_k does not bound is drawn
 * from its largest logits first (sample_fast). */
static int32_t sample_chain(li_sampler *s, const float *logits, const double *u, float *probs) {
    const li_sampling_params *p = &s->p;
    const int32_t nv = s->n_vocab;
    if (p->temperature <= 0 && !penalties_on(p) && !p->n_logit_bias && !s->n_ban) {
        /* plain greedy: the argmax, no candidate list */
        const int32_t chosen = argmax_of(logits, nv);
        if (probs) probs_one_hot(probs, nv, chosen);
        return chosen;
    }
    if (!s->reference) { /* from the largest logits first (with the distribution: a verifier's top_k row) */
        const int32_t chosen = probs ? sample_topk_probs(s, logits, u, probs) : sample_fast(s, logits, u);
        if (chosen >= 0) return chosen;
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
        if (penalties_on(p) && s->counts[i]) v = penalize(p, s->counts[i], v);
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
    if (topk_on(s)) {
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
    if (n > 512 && !topk_on(s)) sort_desc_radix(s, c, n); /* c is in id order */
    else qsort(c, (size_t)n, sizeof *c, cmp_desc);
    return chain_tail(s, c, n, mx, u, probs);
}

/* top-p on the temperature-1 distribution: the kept count of the n sorted
 * candidates c, given their sum of exp(l - mx). cum is monotone in sum, so
 * the cand path below brackets the result by bracketing the sum. */
static int32_t top_p_cut(const li_sampling_params *p, const li_token_logprob *c, int32_t n, float mx, double sum) {
    if (p->top_p < 1.0f) {
        double cum = 0;
        for (int32_t i = 0; i < n; i++) {
            cum += exp((double)c[i].logprob - mx) / sum;
            if (cum >= p->top_p) return i + 1;
        }
    }
    return n;
}

/* min-p: the kept count of c[0, n), at least 1 */
static int32_t min_p_cut(const li_sampling_params *p, const li_token_logprob *c, int32_t n, float mx) {
    if (!(p->min_p > 0.0f)) return n;
    const float cut = mx + logf(p->min_p);
    int32_t w = 1;
    while (w < n && c[w].logprob >= cut) w++;
    return w;
}

/* temperature, then a draw from the kept c[0, n) */
static int32_t draw_kept(li_sampler *s, const li_token_logprob *c, int32_t n, float mx, const double *u, float *probs) {
    const li_sampling_params *p = &s->p;
    double z = 0;
    for (int32_t i = 0; i < n; i++) z += exp(((double)c[i].logprob - mx) / p->temperature);
    if (probs) {
        memset(probs, 0, (size_t)s->n_vocab * sizeof *probs);
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

/* The chain's end, from the kept candidates c[0, n) sorted by cmp_desc and
 * the largest logit mx: top-p and min-p on the temperature-1
 * distribution, then temperature and the draw. */
static int32_t chain_tail(li_sampler *s, li_token_logprob *c, int32_t n, float mx, const double *u, float *probs) {
    double sum = 0;
    for (int32_t i = 0; i < n; i++) sum += exp((double)c[i].logprob - mx);
    n = top_p_cut(&s->p, c, n, mx, sum);
    n = min_p_cut(&s->p, c, n, mx);
    return draw_kept(s, c, n, mx, u, probs);
}

/* the most ids the chain may change before a draw: penalty window, bias, ban */
static int32_t edit_bound(const li_sampler *s) {
    return (penalties_on(&s->p) ? s->n_recent : 0) + s->p.n_logit_bias + s->n_ban;
}

static int cmp_i32(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int32_t li_sampler_edit_ids(const li_sampler *s, int32_t *out, int32_t cap) {
    if (edit_bound(s) > cap) return -1;
    int32_t n = 0;
    if (penalties_on(&s->p))
        for (int32_t i = 0; i < s->n_recent; i++) out[n++] = s->recent[(s->head_recent + i) % s->cap_recent];
    for (int32_t i = 0; i < s->p.n_logit_bias; i++) out[n++] = s->p.logit_bias[i].id;
    for (int32_t i = 0; i < s->n_ban; i++) out[n++] = s->ban[i];
    qsort(out, (size_t)n, sizeof *out, cmp_i32);
    int32_t w = 0;
    for (int32_t i = 0; i < n; i++)
        if (!w || out[i] != out[w - 1]) out[w++] = out[i];
    return w;
}

/* What the chain makes of id's raw logit before it draws (sample_chain's
 * steps for one id, in its order and arithmetic) */
static float edited(const li_sampler *s, int32_t id, float v) {
    for (int32_t k = 0; k < s->p.n_logit_bias; k++)
        if (s->p.logit_bias[k].id == id) v += s->p.logit_bias[k].bias;
    for (int32_t k = 0; k < s->n_ban; k++)
        if (s->ban[k] == id) v = -INFINITY;
    if (penalties_on(&s->p) && s->counts[id]) v = penalize(&s->p, s->counts[id], v);
    return v;
}

int32_t li_sampler_cand_need(const li_sampler *s, bool *lse) {
    const li_sampling_params *p = &s->p;
    *lse = p->logprob || p->n_logprobs > 0;
    const int32_t edits = edit_bound(s);
    if (edits > LI_SAMPLER_EDIT_MAX) return 0;
    if (p->temperature <= 0 && !edits) return LI_MAX(1, p->n_logprobs);
    /* top_k: one past it (a tie there would leave the choice of the kept
     * set to the full logits' selection) */
    if (p->temperature > 0 && topk_small(s) && !edits) return LI_MAX(p->top_k + 1, p->n_logprobs);
    /* a wider kept set, or logits the chain changes: the widest fetch, and
     * (when sampling wide) the lse to bound the rest */
    if (p->temperature > 0 && !topk_small(s)) *lse = true;
    return LI_MIN(LI_SAMPLER_CAND_WIDE, s->n_vocab);
}

float li_sampler_cand_scale(const li_sampler *s) {
    const li_sampling_params *p = &s->p;
    if (!(p->temperature > 0) || p->temperature == 1.0f || (topk_small(s) && !edit_bound(s))) return 0;
    return (float)(1.0 / (double)p->temperature);
}

/* The draw from candidates when the kept set may reach past them: what
 * sample_chain would draw, or -1 (the RNG untouched) when the logits not
 * seen could change it.
 *
 * c[0, n): the largest logits after the chain's edits, sorted as the
 * chain sorts them and ahead of every other logit in that order, so every
 * sum the chain makes over them is the same prefix sum here; mx = c[0]'s.
 * The rest (the tail): at most n_tail of them can be kept, none above
 * bound, their mass at temperature 1 (exp(l - mx) each) between t1_lo and
 * t1_hi (from the row's lse), and at temperature T between tt_lo and
 * tt_hi (from the lse at T; NAN: not known). When the chain's kept set lies within c (the
 * 40-nat cut, top-p or min-p ends there, for every sum the tail allows)
 * the draw is exact; otherwise it is bracketed: the temperature-T sum z
 * between its least and largest possible values, and the draw is taken
 * when both give the same token. */
static int32_t sample_wide(li_sampler *s, li_token_logprob *c, int32_t n, float bound, double n_tail, double t1_lo,
                           double t1_hi, double tt_lo, double tt_hi, const double *u) {
    const li_sampling_params *p = &s->p;
    const bool bounded = topk_on(s);
    const float mx = c[0].logprob;
    int32_t m = n;
    bool cut_all = false; /* every tail logit lies below the cut */
    if (!bounded) { /* the chain drops logits 40 T nats below the best first */
        const float cut = mx - 40.0f * (p->temperature > 1.0f ? p->temperature : 1.0f);
        while (m > 1 && !(c[m - 1].logprob >= cut)) m--;
        cut_all = bound < cut;
    }
    if (n_tail <= 0 || m < n || cut_all) return chain_tail(s, c, m, mx, u, NULL); /* every kept logit is seen */
    const double e_last = exp((double)bound - mx);
    double acc1 = 0;
    for (int32_t i = 0; i < n; i++) acc1 += exp((double)c[i].logprob - mx);
    /* the whole tail's mass (w1), and what of it top-k can keep (t1) */
    const double w1_lo = LI_MAX(t1_lo, 0.0), w1_hi = LI_MAX(t1_hi, 0.0);
    t1_hi = LI_MIN(w1_hi, n_tail * e_last), t1_lo = bounded ? 0 : w1_lo; /* which of the tail top-k keeps: unknown */
    if (t1_lo > t1_hi) return -1; /* lse disagrees with the candidates */
    /* top-p's cut, for the least and the largest sum the tail allows (cum
     * falls as the sum grows): the same count, or undecided */
    bool past = true; /* the kept set reaches past the candidates */
    int32_t kn = n;
    if (p->top_p < 1.0f) {
        const int32_t a = top_p_cut(p, c, n, mx, (acc1 + t1_lo) * (1 - 1e-9));
        const int32_t b = top_p_cut(p, c, n, mx, (acc1 + t1_hi) * (1 + 1e-9));
        if (a != b) return -1;
        if (a < n) past = false, kn = a; /* else cum never reached top_p among the candidates */
    }
    const int32_t w = min_p_cut(p, c, kn, mx); /* a candidate below min-p's cut ends the kept set */
    if (w < kn) past = false;
    if (!past) return draw_kept(s, c, w, mx, u, NULL);
    /* the kept set is every candidate and some of the tail. Their mass at
     * temperature 1: the whole tail's when nothing truncates; with top-p,
     * what takes the kept set's mass to top_p of the sum (cum reached it at
     * the last kept logit, not before); with min-p, no lower bound */
    double k1_lo = p->top_p >= 1.0f ? t1_lo : 0, k1_hi = t1_hi;
    if (p->top_p < 1.0f) {
        k1_lo = LI_MAX(k1_lo, ((double)p->top_p - 1e-9) * (acc1 + t1_lo) * (1 - 1e-9) - acc1);
        k1_hi = LI_MIN(k1_hi, ((double)p->top_p + 1e-9) * (acc1 + t1_hi) * (1 + 1e-9) + e_last - acc1);
    }
    if (p->min_p > 0.0f) k1_lo = 0;
    k1_lo = LI_MAX(k1_lo, 0.0);
    if (k1_lo > k1_hi) return -1;
    /* ... and at temperature T (z's tail part), each term e^(1/T) for an
     * e <= e_last: by e_last's power and the power means over n_tail terms */
    const double it = 1.0 / (double)p->temperature;
    double tz_lo, tz_hi;
    if (it >= 1) {
        tz_hi = k1_hi * pow(e_last, it - 1); /* e^it <= e * e_last^(it - 1) */
        tz_lo = pow(n_tail, 1 - it) * pow(k1_lo, it);
    } else {
        tz_hi = LI_MIN(n_tail * pow(e_last, it), pow(n_tail, 1 - it) * pow(k1_hi, it));
        tz_lo = k1_lo; /* e^it >= e for e <= 1 */
    }
    /* the tail's mass at T, when fetched: all of it is kept when nothing
     * truncates; else the kept part is the tail's largest logits, whose
     * share of the mass grows with 1/T (at 1/T >= 1 at least its share at
     * 1, at 1/T < 1 at most) */
    if (!isnan(tt_lo) && !isnan(tt_hi)) {
        tt_lo = LI_MAX(tt_lo, 0.0);
        tz_hi = LI_MIN(tz_hi, tt_hi);
        if (p->top_p >= 1.0f && !(p->min_p > 0.0f) && !bounded) tz_lo = LI_MAX(tz_lo, tt_lo);
        else if (it >= 1 && w1_hi > 0) tz_lo = LI_MAX(tz_lo, k1_lo / w1_hi * tt_lo);
        else if (it < 1 && w1_lo > 0) tz_hi = LI_MIN(tz_hi, k1_hi / w1_lo * tt_hi);
        if (tz_lo > tz_hi) return -1; /* the two lse disagree */
    }
    double zk = 0;
    for (int32_t i = 0; i < n; i++) zk += exp(((double)c[i].logprob - mx) / p->temperature);
    const double z_lo = (zk + tz_lo) * (1 - 1e-9), z_hi = (zk + tz_hi) * (1 + 1e-9);
    uint64_t rng[4]; /* the draw the RNG would give, taken only when it decides */
    memcpy(rng, s->rng, sizeof rng);
    const double uu = u ? *u : rng_uniform(rng), r_lo = uu * z_lo, r_hi = uu * z_hi;
    double acc = 0;
    for (int32_t i = 0; i < n; i++) {
        acc += exp(((double)c[i].logprob - mx) / p->temperature);
        if (r_lo < acc) { /* the least z's token: the largest z's too? */
            if (!(r_hi < acc)) return -1;
            memcpy(s->rng, rng, sizeof rng); /* advanced only when it drew */
            return c[i].id;
        }
    }
    return -1; /* the draw lands in the tail */
}

/* The draw from the fetched candidates (sampler.h), or -1 (the RNG
 * untouched); cd's edited ids are the sampler's own (li_sampler_edit_ids:
 * the caller made sure). The draw uses *u when given, else the RNG. */
static int32_t sample_from(li_sampler *s, const li_sampler_cands *cd, const double *u) {
    const li_sampling_params *p = &s->p;
    const float *vals = cd->vals;
    const int32_t *ids = cd->ids, n = cd->n, *eids = cd->edit_ids, ne = cd->n_edit;
    if (p->temperature <= 0 && !ne) return ids[0]; /* the lowest id of the largest value: argmax_of's */
    if (p->temperature > 0 && topk_small(s) && !ne) { /* the kept set is the first top_k: exact, unless the next ties it */
        const int32_t k = p->top_k;
        if (!(vals[k - 1] > vals[k])) return -1;
        if (!s->cand) s->cand = li_xmalloc((size_t)s->n_vocab * sizeof *s->cand);
        for (int32_t i = 0; i < k; i++) s->cand[i] = (li_token_logprob){ids[i], vals[i]};
        return chain_tail(s, s->cand, k, vals[0], u, NULL);
    }
    /* the edited row's largest: every fetched logit the chain leaves as it
     * is, and the edited ones above theta (no unseen logit is larger than
     * theta, and one equal to it has a larger id than every fetched one) */
    const float theta = vals[n - 1];
    if (!s->cand) s->cand = li_xmalloc((size_t)s->n_vocab * sizeof *s->cand);
    if (!s->cand2) s->cand2 = li_xmalloc((size_t)s->n_vocab * sizeof *s->cand2);
    if ((int64_t)n + ne > s->n_vocab) return -1; /* c and tail hold at most n + ne entries */
    li_token_logprob *c = s->cand, *tail = s->cand2;
    int32_t nc = 0, nt = 0;
    bool e_at_theta = false, fetched[LI_SAMPLER_EDIT_MAX] = {false}; /* edited ids among the fetched */
    for (int32_t i = 0; i < n; i++) {
        const int32_t *e = ne ? bsearch(&ids[i], eids, (size_t)ne, sizeof *eids, cmp_i32) : NULL;
        if (!e) {
            c[nc++] = (li_token_logprob){ids[i], vals[i]};
            continue;
        }
        if (vals[i] != cd->edit_vals[e - eids]) return -1; /* the fetched values disagree */
        fetched[e - eids] = true;
    }
    for (int32_t j = 0; j < ne; j++) {
        const float v = edited(s, eids[j], cd->edit_vals[j]);
        if (isnan(v)) return -1;
        if (v > theta) c[nc++] = (li_token_logprob){eids[j], v};
        else tail[nt++] = (li_token_logprob){eids[j], v}, e_at_theta |= v == theta;
    }
    if (ne) qsort(c, (size_t)nc, sizeof *c, cmp_desc);
    float bound = theta; /* no tail logit is larger */
    if (e_at_theta) /* an edited id at theta may sort before a fetched one there */
        while (nc > 0 && c[nc - 1].logprob == theta) tail[nt++] = c[--nc];
    if (nc < 1) return -1;
    if (p->temperature <= 0) return c[0].id;
    const bool bounded = topk_on(s);
    if (bounded && p->top_k < nc) { /* the kept set lies among them: exact, unless the next ties it */
        if (!(c[p->top_k - 1].logprob > c[p->top_k].logprob)) return -1;
        return chain_tail(s, c, p->top_k, c[0].logprob, u, NULL);
    }
    if (bounded) { /* top-k may keep other ids of the last value: to the tail */
        bound = LI_MAX(bound, c[nc - 1].logprob);
        const float last = c[nc - 1].logprob;
        while (nc > 0 && c[nc - 1].logprob == last) tail[nt++] = c[--nc];
        if (nc < 1) return -1;
    }
    const float lse = cd->lse, mxr = vals[0], mx = c[0].logprob;
    if (!isfinite(mx) || !isfinite(mxr) || !isfinite(lse)) return -1;
    /* the tail's mass at temperature 1, relative to mx: the unseen logits'
     * (the row's raw mass S1, from lse = mxr + log(S1) in floats, less
     * every fetched or edited id's raw mass; each rounding is within 2^-24
     * of its value, and 1e-9 covers the double sums' own order) and the
     * known tail's */
    const float sc = li_sampler_cand_scale(s); /* the lse at T's scale, as the device used it */
    const bool at_t = sc > 0 && isfinite(cd->lse_t);
    const double it = (double)sc;
    double known = 0, known_t = 0;
    for (int32_t i = 0; i < n; i++) {
        known += exp((double)vals[i] - mxr);
        if (at_t) known_t += exp(((double)vals[i] - mxr) * it);
    }
    int32_t n_known = n;
    for (int32_t j = 0; j < ne; j++) {
        if (fetched[j]) continue;
        if (!(cd->edit_vals[j] <= theta)) return -1; /* a raw logit above theta was not fetched */
        known += exp((double)cd->edit_vals[j] - mxr), n_known++;
        if (at_t) known_t += exp(((double)cd->edit_vals[j] - mxr) * it);
    }
    const double ld = (double)lse - mxr, dl = 0x1p-23 * (fabs(ld) + fabs((double)lse)) + 1e-9;
    const double scale = exp((double)mxr - mx);
    const double n_unseen = (double)s->n_vocab - n_known;
    double kt = 0;
    for (int32_t i = 0; i < nt; i++) kt += exp((double)tail[i].logprob - mx);
    const double u_hi = LI_MIN(n_unseen * exp((double)theta - mx), (exp(ld + dl) - known * (1 - 1e-9)) * scale);
    const double u_lo = (exp(ld - dl) - known * (1 + 1e-9)) * scale - (double)s->n_vocab * exp(-40.0);
    const double n_tail = bounded ? (double)(p->top_k - nc) : n_unseen + nt;
    /* the same at temperature T from the lse at T, when fetched. The chain
     * divides by T where the device multiplied by sc: over the 40 T nats
     * the chain keeps, their exponents differ by at most rel */
    double tt_lo = NAN, tt_hi = NAN;
    if (at_t) {
        const double T = (double)p->temperature, lt = cd->lse_t;
        const double ldt = lt - mxr, dlt = 0x1p-23 * (fabs(ldt) + fabs(lt)) + 1e-9;
        const double rel = 40.0 * LI_MAX(T, 1.0) * fabs(it - 1.0 / T) + 1e-9, scale_t = exp(((double)mxr - mx) * it);
        double ktt = 0;
        for (int32_t i = 0; i < nt; i++) ktt += exp(((double)tail[i].logprob - mx) / T);
        const double ut_hi = (exp(ldt + dlt) - known_t * (1 - 1e-9)) * scale_t;
        const double ut_lo = (exp(ldt - dlt) - known_t * (1 + 1e-9)) * scale_t - (double)s->n_vocab * exp(-39.0);
        tt_lo = (ktt + LI_MAX(ut_lo, 0.0)) * (1 - 1e-9) * exp(-rel);
        tt_hi = (ktt + LI_MAX(ut_hi, 0.0)) * (1 + 1e-9) * exp(rel);
    }
    return sample_wide(s, c, nc, bound, n_tail, kt * (1 - 1e-9) + LI_MAX(u_lo, 0.0),
                       kt * (1 + 1e-9) + LI_MAX(u_hi, 0.0), tt_lo, tt_hi, u);
}

int32_t li_sampler_sample_cand(li_sampler *s, const li_sampler_cands *cd, li_token_logprob *top,
                               float *chosen_logprob) {
    bool want_lse;
    const int32_t need = li_sampler_cand_need(s, &want_lse);
    const int32_t n = cd->n;
    /* a top value that is not finite: the row's logits decide (a model gone
     * NaN or Inf ends the request there, li_sampler_logits_usable) */
    if (!need || n < need || n < 1 || n > s->n_vocab || cd->ids[0] < 0 || (want_lse && isnan(cd->lse)) ||
        !isfinite(cd->vals[0]))
        return -1;
    /* sorted by value descending, then id ascending, ids in range */
    for (int32_t i = 0; i < n; i++) {
        const float v = cd->vals[i];
        const int32_t id = cd->ids[i];
        if (isnan(v) || id < 0 || id >= s->n_vocab) return -1;
        if (i && !(v < cd->vals[i - 1] || (v == cd->vals[i - 1] && id > cd->ids[i - 1]))) return -1;
    }
    /* the ids the chain edits, as the device read them */
    int32_t eids[LI_SAMPLER_EDIT_MAX];
    const int32_t ne = edit_bound(s) ? li_sampler_edit_ids(s, eids, LI_SAMPLER_EDIT_MAX) : 0;
    if (ne < 0 || ne != cd->n_edit || (ne && memcmp(eids, cd->edit_ids, (size_t)ne * sizeof *eids))) return -1;
    const int32_t chosen = sample_from(s, cd, NULL);
    if (chosen < 0) return -1;
    /* what report_logprobs reports, from the raw candidates: the top
     * n_logprobs are the first (logits_top keeps the lower id of equal
     * values, as the candidates are sorted); the chosen one's raw logit is
     * among the fetched or the edited ones */
    const li_sampling_params *p = &s->p;
    if (chosen_logprob) *chosen_logprob = 0.0f;
    if (top && p->n_logprobs > 0)
        for (int32_t i = 0; i < p->n_logprobs; i++) top[i] = (li_token_logprob){cd->ids[i], cd->vals[i] - cd->lse};
    if (chosen_logprob && (p->logprob || p->n_logprobs > 0)) {
        bool found = false;
        for (int32_t i = 0; i < n && !found; i++)
            if (cd->ids[i] == chosen) *chosen_logprob = cd->vals[i] - cd->lse, found = true;
        for (int32_t j = 0; j < cd->n_edit && !found; j++)
            if (cd->edit_ids[j] == chosen) *chosen_logprob = cd->edit_vals[j] - cd->lse, found = true;
    }
    return chosen;
}

float li_sampler_lse(const float *logits, int32_t n_vocab) { return log_sum_exp(logits, n_vocab); }

float li_sampler_lse_scaled(const float *logits, int32_t n_vocab, double scale) {
    const float mx = max_of(logits, n_vocab);
    return mx + (float)log(sum_exp(logits, n_vocab, mx, scale));
}

#define HOST_CAND 256 /* the largest a host draw starts from */

/* Bins of 1/32 nat counted down from a row's max (host_cands): a logit x's
 * bin is (int)d, d = (mx - x) * scale in float. Every path below computes
 * that d with the same two IEEE operations, so they take the same logits. */
enum { CAND_BINS = 2048 }; /* 64 nats */

/* (id, logit) of every logit x[i..n) less than lim bins below mx, in id
 * order, to c; their count. *nan (when given) says whether they hold a NaN. */
static int32_t cand_take_c(const float *x, int32_t i, int32_t n, float mx, float scale, float lim,
                           li_token_logprob *c, bool *nan) {
    int32_t m = 0;
    bool bad = false;
    for (; i < n; i++) {
        bad |= isnan(x[i]);
        if ((mx - x[i]) * scale < lim) c[m++] = (li_token_logprob){i, x[i]};
    }
    if (nan) *nan = bad;
    return m;
}

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#include <immintrin.h>
/* cand_take_c 16 logits a compare: a block without a taken logit (most of
 * a row: about 300 of 49k lie within 8 nats of the best) costs the compare */
__attribute__((target("avx512f"))) static int32_t cand_take_avx512(const float *x, int32_t n, float mx, float scale,
                                                                   float lim, li_token_logprob *c, bool *nan) {
    const __m512 vmx = _mm512_set1_ps(mx), vsc = _mm512_set1_ps(scale), vlim = _mm512_set1_ps(lim);
    __mmask16 bad = 0;
    int32_t i = 0, m = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        const __m512 d = _mm512_mul_ps(_mm512_sub_ps(vmx, v), vsc);
        bad |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        for (uint32_t k = _mm512_cmp_ps_mask(d, vlim, _CMP_LT_OQ); k; k &= k - 1) {
            const int32_t id = i + __builtin_ctz(k);
            c[m++] = (li_token_logprob){id, x[id]};
        }
    }
    bool tail_nan = false;
    m += cand_take_c(x, i, n, mx, scale, lim, c + m, &tail_nan);
    if (nan) *nan = bad || tail_nan;
    return m;
}
#endif

static int32_t cand_take(const float *x, int32_t n, float mx, float scale, float lim, li_token_logprob *c, bool *nan) {
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
    if (__builtin_cpu_supports("avx512f")) return cand_take_avx512(x, n, mx, scale, lim, c, nan);
#endif
    return cand_take_c(x, 0, n, mx, scale, lim, c, nan);
}

/* The HOST_CAND largest logits of a row (no NaN) less those tied with the
 * last, into s->cand sorted as cmp_desc sorts them: exactly the logits above
 * the last kept value, in the full chain's order. Their count, or -1 for a
 * row holding a NaN. By a histogram over the 64 nats below the best: bins
 * of 1/32 nat counted from the top until HOST_CAND, then the logits of
 * those bins (a bin's index never grows with the value, so every logit left
 * out is at most every one kept), sorted. The histogram takes the logits
 * within 8 nats of the best, or 16, 32, 64, the first span holding
 * HOST_CAND of them (the model's rows: 8 nats, about 300 logits, most of the
 * time): its bins are the full histogram's first, and the count stops
 * inside them. (Binning all 49k logits one by one was 60 of the 80 us a
 * verified row took at temperature > 0.) */
static int32_t host_cands(li_sampler *s, const float *logits) {
    const int32_t nv = s->n_vocab;
    if (!s->cand) s->cand = li_xmalloc((size_t)nv * sizeof *s->cand);
    li_token_logprob *c = s->cand;
    const float mx = max_of(logits, nv), scale = (float)CAND_BINS / 64.0f;
    int32_t m = 0, lim = CAND_BINS / 8;
    for (;; lim *= 2) {
        bool nan = false;
        m = cand_take(logits, nv, mx, scale, (float)lim, c, lim == CAND_BINS / 8 ? &nan : NULL);
        if (nan) return -1; /* the full chain's NaN rule */
        if (m >= HOST_CAND || lim == CAND_BINS) break;
    }
    /* the span's bins only: every taken logit's bin is below lim */
    int32_t hist[CAND_BINS];
    memset(hist, 0, (size_t)lim * sizeof *hist);
    for (int32_t i = 0; i < m; i++) hist[(int)((mx - c[i].logprob) * scale)]++;
    int32_t top = 0, got = 0;
    while (top < lim - 1 && got + hist[top] < HOST_CAND) got += hist[top++];
    int32_t kept = 0;
    for (int32_t i = 0; i < m; i++)
        if ((mx - c[i].logprob) * scale < (float)(top + 1)) c[kept++] = c[i];
    qsort(c, (size_t)kept, sizeof *c, cmp_desc);
    int32_t n = LI_MIN(kept, HOST_CAND);
    const float last = n ? c[n - 1].logprob : 0.0f;
    while (n > 0 && c[n - 1].logprob == last) n--;
    return n;
}

/* A draw with its distribution (a speculative verifier's row) for a top_k
 * below HOST_CAND and nothing edited: the kept set is the first top_k of
 * the largest, so the chain's tail runs on them (sorting and filling 49k
 * entries took 0.35 ms a row); -1 when a tie at top_k's edge leaves the set
 * to the full chain. The same token and distribution as the full chain. */
static int32_t sample_topk_probs(li_sampler *s, const float *logits, const double *u, float *probs) {
    const li_sampling_params *p = &s->p;
    if (!(p->temperature > 0) || !topk_on(s) || p->top_k >= HOST_CAND || s->n_vocab <= HOST_CAND || edit_bound(s))
        return -1;
    const int32_t n = host_cands(s, logits), k = p->top_k;
    if (n <= k || !(s->cand[k - 1].logprob > s->cand[k].logprob)) return -1;
    return chain_tail(s, s->cand, k, s->cand[0].logprob, u, probs);
}

/* The chain's draw without sorting the vocabulary: for a kept set top_k
 * does not bound (top-p, min-p, temperature alone: sorting every logit
 * within 40 nats, most of a 49k vocabulary, took 8 ms a draw), and for a
 * top_k below HOST_CAND (the quickselect over the vocabulary took 0.3 ms
 * of a 2 ms decode step). The HOST_CAND largest (a histogram, then a sort
 * of those) and, where the draw may need it, the row's lse (at 1 and at
 * T), through the device's path (sample_from): the same token, drawn with
 * *u when given, or -1 when the rest could change it (a tie at top_k's
 * edge, an undecided bracket: then the full chain draws; the RNG is
 * untouched). */
static int32_t sample_fast(li_sampler *s, const float *logits, const double *u) {
    const li_sampling_params *p = &s->p;
    const int32_t nv = s->n_vocab;
    if (!(p->temperature > 0) || (topk_on(s) && p->top_k >= HOST_CAND) || nv <= HOST_CAND) return -1;
    int32_t eids[LI_SAMPLER_EDIT_MAX];
    float ev[LI_SAMPLER_EDIT_MAX];
    const int32_t ne = edit_bound(s) ? li_sampler_edit_ids(s, eids, LI_SAMPLER_EDIT_MAX) : 0;
    if (ne < 0) return -1;
    const int32_t n = host_cands(s, logits);
    if (n < 1) return -1;
    const li_token_logprob *c = s->cand;
    float vals[HOST_CAND];
    int32_t ids[HOST_CAND];
    for (int32_t i = 0; i < n; i++) vals[i] = c[i].logprob, ids[i] = c[i].id;
    for (int32_t j = 0; j < ne; j++) ev[j] = logits[eids[j]];
    /* a top_k below the candidates, nothing edited: sample_from draws from
     * the first top_k and never reads the lse (a pass of exps over the row) */
    const bool no_lse = topk_on(s) && ne == 0 && p->top_k < n;
    const float sc = li_sampler_cand_scale(s);
    const li_sampler_cands cd = {
        .vals = vals, .ids = ids, .n = n, .lse = no_lse ? NAN : log_sum_exp(logits, nv),
        .lse_t = !no_lse && sc > 0 ? li_sampler_lse_scaled(logits, nv, sc) : NAN, .edit_ids = eids, .edit_vals = ev,
        .n_edit = ne,
    };
    return sample_from(s, &cd, u);
}

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
