/* sampler.h — turning logits into the next token.
 *
 * The chain, in llama.cpp's order: logit bias (OpenAI's `logit_bias`:
 * per-token offsets added to the logits), penalties (repetition, presence,
 * frequency over the last `penalty_last_n` tokens), top-k, top-p, min-p (all
 * on the temperature-1 distribution), then temperature and a draw from a
 * seeded RNG (the draw can also be handed in, and the distribution it is
 * made from handed out: see li_sampler_sample_u). temperature <= 0 is
 * greedy (argmax after bias and penalties; ties go to the lowest id).
 * Top-N logprobs are reported from the raw model logits, before bias and
 * penalties, as vLLM reports them by default. */
#ifndef LI_SAMPLER_H
#define LI_SAMPLER_H

#include "util/common.h"

/* One logit_bias entry: `bias` is added to token `id`'s logit. */
typedef struct li_logit_bias {
    int32_t id;
    float bias;
} li_logit_bias;

#define LI_LOGIT_BIAS_MAX 1024   /* entries per request */
#define LI_LOGIT_BIAS_RANGE 100.0f /* |bias| <= this, OpenAI's range */

typedef struct li_sampling_params {
    float temperature;       /* <= 0: greedy */
    int32_t top_k;           /* <= 0: off */
    float top_p;             /* >= 1: off */
    float min_p;             /* <= 0: off */
    float repeat_penalty;    /* 1: off; >1 pushes seen tokens down */
    float presence_penalty;  /* 0: off; subtracted once per seen token */
    float frequency_penalty; /* 0: off; subtracted per occurrence */
    int32_t penalty_last_n;  /* window of recent tokens the penalties look at; -1 = all */
    uint64_t seed;           /* same seed, same logits -> same tokens */
    int32_t n_logprobs;      /* top-N logprobs to report (0..20) */
    bool logprob;            /* report the chosen token's logprob (implied by n_logprobs > 0);
                                off, the sampler skips the normalizer over the vocabulary */
    const li_logit_bias *logit_bias; /* (n_logit_bias) borrowed: li_sampler_init copies it;
                                        an id listed twice gets both biases */
    int32_t n_logit_bias;
} li_sampling_params;

/* llama.cpp's defaults: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05. */
void li_sampling_params_default(li_sampling_params *p);
int li_sampling_params_validate(const li_sampling_params *p, li_error *err);

typedef struct li_token_logprob {
    int32_t id;
    float logprob;
} li_token_logprob;

typedef struct li_sampler {
    li_sampling_params p;
    int32_t n_vocab;
    uint64_t rng[4];       /* xoshiro256** state */
    li_token_logprob *cand;/* (n_vocab) scratch candidates */
    li_token_logprob *cand2; /* (n_vocab) the radix sort's other half */
    int32_t *recent;       /* ring of the last penalty_last_n tokens */
    int32_t n_recent, cap_recent, head_recent;
    uint16_t *counts;      /* (n_vocab) occurrences inside the window */
    li_logit_bias *bias;   /* (p.n_logit_bias) owned copy; p.logit_bias points here */
    const int32_t *ban;    /* (n_ban) ids that cannot be drawn now (borrowed; min_tokens) */
    int32_t n_ban;
    bool reference;        /* every draw by the full chain, never from the largest logits first (tests) */
} li_sampler;

/* Fails (LI_EINVAL) on invalid params or a logit_bias id outside [0, n_vocab). */
int li_sampler_init(li_sampler *s, const li_sampling_params *p, int32_t n_vocab, li_error *err);
void li_sampler_free(li_sampler *s);
/* Until the next call, ids (n, in [0, n_vocab); borrowed) cannot be drawn:
 * their logits count as -inf after the bias. NULL/0 lifts the ban.
 * Reported logprobs stay raw. */
void li_sampler_ban(li_sampler *s, const int32_t *ids, int32_t n);
/* ---- drawing from the largest logits alone (a device's top-k) ----
 *
 * A device backend samples where the logits are by fetching each row's
 * largest few (sorted by value descending then id ascending), its
 * log-sum-exp, and the raw logits of the ids the chain edits (bias, a
 * ban, the penalty window): never the whole row, unless these cannot
 * decide the draw.
 *
 * li_sampler_cand_need: how many of the largest to fetch for the next
 * draw, and in *lse whether the row's lse is needed (li_sampler_lse);
 * 0 when the full logits are needed (more than LI_SAMPLER_EDIT_MAX edited
 * ids). Greedy needs 1; top_k = K below LI_SAMPLER_CAND_WIDE needs K + 1
 * (the one past the kept set shows it is not a tie); logprobs at least
 * n_logprobs, with the lse. A wider kept set (top_k off or larger:
 * top-p, min-p or temperature alone) or edited ids take the widest fetch,
 * a wide kept set the lse too (and at T != 1 the lse at T,
 * li_sampler_cand_scale): they bound the mass of the logits not fetched.
 * li_sampler_edit_ids: the ids whose raw logits the fetch must also read,
 * ascending, each once; their count (0: none), or -1 above cap.
 * li_sampler_sample_cand: the token li_sampler_sample would draw from
 * that row, advancing the RNG as it would, and the logprobs it would
 * report (top, *chosen_logprob, as li_sampler_sample's); or -1, with the
 * RNG untouched, when the candidates cannot decide it (too few, a NaN,
 * ids[0] < 0, a tie at top_k, edited ids other than li_sampler_edit_ids',
 * a draw that the logits not fetched could change): then sample the
 * logits. */
