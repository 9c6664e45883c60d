/* prune_rank.c — the ranking math of `luainfer prune` (prune.h): cosine,
 * log-softmax and KL in double, the k lowest scores, parameter counts. */
#include "prune/prune.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

double li_prune_cosine(const float *a, const float *b, int64_t n) {
    double ab = 0, aa = 0, bb = 0;
    for (int64_t i = 0; i < n; i++) {
        ab += (double)a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
    }
    if (aa == 0 || bb == 0) return 1.0;
    return ab / (sqrt(aa) * sqrt(bb));
}

void li_prune_log_softmax(const float *logits, float *lp, int64_t n) {
    double mx = -INFINITY;
    for (int64_t i = 0; i < n; i++) mx = fmax(mx, logits[i]);
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += exp((double)logits[i] - mx);
    const double lse = mx + log(s);
    for (int64_t i = 0; i < n; i++) lp[i] = (float)((double)logits[i] - lse);
}

double li_prune_kl_row(const float *base_lp, const float *logits, int64_t n) {
    double mx = -INFINITY;
    for (int64_t i = 0; i < n; i++) mx = fmax(mx, logits[i]);
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += exp((double)logits[i] - mx);
    const double lse = mx + log(s);
    double kl = 0;
    for (int64_t i = 0; i < n; i++) {
        const double lb = base_lp[i];
        if (lb < -80) continue; /* p_base ~ 0: its term is 0 to double precision */
        kl += exp(lb) * (lb - ((double)logits[i] - lse));
    }
    return kl > 0 ? kl : 0; /* rounding can leave -1e-17 for equal rows */
}

typedef struct scored {
    double s;
    int64_t i;
} scored;

static int cmp_scored(const void *a, const void *b) {
    const scored *x = a, *y = b;
    if (x->s != y->s) return x->s < y->s ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

void li_prune_lowest(const double *scores, int64_t n, int64_t k, uint8_t *drop) {
    scored *v = li_xmalloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = (scored){isnan(scores[i]) ? INFINITY : scores[i], i};
    qsort(v, (size_t)n, sizeof *v, cmp_scored);
    memset(drop, 0, (size_t)n);
    for (int64_t j = 0; j < k && j < n; j++) drop[v[j].i] = 1;
    free(v);
}

void li_prune_count(const li_model *m, li_prune_params *pp) {
    const li_hparams *hp = &m->hp;
    const int64_t d = hp->n_embd, hd = hp->head_dim, r = hp->n_head / hp->n_head_kv;
    const int64_t q = (int64_t)hp->n_head * hd, kv = (int64_t)hp->n_head_kv * hd;
    memset(pp, 0, sizeof *pp);
    pp->per_group = 2 * (r * hd * d) + 2 * (hd * d);
    pp->per_channel = 3 * d;
    pp->per_layer = 2 * q * d + 2 * kv * d + 3 * (int64_t)hp->n_ff * d + 2 * d;
    pp->total = (int64_t)hp->n_vocab * d + d + (int64_t)hp->n_layer * pp->per_layer;
    if (m->output.data != m->tok_embd.data) pp->total += (int64_t)hp->n_vocab * d;
}
