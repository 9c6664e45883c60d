/* kld.h — KL divergence of a model's next-token distributions against a
 * baseline's, llama.cpp's `--kl-divergence` convention: the baseline's
 * log-probabilities of every scored position are saved by one run
 * (`perplexity --kl-base-out FILE`), and a later run over the same tokens
 * (`perplexity --kl-base FILE`) reports, per scored token,
 *   KL(p_base || p) = sum_i p_base(i) * (log p_base(i) - log p(i))
 * as its mean and 99th percentile, the share of tokens whose top-1 token
 * agrees, and the baseline's perplexity over the same tokens.
 *
 * File: "LIKLD001", u32 n_vocab, u32 0, u64 n_tokens, then per scored token
 * its target id and the baseline's top-1 id (u32 each), then its n_vocab
 * log-probabilities as f32 (llama.cpp keeps 16 bits; f32 leaves no
 * rounding floor under small divergences: 200 KB per token). Written to a temporary
 * file and renamed; read back checked against the run's vocabulary, token
 * count and targets. */
#ifndef LI_KLD_H
#define LI_KLD_H

#include "util/common.h"

#include <stdio.h>

typedef struct li_kld {
    FILE *f;               /* the file being written or read */
    char *path, *tmp;      /* the output and its temporary name (writing) */
    bool writing;
    int32_t n_vocab;
    uint64_t n_tokens;     /* written so far / in the file */
    uint64_t at;           /* tokens read so far */
    float *row;            /* (n_vocab) scratch */
    double *lp;            /* (n_vocab) scratch */
    /* reading: per-token results */
    double *kl;            /* (n_tokens) */
    uint64_t top1_same;
    double base_nll;
} li_kld;

int li_kld_create(li_kld *k, const char *path, int32_t n_vocab, li_error *err);
int li_kld_open(li_kld *k, const char *path, int32_t n_vocab, li_error *err);
/* One scored position: logits (n_vocab) and the target token. Writing:
 * appends its log-probabilities; reading: compares with the next saved
 * one (LI_EINVAL when the file ends or its target differs). */
int li_kld_add(li_kld *k, const float *logits, int32_t target, li_error *err);
/* Writing: finishes the file (header count, rename). Reading: checks that
 * every saved position was used and fills the statistics. */
typedef struct li_kld_stats {
    uint64_t n;
    double kl_mean, kl_p99, kl_max;
    double top1_agree;     /* share in [0, 1] */
    double base_ppl;       /* the baseline's perplexity on the same tokens */
} li_kld_stats;
int li_kld_finish(li_kld *k, li_kld_stats *st, li_error *err);
void li_kld_free(li_kld *k); /* also removes an unfinished temporary file */

#endif
