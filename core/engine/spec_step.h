/* spec_step.h — the engine's speculation step (spec_step.c): which request
 * drafts with what (its own ask, the engine's default or the policy's
 * speculate hook), the proposers' calls (spec/proposer.h), the appended
 * drafts and their verification against the target's rows (greedy, or
 * rejection sampling with spec/verify.c; chains and Medusa trees), the
 * rollback of what was not accepted (tokens, and a tree's KV moved to its
 * positions) and the acceptance counts per request, per method and in the
 * engine's stats. engine.c runs the step and asks this file at its points:
 * before the plan (propose), while building the batch (tree rows), after the
 * forward (verify, keep_hidden). */
#ifndef LI_SPEC_STEP_H
#define LI_SPEC_STEP_H

#include "engine/engine.h"
#include "engine/runner.h"
#include "spec/eagle.h"
#include "spec/medusa.h"
#include "spec/proposer.h"

/* Rows of draft input a request keeps waiting before its EAGLE KV catches up. */
#define LI_EAGLE_PENDING_MAX 64
/* eagle_lazy: rows a request that has not drafted with EAGLE keeps waiting
 * (in_width floats each: 6.75 KiB for SmolLM2's three features); past it
 * the draft's KV is computed as without eagle_lazy */
#define LI_EAGLE_LAZY_MAX 512

struct li_engine_req; /* engine_internal.h */

typedef struct li_spec_step {
    /* a proposer per method (NULL: not available), and the view of the
     * target layerskip drafts with */
    li_proposer *prop[LI_SPEC_N_METHODS];
    li_model skip_model;
    /* the step's proposal scratch */
    li_spec_seq *sseq;           /* (max_num_seqs) */
    struct li_engine_req **sreq; /* (max_num_seqs) */
    int32_t *sdraft;             /* (max_num_seqs, LI_SPEC_MAX_TOKENS) */
    bool asked;                  /* a request asked for its own speculation: proposals run
                                  * even with spec_tokens 0 */
    float *sq;                   /* (sq_cap) sampled drafts' distributions this step */
    size_t sq_cap;
    float *vp;                   /* (LI_SPEC_MAX_TOKENS + 1, n_vocab) target distributions */
    float *vscratch;             /* (2 * n_vocab) */
    /* the speculate hook's candidates and the costs it is shown */
    li_spec_cand *cands;         /* (max_num_seqs) */
    double *c_acc;               /* (max_num_seqs, LI_SPEC_N_METHODS) */
    int64_t *c_drafted;          /* (max_num_seqs, LI_SPEC_N_METHODS) */
    double ema_step, ema_token, ema_draft[LI_SPEC_N_METHODS];
    double ema_rows[LI_SPEC_COST_ROWS]; /* [n - 1]: a forward pass of n tokens, seconds (0: none yet) */
    /* a drafted request's verification, seconds per row it verifies: [0]
     * greedy (an argmax a row, until the first miss), [1] sampled (every
     * row's distribution, then the rejection test); 0 = none yet */
    double ema_verify[2];
    bool seen_rows[LI_SPEC_COST_ROWS]; /* [n - 1]: a pass of n tokens ran (the first is not timed) */
    /* the calibrated curve (li_spec_step_calibrate): [n - 1] for n <= calib_top,
     * seconds, linear between the counts timed; the machine's pace since,
     * the passes' times over it (an average); and what the hook is shown,
     * calib x level up to calib_top, the averages past it */
    double calib[LI_SPEC_COST_ROWS], level, rows_shown[LI_SPEC_COST_ROWS];
    int32_t calib_top;
    int64_t hook_errors;
    int64_t spare;               /* blocks drafts may still take this step past each
                                  * request's next one (spec_spare) */
    /* Medusa (cfg.medusa): the tree, the step's hidden rows, tree batches */
    li_medusa_tree mtree;
    const float *hidden;         /* (n_logits, n_embd) the step's post-norm hidden rows, or NULL */
    int32_t *b_parent;           /* (max_batched_tokens) tree parents of the batch, with Medusa */
    int32_t *sparent;            /* (max_num_seqs, LI_SPEC_MAX_TOKENS) proposals' tree parents */
    size_t *mv_off_d, *mv_off_s; /* (2 * n_layer * LI_SPEC_MAX_TOKENS) KV row moves */
    /* EAGLE (cfg.eagle): the draft over KV following the pool; each target
     * pass's captured rows wait in their request (e_pend) until it drafts
     * with EAGLE, a block of its is about to join the prefix cache, or
     * LI_EAGLE_PENDING_MAX rows wait */
    li_eagle *eagle;             /* borrowed, or NULL */
    li_runner eg_run;            /* cap max_batched_tokens */
    const float *captured;       /* (batch rows, in_width) of the step's target pass, or NULL */
    float *eg_in;                /* (max_batched_tokens, in_width) a catch-up pass's in_hidden rows */
    int32_t *eg_tok, *eg_pos, *eg_seq; /* (max_batched_tokens) a catch-up pass's rows */
    int64_t *eg_slot;            /* (max_batched_tokens) */
    int32_t *eg_tables;          /* (eg_tables_cap) its block tables */
    size_t eg_tables_cap;
    int64_t *eg_drop;            /* (eg_drop_cap) slots an idle request's drop zeroes */
    int64_t eg_drop_cap;
    struct li_engine_req **eg_req; /* (max_num_seqs) */
    int64_t *eg_end, *eg_p0, *eg_k0; /* (max_num_seqs) each one's end position, where the
                                  * step's rows start and their first captured row */
} li_spec_step;

