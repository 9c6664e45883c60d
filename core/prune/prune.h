/* prune.h — `luainfer prune`: structured pruning of a Llama GGUF into a
 * smaller dense GGUF (docs/pruning.md).
 *
 * Three kinds of unit, ranked on calibration text, the lowest removed:
 *   layers  whole transformer blocks, ranked by Block Influence (ShortGPT:
 *           1 - mean over tokens of cos(block input, block output), the
 *           residual stream) or by the KL divergence of the model's logits
 *           with that one block skipped against the full model's;
 *   heads   whole KV groups (a kv head and its n_head/n_head_kv query
 *           heads, so GQA stays valid), the same number in every layer so
 *           the file's scalar head counts stay true; ranked per layer by
 *           mean over tokens of ||W_o[:, group] · att[group]|| (the group's
 *           contribution to the residual stream, "act"), or by the KL of
 *           the model with that one group masked ("kld");
 *   ffn     intermediate channels, the same number in every layer (scalar
 *           feed_forward_length), or with --refit --ffn-alloc error|kl a
 *           number per block (prune_alloc.c; feed_forward_length becomes a
 *           per-layer array, as llama.cpp reads it); ranked per layer by
 *           mean over tokens of |silu(g_j)·u_j| times ||W_down[:, j]|| ("act").
 *   obs     (heads, ffn) structured Optimal Brain Surgeon (prune_obs.c):
 *           per layer, greedily the unit whose removal, with the next
 *           linear's (o_proj's / down_proj's) other columns refit by least
 *           squares on the calibration inputs, adds the least output error;
 *           the refit weights are written (F16).
 * `--refit` gives any heads/ffn ranking the same least-squares refit of
 * the units it keeps.
 *
 * The model is never modified in place: a block is skipped by running a
 * shallow copy of the model whose layer table leaves it out (no hook in the
 * forward pass); head and channel importances are read by a capture backend
 * (the calib.c pattern) wrapping rmsnorm and the o/down matmuls.
 *
 * The output is written to a temporary file next to OUT, loaded back and
 * run over the calibration windows (the predicted quality: KL divergence
 * against the original), then renamed to OUT. */
#ifndef LI_PRUNE_H
#define LI_PRUNE_H

#include "model/model.h"

typedef enum li_prune_what { LI_PRUNE_LAYERS = 0, LI_PRUNE_HEADS, LI_PRUNE_FFN } li_prune_what;
typedef enum li_prune_rank { LI_PRUNE_RANK_BI = 0, LI_PRUNE_RANK_KLD, LI_PRUNE_RANK_ACT, LI_PRUNE_RANK_OBS } li_prune_rank;
/* --ffn-alloc: the same count everywhere; per block from the refit's error
 * curves; per block from KL curves measured on the calibration windows */
typedef enum li_prune_alloc { LI_PRUNE_ALLOC_UNIFORM = 0, LI_PRUNE_ALLOC_ERROR, LI_PRUNE_ALLOC_KL } li_prune_alloc;

typedef struct li_prune_opts {
    const char *in, *out;
    li_prune_what what;
    li_prune_rank rank;
    double ratio;            /* fraction of the parameters to remove, in (0, 1); 0: use keep */
    int64_t keep;            /* layers kept / KV groups kept per layer / channels kept per layer */
    const char *calib;       /* calibration text (this or self_generate) */
    bool self_generate;      /* calibrate on the model's own samples instead (temperature 1, seed) */
    uint64_t seed;
    int64_t samples, seq_len;
    int64_t threads;
    bool refit;              /* least-squares refit of o_proj / down_proj's kept columns (implied by obs) */
    double damp;             /* refit and obs: damping, a fraction of the Hessian's mean diagonal */
    uint32_t refit_type;     /* the refit tensor's type: LI_TYPE_F16 (0 means it), BF16, Q8_0, Q4_0, Q4_1 */
    li_prune_alloc ffn_alloc; /* --ffn-alloc: per-block channel counts (prune_alloc.c); error and kl need
                               * ffn, act and refit */
    double ffn_floor;        /* error: no block keeping fewer than this fraction of the uniform count, (0, 1] */
    bool dry_run;            /* rank, choose and predict; write nothing */
    bool json;               /* the ranking and the prediction as one JSON object on stdout */
} li_prune_opts;

int li_prune_what_parse(const char *s, li_prune_what *out, li_error *err);
int li_prune_rank_parse(const char *s, li_prune_rank *out, li_error *err);
/* --refit-dtype: f16, bf16, q8_0, q4_0 or q4_1 (a clear LI_EINVAL otherwise). */
int li_prune_refit_type_parse(const char *s, uint32_t *out, li_error *err);
const char *li_prune_what_name(li_prune_what w);
const char *li_prune_rank_name(li_prune_rank r);

int li_prune(const li_prune_opts *o, li_error *err);

/* ------------------------------------------------------------------------
 * what to keep (prune_write.c)
 * ---------------------------------------------------------------------- */

