/* test_prune.c — the ranking math of `luainfer prune` (core/prune/prune.h)
 * at odd sizes against long-double transcriptions of the definitions:
 * cosine, log-softmax, KL(p_base || p), the k lowest scores (ties, NaN),
 * and the parameter counts of a synthetic model. */
#include "prune/prune.h"
#include "test_util.h"

#include <string.h>

static long double ref_cos(const float *a, const float *b, int64_t n) {
    long double ab = 0, aa = 0, bb = 0;
    for (int64_t i = 0; i < n; i++) ab += (long double)a[i] * b[i], aa += (long double)a[i] * a[i], bb += (long double)b[i] * b[i];
    return ab / sqrtl(aa * bb);
}

static long double ref_kl(const float *base_logits, const float *logits, int64_t n) {
    long double mb = -INFINITY, m = -INFINITY, sb = 0, s = 0, kl = 0;
    for (int64_t i = 0; i < n; i++) mb = fmaxl(mb, base_logits[i]), m = fmaxl(m, logits[i]);
    for (int64_t i = 0; i < n; i++) sb += expl(base_logits[i] - mb), s += expl(logits[i] - m);
    for (int64_t i = 0; i < n; i++) {
        const long double lb = base_logits[i] - mb - logl(sb), lp = logits[i] - m - logl(s);
        kl += expl(lb) * (lb - lp);
    }
    return kl;
}

static void test_cosine(void) {
    const int64_t sizes[] = {1, 3, 7, 33, 577};
    for (size_t si = 0; si < LI_ARRAY_LEN(sizes); si++) {
        const int64_t n = sizes[si];
        float *a = malloc((size_t)n * sizeof(float)), *b = malloc((size_t)n * sizeof(float));
        for (int64_t i = 0; i < n; i++) a[i] = rng_f() * 3, b[i] = a[i] * 0.5f + rng_f();
        const double got = li_prune_cosine(a, b, n), want = (double)ref_cos(a, b, n);
        CHECK(fabs(got - want) < 1e-12, "n=%lld cos %.17g want %.17g", (long long)n, got, want);
        CHECK(fabs(li_prune_cosine(a, a, n) - 1) < 1e-12, "cos(a, a) = 1 at n=%lld", (long long)n);
        for (int64_t i = 0; i < n; i++) b[i] = -2 * a[i];
        CHECK(fabs(li_prune_cosine(a, b, n) + 1) < 1e-12, "cos(a, -2a) = -1 at n=%lld", (long long)n);
        memset(b, 0, (size_t)n * sizeof(float));
        CHECK(li_prune_cosine(a, b, n) == 1.0, "a zero vector: 1 (no information)");
        free(a);
        free(b);
    }
}

static void test_kl(void) {
    const int64_t sizes[] = {2, 5, 49, 1001};
    for (size_t si = 0; si < LI_ARRAY_LEN(sizes); si++) {
        const int64_t n = sizes[si];
        float *bl = malloc((size_t)n * sizeof(float)), *l = malloc((size_t)n * sizeof(float));
        float *lp = malloc((size_t)n * sizeof(float));
        for (int64_t i = 0; i < n; i++) bl[i] = rng_f() * 8, l[i] = bl[i] + rng_f() * 2;
        bl[0] = 40; /* one dominant token, far-away others (the > 80 nats cut-off) */
        li_prune_log_softmax(bl, lp, n);
        long double s = 0;
        for (int64_t i = 0; i < n; i++) s += expl(lp[i]);
        CHECK(fabsl(s - 1) < 1e-6, "log_softmax sums to %.12Lg at n=%lld", s, (long long)n);
        const double got = li_prune_kl_row(lp, l, n), want = (double)ref_kl(bl, l, n);
        CHECK(fabs(got - want) <= 1e-6 * fmax(1, want), "n=%lld KL %.12g want %.12g", (long long)n, got, want);
        CHECK(got >= 0, "KL >= 0");
        CHECK(li_prune_kl_row(lp, bl, n) < 1e-6, "KL(p || p) = %g", li_prune_kl_row(lp, bl, n));
        for (int64_t i = 0; i < n; i++) l[i] = bl[i] + 123.5f; /* a shift leaves the distribution */
        CHECK(li_prune_kl_row(lp, l, n) < 1e-5, "shift invariant: %g", li_prune_kl_row(lp, l, n));
        free(bl);
        free(l);
        free(lp);
    }
}

static void test_lowest(void) {
    const double s[7] = {0.5, 0.1, NAN, 0.1, 0.3, -2, 0.3};
    uint8_t d[7];
    li_prune_lowest(s, 7, 3, d);
    const uint8_t want3[7] = {0, 1, 0, 1, 0, 1, 0}; /* -2, then the two 0.1 */
    CHECK(!memcmp(d, want3, 7), "k=3");
    li_prune_lowest(s, 7, 4, d);
    const uint8_t want4[7] = {0, 1, 0, 1, 1, 1, 0}; /* a tie at 0.3: the lower index */
    CHECK(!memcmp(d, want4, 7), "k=4 tie");
    li_prune_lowest(s, 7, 7, d);
    CHECK(d[2] == 1, "NaN ranks last, removed only when everything is");
    li_prune_lowest(s, 7, 0, d);
    int any = 0;
    for (int i = 0; i < 7; i++) any |= d[i];
    CHECK(!any, "k=0 removes nothing");
    li_prune_lowest(s, 7, 9, d);
    any = 1;
    for (int i = 0; i < 7; i++) any &= d[i];
    CHECK(any, "k > n removes all");
}

static void test_count(void) {
    li_model m;
    memset(&m, 0, sizeof m);
    m.hp = (li_hparams){.n_vocab = 11, .n_embd = 7, .n_layer = 3, .n_head = 6, .n_head_kv = 2, .head_dim = 5, .n_ff = 13};
    static const char a, b;
    m.tok_embd.data = &a;
    m.output.data = &a; /* tied */
    li_prune_params pp;
    li_prune_count(&m, &pp);
    const int64_t q = 6 * 5, kv = 2 * 5;
    const int64_t layer = 7 * q + 2 * 7 * kv + q * 7 + 3 * 13 * 7 + 2 * 7;
    CHECK(pp.per_layer == layer, "per layer %lld want %lld", (long long)pp.per_layer, (long long)layer);
    CHECK(pp.total == 11 * 7 + 7 + 3 * layer, "tied total %lld", (long long)pp.total);
    CHECK(pp.per_group == 2 * (3 * 5 * 7) + 2 * (5 * 7), "per group %lld", (long long)pp.per_group);
    CHECK(pp.per_channel == 3 * 7, "per channel");
    /* a group's and a channel's parameters add up to the layer's */
    CHECK(2 * pp.per_group + 13 * pp.per_channel + 2 * 7 == pp.per_layer, "units partition a layer");
    m.output.data = &b;
    li_prune_count(&m, &pp);
    CHECK(pp.total == 2 * 11 * 7 + 7 + 3 * layer, "untied: the output counts too");
}

int main(void) {
    test_cosine();
    test_kl();
    test_lowest();
    test_count();
    return t_summary("prune");
}
