/* proposer.h — one interface for every way of drafting tokens.
 *
 * A proposer drafts up to k tokens for each of a step's speculating
 * requests at once (one call per step and method, so a model proposer runs
 * its k draft steps batched over the requests). The engine owns everything
 * else: which requests speculate and with what k, the KV slots the drafts
 * may write (reserved and copied-on-write before the call), verification
 * (spec/verify.h) and rollback. Rollback costs nothing in any proposer:
 * KV past a request's last verified position is simply written over later,
 * in the target's storage and in a draft's, so only verified tokens ever
 * reach the prefix cache.
 *
 * Methods:
 *   ngram      prompt lookup over the request's own tokens (spec/ngram.c);
 *              deterministic drafts, no KV.
 *   draft      a draft model (same vocabulary) whose KV storage follows the
 *              target's block pool; before the call the engine brings its
 *              KV up to the request's last token (only requests that draft
 *              with it, only the positions it has not computed: lazy), so
 *              the proposer only runs the k autoregressive draft steps.
 *   layerskip  the target's first N blocks plus its output norm and head.
 *              Those N layers' KV are exactly the target's own (same
 *              weights, same tokens, batch-invariant kernels), so the
 *              proposer reads and writes the target's pool: no extra KV,
 *              no extra pass over the batch. A draft step writes layers
 *              [0, N) of positions the target then verifies and rewrites
 *              with the same bits, or leaves past the verified end.
 *   eagle      an EAGLE draft block (spec/eagle.h) whose KV storage follows
 *              the target's pool and is written by the engine right after
 *              every target pass (the same rows, fed the target's captured
 *              hidden states): step 0 reads the request's last token with
 *              the captured rows of the position before it (seq.feature),
 *              the next steps feed back the block's own output. Its logits
 *              cover the draft vocabulary (zero probability outside it).
 *   medusa     Medusa heads (spec/medusa.h) over the target's post-norm
 *              hidden state at the request's last computed position: a
 *              candidate tree (parent[] filled) of their top-k, verified by
 *              the engine in one tree pass; deterministic (q = NULL), no KV.
 * At temperature > 0 a model proposer samples its drafts from
 * softmax(logits / T) with the request's own uniforms and hands out those
 * distributions (q) for lossless verification; ngram drafts stay
 * deterministic (q = NULL). */
#ifndef LI_SPEC_PROPOSER_H
#define LI_SPEC_PROPOSER_H

#include "kv/kv_cache.h"
#include "model/forward.h"
#include "spec/verify.h"

typedef enum li_spec_method {
    LI_SPEC_NGRAM = 0,
    LI_SPEC_DRAFT,
    LI_SPEC_LAYERSKIP,
    LI_SPEC_MEDUSA,
    LI_SPEC_EAGLE,
    LI_SPEC_N_METHODS
} li_spec_method;

/* "ngram", "draft", "layerskip", "medusa", "eagle"; "?" out of range. */
const char *li_spec_method_name(int method);
/* The method a name gives; LI_EINVAL naming the choices otherwise. `what`
 * names the option in the message. */
int li_spec_method_parse(const char *name, const char *what, li_spec_method *out, li_error *err);

/* One request asking for drafts this step. */
typedef struct li_spec_seq {
    int64_t id;
    const int32_t *toks;         /* (n_toks) prompt + generated; the last is not in the KV yet */
    int64_t n_toks;
    const int32_t *blocks;       /* (n_blocks) its block table: a model proposer writes the KV of
                                  * positions [n_toks - 1, n_toks - 1 + k) (reserved by the engine) */
    int32_t n_blocks;
    int32_t k;                   /* drafts wanted, 1..LI_SPEC_MAX_DRAFT */
    float temperature;           /* > 0: model proposers sample and fill q */
    li_spec_uniform_fn uniform;  /* draws for sampled drafts (the request's seeded RNG) */
    void *uctx;
    /* out */
    int32_t *draft;              /* (k) caller's */
    float *q;                    /* (k, n_vocab) caller's, filled when *has_q is set */
    int32_t n_draft;             /* 0..k */
    bool has_q;                  /* q holds the distributions the drafts were sampled from */
    /* tree proposers (medusa) */
    const float *hidden;         /* (n_embd) the target's post-norm hidden state that predicted
                                  * toks[n_toks - 1], or NULL (then no drafts) */
    int32_t *parent;             /* (k) caller's, or NULL: out, each draft's tree parent (a draft
                                  * index before it, -1 = a child of the last token) */
    /* eagle */
    const float *feature;        /* (in_width) the target's captured rows at position n_toks - 2,
                                  * or NULL: zeros (a request with no such row: a prefix hit) */
} li_spec_seq;