typedef struct li_prune_plan {
    li_prune_what what;
    int32_t n_layer_keep;
    int32_t *keep_layer;     /* (n_layer_keep) original block ids, ascending */
    int32_t n_group_keep;    /* KV groups kept per layer (heads), else n_head_kv */
    int32_t *keep_group;     /* (n_layer, n_group_keep) ascending per layer, or NULL */
    int64_t n_ff_keep;       /* channels kept per layer (ffn), else n_ff; the most, with ff_keep_layer */
    int32_t *keep_ff;        /* (n_layer, n_ff_keep) ascending per layer, or NULL; rows of n_ff with ff_keep_layer */
    int64_t *ff_keep_layer;  /* (n_layer) channels kept by each block when they differ (--ffn-alloc), or NULL */
    /* after a refit: per layer the next linear's refit weight, (d_out, n)
     * row-major with its removed columns 0; the writer gathers the kept
     * columns as for a slice and writes them F16. NULL: none */
    float **refit;
    int32_t n_refit;         /* entries of refit (n_layer) */
    uint32_t refit_type;     /* ... written in this type (0: F16) */
} li_prune_plan;

void li_prune_plan_free(li_prune_plan *p);

/* Writes the dense pruned GGUF of m under plan p to path (temporary file
 * and rename, gguf_write.h); `extra` metadata strings are appended as
 * luainfer.prune.* keys (what, rank). */
int li_prune_write(const li_model *m, const li_prune_plan *p, const char *rank, const char *path, li_error *err);

/* ------------------------------------------------------------------------
 * the ranking math (prune_rank.c), exposed for the unit test
 * ---------------------------------------------------------------------- */

/* cos(a, b) in double; 1 when either vector is zero (no information). */
double li_prune_cosine(const float *a, const float *b, int64_t n);
/* log_softmax(logits) into lp (n), in double accumulation, stored f32. */
void li_prune_log_softmax(const float *logits, float *lp, int64_t n);
/* KL(p_base || p) of one row: base given as log-probabilities, p as logits. */
double li_prune_kl_row(const float *base_lp, const float *logits, int64_t n);
/* The k lowest of scores[0..n) (ties: the lower index first) as a 0/1 mask
 * in drop (n). */
void li_prune_lowest(const double *scores, int64_t n, int64_t k, uint8_t *drop);

/* --ffn-alloc (prune_alloc.c). The refit error E(k) of keeping block l's
 * first k channels in score-descending order (the ones li_prune_lowest
 * keeps), for k = 0..n, into curve
 * (n + 1): xtx (n, n) the down_proj inputs' X^T X (both triangles), w
 * (d, n) down_proj, damped as li_prune_obs damps. LI_ERANGE when the damped
 * Gram is not positive definite. */
int li_prune_ffn_curve(const double *xtx, const double *w, int64_t d, int64_t n, const double *score, double damp,
                       double *curve, li_error *err);
/* --ffn-alloc kl: block l's curve (n + 1, indexed by channels kept) from
 * n_pts measured points, removed[j] channels (ascending, in (0, n)) costing
 * kl[j]: 0 at nothing removed, linear between the points, INFINITY past the
 * last (a block is never cut beyond what was measured). */
void li_prune_ffn_curve_interp(const int64_t *removed, const double *kl, int n_pts, int64_t n, double *curve);
/* keep (n_layer) from the curves: `remove` channels taken `unit` at a time
 * (the last step the remainder) from the block whose curve rises least over
 * sig[l] (sig NULL: the rises as they are), no block below floor. */
int li_prune_ffn_allocate(const double *const *curve, const double *sig, int n_layer, int64_t n, int64_t unit,
                          int64_t floor, int64_t remove, int64_t *keep, li_error *err);

/* Structured OBS on one linear y = W x (prune_obs.c): W (d_out, n)
 * row-major, h (n, n) the calibration inputs' X^T X (destroyed), units of
 * `width` adjacent columns. Removes k units (choose: the cheapest each
 * step; else the units already marked in drop: in index order when score
 * is asked for, else all at once), refitting W's other columns by least
 * squares; removed columns end exactly 0.
 * damp: added to the diagonal as a fraction of its mean. score (units, or
 * NULL): a removed unit's output error at its turn, a kept one's at the
 * end. Errors: a non-positive-definite Hessian (raise damp). */
int li_prune_obs(double *w, int64_t d_out, int64_t n, double *h, int64_t width, int64_t k, double damp, bool choose,
                 uint8_t *drop, double *score, li_error *err);

/* Parameter counts (weights' elements, the embedding once when tied). */
typedef struct li_prune_params {
    int64_t total;
    int64_t per_layer;      /* one transformer block, norms included */
    int64_t per_group;      /* one KV group in one layer: q, k, v rows and o columns */
    int64_t per_channel;    /* one FFN channel in one layer: gate, up rows and a down column */
} li_prune_params;
void li_prune_count(const li_model *m, li_prune_params *pp);

#endif
