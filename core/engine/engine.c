/* engine.c — the step loop. Owns: requests, the runners (runner.c: the
 * target, whose KV cache is the block pool, and an optional draft over
 * storage following it), the flat batch. Asks, and glues to the policy:
 * the prefix-cache manager (kv/prefix_cache.c), a request's output stream
 * (output.c: text, stop strings, events), the proposers that draft tokens
 * for speculation (spec/proposer.h) and the built-in FCFS (policy/fcfs.c).
 *
 * C owns every byte of state; the policy only proposes a plan. Validation
 * drops unknown or finished ids, clamps token counts to what remains, trims
 * to the step budgets and the free KV blocks, and counts every change. A plan
 * that ends up computing nothing while work is pending is replaced by the
 * built-in FCFS for that step, so a broken policy slows nothing down and
 * loses no request. */
#define _GNU_SOURCE
#include "engine/engine.h"
#include "engine/output.h"
#include "engine/runner.h"
#include "engine/tp.h"
#include "kv/prefix_cache.h"
#include "spec/medusa.h"
#include "spec/proposer.h"
#include "spec/verify.h"
#include "tokenizer/tokenizer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- requests ------------------------------------------------------------ */

typedef struct req {
    li_request_result res;    /* public view: tokens/text point into this struct */
    li_req_state state;
    bool live;                /* false once finished or cancelled */
    bool cancel_pending;      /* cancel asked during a step */
    int32_t *toks;            /* (cap) prompt then generated tokens */
    int64_t n_toks, cap;
    int64_t n_prompt, num_computed, max_tokens;
    li_kv_seq seq;
    li_sampler smp;
    li_output out;            /* detokenized text, stop strings, what was sent */
    int32_t *ban;             /* (n_ban) stop token ids, then, with min_tokens and without
                               * ignore_eos, the end-of-generation ones: what min_tokens
                               * holds back; NULL when empty */
    int n_ban, n_stop_ids;    /* the first n_stop_ids of ban are the stop token ids */
    int64_t min_tokens;
    int32_t n_draft;          /* draft tokens at the end of toks this step (speculation) */
    int64_t spec_drafted, spec_accepted;
    bool ignore_eos;
    int32_t priority;
    char *tenant;
    li_event_fn on_event;
    void *ud;
    li_token_logprob *top;    /* (n_logprobs) scratch */
    struct req *fork_of;      /* n > 1: waits for this parent's prompt, then shares its blocks */
    char *cache_salt;
    li_prefix_seq pfx;        /* seq's side of the prefix cache: block hashes, what is registered */
    bool spec_set;            /* the request's own speculation (li_request_params) */
    li_spec_method spec_method;
    int32_t spec_k;
    li_spec_method d_method;  /* the proposer of this step's drafts */
    int64_t d_q;              /* offset in the engine's sq of the (n_draft, n_vocab)
                               * distributions sampled drafts came from; -1: deterministic */
    int64_t spec_drafted_by[LI_SPEC_N_METHODS], spec_accepted_by[LI_SPEC_N_METHODS];
    int64_t pol_step;         /* the step the speculate hook chose pol_method / pol_k for */
    int32_t pol_method, pol_k;
    int64_t plan_mark;        /* == e->plan_marks: a run entry of the plan being applied */
    double slo_ttft_ms, slo_tpot_ms; /* the request's objectives (0 = none), for policies */
    /* Medusa: the target's post-norm hidden state that predicted toks[hid_tok] */
    float *hid;               /* (n_embd), or NULL */
    int64_t hid_tok;          /* -1: none */
    bool d_tree;              /* this step's drafts are a tree: d_parent holds it */
    int32_t d_parent[LI_SPEC_MAX_TOKENS]; /* each draft's parent draft, -1 = the last token */
} req;

struct li_engine {
    li_model *model;          /* tgt.model */
    li_backend *be;           /* tgt.be */
    li_engine_config cfg;
    li_runner tgt;            /* the target: its KV cache is the block pool */
    li_runner draft;          /* when has_draft: runs each step's batch over storage following the pool */
    bool has_draft;
    /* the draft's last step: (d_rows) request id and position of each logit row */
    int64_t *d_row_id;        /* (max_rows) */
    int32_t *d_row_pos;       /* (max_rows) */
    int32_t d_rows;
    li_prefix_cache pc;       /* the prefix-cache manager over tgt.kv */
    li_policy *policy;
    double t0;
    int64_t next_id, step_no;
    bool in_step;

    req **reqs;               /* arrival order; live and finished-unreleased */
    int32_t n_reqs, cap_reqs;

    /* per-step scratch, sized once */
    li_req_view *views;       /* (cap_views) */
    int32_t cap_views;
    li_plan plan, fallback;
    req **batch_req;          /* (max_num_seqs) */
    int32_t *batch_n;         /* (max_num_seqs) tokens per scheduled request */
    int32_t *b_tokens, *b_pos, *b_seq;   /* (max_batched_tokens) */
    int32_t *b_rows;          /* (max_rows) */
    int64_t *b_slot;
    int32_t *b_tables;        /* (max_num_seqs, b_stride) flat block table of the step */
    size_t b_tables_cap;      /* entries */
    size_t max_rows;          /* logit rows per step: max_num_seqs, more with speculation */
    float *logits;            /* (max_rows, n_vocab): the forward's logits, set each step */
    li_evict_candidate *ev_cand; /* (cap_ev) the evict hook's candidates */
    int32_t cap_ev;
    int64_t ev_warned_step;   /* the last step that logged an evict failure */
    li_engine_stats st;
    /* speculation: a proposer per method (NULL: not available), the view of
     * the target layerskip drafts with, and the step's proposal scratch */
    li_proposer *prop[LI_SPEC_N_METHODS];
    li_model skip_model;
    li_spec_seq *sseq;        /* (max_num_seqs) */
    req **sreq;               /* (max_num_seqs) */
    int32_t *sdraft;          /* (max_num_seqs, LI_SPEC_MAX_TOKENS) */
    bool spec_asked;          /* a request asked for its own speculation: proposals run
                               * even with spec_tokens 0 */
    float *sq;                /* (sq_cap) sampled drafts' distributions this step */
    size_t sq_cap;
    float *vp;                /* (LI_SPEC_MAX_TOKENS + 1, n_vocab) target distributions */
    float *vscratch;          /* (n_vocab) */
    /* the speculate hook's candidates and the costs it is shown */
    li_spec_cand *cands;      /* (max_num_seqs) */
    double *c_acc;            /* (max_num_seqs, LI_SPEC_N_METHODS) */
    int64_t *c_drafted;       /* (max_num_seqs, LI_SPEC_N_METHODS) */
    double ema_step, ema_token, ema_draft[LI_SPEC_N_METHODS];
    int64_t spec_hook_errors;
    /* the progress guard (livelock_guard): */
    int64_t plan_marks;       /* bumped by every apply_plan */
    int64_t pg_mark;          /* tokens sampled + requests finished after the last policy step */
    bool pg_policy;           /* the last step ran the policy's plan */
    bool pg_moved;            /* ... and it computed tokens without preempting anyone */
    int32_t pg_idle;          /* policy steps in a row without progress */
    int32_t pg_loss, pg_left; /* steps the policy loses on this trip, and of those still to go */
    int64_t fail_logged;      /* schedule failures logged one by one */
    int64_t fail_quiet;       /* ... and not logged since the last summary */
    double fail_summary_t;    /* when the last summary line went out */
    li_tp *tp;                /* tensor parallel: the ranks, tgt being rank 0's runner; NULL with one rank */
    /* Medusa (cfg.medusa): the tree, the step's hidden rows, tree batches */
    li_medusa_tree mtree;
    const float *hidden;      /* (n_logits, n_embd) the step's post-norm hidden rows, or NULL */
    int32_t *b_parent;        /* (max_batched_tokens) tree parents of the batch, with Medusa */
    int32_t *sparent;         /* (max_num_seqs, LI_SPEC_MAX_TOKENS) proposals' tree parents */
    size_t *mv_off_d, *mv_off_s; /* (2 * n_layer * LI_SPEC_MAX_TOKENS) KV row moves */
    bool mclock_on;           /* the model clock replaces wall time (li_engine_set_model_clock) */
    double mclock;            /* ... its time, seconds */
    double mclock_policy;     /* ... st.time_policy it has already charged */
    li_step_cost mcost;       /* ... its step cost model */
};

void li_engine_config_default(li_engine_config *c) {
    *c = (li_engine_config){
        .block_size = 16, .kv_dtype = LI_TYPE_F16, .kv_memory = (size_t)256 << 20,
        .max_num_seqs = 64, .max_batched_tokens = 512, .max_model_len = 0, .prefix_caching = true,
        .spec_tokens = 0, .spec_ngram_max = 4, .spec_ngram_min = 2, .spec_disable_batch = 4,
        .spec_method = LI_SPEC_NGRAM, .spec_layers = 0, .tensor_parallel = 1,
    };
}

double li_engine_now(const li_engine *e) { return e->mclock_on ? e->mclock : li_time_now() - e->t0; }

/* The prefix cache stamps hits and releases with the engine clock. */
static double engine_clock(const void *e) { return li_engine_now(e); }

