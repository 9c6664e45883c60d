/* engine_internal.h — the engine's private state, shared by the files of
 * core/engine/ that do its step: engine.c (requests, the plan, the batch,
 * sampling) and spec_step.c (speculation). Nothing outside core/engine/
 * includes it: the public interface is engine.h. */
#ifndef LI_ENGINE_INTERNAL_H
#define LI_ENGINE_INTERNAL_H

#include "engine/engine.h"
#include "engine/output.h"
#include "engine/runner.h"
#include "engine/spec_step.h"
#include "engine/tp.h"
#include "kv/prefix_cache.h"

/* A request: its tokens (prompt, then generated, then this step's drafts),
 * its KV sequence, sampler and output stream, and its speculation. */
typedef struct li_engine_req {
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
    struct li_engine_req *fork_of;      /* n > 1: waits for this parent's prompt, then shares its blocks */
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
    /* EAGLE: the target's captured rows at position eg_pos (in_width), or NULL */
    float *eg;
    int64_t eg_pos;           /* -1: none */
    /* EAGLE's KV, caught up lazily (spec_step.c): positions [0, e_done) hold
     * it; e_pend holds the draft's input rows (in_width each) of positions
     * [e_done, e_done + e_pend_n), the first num_computed - e_done verified.
     * e_done may pass num_computed by one: a first draft step wrote the
     * last token's, before the target computed it */
    int64_t e_done, e_hi;     /* e_hi: this step's catch-up wrote [e_done, e_hi) */
    int64_t e_used;           /* the last step it drafted with EAGLE (first scheduled before; -1 not yet) */
    int64_t e_used_pos;       /* the end of that step's rows (its prompt's end before it drafted) */
    float *e_pend;            /* (e_pend_cap, in_width), or NULL */
    int64_t e_pend_n, e_pend_cap;
    bool e_lazy;              /* eagle_lazy and no EAGLE draft yet: rows wait, up to LI_EAGLE_LAZY_MAX */
    int64_t e_zero;           /* while lazy: the draft's KV of [e_done, e_zero) zeroed for the prefix cache */
    /* the draft model's KV of this request (lazy: computed when it drafts) */
    int64_t d_valid;          /* positions [0, d_valid) hold the draft's KV of toks */
    int64_t d_hi;             /* this step's draft steps wrote positions [d_valid, d_hi) */
    bool d_tree;              /* this step's drafts are a tree: d_parent holds it */
    int32_t d_parent[LI_SPEC_MAX_TOKENS]; /* each draft's parent draft, -1 = the last token */
} li_engine_req;

struct li_engine {
    li_model *model;          /* tgt.model */
    li_backend *be;           /* tgt.be */
    li_engine_config cfg;
    li_runner tgt;            /* the target: its KV cache is the block pool */
    li_runner draft;          /* when has_draft: the draft model over storage following the pool,
                               * brought up to date only for requests drafting with it */
    bool has_draft;
    li_prefix_cache pc;       /* the prefix-cache manager over tgt.kv */
    li_policy *policy;
    double t0;
    int64_t next_id, step_no;
    bool in_step;

    li_engine_req **reqs;     /* arrival order; live and finished-unreleased */
    int32_t n_reqs, cap_reqs;

    /* per-step scratch, sized once */
    li_req_view *views;       /* (cap_views) */
    int32_t cap_views;
    li_plan plan, fallback;
    li_engine_req **batch_req; /* (max_num_seqs) */
    int32_t *batch_n;         /* (max_num_seqs) tokens per scheduled request */
    int32_t *b_tokens, *b_pos, *b_seq;   /* (max_batched_tokens) */
    int32_t *b_rows;          /* (max_rows) */
    int32_t *b_ids;           /* (max_rows, LI_TOPK_MAX) the ids the device sampled from, when the step did */
    float *b_cvals;           /* (max_rows, LI_TOPK_MAX) their logits */
    int32_t row_fetches;      /* rows of this step's device logits read one by one (step_logits) */
    float *b_lse;             /* (max_rows) each row's log-sum-exp, when b_has_lse (logprobs asked) */
    int32_t *b_eoff, *b_en;   /* (max_rows) each sampled row's edited ids: where in b_eids, how many (-1:
                                 none fetched, its logits decide) */
    int32_t *b_eids;          /* (b_ecap) the edited ids of the step's rows, row after row */
    float *b_evals;           /* (b_ecap) their raw logits, gathered on the device */
    int64_t *b_gidx;          /* (b_ecap) their flat indices into the step's logits */
    int64_t b_ecap;
    bool b_has_lse;
    float *b_scale;           /* (max_rows) each row's scale (1/T) for its lse at its temperature */
    float *b_lse_t;           /* (max_rows) that lse, when b_has_lse_t */
    bool b_has_lse_t;
    int64_t *b_slot;
    int32_t *b_tables;        /* (max_num_seqs, b_stride) flat block table of the step */
    size_t b_tables_cap;      /* entries */
    size_t max_rows;          /* logit rows per step: max_num_seqs, more with speculation */
    float *logits;            /* (max_rows, n_vocab): the forward's logits, set each step */
    li_evict_candidate *ev_cand; /* (cap_ev) the evict hook's candidates */
    int32_t cap_ev;
    int64_t ev_warned_step;   /* the last step that logged an evict failure */
    li_engine_stats st;
    li_spec_step sp;          /* speculation: proposers, their scratch, the hook's costs (spec_step.h) */
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
    bool mclock_on;           /* the model clock replaces wall time (li_engine_set_model_clock) */
    double mclock;            /* ... its time, seconds */
    double mclock_policy;     /* ... st.time_policy it has already charged */
    li_step_cost mcost;       /* ... its step cost model */
    li_step_shape last_shape; /* the last step's batch (li_engine_last_step) */
};

/* engine.c's helpers the speculation step calls back into */

/* The request with this id, or NULL (ids increase with arrival). */
li_engine_req *li_engine_find(li_engine *e, int64_t id);
/* The step state a policy sees: one view per live request, KV and budgets. */
void li_engine_gather(li_engine *e, li_step_state *st);
/* Samples r's next token from logits and appends it; returns it, or -1
 * when it ended the request without being appended. */
int32_t li_engine_sample_one(li_engine *e, li_engine_req *r, const float *logits);
/* Ends r with "error": its logits row has no finite value (logged). */
void li_engine_fail_logits(li_engine *e, li_engine_req *r);
/* A token chosen from logits (a draw, or a verifier's) joins r: appended and
 * emitted, or the end of r (-1) when it is an end-of-generation or stop id. */
int32_t li_engine_take_token(li_engine *e, li_engine_req *r, int32_t tok, float lp, const float *logits);
/* Whether tok would end r (an end-of-generation id unless ignore_eos, or
 * one of its stop ids): drafts after it can never be accepted. */
bool li_engine_ends_on(const li_engine *e, const li_engine_req *r, int32_t tok);

#endif