#define LI_SPEC_MAX_DRAFT 16

typedef struct li_proposer li_proposer;

typedef struct li_proposer_ops {
    /* Fills each seq's draft (n_draft may stay 0). An error fails nothing
     * but this step's drafts. */
    int (*propose)(li_proposer *p, li_spec_seq *seqs, int32_t n, li_error *err);
    /* (optional) after verification: how many of the request's drafts were
     * checked and how many accepted */
    void (*on_verified)(li_proposer *p, int64_t id, int32_t drafted, int32_t accepted);
    /* (optional) the request was preempted, finished or cancelled */
    void (*on_release)(li_proposer *p, int64_t id);
    void (*free)(li_proposer *p);
} li_proposer_ops;

struct li_proposer {
    const li_proposer_ops *ops;
    li_spec_method method;
    int32_t n_vocab;
};

/* Prompt lookup: n-grams of n_max down to n_min tokens (li_spec_ngram_draft). */
li_proposer *li_proposer_ngram_new(int n_max, int n_min, int32_t n_vocab);

/* A model proposer (method LI_SPEC_DRAFT or LI_SPEC_LAYERSKIP) running m on
 * be over kv, whose positions before each seq's last token must already
 * hold m's KV. cap: draft tokens per step (one per request). m, be and kv
 * are borrowed and must outlive the proposer. */
int li_proposer_model_new(li_proposer **out, li_spec_method method, const li_model *m, li_backend *be,
                          li_kv_cache *kv, int32_t cap, li_error *err);

/* m's first n_layer blocks with its embedding, output norm and head: a
 * shallow view sharing every weight (nothing to free; m must outlive it). */
int li_spec_layer_view(li_model *view, const li_model *m, int32_t n_layer, li_error *err);

struct li_eagle;
/* An EAGLE draft eg (prepared on be, li_eagle_prepare) drafting over kv, a
 * follower of the target's pool holding eg's KV at every position before
 * each seq's last token (the engine writes it after every target pass).
 * cap: seqs per step. eg, be and kv must outlive the proposer. */
int li_proposer_eagle_new(li_proposer **out, struct li_eagle *eg, li_backend *be, li_kv_cache *kv, int32_t cap,
                          li_error *err);

struct li_medusa;
struct li_medusa_tree;
/* Medusa heads h (prepared on the target's backend, li_medusa_prepare with
 * at least cap rows) drafting `tree` (copied) for up to cap seqs a call.
 * h must outlive the proposer. */
int li_proposer_medusa_new(li_proposer **out, struct li_medusa *h, const struct li_medusa_tree *tree, int32_t cap,
                           li_error *err);

void li_proposer_free(li_proposer *p);

/* Test hook of a model proposer: fn sees each seq's first draft step, its
 * last token at position n_toks - 1, and the logits it gave (n_vocab; an
 * EAGLE draft's n_draft); NULL stops. */
typedef void (*li_proposer_observe_fn)(void *ud, int64_t id, int32_t pos, const float *logits);
void li_proposer_model_observe(li_proposer *p, li_proposer_observe_fn fn, void *ud);

/* softmax(logits / t) into probs (n), in double, and argmax (ties: lowest
 * id) when t <= 0 (then probs is one-hot). */
int32_t li_spec_draft_dist(const float *logits, int32_t n, float t, float *probs);

#endif
