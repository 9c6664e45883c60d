/* kld.c — baseline distributions and KL divergence (kld.h). */
#define _GNU_SOURCE
#include "quant/kld.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char MAGIC[8] = {'L', 'I', 'K', 'L', 'D', '0', '0', '1'};

/* log-softmax of logits in double, and the argmax */
static int32_t log_softmax(const float *lg, int32_t n, double *out) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++) best = lg[i] > lg[best] ? i : best;
    const double mx = lg[best];
    double sum = 0;
    for (int32_t i = 0; i < n; i++) sum += exp((double)lg[i] - mx);
    const double lse = mx + log(sum);
    for (int32_t i = 0; i < n; i++) out[i] = (double)lg[i] - lse;
    return best;
}

int li_kld_create(li_kld *k, const char *path, int32_t n_vocab, li_error *err) {
    memset(k, 0, sizeof *k);
    k->writing = true;
    k->n_vocab = n_vocab;
    k->path = strdup(path);
    if (!k->path || asprintf(&k->tmp, "%s.tmp.%ld", path, (long)getpid()) < 0) abort();
    k->f = fopen(k->tmp, "wb");
    if (!k->f) {
        const int e = errno;
        li_kld_free(k);
        return li_error_set(err, LI_EIO, "cannot write '%s': %s", path, strerror(e));
    }
    const uint32_t hv[2] = {(uint32_t)n_vocab, 0};
    const uint64_t n = 0;
    fwrite(MAGIC, 1, 8, k->f);
    fwrite(hv, 4, 2, k->f);
    fwrite(&n, 8, 1, k->f);
    k->row = li_xmalloc((size_t)n_vocab * sizeof *k->row);
    k->lp = li_xmalloc((size_t)n_vocab * sizeof *k->lp);
    return 0;
}

int li_kld_open(li_kld *k, const char *path, int32_t n_vocab, li_error *err) {
    memset(k, 0, sizeof *k);
    k->f = fopen(path, "rb");
    if (!k->f) return li_error_set(err, LI_EIO, "cannot open baseline distributions '%s': %s", path, strerror(errno));
    char mg[8];
    uint32_t hv[2];
    if (fread(mg, 1, 8, k->f) != 8 || memcmp(mg, MAGIC, 8) || fread(hv, 4, 2, k->f) != 2 ||
        fread(&k->n_tokens, 8, 1, k->f) != 1) {
        li_kld_free(k);
        return li_error_set(err, LI_EINVAL, "'%s' is not a baseline distribution file (perplexity --kl-base-out)", path);
    }
    if ((int32_t)hv[0] != n_vocab) {
        li_kld_free(k);
        return li_error_set(err, LI_EINVAL, "'%s' holds distributions over %u tokens, this model has %d", path, hv[0],
                            n_vocab);
    }
    if (k->n_tokens == 0 || k->n_tokens > ((uint64_t)1 << 32)) {
        li_kld_free(k);
        return li_error_set(err, LI_EINVAL, "'%s': bad token count %llu", path, (unsigned long long)k->n_tokens);
    }
    k->n_vocab = n_vocab;
    k->row = li_xmalloc((size_t)n_vocab * sizeof *k->row);
    k->lp = li_xmalloc((size_t)n_vocab * sizeof *k->lp);
    k->kl = li_xmalloc((size_t)k->n_tokens * sizeof *k->kl);
    return 0;
}

int li_kld_add(li_kld *k, const float *logits, int32_t target, li_error *err) {
    const int32_t nv = k->n_vocab;
    const int32_t top = log_softmax(logits, nv, k->lp);
    if (k->writing) {
        for (int32_t i = 0; i < nv; i++) k->row[i] = (float)k->lp[i];
        const uint32_t rec[2] = {(uint32_t)target, (uint32_t)top};
        if (fwrite(rec, 4, 2, k->f) != 2 || fwrite(k->row, 4, (size_t)nv, k->f) != (size_t)nv)
            return li_error_set(err, LI_EIO, "cannot write '%s': %s", k->path, strerror(errno));
        k->n_tokens++;
        return 0;
    }
    uint32_t rec[2];
    if (k->at >= k->n_tokens || fread(rec, 4, 2, k->f) != 2 || fread(k->row, 4, (size_t)nv, k->f) != (size_t)nv)
        return li_error_set(err, LI_EINVAL, "the baseline distributions end after %llu tokens: not the same text, "
                            "--ctx or --chunks", (unsigned long long)k->at);
    if (rec[0] != (uint32_t)target)
        return li_error_set(err, LI_EINVAL, "scored token %llu is %d here but %u in the baseline: not the same text",
                            (unsigned long long)k->at, target, rec[0]);
    double kl = 0, psum = 0;
    for (int32_t i = 0; i < nv; i++) {
        const double bl = k->row[i], p = exp(bl);
        kl += p * (bl - k->lp[i]);
        psum += p;
    }
    /* the f32 log-probs sum to 1 only to their rounding: renormalized, KL >= 0 */
    k->kl[k->at] = fmax(kl / psum + log(psum), 0.0);
    k->top1_same += rec[1] == (uint32_t)top;
    k->base_nll += -(double)k->row[target] + log(psum);
    k->at++;
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int li_kld_finish(li_kld *k, li_kld_stats *st, li_error *err) {
    memset(st, 0, sizeof *st);
    if (k->writing) {
        bool ok = fseek(k->f, 16, SEEK_SET) == 0 && fwrite(&k->n_tokens, 8, 1, k->f) == 1;
        ok = fclose(k->f) == 0 && ok;
        k->f = NULL;
        if (!ok || rename(k->tmp, k->path) != 0)
            return li_error_set(err, LI_EIO, "cannot write '%s': %s", k->path, strerror(errno));
        free(k->tmp);
        k->tmp = NULL;
        st->n = k->n_tokens;
        return 0;
    }
    if (k->at != k->n_tokens)
        return li_error_set(err, LI_EINVAL, "the baseline has %llu scored tokens, this run %llu: not the same text, "
                            "--ctx or --chunks", (unsigned long long)k->n_tokens, (unsigned long long)k->at);
    st->n = k->at;
    double sum = 0;
    for (uint64_t i = 0; i < k->at; i++) sum += k->kl[i];
    qsort(k->kl, (size_t)k->at, sizeof *k->kl, cmp_double);
    st->kl_mean = sum / (double)k->at;
    st->kl_p99 = k->kl[(size_t)fmin((double)k->at - 1, ceil(0.99 * (double)k->at) - 1)]; /* nearest rank */
    st->kl_max = k->kl[k->at - 1];
    st->top1_agree = (double)k->top1_same / (double)k->at;
    st->base_ppl = exp(k->base_nll / (double)k->at);
    return 0;
}

void li_kld_free(li_kld *k) {
    if (k->f) fclose(k->f);
    if (k->tmp) unlink(k->tmp);
    free(k->tmp);
    free(k->path);
    free(k->row);
    free(k->lp);
    free(k->kl);
    memset(k, 0, sizeof *k);
}