/* The proposers (none on a batch-variant backend, where verification would
 * not be exact: n-gram always, a draft model over draft_kv, layer skip over
 * tgt_kv, Medusa heads with mtree) and the scratch, sized for c's
 * max_num_seqs and max_batched_tokens. On failure everything made is freed. */
int li_spec_step_init(li_spec_step *sp, li_model *m, li_model *draft, li_backend *be, li_kv_cache *draft_kv,
                      li_kv_cache *tgt_kv, const li_engine_config *c, const li_medusa_tree *mtree, li_error *err);
void li_spec_step_free(li_spec_step *sp);

/* Step 0: each proposer drafts, in one call, for the requests in decode that
 * speculate with it; the drafts are appended to their tokens. */
void li_spec_step_propose(li_engine *e);
/* Step 4: a tree that needs more scratch KV blocks than are free is cut to
 * its chain (batch_n); then each drafted tree's rows get their positions
 * (P + depth) and parents, rows [row0, row0 + n) of the batch. */
void li_spec_step_tree_fit(li_engine *e, int32_t nb);
void li_spec_step_tree_batch(li_engine *e, const struct li_engine_req *r, int64_t row0, int32_t n);
/* Step 6: the m rows computed for a drafted request (its first at logit row
 * row0) verify its drafts; the accepted join it, the rest are rolled back. */
void li_spec_step_verify(li_engine *e, struct li_engine_req *r, int32_t m, const float *rows, int32_t row0);
/* Step 5b, EAGLE: the target pass's rows of its nb requests join their
 * pending input rows (each reads the captured row of the position before
 * it; a request's first row the one it kept); requests that would register
 * a block in the prefix cache this step, or hold LI_EAGLE_PENDING_MAX rows,
 * catch up now (e_hi). A failed pass loses drafts, never tokens. */
int li_spec_step_eagle_sync(li_engine *e, int32_t nb, li_error *err);
/* After r's num_computed is final for the step: what the catch-up wrote up
 * to it is done, pending rows past it are dropped. */
void li_spec_step_eagle_settle(struct li_engine_req *r);
/* r's EAGLE state after its KV changed hands: none (preempted: done 0),
 * a prefix hit's (done = num_computed, the cached blocks carry it), or a
 * fork's (the parent's done and pending rows). */
void li_spec_step_eagle_reset(struct li_engine_req *r, int64_t done);
void li_spec_step_eagle_fork(const li_engine *e, struct li_engine_req *c, const struct li_engine_req *parent);
/* Medusa drafts from the hidden state that predicted a request's last token,
 * EAGLE from the captured rows of that position: logit row `row` of the
 * step, kept after r took a token. */
void li_spec_step_keep_hidden(li_engine *e, struct li_engine_req *r, int32_t row);
/* The forward just measured (dt seconds for n tokens, n_logits of them
 * with logits): the costs the hook sees. */
void li_spec_step_costs(li_spec_step *sp, double dt, int64_t n, int64_t n_logits);
/* One drafted request's verification took dt seconds over m rows. */
void li_spec_step_verify_cost(li_spec_step *sp, bool sampled, double dt, int32_t m);
/* Times forward passes of 1 to 64 rows (every row with logits) on a scratch
 * sequence of empty blocks, between steps: the row-cost curve a speculate
 * policy prices drafts with, before its first step (cfg.spec_calibrate).
 * Fewer rows when fewer blocks are empty; a failed pass is logged and the
 * curve keeps what was timed. */
void li_spec_step_calibrate(li_engine *e);

/* Draft tokens leave r's tokens (not verified this step, or r stops). */
void li_spec_step_drop(struct li_engine_req *r);
/* Proposers that keep per-request state hear when r lets go of its KV. */
void li_spec_step_release(li_engine *e, const struct li_engine_req *r);
/* Accepted over verified drafts, or -1 before any draft (li_req_view). */
double li_spec_step_acceptance(const struct li_engine_req *r);

#endif