#define LI_SAMPLER_CAND_WIDE 64  /* the widest fetch (a backend's LI_TOPK_MAX) */
#define LI_SAMPLER_EDIT_MAX 256  /* the most edited ids a fetch reads */
typedef struct li_sampler_cands {
    const float *vals;       /* (n) the row's n largest raw logits, sorted */
    const int32_t *ids;      /* (n) their ids */
    int32_t n;
    float lse;               /* the row's raw log-sum-exp, NAN when not fetched */
    float lse_t;             /* at li_sampler_cand_scale's scale, NAN when not fetched */
    const int32_t *edit_ids; /* (n_edit) li_sampler_edit_ids' */
    const float *edit_vals;  /* (n_edit) their raw logits */
    int32_t n_edit;
} li_sampler_cands;
int32_t li_sampler_cand_need(const li_sampler *s, bool *lse);
int32_t li_sampler_edit_ids(const li_sampler *s, int32_t *out, int32_t cap);
/* 1/T when a wide draw also uses the row's lse at its temperature T
 * (li_sampler_lse_scaled at that scale: it bounds the unseen logits'
 * mass at T far closer than lse alone), else 0 */
float li_sampler_cand_scale(const li_sampler *s);
int32_t li_sampler_sample_cand(li_sampler *s, const li_sampler_cands *c, li_token_logprob *top,
                               float *chosen_logprob);
/* The normalizer every reported logprob subtracts: max + log(sum(exp(l -
 * max))), the sum in double in index order (what a device's lse op
 * computes in its own order). */
float li_sampler_lse(const float *logits, int32_t n_vocab);
/* The same with each exponent scaled: mx + log(sum(exp((l - mx) * scale)))
 * (at scale 1/T, the mass at temperature T; at 1, li_sampler_lse's) */
float li_sampler_lse_scaled(const float *logits, int32_t n_vocab, double scale);
/* Whether a row of logits can be drawn from: its largest value is finite
 * (a NaN logit alone never wins; a row of NaNs, or one with +Inf, comes
 * from NaN or Inf in the model's weights or activations). */
bool li_sampler_logits_usable(const float *logits, int32_t n_vocab);
/* Records a token (prompt or generated) into the penalty window. */
void li_sampler_accept(li_sampler *s, int32_t token);
/* Picks the next token from logits (n_vocab). When top is non-NULL it
 * receives p.n_logprobs entries; *chosen_logprob (if non-NULL) gets the
 * chosen token's raw logprob when p.logprob or p.n_logprobs asks for it,
 * else 0. Does not accept the token. */
int32_t li_sampler_sample(li_sampler *s, const float *logits, li_token_logprob *top, float *chosen_logprob);
/* ---- distributions and reusable draws (for a speculative verifier) ----
 *
 * li_sampler_sample draws exactly one seeded uniform per call when
 * temperature > 0 and none when greedy; li_sampler_uniform hands out that
 * same draw, so
 *     li_sampler_sample_u(s, logits, li_sampler_uniform(s), NULL, top, lp)
 * returns the token li_sampler_sample(s, logits, top, lp) would, and leaves
 * the RNG where it would (greedy aside: there the extra draw is unused).
 *
 * The distribution: probs (n_vocab) gets, for each id, the probability the
 * draw gave it after logit bias, the ban, penalties, top-k, top-p, min-p and
 * temperature: softmax((l - max) / T) over the kept ids, computed in double
 * and stored as f32; 0 for every filtered id. Greedy (temperature <= 0)
 * gives a one-hot at the chosen id. The draw walks the kept ids from the
 * most to the least probable (ties: lower id first) and takes the first
 * whose cumulative probability exceeds u. */

/* The next seeded uniform in [0, 1) (53 random bits); advances the RNG. */
double li_sampler_uniform(li_sampler *s);
/* As li_sampler_sample, but draws with u in [0, 1) (u >= 1 or NaN: the
 * least probable kept id) instead of the RNG, which it leaves untouched;
 * when probs (n_vocab) is non-NULL it receives the distribution above. */
int32_t li_sampler_sample_u(li_sampler *s, const float *logits, double u, float *probs, li_token_logprob *top,
                            float *chosen_logprob);
/* What li_sampler_sample reports (top, *chosen_logprob) had it drawn
 * `chosen` from logits: for a token a speculative verifier picked. */
void li_sampler_report(const li_sampler *s, const float *logits, int32_t chosen, li_token_logprob *top,
                       float *chosen_logprob);
/* Refills the penalty window from the last penalty_last_n of toks (n): takes
 * back accepts made tentatively (drafts a verifier then rejected). */
void li_sampler_window_reset(li_sampler *s, const int32_t *toks, int64_t n);
/* Raw log-softmax of one id, and the top-n ids by logit (sorted). */
void li_logits_top(const float *logits, int32_t n_vocab, int32_t n, li_token_logprob *out, bool as_logprob);

#endif