static req *find(li_engine *e, int64_t id) {
    /* ids increase with arrival: binary search the arrival-ordered array */
    int32_t lo = 0, hi = e->n_reqs - 1;
    while (lo <= hi) {
        int32_t mid = (lo + hi) / 2;
        int64_t v = e->reqs[mid]->res.id;
        if (v == id) return e->reqs[mid];
        if (v < id) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

static void req_free(req *r) {
    li_sampler_free(&r->smp);
    li_kv_seq_free(&r->seq);
    li_output_free(&r->out);
    free(r->ban);
    free(r->toks);
    free(r->tenant);
    free(r->cache_salt);
    li_prefix_seq_free(&r->pfx);
    free(r->top);
    free(r->hid);
    free(r);
}

static void push_token(req *r, int32_t t) {
    if (r->n_toks == r->cap) {
        r->cap = r->cap * 2 + 16;
        r->toks = li_xrealloc(r->toks, (size_t)r->cap * sizeof *r->toks);
    }
    r->toks[r->n_toks++] = t;
}

static void sync_result(req *r) {
    r->res.tokens = r->toks + r->n_prompt;
    r->res.n_tokens = r->n_toks - r->n_prompt;
    r->res.text = r->out.text ? r->out.text : "";
    r->res.text_len = r->out.text_len;
}

/* Returns a sequence's blocks; cached ones remember when, for LRU/LFU. */
static void release_seq(li_engine *e, req *r) { li_prefix_release(&e->pc, &r->pfx, &r->seq); }

/* Ends a request: frees its blocks now, keeps its result until released. */
/* Accepted over verified drafts, or -1 before any draft (li_req_view). */
static double spec_acceptance(const req *r) {
    return r->spec_drafted ? (double)r->spec_accepted / (double)r->spec_drafted : -1;
}

/* Proposers that keep per-request state hear when a request lets go of its KV. */
static void spec_release(li_engine *e, const req *r) {
    for (int m = 0; m < LI_SPEC_N_METHODS; m++)
        if (e->prop[m] && e->prop[m]->ops->on_release) e->prop[m]->ops->on_release(e->prop[m], r->res.id);
}

static void finish(li_engine *e, req *r, const char *reason) {
    if (!r->live) return;
    spec_release(e, r);
    /* samples still waiting to fork from this request go on alone */
    for (int32_t i = 0; i < e->n_reqs; i++)
        if (e->reqs[i]->fork_of == r) e->reqs[i]->fork_of = NULL;
    release_seq(e, r);
    r->live = false;
    r->res.finished = true;
    r->res.finish_reason = reason;
    r->res.t_finish = li_engine_now(e);
    sync_result(r);
    e->st.requests_finished++;
    if (e->policy && e->policy->ops->on_finish) {
        li_req_view v = {.id = r->res.id, .state = r->state, .arrival = r->res.t_arrival,
                         .priority = r->priority, .tenant = r->tenant, .prompt_len = r->n_prompt,
                         .num_tokens = r->n_toks, .num_computed = r->num_computed,
                         .num_generated = r->n_toks - r->n_prompt, .max_tokens = r->max_tokens,
                         .n_preemptions = r->res.n_preemptions, .spec_acceptance = spec_acceptance(r),
                         .slo_ttft_ms = r->slo_ttft_ms, .slo_tpot_ms = r->slo_tpot_ms,
                         .first_scheduled = r->res.t_first_scheduled, .first_token = r->res.t_first_token};
        e->policy->ops->on_finish(e->policy, &v, reason);
    }
    li_output_finish(r->res.id, reason, r->on_event, r->ud);
}

/* Draft tokens leave toks (not verified this step, or the request stops). */
static void drop_drafts(req *r) {
    r->n_toks -= r->n_draft;
    r->n_draft = 0;
}

/* At the end of a step, or when it ends early: no draft outlives the step. */
static void drop_all_drafts(li_engine *e) {
    for (int32_t i = 0; i < e->n_reqs; i++) drop_drafts(e->reqs[i]);
}

static void preempt(li_engine *e, req *r) {
    drop_drafts(r);
    spec_release(e, r);
    release_seq(e, r);
    r->num_computed = 0;
    r->state = LI_REQ_PREEMPTED;
    r->res.n_preemptions++;
    e->st.preemptions++;
}

/* ---- init / free ------------------------------------------------------------ */

/* The target runner, and with tensor parallelism every rank (rank 0's runner last). */
static void target_free(li_engine *e) {
    li_tp_free(e->tp);
    e->tp = NULL;
    li_runner_free(&e->tgt);
}

int li_engine_init(li_engine **out, li_model *m, li_backend *be, const li_engine_config *cfg, li_error *err) {
    return li_engine_init_runners(out, m, NULL, be, cfg, err);
}

int li_engine_init_runners(li_engine **out, li_model *m, li_model *draft, li_backend *be, const li_engine_config *cfg,
                           li_error *err) {
    *out = NULL;
    li_engine_config c = *cfg;
    if (c.block_size <= 0 || c.block_size > 1024)
        return li_error_set(err, LI_EINVAL, "engine: block_size must be in [1, 1024], got %d", c.block_size);
    if (c.max_num_seqs <= 0 || c.max_num_seqs > 4096)
        return li_error_set(err, LI_EINVAL, "engine: max_num_seqs must be in [1, 4096], got %d", c.max_num_seqs);
    if (c.max_batched_tokens <= 0 || c.max_batched_tokens > 65536)
        return li_error_set(err, LI_EINVAL, "engine: max_batched_tokens must be in [1, 65536], got %d",
                            c.max_batched_tokens);
    if (c.max_model_len <= 0 || c.max_model_len > m->hp.n_ctx_train) c.max_model_len = m->hp.n_ctx_train;
    if (c.spec_tokens < 0 || c.spec_tokens > LI_SPEC_MAX_TOKENS)
        return li_error_set(err, LI_EINVAL, "engine: spec_tokens must be in [0, %d], got %d", LI_SPEC_MAX_TOKENS,
                            c.spec_tokens);
    if (c.spec_tokens && be->ops->batch_variant)
        return li_error_set(err, LI_EINVAL,
                            "engine: speculation needs batch-invariant kernels; the '%s' backend is not (use another --isa)",
                            be->ops->name);
    if (c.spec_disable_batch < 0)
        return li_error_set(err, LI_EINVAL, "engine: spec_disable_batch must be >= 0, got %d", c.spec_disable_batch);
    if (c.spec_ngram_min < 1 || c.spec_ngram_max < c.spec_ngram_min || c.spec_ngram_max > 64)
        return li_error_set(err, LI_EINVAL, "engine: want 1 <= spec_ngram_min <= spec_ngram_max <= 64, got %d and %d",
                            c.spec_ngram_min, c.spec_ngram_max);
    if ((int)c.spec_method < 0 || c.spec_method >= LI_SPEC_N_METHODS)
        return li_error_set(err, LI_EINVAL, "engine: spec_method %d is not ngram, draft or layerskip", (int)c.spec_method);
    if (c.spec_layers && (c.spec_layers < 1 || c.spec_layers >= m->hp.n_layer))
        return li_error_set(err, LI_EINVAL, "engine: spec_layers must be in [1, %d] (the model has %d layers), got %d",
                            m->hp.n_layer - 1, m->hp.n_layer, c.spec_layers);
    if (c.spec_tokens && c.spec_method == LI_SPEC_DRAFT && !draft)
        return li_error_set(err, LI_EINVAL, "engine: spec_method 'draft' needs a draft model (--draft-model FILE)");
    if (c.spec_tokens && c.spec_method == LI_SPEC_LAYERSKIP && !c.spec_layers)
        return li_error_set(err, LI_EINVAL, "engine: spec_method 'layerskip' needs spec_layers (--spec-layers N)");
    if (draft && draft->hp.n_vocab != m->hp.n_vocab)
        return li_error_set(err, LI_EINVAL,
                            "engine: the draft model's vocabulary has %d tokens, the target's %d: a draft must share "
                            "the target's vocabulary",
                            draft->hp.n_vocab, m->hp.n_vocab);
    if (c.tensor_parallel < 0 || c.tensor_parallel > m->hp.n_head_kv)
        return li_error_set(err, LI_EINVAL,
                            "engine: tensor_parallel must be in [1, %d] (the model's KV heads: one at least per rank), "
                            "got %d",
                            m->hp.n_head_kv, c.tensor_parallel);
    if (c.tensor_parallel == 0) c.tensor_parallel = 1;
    if (c.tensor_parallel > 1 && draft)
        return li_error_set(err, LI_EUNSUP, "engine: tensor_parallel %d with a draft model is not supported yet",
                            c.tensor_parallel);
    if (c.spec_tokens && c.spec_method == LI_SPEC_MEDUSA && !c.medusa)
        return li_error_set(err, LI_EINVAL, "engine: spec_method 'medusa' needs Medusa heads (--medusa FILE)");
    li_medusa_tree mtree = {0};
    if (c.medusa) {
        li_medusa *h = c.medusa;
        if (be->ops->batch_variant)
            return li_error_set(err, LI_EINVAL,
                                "engine: Medusa needs batch-invariant kernels; the '%s' backend is not (use another --isa)",
                                be->ops->name);
        if (c.tensor_parallel > 1)
            return li_error_set(err, LI_EUNSUP, "engine: tensor_parallel %d with Medusa heads is not supported yet",
                                c.tensor_parallel);
        if (draft) return li_error_set(err, LI_EUNSUP, "engine: Medusa heads with a draft model are not supported yet");
        if (h->n_embd != m->hp.n_embd || h->n_vocab != m->hp.n_vocab)
            return li_error_set(err, LI_EINVAL,
                                "engine: Medusa heads of n_embd %d, n_vocab %d for a model of n_embd %d, n_vocab %d",
                                h->n_embd, h->n_vocab, m->hp.n_embd, m->hp.n_vocab);
        int mrc = li_medusa_tree_parse(c.medusa_tree, h->n_heads, &mtree, err);
        if (!mrc && !h->be) mrc = li_medusa_prepare(h, m, be, c.max_num_seqs, err);
        if (!mrc && (h->be != be || h->cap < c.max_num_seqs))
            mrc = li_error_set(err, LI_EINVAL, "engine: the Medusa heads are prepared on another backend or for fewer rows");
        if (mrc) return mrc;
    }
    if (c.tensor_parallel > 1 && c.spec_layers)
        return li_error_set(err, LI_EUNSUP, "engine: tensor_parallel %d with layerskip (spec_layers) is not supported yet",
                            c.tensor_parallel);
    /* one block id holds a block of tokens in the target's storage and the
     * draft's: the budget pays for both */
    const size_t bpt_t = li_runner_kv_bytes_per_token(m, c.kv_dtype);
    if (!bpt_t) /* not a KV dtype: say which, not that the budget holds nothing */
        return li_error_set(err, LI_EUNSUP, "engine: kv_dtype %s (type %d) is not a KV cache dtype (f32, f16, bf16, fp8 or int8)",
                            li_type_name(c.kv_dtype), (int)c.kv_dtype);
    const size_t bpt = bpt_t + (draft ? li_runner_kv_bytes_per_token(draft, c.kv_dtype) : 0);
    const size_t per_block = bpt * (size_t)c.block_size;
    const size_t nb = per_block ? c.kv_memory / per_block : 0;
    const int32_t nblocks = nb > INT32_MAX ? INT32_MAX : (int32_t)nb;
    if (nblocks <= 0)
        return li_error_set(err, LI_ENOMEM, "engine: KV budget of %zu bytes holds no block of %d tokens (%zu bytes/token)",
                            c.kv_memory, c.block_size, bpt);
    li_engine *e = li_xcalloc(1, sizeof *e);
    e->model = m;
    e->be = be;
    e->cfg = c;
    /* the ranks' KV heads add up to the model's: the same blocks fit the budget */
    int rc = c.tensor_parallel > 1 ? li_tp_init(&e->tp, m, be, c.tensor_parallel, &e->tgt, c.kv_dtype, c.block_size,
                                                nblocks, c.max_batched_tokens, err)
                                   : li_runner_init(&e->tgt, m, be, NULL, c.kv_dtype, c.block_size, nblocks,
                                                    c.max_batched_tokens, err);
    if (rc) {
        free(e);
        return rc;
    }
    if (draft) {
        if ((rc = li_runner_init(&e->draft, draft, be, &e->tgt.kv, c.kv_dtype, c.block_size, nblocks,
                                 c.max_batched_tokens, err))) {
            target_free(e);
            free(e);
            return rc;
        }
        e->has_draft = true;
    }
    /* proposers: n-gram always, a model where there is one; none on a
     * batch-variant backend, where verification would not be exact */
    if (!be->ops->batch_variant) {
        e->prop[LI_SPEC_NGRAM] = li_proposer_ngram_new(c.spec_ngram_max, c.spec_ngram_min, m->hp.n_vocab);
        if (!rc && draft)
            rc = li_proposer_model_new(&e->prop[LI_SPEC_DRAFT], LI_SPEC_DRAFT, draft, be, &e->draft.kv, c.max_num_seqs,
                                       err);
        if (!rc && c.spec_layers && !(rc = li_spec_layer_view(&e->skip_model, m, c.spec_layers, err)))
            rc = li_proposer_model_new(&e->prop[LI_SPEC_LAYERSKIP], LI_SPEC_LAYERSKIP, &e->skip_model, be, &e->tgt.kv,
                                       c.max_num_seqs, err);
        if (!rc && c.medusa) rc = li_proposer_medusa_new(&e->prop[LI_SPEC_MEDUSA], c.medusa, &mtree, c.max_num_seqs, err);
        if (rc) {
            for (int i = 0; i < LI_SPEC_N_METHODS; i++) li_proposer_free(e->prop[i]);
            li_runner_free(&e->draft);
            target_free(e);
            free(e);
            return rc;
        }
    }
    li_prefix_cache_init(&e->pc, &e->tgt.kv, c.prefix_caching, engine_clock, e);
    e->t0 = li_time_now();
    e->next_id = 1;
    li_plan_init(&e->plan);
    li_plan_init(&e->fallback);
    const size_t S = (size_t)c.max_num_seqs, T = (size_t)c.max_batched_tokens;
    /* logit rows: one per request, or one per verified position with
     * speculation (a request may ask for it on an engine without a default) */
    e->max_rows = e->prop[LI_SPEC_NGRAM] ? LI_MAX(S, LI_MIN(T, S * (size_t)(LI_SPEC_MAX_TOKENS + 1))) : S;
    e->sseq = li_xmalloc(S * sizeof *e->sseq);
    e->sreq = li_xmalloc(S * sizeof *e->sreq);
    e->sdraft = li_xmalloc(S * LI_SPEC_MAX_TOKENS * sizeof *e->sdraft);
    e->cands = li_xmalloc(S * sizeof *e->cands);
    e->c_acc = li_xmalloc(S * LI_SPEC_N_METHODS * sizeof *e->c_acc);
    e->c_drafted = li_xmalloc(S * LI_SPEC_N_METHODS * sizeof *e->c_drafted);
    if (e->prop[LI_SPEC_NGRAM]) {
        e->vp = li_xmalloc((size_t)(LI_SPEC_MAX_TOKENS + 1) * (size_t)m->hp.n_vocab * sizeof *e->vp);
        e->vscratch = li_xmalloc(2 * (size_t)m->hp.n_vocab * sizeof *e->vscratch); /* a tree's verify takes 2 rows */
    }
    if (e->prop[LI_SPEC_MEDUSA]) {
        e->mtree = mtree;
        e->b_parent = li_xmalloc(T * sizeof *e->b_parent);
        e->sparent = li_xmalloc(S * LI_SPEC_MAX_TOKENS * sizeof *e->sparent);
        const size_t nr = 2 * (size_t)m->hp.n_layer * LI_SPEC_MAX_TOKENS;
        e->mv_off_d = li_xmalloc(nr * sizeof *e->mv_off_d);
        e->mv_off_s = li_xmalloc(nr * sizeof *e->mv_off_s);
    }
    e->batch_req = li_xmalloc(S * sizeof *e->batch_req);
    e->batch_n = li_xmalloc(S * sizeof *e->batch_n);
    e->b_tokens = li_xmalloc(T * sizeof(int32_t));
    e->b_pos = li_xmalloc(T * sizeof(int32_t));
    e->b_seq = li_xmalloc(T * sizeof(int32_t));
    e->b_rows = li_xmalloc(e->max_rows * sizeof(int32_t));
    e->b_slot = li_xmalloc(T * sizeof(int64_t));
    if (e->has_draft) {
        e->d_row_id = li_xmalloc(e->max_rows * sizeof *e->d_row_id);
        e->d_row_pos = li_xmalloc(e->max_rows * sizeof *e->d_row_pos);
    }
    *out = e;
    return 0;
}

void li_engine_free(li_engine *e) {
    if (!e) return;
    for (int32_t i = 0; i < e->n_reqs; i++) {
        li_kv_seq_release(&e->tgt.kv, &e->reqs[i]->seq);
        req_free(e->reqs[i]);
    }
    free(e->reqs);
    free(e->views);
    li_plan_free(&e->plan);
    li_plan_free(&e->fallback);
    free(e->batch_req);
    free(e->batch_n);
    free(e->b_tables);
    free(e->b_tokens);
    free(e->b_pos);
    free(e->b_seq);
    free(e->b_rows);
    free(e->b_slot);
    free(e->d_row_id);
    free(e->d_row_pos);
    free(e->ev_cand);
    for (int i = 0; i < LI_SPEC_N_METHODS; i++) li_proposer_free(e->prop[i]);
    free(e->sseq);
    free(e->sreq);
    free(e->sdraft);
    free(e->sq);
    free(e->cands);
    free(e->c_acc);
    free(e->c_drafted);
    free(e->vp);
    free(e->vscratch);
    free(e->b_parent);
    free(e->sparent);
    free(e->mv_off_d);
    free(e->mv_off_s);
    li_prefix_cache_free(&e->pc);
    li_runner_free(&e->draft); /* a follower goes before its pool */
    target_free(e);
    free(e);
}

void li_engine_set_policy(li_engine *e, li_policy *p) {
    e->policy = p;
    /* a new policy starts with a clean progress record and its own log quota */
    e->pg_policy = false;
    e->pg_idle = e->pg_loss = e->pg_left = 0;
    e->fail_logged = e->fail_quiet = 0;
}
li_policy *li_engine_policy(li_engine *e) { return e->policy; }
const li_engine_config *li_engine_get_config(const li_engine *e) { return &e->cfg; }
li_model *li_engine_model(li_engine *e) { return e->model; }

/* ---- prefix cache (the manager, glued to the policy's evict hook) --------------- */

/* Leading blocks of a request with no KV found in the cache. */
static int32_t prefix_probe(li_engine *e, req *r) {
    return li_prefix_probe(&e->pc, &r->pfx, &r->seq, r->num_computed, r->toks, r->n_toks, r->cache_salt);
}

/* Takes the cached prefix: the request starts with num_computed at its end. */
static void prefix_acquire(li_engine *e, req *r) {
    const int64_t hit =
        li_prefix_acquire(&e->pc, &r->pfx, &r->seq, r->num_computed, r->toks, r->n_toks, r->cache_salt);
    if (hit == 0) return;
    r->num_computed = hit;
    r->res.cached_tokens = hit;
}

/* Blocks the step just filled join the cache (all tokens here are verified:
 * speculative tokens must be accepted before they reach this point). */
static void prefix_register(li_engine *e, req *r) {
    li_prefix_register(&e->pc, &r->pfx, &r->seq, r->num_computed, r->toks, r->cache_salt);
}

/* The prefix cache's eviction order from the policy's evict hook. */
static int policy_evict_order(void *ud, const li_prefix_candidate *c, int32_t n, int32_t want, int32_t *order,
                              int32_t *n_order) {
    li_engine *e = ud;
    if (n > e->cap_ev) { /* grows to the pool size at most, then stays */
        e->cap_ev = LI_MAX(n, e->cap_ev * 2);
        e->ev_cand = li_xrealloc(e->ev_cand, (size_t)e->cap_ev * sizeof *e->ev_cand);
    }
    for (int32_t i = 0; i < n; i++)
        e->ev_cand[i] = (li_evict_candidate){c[i].block, c[i].last_access, c[i].hits, c[i].depth};
    li_error perr = {0};
    double tp = li_time_now();
    int rc = e->policy->ops->evict(e->policy, e->ev_cand, n, want, order, n_order, &perr);
    e->st.time_policy += li_time_now() - tp;
    if (rc) {
        e->st.policy_errors++;
        /* once per step at most: a broken hook would otherwise log per request */
        if (e->ev_warned_step != e->step_no)
            li_log_warn("policy %s: evict failed, using LRU: %s", e->policy->name, perr.msg);
        e->ev_warned_step = e->step_no;
    }
    return rc;
}

/* Frees at least `need` empty blocks ahead of allocation, in the order the
 * policy's evict hook chooses (without one, allocation evicts in LRU order
 * by itself). */
static void prefix_evict_for(li_engine *e, int32_t need) {
    const bool hook = e->policy && e->policy->has_evict && e->policy->ops->evict;
    bool short_order = false;
    li_prefix_evict_for(&e->pc, need, hook ? policy_evict_order : NULL, e, &short_order);
    if (short_order) e->st.plans_trimmed++;
}

/* ---- state for the policy ------------------------------------------------------ */

/* Blocks r still needs beyond `held` to reach its end: the KV of every token
 * but the last it may sample (max_tokens, the context's end, or the pool's:
 * sample_one stops a request there). */
static int32_t projected_blocks(const li_engine *e, const req *r, int32_t held) {
    const int64_t bs = e->tgt.kv.block_size;
    const int64_t end = LI_MIN(LI_MIN(r->n_prompt + r->max_tokens, e->cfg.max_model_len),
                               (int64_t)e->tgt.kv.num_blocks * bs) - 1;
    const int64_t need = (LI_MAX(end, r->n_toks) + bs - 1) / bs - held;
    return need > 0 ? (int32_t)LI_MIN(need, INT32_MAX) : 0;
}

/* The prompt's block hashes for req.prefix_hashes (probed requests have
 * them; the policy side reads them only when asked). */
static void prefix_view(const li_engine *e, const req *r, li_req_view *v) {
    _Static_assert(sizeof(li_block_hash) == 2 * sizeof(uint64_t), "li_block_hash is (lo, hi)");
    v->prefix_hash = (const uint64_t *)r->pfx.hash;
    v->n_prefix_hash = LI_MIN(r->pfx.n_hash, (int32_t)((r->n_prompt - 1) / e->tgt.kv.block_size));
}

static void view_of(li_engine *e, req *r, li_req_view *v) {
    /* a request about to start sees its cache hit as already computed */
    int64_t hit = (int64_t)prefix_probe(e, r) * e->tgt.kv.block_size;
    *v = (li_req_view){
        .id = r->res.id, .state = r->state, .arrival = r->res.t_arrival, .priority = r->priority,
        .tenant = r->tenant, .prompt_len = r->n_prompt, .num_tokens = r->n_toks,
        .num_computed = r->num_computed + hit, .num_generated = r->n_toks - r->n_prompt,
        .max_tokens = r->max_tokens, .cached_len = hit ? hit : r->res.cached_tokens,
        .n_blocks = r->seq.n_blocks + (int32_t)(hit / e->tgt.kv.block_size),
        .n_preemptions = r->res.n_preemptions, .spec_acceptance = spec_acceptance(r),
        .slo_ttft_ms = r->slo_ttft_ms, .slo_tpot_ms = r->slo_tpot_ms,
        .first_scheduled = r->res.t_first_scheduled, .first_token = r->res.t_first_token,
    };
    v->projected_blocks = projected_blocks(e, r, v->n_blocks);
    prefix_view(e, r, v);
}

static void gather(li_engine *e, li_step_state *st) {
    if (e->cap_views < e->n_reqs) {
        e->cap_views = e->n_reqs * 2 + 16;
        e->views = li_xrealloc(e->views, (size_t)e->cap_views * sizeof *e->views);
    }
    int32_t n = 0;
    for (int32_t i = 0; i < e->n_reqs; i++)
        if (e->reqs[i]->live && !e->reqs[i]->fork_of) view_of(e, e->reqs[i], &e->views[n++]);
    *st = (li_step_state){
        .step = e->step_no, .now = li_engine_now(e), .reqs = e->views, .n_reqs = n,
        .kv_free_blocks = li_kv_available(&e->tgt.kv), .kv_total_blocks = e->tgt.kv.num_blocks,
        .kv_cached_blocks = li_prefix_cache_blocks(&e->pc),
        .block_size = e->tgt.kv.block_size, .max_num_seqs = e->cfg.max_num_seqs,
        .max_batched_tokens = e->cfg.max_batched_tokens,
    };
    for (int32_t i = 0; i < n; i++)
        if (e->views[i].state == LI_REQ_RUNNING)
            st->kv_running_need = (int32_t)LI_MIN((int64_t)st->kv_running_need + e->views[i].projected_blocks, INT32_MAX);
}

/* ---- admission ----------------------------------------------------------------- */

/* A new request from validated params; sample i of n uses seed + i. */
static req *req_new(li_engine *e, const li_request_params *p, int32_t i, li_error *err) {
    req *r = li_xcalloc(1, sizeof *r);
    li_sampling_params sp = p->sampling;
    sp.seed += (uint64_t)i;
    if (li_sampler_init(&r->smp, &sp, e->model->hp.n_vocab, err) != 0) {
        free(r);
        return NULL;
    }
    r->cap = p->n_prompt + LI_MIN(p->max_tokens, 4096) + 1;
    r->toks = li_xmalloc((size_t)r->cap * sizeof *r->toks);
    memcpy(r->toks, p->prompt, (size_t)p->n_prompt * sizeof *r->toks);
    r->n_toks = r->n_prompt = p->n_prompt;
    r->max_tokens = p->max_tokens;
    for (int64_t k = 0; k < p->n_prompt; k++) li_sampler_accept(&r->smp, p->prompt[k]);
    li_kv_seq_init(&r->seq);
    li_prefix_seq_init(&r->pfx);
    li_output_init(&r->out, p->stop, p->n_stop);
    r->ignore_eos = p->ignore_eos;
    r->min_tokens = p->min_tokens;
    /* the end-of-generation ids join the list only when min_tokens holds them back */
    const int32_t *eog = NULL;
    const int n_eog = p->ignore_eos || !p->min_tokens ? 0 : li_tokenizer_eog_ids(e->model->tok, &eog);
    r->n_stop_ids = p->n_stop_token_ids;
    r->n_ban = p->n_stop_token_ids + n_eog;
    if (r->n_ban) {
        r->ban = li_xmalloc((size_t)r->n_ban * sizeof *r->ban);
        if (p->n_stop_token_ids) memcpy(r->ban, p->stop_token_ids, (size_t)p->n_stop_token_ids * sizeof *r->ban);
        if (n_eog) memcpy(r->ban + p->n_stop_token_ids, eog, (size_t)n_eog * sizeof *r->ban);
    }
    r->priority = p->priority;
    r->tenant = strdup(p->tenant ? p->tenant : "");
    r->cache_salt = strdup(p->cache_salt ? p->cache_salt : "");
    r->on_event = p->on_event;
    r->ud = p->ud;
    r->spec_set = p->spec_set;
    r->spec_method = p->spec_method;
    r->spec_k = p->spec_k;
    r->slo_ttft_ms = p->slo_ttft_ms;
    r->slo_tpot_ms = p->slo_tpot_ms;
    r->top = li_xmalloc((size_t)LI_MAX(p->sampling.n_logprobs, 1) * sizeof *r->top);
    r->state = LI_REQ_WAITING;
    r->live = true;
    r->res.id = e->next_id + i;
    r->res.n_prompt = p->n_prompt;
    r->res.t_arrival = li_engine_now(e);
    r->res.t_first_token = -1;
    r->res.t_first_scheduled = -1;
    r->hid_tok = -1;
    sync_result(r);
    return r;
}

int li_engine_add(li_engine *e, const li_request_params *p, int64_t *id, li_error *err) {
    if (!p->prompt || p->n_prompt <= 0) return li_error_set(err, LI_EINVAL, "request: the prompt is empty");
    const int32_t nv = e->model->hp.n_vocab;
    for (int64_t i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= nv)
            return li_error_set(err, LI_EINVAL, "request: prompt token %lld = %d is outside the vocabulary [0, %d)",
                                (long long)i, p->prompt[i], nv);
    if (p->n_prompt >= e->cfg.max_model_len)
        return li_error_set(err, LI_ERANGE, "request: the prompt has %lld tokens, the context holds %lld",
                            (long long)p->n_prompt, (long long)e->cfg.max_model_len);
    const int64_t kv_tokens = (int64_t)e->tgt.kv.num_blocks * e->tgt.kv.block_size;
    if (p->n_prompt + 1 > kv_tokens)
        return li_error_set(err, LI_ENOMEM, "request: the prompt (%lld tokens) does not fit in the KV cache (%lld tokens)",
                            (long long)p->n_prompt, (long long)kv_tokens);
    if (p->max_tokens < 0) return li_error_set(err, LI_EINVAL, "request: max_tokens must be >= 0");
    const int32_t n = p->n <= 0 ? 1 : p->n;
    if (n > 64) return li_error_set(err, LI_EINVAL, "request: n must be in [1, 64], got %d", p->n);
    if (p->n_stop < 0 || p->n_stop > 16) return li_error_set(err, LI_EINVAL, "request: at most 16 stop strings");
    if (p->n_stop_token_ids < 0 || p->n_stop_token_ids > 64 || (p->n_stop_token_ids && !p->stop_token_ids))
        return li_error_set(err, LI_EINVAL, "request: at most 64 stop token ids");
    for (int i = 0; i < p->n_stop_token_ids; i++)
        if (p->stop_token_ids[i] < 0 || p->stop_token_ids[i] >= nv)
            return li_error_set(err, LI_EINVAL, "request: stop token id %d is outside the vocabulary [0, %d)",
                                p->stop_token_ids[i], nv);
    if (p->min_tokens < 0 || p->min_tokens > p->max_tokens)
        return li_error_set(err, LI_EINVAL, "request: min_tokens must be in [0, max_tokens = %lld], got %lld",
                            (long long)p->max_tokens, (long long)p->min_tokens);
    for (int i = 0; i < p->n_stop; i++)
        if (!p->stop[i] || !p->stop[i][0] || strlen(p->stop[i]) > 256)
            return li_error_set(err, LI_EINVAL, "request: stop strings must be 1..256 bytes");
    if (!(p->slo_ttft_ms >= 0 && p->slo_ttft_ms <= LI_ENGINE_MAX_SLO_MS) ||
        !(p->slo_tpot_ms >= 0 && p->slo_tpot_ms <= LI_ENGINE_MAX_SLO_MS))
        return li_error_set(err, LI_EINVAL, "request: slo_ttft_ms and slo_tpot_ms must be numbers in [0, %.0f]",
                            LI_ENGINE_MAX_SLO_MS);
    if (p->spec_set) {
        if (p->spec_k < 0 || p->spec_k > LI_SPEC_MAX_TOKENS)
            return li_error_set(err, LI_EINVAL, "request: speculation k must be in [0, %d], got %d", LI_SPEC_MAX_TOKENS,
                                p->spec_k);
        if ((int)p->spec_method < 0 || p->spec_method >= LI_SPEC_N_METHODS)
            return li_error_set(err, LI_EINVAL, "request: speculation method %d is not ngram, draft or layerskip",
                                (int)p->spec_method);
        if (p->spec_k && !e->prop[LI_SPEC_NGRAM])
            return li_error_set(err, LI_EINVAL,
                                "request: speculation needs batch-invariant kernels; the '%s' backend is not (use another --isa)",
                                e->be->ops->name);
        if (p->spec_k && !e->prop[p->spec_method])
            return li_error_set(err, LI_EINVAL, "request: speculation method '%s' is not available on this engine (%s)",
                                li_spec_method_name(p->spec_method),
                                p->spec_method == LI_SPEC_DRAFT    ? "start it with a draft model"
                                : p->spec_method == LI_SPEC_MEDUSA ? "start it with Medusa heads"
                                                                   : "start it with spec_layers");
    }
    req *first = req_new(e, p, 0, err);
    if (!first) return err ? err->code : LI_EINVAL;

    if (e->policy && e->policy->ops->admit) {
        li_step_state st;
        gather(e, &st);
        li_req_view v;
        view_of(e, first, &v);
        bool accept = true;
        char reason[256] = "";
        li_error perr = {0};
        if (e->policy->ops->admit(e->policy, &v, &st, &accept, reason, sizeof reason, &perr) != 0) {
            li_log_warn("policy admit failed (request accepted): %s", perr.msg);
            e->st.policy_errors++;
        } else if (!accept) {
            e->st.requests_rejected++;
            req_free(first);
            return li_error_set(err, LI_EREJECTED, "request rejected by policy: %s", reason[0] ? reason : "no reason given");
        }
    }
    if (e->n_reqs + n > e->cap_reqs) {
        e->cap_reqs = (e->cap_reqs + n) * 2 + 16;
        e->reqs = li_xrealloc(e->reqs, (size_t)e->cap_reqs * sizeof *e->reqs);
    }
    e->reqs[e->n_reqs++] = first;
    e->spec_asked |= p->spec_set && p->spec_k > 0;
    for (int32_t i = 1; i < n; i++) {
        req *c = req_new(e, p, i, err); /* cannot fail: same params as the first */
        c->fork_of = first;
        e->reqs[e->n_reqs++] = c;
    }
    e->next_id += n;
    if (p->max_tokens == 0)
        for (int32_t i = 0; i < n; i++) finish(e, e->reqs[e->n_reqs - n + i], "length");
    *id = first->res.id;
    return 0;
}

int li_engine_cancel(li_engine *e, int64_t id) {
    req *r = find(e, id);
    if (!r || !r->live) return 1;
    if (e->in_step) r->cancel_pending = true;
    else finish(e, r, "cancelled");
    return 0;
}

const li_request_result *li_engine_result(li_engine *e, int64_t id) {
    req *r = find(e, id);
    if (!r) return NULL;
    sync_result(r);
    return &r->res;
}

void li_engine_release(li_engine *e, int64_t id) {
    req *r = find(e, id);
    if (!r) return;
    if (r->live) {
        r->on_event = NULL; /* the owner is going away: no more callbacks */
        finish(e, r, "cancelled");
    }
    int32_t i = 0;
    while (e->reqs[i] != r) i++;
    memmove(&e->reqs[i], &e->reqs[i + 1], (size_t)(e->n_reqs - i - 1) * sizeof *e->reqs);
    e->n_reqs--;
    req_free(r);
}

bool li_engine_has_work(const li_engine *e) {
    for (int32_t i = 0; i < e->n_reqs; i++)
        if (e->reqs[i]->live) return true;
    return false;
}

/* ---- validate + apply ------------------------------------------------------------ */

static int32_t blocks_needed(const li_engine *e, const req *r, int64_t n) {
    int64_t need = (r->num_computed + n + e->tgt.kv.block_size - 1) / e->tgt.kv.block_size - r->seq.n_blocks;
    return need > 0 ? (int32_t)need : 0;
}

/* Applies a plan; returns the number of requests scheduled into the batch. */
static int32_t apply_plan(li_engine *e, const li_plan *plan, int64_t *n_batch_tokens) {
    int64_t trimmed = 0;
    /* a request both preempted and run is a contradiction (preempting it
     * every step would recompute it forever): it is run, not preempted */
    const int64_t mark = ++e->plan_marks;
    if (plan->n_preempt > 0)
        for (int32_t i = 0; i < plan->n_run; i++) {
            req *r = plan->run[i].n_tokens > 0 ? find(e, plan->run[i].id) : NULL;
            if (r) r->plan_mark = mark;
        }
    for (int32_t i = 0; i < plan->n_preempt; i++) {
        req *r = find(e, plan->preempt[i]);
        if (!r || !r->live || r->state != LI_REQ_RUNNING || r->plan_mark == mark) {
            trimmed++;
            continue;
        }
        preempt(e, r);
    }
    int32_t nb = 0;
    int64_t budget = e->cfg.max_batched_tokens;
    for (int32_t i = 0; i < plan->n_run; i++) {
        const li_plan_run *pr = &plan->run[i];
        req *r = find(e, pr->id);
        if (!r || !r->live || r->fork_of || nb == e->cfg.max_num_seqs || budget == 0) {
            trimmed++;
            continue;
        }
        bool dup = false;
        for (int32_t j = 0; j < nb; j++) dup |= e->batch_req[j] == r;
        if (!dup) prefix_acquire(e, r);
        int64_t remaining = r->n_toks - r->num_computed;
        if (!dup && remaining > 0)
            prefix_evict_for(e, blocks_needed(e, r, LI_MIN((int64_t)LI_MAX(pr->n_tokens, 1), remaining)));
        if (dup || remaining <= 0 || pr->n_tokens <= 0) {
            trimmed++;
            continue;
        }
        int64_t n = LI_MIN((int64_t)pr->n_tokens, remaining);
        n = LI_MIN(n, budget);
        if (n != pr->n_tokens) trimmed++;
        if (li_kv_seq_reserve(&e->tgt.kv, &r->seq, r->num_computed + n) != 0) {
            /* shrink to the blocks the sequence managed to get */
            int64_t fit = (int64_t)r->seq.n_blocks * e->tgt.kv.block_size - r->num_computed;
            trimmed++;
            if (fit <= 0) continue;
            n = LI_MIN(n, fit);
        }
        /* samples of one prompt share blocks: copy the ones about to be written */
        if (li_kv_seq_cow(&e->tgt.kv, &r->seq, r->num_computed, r->num_computed + n) != 0) {
            trimmed++;
            continue;
        }
        r->state = LI_REQ_RUNNING;
        if (r->res.t_first_scheduled < 0) r->res.t_first_scheduled = li_engine_now(e);
        e->batch_req[nb] = r;
        e->batch_n[nb] = (int32_t)n;
        nb++;
        budget -= n;
    }
    e->st.plans_trimmed += trimmed;
    *n_batch_tokens = e->cfg.max_batched_tokens - budget;
    return nb;
}

/* ---- sampling and output ---------------------------------------------------------- */

/* The token's text and event; a stop string (once min_tokens are out) ends
 * the request. */
static void emit_token(li_engine *e, req *r, int32_t tok, float lp, const float *logits) {
    li_event ev = {.kind = LI_EVENT_TOKEN, .id = r->res.id, .token = tok, .logprob = lp, .top = r->top,
                   .n_top = r->smp.p.n_logprobs, .logits = logits, .n_vocab = e->model->hp.n_vocab};
    const bool check_stop = r->n_toks - r->n_prompt >= r->min_tokens;
    if (li_output_token(&r->out, e->model->tok, check_stop, &ev, r->on_event, r->ud)) finish(e, r, "stop");
}

/* Flushes held-back text (a partial stop string that never completed). */
static void flush_text(li_engine *e, req *r) {
    li_output_flush(&r->out, r->res.id, e->model->hp.n_vocab, r->on_event, r->ud);
}

static bool is_stop_id(const req *r, int32_t tok) {
    for (int i = 0; i < r->n_stop_ids; i++)
        if (r->ban[i] == tok) return true;
    return false;
}

/* While min_tokens are not out, the end-of-generation and stop ids cannot
 * be drawn. */
static void ban_for_min_tokens(req *r) {
    const bool hold = r->n_toks - r->n_prompt < r->min_tokens;
    li_sampler_ban(&r->smp, hold ? r->ban : NULL, hold ? r->n_ban : 0);
}

static int32_t take_token(li_engine *e, req *r, int32_t tok, float lp, const float *logits);

/* Samples r's next token from logits and appends it; returns it, or -1
 * when it ended the request without being appended (end-of-generation or
 * a stop token). */
static int32_t sample_one(li_engine *e, req *r, const float *logits) {
    float lp = 0;
    ban_for_min_tokens(r);
    int32_t tok = li_sampler_sample(&r->smp, logits, r->smp.p.n_logprobs ? r->top : NULL, &lp);
    return take_token(e, r, tok, lp, logits);
}

/* A token chosen from logits (the sampler's draw, or a verifier's) joins r:
 * end-of-generation or a stop id ends r (-1), else it is accepted into the
 * penalty window, appended and emitted; length limits end r after it. */
static int32_t take_token(li_engine *e, req *r, int32_t tok, float lp, const float *logits) {
    if (r->res.t_first_token < 0) r->res.t_first_token = li_engine_now(e);
    if ((!r->ignore_eos && li_tokenizer_is_eog(e->model->tok, tok)) || is_stop_id(r, tok)) {
        flush_text(e, r);
        finish(e, r, "stop");
        return -1;
    }
    li_sampler_accept(&r->smp, tok);
    push_token(r, tok);
    e->st.tokens_generated++;
    emit_token(e, r, tok, lp, logits);
    if (!r->live) return tok;
    /* the whole KV pool bounds a request like the context does: past it the
     * next token could never be computed, however many others are preempted */
    if (r->n_toks - r->n_prompt >= r->max_tokens || r->n_toks >= e->cfg.max_model_len ||
        r->n_toks >= (int64_t)e->tgt.kv.num_blocks * e->tgt.kv.block_size) {
        flush_text(e, r);
        finish(e, r, "length");
    }
    return tok;
}

/* ---- speculation: proposals ------------------------------------------------------- */

/* The request's seeded RNG feeds sampled drafts and their verification. */
static double sampler_uniform(void *smp) { return li_sampler_uniform(smp); }

/* The method and k a request drafts with this step: its own ask, else the
 * engine's default. */
static int32_t spec_want(const li_engine *e, const req *r, li_spec_method *method) {
    if (r->pol_step == e->step_no) { /* the policy's word */
        *method = r->pol_method < 0 ? LI_SPEC_NGRAM : (li_spec_method)r->pol_method;
        return r->pol_method < 0 ? 0 : r->pol_k;
    }
    if (r->spec_set) {
        *method = r->spec_method;
        return r->spec_k;
    }
    *method = e->cfg.spec_method;
    /* prompt-lookup drafts are deterministic: at temperature > 0 they are
     * accepted with probability p(draft) only, so the engine's default
     * drafts greedy requests alone (a request may still ask) */
    return e->cfg.spec_tokens;
}

/* How many drafts fit a request in decode, 0 when it cannot draft now.
 * Drafts never take a KV block the request would not hold anyway: only the
 * slots after its last token in blocks it has or is about to get, so
 * speculation cannot preempt or evict anyone. */
static int32_t spec_room(const li_engine *e, const req *r, int32_t k) {
    if (!r->live || r->state != LI_REQ_RUNNING || r->fork_of || r->num_computed != r->n_toks - 1 || k <= 0) return 0;
    const int64_t room = LI_MIN(r->max_tokens - (r->n_toks - r->n_prompt), e->cfg.max_model_len - r->n_toks) - 1;
    const int64_t bs = e->tgt.kv.block_size;
    const int64_t held = LI_MAX((int64_t)r->seq.n_blocks * bs, (r->n_toks + bs - 1) / bs * bs) - r->n_toks;
    return (int32_t)LI_MAX(0, LI_MIN(LI_MIN((int64_t)k, room), held));
}

/* A model proposer writes the KV of positions [n_toks - 1, n_toks - 1 + k)
 * now: the block of the last token must be the request's (the plan would
 * take it this step anyway) and private. */
static bool spec_slots(li_engine *e, req *r, int32_t k) {
    const int64_t p = r->n_toks - 1;
    return li_kv_seq_reserve(&e->tgt.kv, &r->seq, r->n_toks) == 0 && li_kv_seq_cow(&e->tgt.kv, &r->seq, p, p + k) == 0;
}

static void gather(li_engine *e, li_step_state *st);

static double ema(double old, double x) { return old > 0 ? 0.8 * old + 0.2 * x : x; }

/* The speculate hook: every request that could draft now, with what it
 * wants, its acceptance per method and the measured costs; the answers are
 * kept for this step (pol_*). */
static void policy_speculate(li_engine *e, int32_t running) {
    int32_t n = 0;
    for (int32_t i = 0; i < e->n_reqs && n < e->cfg.max_num_seqs; i++) {
        req *r = e->reqs[i];
        const int32_t max_k = spec_room(e, r, LI_SPEC_MAX_TOKENS);
        if (!max_k) continue;
        li_spec_method want;
        const int32_t k = spec_want(e, r, &want);
        double *acc = e->c_acc + (size_t)n * LI_SPEC_N_METHODS;
        int64_t *dr = e->c_drafted + (size_t)n * LI_SPEC_N_METHODS;
        for (int m = 0; m < LI_SPEC_N_METHODS; m++) {
            dr[m] = r->spec_drafted_by[m];
            acc[m] = dr[m] ? (double)r->spec_accepted_by[m] / (double)dr[m] : -1;
        }
        e->cands[n++] = (li_spec_cand){.id = r->res.id, .want_method = want, .want_k = LI_MIN(k, max_k),
                                       .max_k = max_k, .temperature = r->smp.p.temperature, .acceptance = acc,
                                       .drafted = dr, .method = k ? (int32_t)want : -1, .k = LI_MIN(k, max_k)};
    }
    if (!n) return;
    static const char *const names[LI_SPEC_N_METHODS] = {"ngram", "draft", "layerskip", "medusa"};
    bool avail[LI_SPEC_N_METHODS];
    for (int m = 0; m < LI_SPEC_N_METHODS; m++) avail[m] = e->prop[m] != NULL;
    const li_spec_state ss = {.methods = names, .available = avail, .n_methods = LI_SPEC_N_METHODS,
                              .batch_size = running, .step_time = e->ema_step, .token_time = e->ema_token,
                              .draft_time = e->ema_draft};
    li_step_state st;
    gather(e, &st);
    li_error perr = {0};
    const double tp = li_time_now();
    const int rc = e->policy->ops->speculate(e->policy, &st, &ss, e->cands, n, &perr);
    e->st.time_policy += li_time_now() - tp;
    if (rc) {
        e->st.policy_errors++;
        /* a broken hook fails every step: log the first few, then now and then */
        if (++e->spec_hook_errors <= 3 || e->spec_hook_errors % 1000 == 0)
            li_log_warn("policy %s: speculate failed (%lld times), the requests' own speculation stands: %s",
                        e->policy->name, (long long)e->spec_hook_errors, perr.msg);
        return;
    }
    for (int32_t i = 0; i < n; i++) {
        li_spec_cand *c = &e->cands[i];
        req *r = find(e, c->id);
        if (!r) continue;
        int32_t m = c->method, k = c->k;
        if (m >= LI_SPEC_N_METHODS || (m >= 0 && !e->prop[m]) || k < 0 || k > c->max_k) {
            e->st.plans_trimmed++; /* an unavailable method is off, k is clamped */
            if (m >= LI_SPEC_N_METHODS || (m >= 0 && !e->prop[m])) m = -1;
            k = LI_MAX(0, LI_MIN(k, c->max_k));
        }
        r->pol_step = e->step_no;
        r->pol_method = k ? m : -1;
        r->pol_k = k;
    }
}

/* Step 0: each proposer drafts, in one call, for the requests in decode
 * that speculate with it; the drafts are appended to their tokens (their
 * num_tokens grows, so any policy schedules them as more tokens). A
 * speculate hook has the last word on who drafts with what. */
static void propose_drafts(li_engine *e) {
    int32_t running = 0;
    for (int32_t i = 0; i < e->n_reqs; i++) running += e->reqs[i]->live && e->reqs[i]->state == LI_REQ_RUNNING;
    const bool hook = e->policy && e->policy->has_speculate && e->policy->ops->speculate;
    if (hook) policy_speculate(e, running);
    else if (e->cfg.spec_disable_batch && running > e->cfg.spec_disable_batch) return;
    size_t sq_used = 0; /* floats of sq taken this step */
    for (int m = 0; m < LI_SPEC_N_METHODS; m++) {
        li_proposer *p = e->prop[m];
        if (!p) continue;
        int32_t ns = 0;
        for (int32_t i = 0; i < e->n_reqs && ns < e->cfg.max_num_seqs; i++) {
            req *r = e->reqs[i];
            li_spec_method want;
            int32_t k = spec_want(e, r, &want);
            /* sampled requests draft with a model (which hands out q), or
             * with n-gram when they ask for it themselves */
            if ((int)want != m ||
                (r->smp.p.temperature > 0 && m == LI_SPEC_NGRAM && !r->spec_set && r->pol_step != e->step_no))
                continue;
            if (!(k = spec_room(e, r, k))) continue;
            /* Medusa reads the hidden state that predicted the last token */
            const bool tree = m == LI_SPEC_MEDUSA;
            if (tree && r->hid_tok != r->n_toks - 1) continue;
            if ((m == LI_SPEC_DRAFT || m == LI_SPEC_LAYERSKIP) && !spec_slots(e, r, k)) continue;
            e->sseq[ns] = (li_spec_seq){.id = r->res.id, .toks = r->toks, .n_toks = r->n_toks,
                                        .blocks = r->seq.blocks, .n_blocks = r->seq.n_blocks, .k = k,
                                        .temperature = m == LI_SPEC_NGRAM ? 0 : r->smp.p.temperature,
                                        .uniform = sampler_uniform, .uctx = &r->smp,
                                        .draft = e->sdraft + (size_t)ns * LI_SPEC_MAX_TOKENS,
                                        .hidden = tree ? r->hid : NULL,
                                        .parent = tree ? e->sparent + (size_t)ns * LI_SPEC_MAX_TOKENS : NULL};
            e->sreq[ns++] = r;
        }
        if (!ns) continue;
        /* room for the distributions of sampled drafts, after those of the
         * methods before (kept by offset: the buffer may move) */
        const size_t nv = (size_t)e->model->hp.n_vocab;
        size_t need = sq_used;
        for (int32_t i = 0; i < ns; i++)
            if (e->sseq[i].temperature > 0) need += (size_t)e->sseq[i].k * nv;
        if (need > e->sq_cap) {
            e->sq_cap = need;
            e->sq = li_xrealloc(e->sq, need * sizeof *e->sq);
        }
        for (int32_t i = 0; i < ns; i++) {
            e->sreq[i]->d_q = -1;
            if (e->sseq[i].temperature <= 0) continue;
            e->sseq[i].q = e->sq + sq_used;
            e->sreq[i]->d_q = (int64_t)sq_used;
            sq_used += (size_t)e->sseq[i].k * nv;
        }
        li_error perr = {0};
        const double t0 = li_time_now();
        const int rc = p->ops->propose(p, e->sseq, ns, &perr);
        const double dt = li_time_now() - t0;
        e->st.time_propose += dt;
        int64_t n_drafts = 0;
        for (int32_t i = 0; i < ns; i++) n_drafts += e->sseq[i].k;
        if (!rc && n_drafts) e->ema_draft[m] = ema(e->ema_draft[m], dt / (double)n_drafts);
        if (rc) {
            li_log_warn("speculation: the %s proposer failed, no drafts this step: %s", li_spec_method_name(m), perr.msg);
            continue;
        }
        for (int32_t i = 0; i < ns; i++) {
            req *r = e->sreq[i];
            const int32_t n = e->sseq[i].n_draft;
            if (n <= 0) continue;
            if (r->n_toks + n > r->cap) {
                r->cap = r->n_toks + n + 16;
                r->toks = li_xrealloc(r->toks, (size_t)r->cap * sizeof *r->toks);
            }
            memcpy(r->toks + r->n_toks, e->sseq[i].draft, (size_t)n * sizeof *r->toks);
            r->n_toks += n;
            r->n_draft = n;
            r->d_method = (li_spec_method)m;
            if (!e->sseq[i].has_q) r->d_q = -1;
            r->d_tree = e->sseq[i].parent != NULL;
            if (r->d_tree) memcpy(r->d_parent, e->sseq[i].parent, (size_t)n * sizeof *r->d_parent);
        }
    }
}

/* ---- speculation: verification ------------------------------------------------------ */

/* The m rows computed for a drafted request: row j's logits give the token
 * after position P0 + j. Tokens are sampled in order; each one that equals
 * the draft at its place lets the next row count, the first that differs
 * (or a bonus after the last draft) ends the run. The KV of positions past
 * the last accepted input is simply overwritten later. */
/* Temperature > 0: rejection sampling (li_spec_verify_chain) against the
 * target's distributions as the sampler makes them (bias, ban, penalties,
 * top-k/p, min-p, temperature: li_sampler_sample_u), with the request's
 * own uniforms, so a seed reproduces its tokens. Row j's distribution sees
 * drafts 0..j-1 in the penalty window (they precede it if it is used at
 * all); the window is rebuilt from the tokens kept. m rows verify m - 1
 * drafts (the last row gives the token after them). Returns the accepted. */
static int32_t verify_sampled(li_engine *e, req *r, int32_t m, const float *rows, const int32_t *draft,
                              const float *q) {
    const int32_t nv = e->model->hp.n_vocab, kk = m - 1;
    const int64_t p0 = r->num_computed, gen0 = r->n_toks - r->n_prompt;
    for (int32_t j = 0; j <= kk; j++) {
        const bool hold = gen0 + j < r->min_tokens;
        li_sampler_ban(&r->smp, hold ? r->ban : NULL, hold ? r->n_ban : 0);
        li_sampler_sample_u(&r->smp, rows + (size_t)j * nv, 0.5, e->vp + (size_t)j * nv, NULL, NULL);
        if (j < kk) li_sampler_accept(&r->smp, draft[j]);
    }
    int32_t next = -1;
    int32_t a = li_spec_verify_chain(e->vp, q, nv, draft, kk, sampler_uniform, &r->smp, e->vscratch, &next);
    if (a < 0) a = 0, next = li_sampler_sample_u(&r->smp, rows, li_sampler_uniform(&r->smp), NULL, NULL, NULL);
    /* the window as if only the kept tokens had been accepted */
    li_sampler_window_reset(&r->smp, r->toks, r->n_toks);
    int32_t accepted = 0;
    for (int32_t j = 0; j <= a; j++) {
        const int32_t tok = j < a ? draft[j] : next;
        const float *row = rows + (size_t)j * nv;
        float lp = 0;
        li_sampler_report(&r->smp, row, tok, r->smp.p.n_logprobs ? r->top : NULL, &lp);
        r->num_computed = p0 + j + 1;
        take_token(e, r, tok, lp, row);
        if (!r->live) break;
        accepted += j < a;
    }
    return accepted;
}

/* ---- speculation: trees (Medusa) ------------------------------------------------------ */

/* Medusa drafts from the hidden state that predicted a request's last
 * token: row `row` of the step's hidden rows, kept after r took a token. */
static void keep_hidden(li_engine *e, req *r, int32_t row) {
    if (!e->hidden || !r->live) return;
    const size_t E = (size_t)e->model->hp.n_embd;
    if (!r->hid) r->hid = li_xmalloc(E * sizeof *r->hid);
    memcpy(r->hid, e->hidden + (size_t)row * E, E * sizeof *r->hid);
    r->hid_tok = r->n_toks - 1;
}

/* Depth of each of the n tree drafts (1 = a child of the last token). */
static void tree_depths(const req *r, int32_t n, int32_t *depth) {
    for (int32_t i = 0; i < n; i++) depth[i] = r->d_parent[i] < 0 ? 1 : depth[r->d_parent[i]] + 1;
}

/* Draft i of a tree sits in the batch at position P + depth, writing the
 * slot of toks position P + 1 + i (the request's own, private: the plan
 * copied it on write). The top-1 chain comes first, so its drafts write
 * their positions' own slots; the others are displaced, and the forward
 * gives each a view over scratch blocks (forward.h). Those blocks come from
 * the pool's empty ones only (speculation never evicts): a tree that would
 * need more than there are is cut to its chain this step. */
static void tree_fit(li_engine *e, int32_t nb) {
    int64_t free_blocks = e->tgt.kv.n_free;
    const int64_t bs = e->tgt.kv.block_size;
    for (int32_t i = 0; i < nb; i++) {
        req *r = e->batch_req[i];
        if (!r->n_draft || !r->d_tree) continue;
        const int32_t n = LI_MIN(e->batch_n[i] - 1, r->n_draft);
        const int64_t P = r->num_computed;
        int32_t depth[LI_SPEC_MAX_TOKENS], chain = 0;
        tree_depths(r, n, depth);
        while (chain < n && depth[chain] == chain + 1) chain++;
        int64_t need = 0;
        for (int32_t j = chain; j < n; j++) need += (P + depth[j]) / bs - P / bs + 1;
        if (need <= free_blocks) free_blocks -= need;
        else e->batch_n[i] = 1 + chain;
    }
}

/* The accepted drafts' KV to their positions' slots: draft path[j] was
 * computed at toks position P + 1 + path[j] and belongs at P + 1 + j. One
 * backend copy over every layer, K and V (and their scales). Sources lie
 * past the chain's positions, destinations on them: no overlap. */
static void tree_move_kv(li_engine *e, req *r, int64_t P, const int32_t *path, int32_t a) {
    li_kv_cache *kv = &e->tgt.kv;
    int64_t src[LI_SPEC_MAX_TOKENS], dst[LI_SPEC_MAX_TOKENS];
    int32_t n = 0;
    for (int32_t j = 0; j < a; j++)
        if (path[j] != j) {
            src[n] = li_kv_seq_slot(kv, &r->seq, P + 1 + path[j]);
            dst[n++] = li_kv_seq_slot(kv, &r->seq, P + 1 + j);
        }
    if (!n) return;
    e->st.spec_tree_moves += n;
    const size_t slots = (size_t)kv->num_blocks * (size_t)kv->block_size;
    const size_t row = (size_t)((const char *)kv->layers[0].v - (const char *)kv->layers[0].k) / slots;
    const size_t srow = (size_t)kv->n_head_kv * sizeof(float);
    for (int pass = 0; pass < 2; pass++) {
        if (pass && !kv->layers[0].k_scale) break;
        const li_buffer *buf = pass ? &kv->scales_buf : &kv->storage_buf;
        const size_t w = pass ? srow : row;
        int runs = 0;
        for (int l = 0; l < kv->n_layer; l++) {
            const li_kv_layer *L = &kv->layers[l];
            const size_t k0 = li_buffer_offset(buf, pass ? (void *)L->k_scale : L->k);
            const size_t v0 = li_buffer_offset(buf, pass ? (void *)L->v_scale : L->v);
            for (int32_t j = 0; j < n; j++, runs += 2) {
                e->mv_off_d[runs] = k0 + (size_t)dst[j] * w;
                e->mv_off_s[runs] = k0 + (size_t)src[j] * w;
                e->mv_off_d[runs + 1] = v0 + (size_t)dst[j] * w;
                e->mv_off_s[runs + 1] = v0 + (size_t)src[j] * w;
            }
        }
        e->be->ops->buffer_copy(e->be, (li_buffer *)buf, buf, e->mv_off_d, e->mv_off_s, runs, w);
    }
}

/* The penalties see the tokens before a draft: its branch (depth dd, the
 * ancestors' tokens) after the request's kept tokens. */
static void tree_window(req *r, const int32_t *tok, int32_t node, int32_t dd) {
    for (int32_t j = dd - 1, x = node; j >= 0; j--, x = r->d_parent[x]) r->toks[r->n_toks + j] = tok[x];
    li_sampler_window_reset(&r->smp, r->toks, r->n_toks + dd);
}

/* A tree of m - 1 drafts (m rows: row 0 the last token's, row i + 1 draft
 * i's). Greedy: the target's token at the current node, then the child
 * holding it, exactly what sampling alone gives. Temperature > 0:
 * li_spec_verify_tree with deterministic children (q = NULL), each row's
 * distribution made with its branch in the penalty window. Then the
 * accepted drafts' KV moves to their positions. Returns the accepted; *verified
 * and *last (the row the last token came from) are set. */
static int32_t verify_tree(li_engine *e, req *r, int32_t m, const float *rows, int32_t *verified, int32_t *last) {
    const int32_t nv = e->model->hp.n_vocab, n = LI_MIN(m - 1, r->n_draft);
    int32_t tok[LI_SPEC_MAX_TOKENS], depth[LI_SPEC_MAX_TOKENS], path[LI_SPEC_MAX_TOKENS], a = 0;
    memcpy(tok, r->toks + r->n_toks - r->n_draft, (size_t)n * sizeof *tok);
    tree_depths(r, n, depth);
    drop_drafts(r);
    const int64_t P = r->num_computed, gen0 = r->n_toks - r->n_prompt;
    *verified = n;
    *last = 0;
    if (r->smp.p.temperature > 0) {
        const li_sampling_params *sp = &r->smp.p;
        const bool pen = sp->repeat_penalty != 1.0f || sp->presence_penalty != 0 || sp->frequency_penalty != 0;
        for (int32_t j = 0; j <= n; j++) {
            const int32_t dd = j ? depth[j - 1] : 0;
            const bool hold = gen0 + dd < r->min_tokens;
            li_sampler_ban(&r->smp, hold ? r->ban : NULL, hold ? r->n_ban : 0);
            if (pen) tree_window(r, tok, j - 1, dd);
            li_sampler_sample_u(&r->smp, rows + (size_t)j * nv, 0.5, e->vp + (size_t)j * nv, NULL, NULL);
        }
        if (pen) li_sampler_window_reset(&r->smp, r->toks, r->n_toks);
        int32_t next = -1;
        a = li_spec_verify_tree(e->vp, NULL, nv, tok, r->d_parent, n, sampler_uniform, &r->smp, e->vscratch, path, &next);
        if (a < 0) a = 0, next = li_sampler_sample_u(&r->smp, rows, li_sampler_uniform(&r->smp), NULL, NULL, NULL);
        for (int32_t j = 0; j <= a; j++) {
            const int32_t t = j < a ? tok[path[j]] : next, ri = j ? path[j - 1] + 1 : 0;
            const float *row = rows + (size_t)ri * nv;
            const bool hold = gen0 + j < r->min_tokens;
            li_sampler_ban(&r->smp, hold ? r->ban : NULL, hold ? r->n_ban : 0);
            float lp = 0;
            li_sampler_report(&r->smp, row, t, r->smp.p.n_logprobs ? r->top : NULL, &lp);
            r->num_computed = P + j + 1;
            *last = ri;
            take_token(e, r, t, lp, row);
            if (!r->live) {
                a = j;
                break;
            }
        }
    } else {
        int32_t cur = -1;
        for (;;) {
            r->num_computed = P + a + 1; /* the last token and the accepted drafts are in the KV */
            *last = cur + 1;
            const int32_t t = sample_one(e, r, rows + (size_t)(cur + 1) * nv);
            if (!r->live) break;
            int32_t c = -1;
            for (int32_t i = 0; i < n && c < 0; i++)
                if (r->d_parent[i] == cur && tok[i] == t) c = i;
            if (c < 0) break;
            path[a++] = cur = c;
        }
    }
    if (r->live) tree_move_kv(e, r, P, path, a);
    return a;
}

static void verify_drafts(li_engine *e, req *r, int32_t m, const float *rows, int32_t row0) {
    int32_t draft[LI_SPEC_MAX_TOKENS];
    const int32_t k = r->n_draft;
    const int64_t p0 = r->num_computed; /* before this step's tokens */
    int32_t verified, accepted = 0, last = -1;
    if (!r->d_tree) {
        memcpy(draft, r->toks + r->n_toks - k, (size_t)k * sizeof *draft);
        drop_drafts(r);
    }
    if (r->d_tree) {
        accepted = verify_tree(e, r, m, rows, &verified, &last);
    } else if (r->smp.p.temperature > 0) {
        verified = LI_MIN(m - 1, k);
        accepted = verify_sampled(e, r, LI_MIN(m, k + 1), rows, draft, r->d_q >= 0 ? e->sq + r->d_q : NULL);
    } else {
        /* row j checks draft j: m rows check min(m, k) drafts (a row past the
         * last draft gives the bonus token) */
        verified = LI_MIN(m, k);
        for (int32_t j = 0; j < m; j++) {
            r->num_computed = p0 + j + 1; /* row j's input is valid: the last token, or an accepted draft */
            last = j;
            const int32_t tok = sample_one(e, r, rows + (size_t)j * e->model->hp.n_vocab);
            if (!r->live || j >= k || tok != draft[j]) break;
            accepted++;
        }
    }
    /* the row the last token came from (sampled chains: rows 0..accepted gave tokens) */
    keep_hidden(e, r, row0 + (last >= 0 ? last : accepted));
    r->spec_drafted += verified;
    r->spec_accepted += accepted;
    r->spec_drafted_by[r->d_method] += verified;
    r->spec_accepted_by[r->d_method] += accepted;
    e->st.spec_drafted += verified;
    e->st.spec_accepted += accepted;
    e->st.spec_drafted_by[r->d_method] += verified;
    e->st.spec_accepted_by[r->d_method] += accepted;
    e->st.spec_rounds_by[r->d_method]++;
    li_proposer *p = e->prop[r->d_method];
    if (p && p->ops->on_verified) p->ops->on_verified(p, r->res.id, verified, accepted);
}

/* The parent's prompt is computed: its waiting samples take its blocks
 * (shared, copy-on-write) and draw their first token from the same logits. */
static void fork_samples(li_engine *e, req *parent, const float *logits, int32_t row) {
    for (int32_t i = 0; i < e->n_reqs; i++) {
        req *c = e->reqs[i];
        if (c->fork_of != parent || !c->live) continue;
        c->fork_of = NULL;
        li_kv_seq_fork(&e->tgt.kv, &parent->seq, &c->seq);
        c->num_computed = parent->num_computed;
        li_prefix_seq_fork(&c->pfx, &parent->pfx);
        c->state = LI_REQ_RUNNING;
        if (c->res.t_first_scheduled < 0) c->res.t_first_scheduled = parent->res.t_first_scheduled;
        sample_one(e, c, logits);
        keep_hidden(e, c, row);
    }
}

/* ---- the step ------------------------------------------------------------------------ */

/* The progress guarantee: true when the policy gets this step. A policy
 * step made progress if a token was sampled or a request finished since,
 * or if its plan computed tokens without preempting anyone. After
 * LI_ENGINE_LIVELOCK_STEPS policy steps without progress the policy loses
 * the next pg_loss steps to the built-in FCFS (doubling while it keeps
 * failing, reset once it makes progress itself), counted in livelock_steps. */
static bool livelock_guard(li_engine *e) {
    const int64_t mark = e->st.tokens_generated + e->st.requests_finished;
    if (e->pg_policy) {
        if (mark != e->pg_mark || e->pg_moved) e->pg_idle = 0, e->pg_loss = 0;
        else if (++e->pg_idle >= LI_ENGINE_LIVELOCK_STEPS) {
            e->pg_idle = 0;
            e->pg_loss = e->pg_loss ? LI_MIN(2 * e->pg_loss, LI_ENGINE_LIVELOCK_MAX_LOSS) : LI_ENGINE_LIVELOCK_STEPS;
            e->pg_left = e->pg_loss;
            li_log_warn("policy %s: no progress in %d steps with work pending: the built-in FCFS runs the next %d",
                        e->policy->name, LI_ENGINE_LIVELOCK_STEPS, e->pg_loss);
        }
    }
    e->pg_policy = false;
    e->pg_mark = mark;
    if (e->pg_left > 0) {
        e->pg_left--;
        e->st.livelock_steps++;
        return false;
    }
    return true;
}

/* A failed schedule() is logged in full the first 10 times, then as one
 * summary line per 10 s with a count: a policy failing every step must not
 * flood the log. */
static void log_schedule_failure(li_engine *e, const char *msg) {
    const double now = li_time_now();
    if (e->fail_logged < 10) {
        e->fail_logged++;
        e->fail_summary_t = now;
        li_log_warn("policy %s: schedule failed, using FCFS for step %lld: %s%s", e->policy->name,
                    (long long)e->step_no, msg, e->fail_logged == 10 ? " (further failures: one line per 10 s)" : "");
        return;
    }
    e->fail_quiet++;
    if (now - e->fail_summary_t >= 10.0) {
        li_log_warn("policy %s: schedule failed %lld more times in %.0f s (FCFS ran those steps); last: %.200s",
                    e->policy->name, (long long)e->fail_quiet, now - e->fail_summary_t, msg);
        e->fail_quiet = 0;
        e->fail_summary_t = now;
    }
}

/* ---- the model clock ----------------------------------------------------------- */

void li_engine_set_model_clock(li_engine *e, const li_step_cost *cost, double start) {
    const double t = li_engine_now(e);
    if (cost) {
        e->mcost = *cost;
        e->mclock = start >= 0 ? start : t;
        e->mclock_policy = e->st.time_policy;
    } else
        e->t0 = li_time_now() - t; /* wall time goes on from the model's */
    e->mclock_on = cost != NULL;
}

void li_engine_clock_advance(li_engine *e, double t) {
    if (e->mclock_on && t > e->mclock) e->mclock = t;
}

/* Charges the batch just computed (before its tokens are sampled, so first
 * tokens and finishes are stamped at the step's end, first_scheduled at its
 * start). Only with the model clock: one pass over the step's rows. */
static void model_clock_step(li_engine *e, int32_t nb) {
    const li_step_cost *c = &e->mcost;
    double prefill = 0, decode = 0, ctx = 0;
    for (int32_t i = 0; i < nb; i++) {
        const double n = e->batch_n[i], p0 = (double)e->batch_req[i]->num_computed;
        if (n == 1) decode++;
        else prefill += n;
        ctx += n * p0 + n * (n + 1) / 2; /* positions p0 .. p0+n-1 attend to p+1 each */
    }
    e->mclock += c->a + c->b * prefill + c->c * decode + c->d * ctx;
    e->mclock += c->policy_scale * (e->st.time_policy - e->mclock_policy);
    e->mclock_policy = e->st.time_policy;
}

int li_engine_step(li_engine *e, li_error *err) {
    double t_start = li_time_now();
    e->step_no++;
    e->st.steps++;
    e->d_rows = 0;
    if (!li_engine_has_work(e)) return 0;
    e->in_step = true;

    /* 0: drafts for decodes that speculate (the batch small enough) */
    if (e->prop[LI_SPEC_NGRAM] && (e->cfg.spec_tokens || e->spec_asked || (e->policy && e->policy->has_speculate)))
        propose_drafts(e);

    /* 1-2: state and plan */
    li_step_state st;
    gather(e, &st);
    const li_plan *plan = NULL;
    if (e->policy && e->policy->has_schedule && livelock_guard(e)) {
        li_plan_clear(&e->plan);
        li_error perr = {0};
        double tp = li_time_now();
        int rc = e->policy->ops->schedule(e->policy, &st, &e->plan, &perr);
        e->st.time_policy += li_time_now() - tp;
        if (rc == 0) plan = &e->plan;
        else {
            e->st.policy_errors++;
            log_schedule_failure(e, perr.msg);
        }
    }
    /* 3: validate + apply */
    int64_t n_tokens = 0;
    int32_t nb = 0;
    if (plan) {
        const int64_t pre = e->st.preemptions;
        nb = apply_plan(e, plan, &n_tokens);
        e->pg_policy = true;
        e->pg_moved = nb > 0 && e->st.preemptions == pre;
    }
    if (nb == 0) {
        /* no plan, or one that schedules nothing: the built-in FCFS runs
         * this step so that no request starves behind a broken policy */
        if (plan) {
            e->st.fallback_steps++;
            gather(e, &st); /* the plan's preemptions and cache hits changed it */
        }
        li_policy_fcfs_plan(&st, &e->fallback);
        nb = apply_plan(e, &e->fallback, &n_tokens);
    }
    if (nb == 0) {
        drop_all_drafts(e);
        /* nothing fits even after preempting: the oldest live request can
         * never get its next block (KV budget too small for it) */
        for (int32_t i = 0; i < e->n_reqs; i++)
            if (e->reqs[i]->live) {
                flush_text(e, e->reqs[i]);
                finish(e, e->reqs[i], "length");
                li_log_warn("request %lld stopped: the KV cache cannot hold its next token",
                            (long long)e->reqs[i]->res.id);
                break;
            }
        e->in_step = false;
        e->st.time_total += li_time_now() - t_start;
        return 0;
    }

    /* 4: one flat batch */
    if (e->b_parent) tree_fit(e, nb);
    bool any_tree = false;
    int64_t k = 0, stride = 1;
    int32_t n_logits = 0;
    for (int32_t i = 0; i < nb; i++) stride = LI_MAX(stride, (int64_t)e->batch_req[i]->seq.n_blocks);
    if ((size_t)(nb * stride) > e->b_tables_cap) {
        e->b_tables_cap = LI_MAX((size_t)(nb * stride), 2 * e->b_tables_cap);
        e->b_tables = li_xrealloc(e->b_tables, e->b_tables_cap * sizeof *e->b_tables);
    }
    for (int32_t i = 0; i < nb; i++) {
        req *r = e->batch_req[i];
        memcpy(e->b_tables + i * stride, r->seq.blocks, (size_t)r->seq.n_blocks * sizeof *e->b_tables);
        for (int32_t j = 0; j < e->batch_n[i]; j++, k++) {
            int64_t p = r->num_computed + j;
            e->b_tokens[k] = r->toks[p];
            e->b_pos[k] = (int32_t)p;
            e->b_seq[k] = i;
            e->b_slot[k] = li_kv_seq_slot(&e->tgt.kv, &r->seq, p);
            if (e->b_parent) e->b_parent[k] = -1;
        }
        if (r->n_draft && r->d_tree) { /* draft j - 1 at P + depth, below its parent (forward.h) */
            const int64_t row0 = k - e->batch_n[i];
            int32_t depth[LI_SPEC_MAX_TOKENS];
            tree_depths(r, e->batch_n[i] - 1, depth);
            for (int32_t j = 1; j < e->batch_n[i]; j++) {
                e->b_pos[row0 + j] = (int32_t)(r->num_computed + depth[j - 1]);
                e->b_parent[row0 + j] = (int32_t)(row0 + 1 + r->d_parent[j - 1]);
            }
            any_tree = true;
        }
        if (r->n_draft) /* every computed position of a drafted request is verified */
            for (int32_t j = e->batch_n[i]; j > 0; j--) e->b_rows[n_logits++] = (int32_t)(k - j);
        else if (r->num_computed + e->batch_n[i] == r->n_toks)
            e->b_rows[n_logits++] = (int32_t)k - 1;
    }
    li_batch b = {.n = k, .tokens = e->b_tokens, .pos = e->b_pos, .seq = e->b_seq, .slot = e->b_slot,
                  .block_table = e->b_tables, .n_seqs = nb, .bt_stride = stride, .logit_rows = e->b_rows,
                  .n_logits = n_logits, .parent = any_tree ? e->b_parent : NULL,
                  .hidden = e->prop[LI_SPEC_MEDUSA] ? LI_HIDDEN_POST_NORM : LI_HIDDEN_NONE};
    /* 5: forward */
    double tf = li_time_now();
    int rc = e->tp ? li_tp_run(e->tp, &b, err) : li_runner_run(&e->tgt, &b, err);
    e->logits = e->tgt.logits;
    e->hidden = !rc && e->prop[LI_SPEC_MEDUSA] ? li_forward_hidden(&e->tgt.fw, e->model) : NULL;
    /* the draft computes the same batch: its KV stays in step with the target's */
    if (!rc && e->has_draft && !(rc = li_runner_run(&e->draft, &b, err))) {
        for (int32_t i = 0; i < n_logits; i++) { /* before sampling forks or finishes anything */
            e->d_row_id[i] = e->batch_req[e->b_seq[e->b_rows[i]]]->res.id;
            e->d_row_pos[i] = e->b_pos[e->b_rows[i]];
        }
        e->d_rows = n_logits;
    }
    const double dtf = li_time_now() - tf;
    if (e->mclock_on) model_clock_step(e, nb);
    e->st.time_forward += dtf;
    e->ema_step = ema(e->ema_step, dtf);
    if (k) e->ema_token = ema(e->ema_token, dtf / (double)k);
    if (rc) {
        drop_all_drafts(e);
        for (int32_t i = 0; i < nb; i++) finish(e, e->batch_req[i], "error");
        e->in_step = false;
        return rc;
    }
    e->st.tokens_computed += k;
    /* 6-7: sample and emit */
    int32_t li = 0;
    for (int32_t i = 0; i < nb; i++) {
        req *r = e->batch_req[i];
        if (r->n_draft) {
            const int32_t m = e->batch_n[i];
            verify_drafts(e, r, m, e->logits + (size_t)li * e->model->hp.n_vocab, li);
            li += m;
            if (r->live) prefix_register(e, r);
            continue;
        }
        r->num_computed += e->batch_n[i];
        prefix_register(e, r);
        if (r->num_computed != r->n_toks) continue;
        const float *lg = e->logits + (size_t)li++ * e->model->hp.n_vocab;
        if (r->num_computed == r->n_prompt) fork_samples(e, r, lg, li - 1);
        sample_one(e, r, lg);
        keep_hidden(e, r, li - 1);
    }
    drop_all_drafts(e); /* of requests the plan did not run */
    /* 8: cancellations asked for during the step */
    for (int32_t i = 0; i < e->n_reqs; i++)
        if (e->reqs[i]->cancel_pending) {
            e->reqs[i]->cancel_pending = false;
            finish(e, e->reqs[i], "cancelled");
        }
    e->in_step = false;
    e->st.time_total += li_time_now() - t_start;
    return 0;
}

void li_engine_stats_get(const li_engine *e, li_engine_stats *st) {
    *st = e->st;
    st->n_waiting = st->n_running = st->n_preempted = 0;
    for (int32_t i = 0; i < e->n_reqs; i++) {
        const req *r = e->reqs[i];
        if (!r->live) continue;
        if (r->state == LI_REQ_WAITING) st->n_waiting++;
        else if (r->state == LI_REQ_RUNNING) st->n_running++;
        else st->n_preempted++;
    }
    st->kv_free_blocks = li_kv_available(&e->tgt.kv);
    st->kv_cached_blocks = li_prefix_cache_blocks(&e->pc);
    st->prefix_evictions = li_prefix_cache_evictions(&e->pc);
    st->prefix_query_tokens = e->pc.query_tokens;
    st->prefix_hit_tokens = e->pc.hit_tokens;
    st->kv_total_blocks = e->tgt.kv.num_blocks;
    st->block_size = e->tgt.kv.block_size;
    st->kv_bytes = e->tgt.kv.bytes;
    st->kv_draft_bytes = e->has_draft ? e->draft.kv.bytes : 0;
    st->kv_bytes_per_token = e->tgt.kv.bytes / ((size_t)e->tgt.kv.num_blocks * (size_t)e->tgt.kv.block_size);
    st->tensor_parallel = e->tp ? li_tp_size(e->tp) : 1;
    st->time_allreduce = e->tp ? li_tp_comm_time(e->tp) : 0;
    if (e->tp) { /* every rank's KV storage */
        st->kv_bytes = li_tp_kv_bytes(e->tp);
        st->kv_bytes_per_token = st->kv_bytes / ((size_t)e->tgt.kv.num_blocks * (size_t)e->tgt.kv.block_size);
    }
}

/* ---- the draft runner (internal) --------------------------------------------- */

li_model *li_engine_draft_model(li_engine *e) { return e->has_draft ? e->draft.model : NULL; }

const float *li_engine_draft_logits(const li_engine *e, int32_t *n_rows) {
    *n_rows = e->d_rows;
    return e->d_rows ? e->draft.logits : NULL;
}

int li_engine_draft_row(const li_engine *e, int32_t row, int64_t *id, int32_t *pos) {
    if (row < 0 || row >= e->d_rows) return LI_EINVAL;
    *id = e->d_row_id[row];
    *pos = e->d_row_pos[row];
    return 0;
}
