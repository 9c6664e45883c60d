/* spec_step.c — the engine's speculation step (spec_step.h): who drafts with
 * what, the proposers' calls, verification of chains and Medusa trees, the
 * rollback of rejected drafts and the acceptance bookkeeping. It works on
 * the engine's private state (engine_internal.h) and calls back into
 * engine.c to sample and take tokens, so a verified token goes through the
 * same path (penalty window, stop ids, events, limits) as any other. */
#include "engine/engine_internal.h"
#include "spec/ngram.h"
#include "spec/verify.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef li_engine_req req;

/* ---- init / free ------------------------------------------------------------------- */

int li_spec_step_init(li_spec_step *sp, li_model *m, li_model *draft, li_backend *be, li_kv_cache *draft_kv,
                      li_kv_cache *tgt_kv, const li_engine_config *c, const li_medusa_tree *mtree, li_error *err) {
    *sp = (li_spec_step){0};
    int rc = 0;
    /* proposers: n-gram always, a model where there is one; none on a
     * batch-variant backend, where verification would not be exact */
    if (!be->ops->batch_variant) {
        sp->prop[LI_SPEC_NGRAM] = li_proposer_ngram_new(c->spec_ngram_max, c->spec_ngram_min, m->hp.n_vocab);
        if (!rc && draft)
            rc = li_proposer_model_new(&sp->prop[LI_SPEC_DRAFT], LI_SPEC_DRAFT, draft, be, draft_kv, c->max_num_seqs,
                                       err);
        if (!rc && c->spec_layers && !(rc = li_spec_layer_view(&sp->skip_model, m, c->spec_layers, err)))
            rc = li_proposer_model_new(&sp->prop[LI_SPEC_LAYERSKIP], LI_SPEC_LAYERSKIP, &sp->skip_model, be, tgt_kv,
                                       c->max_num_seqs, err);
        if (!rc && c->medusa)
            rc = li_proposer_medusa_new(&sp->prop[LI_SPEC_MEDUSA], c->medusa, mtree, c->max_num_seqs, err);
        if (!rc && c->eagle) {
            li_eagle *eg = c->eagle;
            if (!eg->be) rc = li_eagle_prepare(eg, m, be, err);
            else if (eg->be != be) rc = li_error_set(err, LI_EINVAL, "engine: the EAGLE draft is prepared on another backend");
            if (!rc) rc = li_runner_init(&sp->eg_run, &eg->m, be, tgt_kv, c->kv_dtype, c->block_size, tgt_kv->num_blocks,
                                         c->max_batched_tokens, err);
            if (!rc) rc = li_proposer_eagle_new(&sp->prop[LI_SPEC_EAGLE], eg, be, &sp->eg_run.kv, c->max_num_seqs, err);
            if (!rc) {
                sp->eagle = eg;
                const size_t T = (size_t)c->max_batched_tokens, S = (size_t)c->max_num_seqs;
                sp->eg_in = li_xmalloc(T * (size_t)eg->inproj.in_width * sizeof(float));
                sp->eg_tok = li_xmalloc(T * sizeof *sp->eg_tok);
                sp->eg_pos = li_xmalloc(T * sizeof *sp->eg_pos);
                sp->eg_seq = li_xmalloc(T * sizeof *sp->eg_seq);
                sp->eg_slot = li_xmalloc(T * sizeof *sp->eg_slot);
                sp->eg_req = li_xmalloc(S * sizeof *sp->eg_req);
                sp->eg_end = li_xmalloc(S * sizeof *sp->eg_end);
                sp->eg_p0 = li_xmalloc(S * sizeof *sp->eg_p0);
                sp->eg_k0 = li_xmalloc(S * sizeof *sp->eg_k0);
            }
        }
        if (rc) {
            li_spec_step_free(sp);
            return rc;
        }
    }
    const size_t S = (size_t)c->max_num_seqs, T = (size_t)c->max_batched_tokens;
    sp->sseq = li_xmalloc(S * sizeof *sp->sseq);
    sp->sreq = li_xmalloc(S * sizeof *sp->sreq);
    sp->sdraft = li_xmalloc(S * LI_SPEC_MAX_TOKENS * sizeof *sp->sdraft);
    sp->cands = li_xmalloc(S * sizeof *sp->cands);
    sp->c_acc = li_xmalloc(S * LI_SPEC_N_METHODS * sizeof *sp->c_acc);
    sp->c_drafted = li_xmalloc(S * LI_SPEC_N_METHODS * sizeof *sp->c_drafted);
    if (sp->prop[LI_SPEC_NGRAM]) {
        sp->vp = li_xmalloc((size_t)(LI_SPEC_MAX_TOKENS + 1) * (size_t)m->hp.n_vocab * sizeof *sp->vp);
        sp->vscratch = li_xmalloc(2 * (size_t)m->hp.n_vocab * sizeof *sp->vscratch); /* a tree's verify takes 2 rows */
    }
    if (sp->prop[LI_SPEC_MEDUSA]) {
        sp->mtree = *mtree;
        sp->b_parent = li_xmalloc(T * sizeof *sp->b_parent);
        sp->sparent = li_xmalloc(S * LI_SPEC_MAX_TOKENS * sizeof *sp->sparent);
        const size_t nr = 2 * (size_t)m->hp.n_layer * LI_SPEC_MAX_TOKENS;
        sp->mv_off_d = li_xmalloc(nr * sizeof *sp->mv_off_d);
        sp->mv_off_s = li_xmalloc(nr * sizeof *sp->mv_off_s);
    }
    return 0;
}

void li_spec_step_free(li_spec_step *sp) {
    for (int i = 0; i < LI_SPEC_N_METHODS; i++) li_proposer_free(sp->prop[i]);
    li_runner_free(&sp->eg_run); /* a follower: before the pool */
    free(sp->eg_in);
    free(sp->eg_tok);
    free(sp->eg_pos);
    free(sp->eg_seq);
    free(sp->eg_slot);
    free(sp->eg_tables);
    free(sp->eg_drop);
    free(sp->eg_req);
    free(sp->eg_end);
    free(sp->eg_p0);
    free(sp->eg_k0);
    free(sp->sseq);
    free(sp->sreq);
    free(sp->sdraft);
    free(sp->sq);
    free(sp->cands);
    free(sp->c_acc);
    free(sp->c_drafted);
    free(sp->vp);
    free(sp->vscratch);
    free(sp->b_parent);
    free(sp->sparent);
    free(sp->mv_off_d);
    free(sp->mv_off_s);
    *sp = (li_spec_step){0};
}

/* ---- bookkeeping ------------------------------------------------------------------- */

/* Accepted over verified drafts, or -1 before any draft (li_req_view). */
double li_spec_step_acceptance(const req *r) {
    return r->spec_drafted ? (double)r->spec_accepted / (double)r->spec_drafted : -1;
}

/* Proposers that keep per-request state hear when a request lets go of its KV. */
void li_spec_step_release(li_engine *e, const req *r) {
    /* eagle_lazy: rows that waited for a draft that never came */
    if (r->e_lazy) e->st.draft_sync_dropped += LI_MAX(0, LI_MIN(r->e_pend_n, r->num_computed - r->e_done));
    for (int m = 0; m < LI_SPEC_N_METHODS; m++)
        if (e->sp.prop[m] && e->sp.prop[m]->ops->on_release) e->sp.prop[m]->ops->on_release(e->sp.prop[m], r->res.id);
}

/* Draft tokens leave toks (not verified this step, or the request stops). */
void li_spec_step_drop(req *r) {
    r->n_toks -= r->n_draft;
    r->n_draft = 0;
}

/* ---- speculation: proposals ------------------------------------------------------- */

/* The request's seeded RNG feeds sampled drafts and their verification. */
static double sampler_uniform(void *smp) { return li_sampler_uniform(smp); }

/* The measured costs the speculate hook sees: moving averages. */
static double ema(double old, double x) { return old > 0 ? 0.8 * old + 0.2 * x : x; }

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
    /* the blocks it holds, or the one its next token (position n_toks)
     * needs anyway, and the step's spare blocks */
    const int64_t held = (LI_MAX((int64_t)r->seq.n_blocks, r->n_toks / bs + 1) + e->sp.spare) * bs - r->n_toks;
    return (int32_t)LI_MAX(0, LI_MIN(LI_MIN((int64_t)k, room), held));
}

/* Blocks drafts may take this step past each request's next one: what the
 * pool can hand out (empty blocks first, then idle cached ones) less a
 * block for every running request's next token and the blocks of every
 * waiting request's prompt, so drafts never preempt a request or keep one
 * waiting. Drafts past the accepted ones give theirs back at the step's
 * end (li_kv_seq_trim). */
static void spec_spare(li_engine *e) {
    const int64_t bs = e->tgt.kv.block_size;
    int64_t need = 0;
    for (int32_t i = 0; i < e->n_reqs; i++) {
        const req *r = e->reqs[i];
        if (!r->live) continue;
        if (r->state == LI_REQ_RUNNING) need++;
        else need += LI_MAX(0, (r->n_toks + bs - 1) / bs - r->seq.n_blocks);
    }
    e->sp.spare = LI_MAX(0, (int64_t)li_kv_available(&e->tgt.kv) - need);
}

/* Slots for positions [0, n): the blocks past the one the next token needs
 * count against the step's spare. Returns the slots the request holds
 * (fewer than n when the pool ran short). */
static int64_t spec_take(li_engine *e, req *r, int64_t n) {
    li_kv_cache *kv = &e->tgt.kv;
    const int64_t base = LI_MAX((int64_t)r->seq.n_blocks, r->n_toks / kv->block_size + 1);
    (void)li_kv_seq_reserve(kv, &r->seq, n); /* on LI_ENOMEM it keeps the blocks it got */
    e->sp.spare = LI_MAX(0, e->sp.spare - LI_MAX(0, (int64_t)r->seq.n_blocks - base));
    return (int64_t)r->seq.n_blocks * kv->block_size;
}

/* A model proposer writes the KV of positions [n_toks - 1, n_toks - 1 + k)
 * now, and verification the next one: their blocks must be the request's
 * and private. Returns the drafts that fit (0: none). */
static int32_t spec_slots(li_engine *e, req *r, int32_t k) {
    const int64_t p = r->n_toks - 1;
    k = (int32_t)LI_MIN((int64_t)k, spec_take(e, r, r->n_toks + k) - r->n_toks);
    return k > 0 && li_kv_seq_cow(&e->tgt.kv, &r->seq, p, p + k + 1) == 0 ? k : 0;
}

static int eagle_catchup_drafters(li_engine *e, int32_t ns, bool lazy, li_error *err); /* below */

/* The draft model's KV is computed only for requests that draft with it,
 * just before they do: positions [d_valid, n_toks - 1) of the ns seqs of
 * sreq, batched in passes of the draft runner's capacity over the step's
 * batch scratch (free until the plan's batch is built), without logits.
 * The kernels are batch-invariant, so these are the bits a draft running
 * every step's batch would have written. Shared blocks (forks, prefix
 * hits) get the same bits from every holder: same tokens, same positions. */
static int draft_sync(li_engine *e, int32_t ns, li_error *err) {
    int32_t stride = 1;
    int64_t todo = 0;
    for (int32_t i = 0; i < ns; i++) {
        const req *r = e->sp.sreq[i];
        stride = LI_MAX(stride, r->seq.n_blocks);
        todo += LI_MAX(0, r->n_toks - 1 - r->d_valid);
    }
    if (!todo) return 0;
    if ((size_t)ns * (size_t)stride > e->b_tables_cap) {
        e->b_tables_cap = LI_MAX((size_t)ns * (size_t)stride, 2 * e->b_tables_cap);
        e->b_tables = li_xrealloc(e->b_tables, e->b_tables_cap * sizeof *e->b_tables);
    }
    for (int32_t i = 0; i < ns; i++)
        memcpy(e->b_tables + (size_t)i * stride, e->sp.sreq[i]->seq.blocks,
               (size_t)e->sp.sreq[i]->seq.n_blocks * sizeof *e->b_tables);
    const double t0 = li_time_now();
    li_batch b = {.tokens = e->b_tokens, .pos = e->b_pos, .seq = e->b_seq, .slot = e->b_slot,
                  .block_table = e->b_tables, .n_seqs = ns, .bt_stride = stride, .no_logits = true};
    int rc = 0;
    for (int32_t i = 0; i < ns && !rc; i++) {
        const req *r = e->sp.sreq[i];
        for (int64_t p = r->d_valid; p < r->n_toks - 1 && !rc; p++) {
            e->b_tokens[b.n] = r->toks[p];
            e->b_pos[b.n] = (int32_t)p;
            e->b_seq[b.n] = i;
            e->b_slot[b.n] = li_kv_seq_slot(&e->tgt.kv, &r->seq, p);
            if (++b.n == e->draft.fw.cap) rc = li_runner_run(&e->draft, &b, err), b.n = 0;
        }
    }
    if (!rc && b.n) rc = li_runner_run(&e->draft, &b, err);
    e->st.time_draft_sync += li_time_now() - t0;
    if (rc) return rc;
    e->st.draft_sync_tokens += todo;
    for (int32_t i = 0; i < ns; i++) e->sp.sreq[i]->d_valid = e->sp.sreq[i]->n_toks - 1;
    return 0;
}

/* The row-cost curve the hook sees: the calibrated shape at the machine's
 * pace where there is one (the relative costs of n and n + k rows come from
 * one sweep: per-count averages taken at different times and loads
 * disagreed, and a dearer T(4) than T(5) priced a draft's row below
 * nothing), each count's own average past it or without one. */
static const double *row_curve(li_spec_step *sp) {
    if (!sp->calib_top) return sp->ema_rows;
    for (int32_t n = 1; n <= LI_SPEC_COST_ROWS; n++)
        sp->rows_shown[n - 1] = n <= sp->calib_top ? sp->calib[n - 1] * sp->level : sp->ema_rows[n - 1];
    return sp->rows_shown;
}

/* A chain of n drafts cut after its first token that would end r: if that
 * one is accepted r ends, if not nothing after it is, so the rows after it
 * are verified in vain (an n-gram copy runs on past the end of the text it
 * copies, into the chat template that followed it: up to 15 rows of 16) */
static int32_t stop_cut(const li_engine *e, const req *r, const int32_t *draft, int32_t n) {
    for (int32_t j = 0; j < n; j++)
        if (li_engine_ends_on(e, r, draft[j])) return j + 1;
    return n;
}

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
        double *acc = e->sp.c_acc + (size_t)n * LI_SPEC_N_METHODS;
        int64_t *dr = e->sp.c_drafted + (size_t)n * LI_SPEC_N_METHODS;
        for (int m = 0; m < LI_SPEC_N_METHODS; m++) {
            dr[m] = r->spec_drafted_by[m];
            acc[m] = dr[m] ? (double)r->spec_accepted_by[m] / (double)dr[m] : -1;
        }
        /* what n-gram lookup would draft now: a policy can send a request
         * with nothing to copy to another proposer this step */
        int32_t match;
        const int32_t ng = stop_cut(e, r, e->sp.sdraft,
                                    li_spec_ngram_lookup(r->toks, r->n_toks, e->cfg.spec_ngram_max,
                                                         e->cfg.spec_ngram_min, max_k, e->sp.sdraft, &match));
        e->sp.cands[n++] = (li_spec_cand){.id = r->res.id, .want_method = want, .want_k = LI_MIN(k, max_k),
                                       .max_k = max_k, .temperature = r->smp.p.temperature, .acceptance = acc,
                                       .drafted = dr, .ngram = ng, .ngram_match = match,
                                       .method = k ? (int32_t)want : -1, .k = LI_MIN(k, max_k)};
    }
    if (!n) return;
    const char *names[LI_SPEC_N_METHODS];
    bool avail[LI_SPEC_N_METHODS];
    for (int m = 0; m < LI_SPEC_N_METHODS; m++) names[m] = li_spec_method_name(m), avail[m] = e->sp.prop[m] != NULL;
    const li_spec_state ss = {.methods = names, .available = avail, .n_methods = LI_SPEC_N_METHODS,
                              .batch_size = running, .step_time = e->sp.ema_step, .token_time = e->sp.ema_token,
                              .draft_time = e->sp.ema_draft, .row_time = row_curve(&e->sp),
                              .verify_time = e->sp.ema_verify};
    li_step_state st;
    li_engine_gather(e, &st);
    li_error perr = {0};
    const double tp = li_time_now();
    const int rc = e->policy->ops->speculate(e->policy, &st, &ss, e->sp.cands, n, &perr);
    e->st.time_policy += li_time_now() - tp;
    if (rc) {
        e->st.policy_errors++;
        /* a broken hook fails every step: log the first few, then now and then */
        if (++e->sp.hook_errors <= 3 || e->sp.hook_errors % 1000 == 0)
            li_log_warn("policy %s: speculate failed (%lld times), the requests' own speculation stands: %s",
                        e->policy->name, (long long)e->sp.hook_errors, perr.msg);
        return;
    }
    for (int32_t i = 0; i < n; i++) {
        li_spec_cand *c = &e->sp.cands[i];
        req *r = li_engine_find(e, c->id);
        if (!r) continue;
        int32_t m = c->method, k = c->k;
        if (m >= LI_SPEC_N_METHODS || (m >= 0 && !e->sp.prop[m]) || k < 0 || k > c->max_k) {
            e->st.plans_trimmed++; /* an unavailable method is off, k is clamped */
            if (m >= LI_SPEC_N_METHODS || (m >= 0 && !e->sp.prop[m])) m = -1;
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
void li_spec_step_propose(li_engine *e) {
    int32_t running = 0;
    for (int32_t i = 0; i < e->n_reqs; i++) running += e->reqs[i]->live && e->reqs[i]->state == LI_REQ_RUNNING;
    const bool hook = e->policy && e->policy->has_speculate && e->policy->ops->speculate;
    spec_spare(e);
    if (hook) policy_speculate(e, running);
    else if (e->cfg.spec_disable_batch && running > e->cfg.spec_disable_batch) return;
    size_t sq_used = 0; /* floats of sq taken this step */
    for (int m = 0; m < LI_SPEC_N_METHODS; m++) {
        li_proposer *p = e->sp.prop[m];
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
            if ((m == LI_SPEC_DRAFT || m == LI_SPEC_LAYERSKIP || m == LI_SPEC_EAGLE) && !(k = spec_slots(e, r, k)))
                continue;
            e->sp.sseq[ns] = (li_spec_seq){.id = r->res.id, .toks = r->toks, .n_toks = r->n_toks,
                                        .blocks = r->seq.blocks, .n_blocks = r->seq.n_blocks, .k = k,
                                        .temperature = m == LI_SPEC_NGRAM ? 0 : r->smp.p.temperature,
                                        .uniform = sampler_uniform, .uctx = &r->smp,
                                        .draft = e->sp.sdraft + (size_t)ns * LI_SPEC_MAX_TOKENS,
                                        .hidden = tree ? r->hid : NULL,
                                        .feature = m == LI_SPEC_EAGLE && r->eg_pos == r->n_toks - 2 ? r->eg : NULL,
                                        .parent = tree ? e->sp.sparent + (size_t)ns * LI_SPEC_MAX_TOKENS : NULL};
            e->sp.sreq[ns++] = r;
        }
        if (!ns) continue;
        double t_sync = 0; /* a model's catch-up is part of what its drafts cost */
        if (m == LI_SPEC_DRAFT || m == LI_SPEC_EAGLE) {
            li_error serr = {0};
            /* eagle_lazy: a first draft's catch-up of its prompt, once, out
             * of what a draft costs (time_draft_sync still counts it) */
            int src = m == LI_SPEC_EAGLE && e->cfg.eagle_lazy ? eagle_catchup_drafters(e, ns, true, &serr) : 0;
            const double t0 = li_time_now();
            if (!src) src = m == LI_SPEC_DRAFT ? draft_sync(e, ns, &serr) : eagle_catchup_drafters(e, ns, false, &serr);
            t_sync = li_time_now() - t0; /* in time_draft_sync, not time_propose */
            if (src) {
                li_log_warn("speculation: the %s catch-up failed, no drafts this step: %s",
                            m == LI_SPEC_DRAFT ? "draft model's" : "EAGLE draft's", serr.msg);
                continue;
            }
        }
        /* room for the distributions of sampled drafts, after those of the
         * methods before (kept by offset: the buffer may move) */
        const size_t nv = (size_t)e->model->hp.n_vocab;
        size_t need = sq_used;
        for (int32_t i = 0; i < ns; i++)
            if (e->sp.sseq[i].temperature > 0) need += (size_t)e->sp.sseq[i].k * nv;
        if (need > e->sp.sq_cap) {
            e->sp.sq_cap = need;
            e->sp.sq = li_xrealloc(e->sp.sq, need * sizeof *e->sp.sq);
        }
        for (int32_t i = 0; i < ns; i++) {
            e->sp.sreq[i]->d_q = -1;
            if (e->sp.sseq[i].temperature <= 0) continue;
            e->sp.sseq[i].q = e->sp.sq + sq_used;
            e->sp.sreq[i]->d_q = (int64_t)sq_used;
            sq_used += (size_t)e->sp.sseq[i].k * nv;
        }
        li_error perr = {0};
        const double t0 = li_time_now();
        const int rc = p->ops->propose(p, e->sp.sseq, ns, &perr);
        const double dt = li_time_now() - t0;
        e->st.time_propose += dt;
        int64_t n_drafts = 0;
        for (int32_t i = 0; i < ns; i++) n_drafts += e->sp.sseq[i].k;
        if (!rc && n_drafts) e->sp.ema_draft[m] = ema(e->sp.ema_draft[m], (dt + t_sync) / (double)n_drafts);
        if (rc) {
            li_log_warn("speculation: the %s proposer failed, no drafts this step: %s", li_spec_method_name(m), perr.msg);
            continue;
        }
        for (int32_t i = 0; i < ns; i++) {
            req *r = e->sp.sreq[i];
            /* EAGLE's first draft step wrote the draft's KV of the last
             * token from its final inputs (that token, the target's row
             * before it): the next catch-up starts after it (a rejected
             * draft then needs no catch-up pass at all) */
            if (m == LI_SPEC_EAGLE && e->sp.sseq[i].n_draft > 0 && r->e_done == r->n_toks - 1 && !r->e_pend_n)
                r->e_done = r->n_toks;
            /* n-gram and Medusa drafts take their slots now (a tree's nodes
             * list parents first: a cut one keeps its shape) */
            int32_t want = e->sp.sseq[i].n_draft;
            if (!e->sp.sseq[i].parent) want = stop_cut(e, r, e->sp.sseq[i].draft, want); /* a chain */
            const int32_t n = (int32_t)LI_MIN((int64_t)want, spec_take(e, r, r->n_toks + want) - r->n_toks);
            if (n <= 0) continue;
            if (r->n_toks + n > r->cap) {
                r->cap = r->n_toks + n + 16;
                r->toks = li_xrealloc(r->toks, (size_t)r->cap * sizeof *r->toks);
            }
            memcpy(r->toks + r->n_toks, e->sp.sseq[i].draft, (size_t)n * sizeof *r->toks);
            r->n_toks += n;
            r->n_draft = n;
            r->d_method = (li_spec_method)m;
            if (!e->sp.sseq[i].has_q) r->d_q = -1;
            r->d_tree = e->sp.sseq[i].parent != NULL;
            /* the draft steps wrote the KV of the last token and of drafts 0..n-2 */
            if (m == LI_SPEC_DRAFT) r->d_hi = r->n_toks - 1;
            if (r->d_tree) memcpy(r->d_parent, e->sp.sseq[i].parent, (size_t)n * sizeof *r->d_parent);
        }
    }
}

/* ---- EAGLE: the draft's KV, caught up lazily ------------------------------------------ */

/* The draft's input row of position p of r (in_width floats to dst): the
 * captured row of position p - 1. Positions before p0 wait in r->e_pend;
 * from p0 on they are this step's target rows, the first at captured row
 * k0: it reads the row r kept from its last pass (r->eg), the others the
 * batch row before. A row nobody has (position 0, the first after a prefix
 * hit or a recompute, one lost to a failed pass) is zeros. */
static void eagle_row(const li_spec_step *sp, const req *r, int64_t p, int64_t p0, int64_t k0, size_t w, float *dst) {
    const float *src = NULL;
    if (p < p0) src = p - r->e_done < r->e_pend_n ? r->e_pend + (size_t)(p - r->e_done) * w : NULL;
    else if (p > p0) src = sp->captured + (size_t)(k0 + p - p0 - 1) * w;
    else if (r->eg && r->eg_pos == p - 1) src = r->eg;
    if (src) memcpy(dst, src, w * sizeof *dst);
    else memset(dst, 0, w * sizeof *dst);
}

/* The draft over positions [e_done, eg_end[i]) of the n requests eg_req
 * (rows from eg_p0[i] on are this step's, from captured row eg_k0[i]: see
 * eagle_row), in passes of the runner's capacity, without logits. The
 * kernels are batch-invariant, so these are the bits a pass right after
 * every target pass would have written. Sets e_hi. */
static int eagle_catchup(li_engine *e, int32_t n, li_error *err) {
    li_spec_step *sp = &e->sp;
    const size_t w = (size_t)sp->eagle->inproj.in_width;
    int32_t stride = 1;
    int64_t todo = 0;
    for (int32_t i = 0; i < n; i++) {
        stride = LI_MAX(stride, sp->eg_req[i]->seq.n_blocks);
        todo += LI_MAX(0, sp->eg_end[i] - sp->eg_req[i]->e_done);
    }
    if (!todo) return 0;
    if ((size_t)n * (size_t)stride > sp->eg_tables_cap) {
        sp->eg_tables_cap = LI_MAX((size_t)n * (size_t)stride, 2 * sp->eg_tables_cap);
        sp->eg_tables = li_xrealloc(sp->eg_tables, sp->eg_tables_cap * sizeof *sp->eg_tables);
    }
    for (int32_t i = 0; i < n; i++)
        memcpy(sp->eg_tables + (size_t)i * stride, sp->eg_req[i]->seq.blocks,
               (size_t)sp->eg_req[i]->seq.n_blocks * sizeof *sp->eg_tables);
    const double t0 = li_time_now();
    li_batch b = {.tokens = sp->eg_tok, .pos = sp->eg_pos, .seq = sp->eg_seq, .slot = sp->eg_slot,
                  .block_table = sp->eg_tables, .n_seqs = n, .bt_stride = stride, .no_logits = true,
                  .in_hidden = sp->eg_in, .in_width = (int32_t)w};
    int rc = 0;
    for (int32_t i = 0; i < n && !rc; i++) {
        const req *r = sp->eg_req[i];
        for (int64_t p = r->e_done; p < sp->eg_end[i] && !rc; p++) {
            sp->eg_tok[b.n] = r->toks[p];
            sp->eg_pos[b.n] = (int32_t)p;
            sp->eg_seq[b.n] = i;
            sp->eg_slot[b.n] = li_kv_seq_slot(&e->tgt.kv, &r->seq, p);
            eagle_row(sp, r, p, sp->eg_p0[i], sp->eg_k0[i], w, sp->eg_in + (size_t)b.n * w);
            if (++b.n == sp->eg_run.fw.cap) rc = li_runner_run(&sp->eg_run, &b, err), b.n = 0;
        }
    }
    if (!rc && b.n) rc = li_runner_run(&sp->eg_run, &b, err);
    e->st.time_draft_sync += li_time_now() - t0;
    if (rc) return rc;
    e->st.draft_sync_tokens += todo;
    for (int32_t i = 0; i < n; i++) sp->eg_req[i]->e_hi = sp->eg_end[i];
    return 0;
}

/* Before the ns requests of sreq draft with EAGLE: their verified positions
 * (lazy: only those drafting with it for the first time under eagle_lazy,
 * whose rows waited since their prompt). */
static int eagle_catchup_drafters(li_engine *e, int32_t ns, bool lazy, li_error *err) {
    li_spec_step *sp = &e->sp;
    int32_t n = 0;
    for (int32_t i = 0; i < ns; i++) {
        req *r = sp->sreq[i];
        if (lazy && !r->e_lazy) continue;
        r->e_used = e->step_no;
        r->e_lazy = false;
        sp->eg_req[n] = r;
        sp->eg_end[n] = sp->eg_p0[n] = r->num_computed;
        sp->eg_k0[n++] = 0;
    }
    const int rc = eagle_catchup(e, n, err);
    if (!rc)
        for (int32_t i = 0; i < n; i++) li_spec_step_eagle_settle(sp->eg_req[i]);
    return rc;
}

/* Room for `rows` pending rows of r, doubling up to max (more never wait:
 * li_spec_step_eagle_sync catches up first); a buffer grown past max while
 * the request was lazy shrinks back to it. */
static void pend_reserve(req *r, int64_t rows, int64_t max, size_t w) {
    int64_t cap = r->e_pend_cap;
    if (cap > max && rows <= max) cap = max;
    else if (rows > cap) cap = LI_MAX(rows, LI_MIN(2 * cap, max));
    if (cap == r->e_pend_cap) return;
    r->e_pend_cap = cap;
    r->e_pend = li_xrealloc(r->e_pend, (size_t)cap * w * sizeof *r->e_pend);
}

/* The step's rows of r at positions [max(e_done, what waits), end) into
 * e_pend: its captured rows from batch row k on (the first at p0). */
static void pend_take(li_spec_step *sp, req *r, int64_t p0, int64_t end, int64_t k, size_t w) {
    /* (after a gap's zeros: rows lost to a failed pass; not the last token's
     * when the first draft step wrote its KV) */
    for (int64_t p = LI_MAX(r->e_done, LI_MIN(p0, r->e_done + r->e_pend_n)); p < end; p++)
        eagle_row(sp, r, p, p0, k, w, r->e_pend + (size_t)(p - r->e_done) * w);
    r->e_pend_n = end - r->e_done;
}

/* Zeros the draft's KV of r's positions [from, end). */
static void eagle_zero(li_engine *e, req *r, int64_t from, int64_t end) {
    li_spec_step *sp = &e->sp;
    const int64_t n = end - from;
    if (n <= 0) return;
    if (n > sp->eg_drop_cap) {
        sp->eg_drop_cap = LI_MAX(n, 2 * sp->eg_drop_cap);
        sp->eg_drop = li_xrealloc(sp->eg_drop, (size_t)sp->eg_drop_cap * sizeof *sp->eg_drop);
    }
    for (int64_t p = from; p < end; p++) sp->eg_drop[p - from] = li_kv_seq_slot(&e->tgt.kv, &r->seq, p);
    li_kv_slots_clear(&sp->eg_run.kv, sp->eg_drop, (int32_t)n);
    r->e_zero = LI_MAX(r->e_zero, end);
}

/* r has not drafted with EAGLE for eagle_idle_steps steps, or over as many
 * positions past its prompt (a request copying 16 tokens a step with n-gram
 * lookup paid the draft's catch-up every step of its short life: 6% of a
 * batch of four such): instead of the
 * draft's pass over [e_done, end), its KV there is zeroed (the same bits
 * whatever the slots held, so a later draft or a prefix hit on these blocks
 * sees the same), and the rows are dropped. The catch-up's bookkeeping
 * (e_hi, then li_spec_step_eagle_settle) is the same. */
static void eagle_drop(li_engine *e, req *r, int64_t end) {
    const int64_t n = end - r->e_done;
    if (n <= 0) return;
    eagle_zero(e, r, r->e_done, end);
    r->e_hi = end;
    r->e_pend_n = 0;
    e->st.draft_sync_dropped += n;
}

int li_spec_step_eagle_sync(li_engine *e, int32_t nb, li_error *err) {
    li_spec_step *sp = &e->sp;
    if (!sp->eagle || !sp->captured) return 0;
    const size_t w = (size_t)sp->eagle->inproj.in_width;
    const bool cached = li_prefix_cache_enabled(&e->pc);
    const int64_t bs = e->tgt.kv.block_size;
    int32_t n = 0;
    int64_t k = 0;
    for (int32_t i = 0; i < nb; k += e->batch_n[i++]) {
        req *r = e->batch_req[i];
        const int64_t p0 = r->num_computed, end = p0 + e->batch_n[i];
        if (r->e_used < 0) r->e_used = e->step_no, r->e_used_pos = r->n_prompt;
        if (r->e_used == e->step_no) r->e_used_pos = LI_MAX(r->e_used_pos, end); /* idle from the step's end */
        const int32_t idle = e->cfg.eagle_idle_steps;
        const bool is_idle = idle && (e->step_no - r->e_used >= idle || end - r->e_used_pos >= idle);
        if (r->e_lazy && !is_idle && end - r->e_done <= LI_EAGLE_LAZY_MAX) {
            /* eagle_lazy, no EAGLE draft yet: the rows wait for its first
             * one; the draft's KV of blocks joining the prefix cache
             * meanwhile is zeroed (a hit there sees the same bits whatever
             * the slots held) */
            pend_reserve(r, end - r->e_done, LI_EAGLE_LAZY_MAX, w);
            pend_take(sp, r, p0, end, k, w);
            if (cached && end / bs > r->e_zero / bs) eagle_zero(e, r, LI_MAX(r->e_zero, r->e_done), end);
            continue;
        }
        r->e_lazy = false; /* idle or too long: as without eagle_lazy (catch up or drop what waited) */
        /* a block that would join the prefix cache needs its draft KV first */
        if ((cached && end / bs > r->e_done / bs) || end - r->e_done > LI_EAGLE_PENDING_MAX) {
            if (is_idle) {
                eagle_drop(e, r, end);
                continue;
            }
            sp->eg_req[n] = r;
            sp->eg_end[n] = end;
            sp->eg_p0[n] = p0; /* the step's rows start here, at captured row k */
            sp->eg_k0[n++] = k;
            continue;
        }
        pend_reserve(r, end - r->e_done, LI_EAGLE_PENDING_MAX, w);
        pend_take(sp, r, p0, end, k, w);
    }
    const int rc = n ? eagle_catchup(e, n, err) : 0;
    /* the next pass starts after this one's last row (a prefill chunk's end;
     * a verification keeps the row its last token came from instead,
     * li_spec_step_keep_hidden) */
    k = 0;
    for (int32_t i = 0; i < nb; i++) {
        req *r = e->batch_req[i];
        k += e->batch_n[i];
        if (!r->eg) r->eg = li_xmalloc(w * sizeof *r->eg);
        memcpy(r->eg, sp->captured + (size_t)(k - 1) * w, w * sizeof *r->eg);
        r->eg_pos = e->b_pos[k - 1];
    }
    return rc;
}

void li_spec_step_eagle_settle(req *r) {
    if (r->e_hi > r->e_done) {
        r->e_done = LI_MIN(r->e_hi, r->num_computed);
        r->e_pend_n = 0;
    } else {
        r->e_pend_n = LI_MAX(0, LI_MIN(r->e_pend_n, r->num_computed - r->e_done));
    }
    r->e_hi = 0;
}

void li_spec_step_eagle_reset(req *r, int64_t done) {
    r->e_done = r->e_zero = done;
    r->e_hi = r->e_pend_n = 0;
}

void li_spec_step_eagle_fork(const li_engine *e, req *c, const req *parent) {
    li_spec_step_eagle_reset(c, parent->e_done);
    c->e_lazy = parent->e_lazy;
    /* a lazy sample zeroes only positions of its own: the ones it shares
     * may hold the parent's catch-up by then */
    if (c->e_lazy) c->e_zero = LI_MAX(parent->e_zero, parent->num_computed);
    if (!e->sp.eagle || !parent->e_pend_n) return;
    const size_t w = (size_t)e->sp.eagle->inproj.in_width;
    pend_reserve(c, parent->e_pend_n, parent->e_lazy ? LI_EAGLE_LAZY_MAX : LI_EAGLE_PENDING_MAX, w);
    memcpy(c->e_pend, parent->e_pend, (size_t)parent->e_pend_n * w * sizeof *c->e_pend);
    c->e_pend_n = parent->e_pend_n;
}

/* ---- speculation: verification ------------------------------------------------------ */

/* The m rows computed for a drafted request: row j's logits give the token
 * after position P0 + j. Tokens are sampled in order; each one that equals
 * the draft at its place lets the next row count, the first that differs
 * (or a bonus after the last draft) ends the run. The KV of positions past
 * the last accepted input is simply overwritten later. */
/* A sampled verification's target rows (li_spec_row_fn), made when the
 * verifier reaches them: at temperature > 0 a row is the request's whole
 * distribution, and with every row made up front a round paid for all of
 * them however early it failed. tok: the drafts; depth: their tree depths
 * (NULL for a chain). */
typedef struct {
    li_engine *e;
    req *r;
    const float *rows;
    const int32_t *tok, *depth;
    int64_t gen0;
    int32_t kk;
    bool pen; /* penalties on: a tree row's window holds its branch */
} sampled_rows;

/* Row j (the logits row j of the step's rows for r) into sp.vp's row j,
 * with the min_tokens ban while it holds at depth dd */
static const float *sampled_make(sampled_rows *c, int32_t j, int32_t dd) {
    const int32_t nv = c->e->model->hp.n_vocab;
    req *r = c->r;
    const bool hold = c->gen0 + dd < r->min_tokens;
    float *pj = c->e->sp.vp + (size_t)j * nv;
    li_sampler_ban(&r->smp, hold ? r->ban : NULL, hold ? r->n_ban : 0);
    li_sampler_sample_u(&r->smp, c->rows + (size_t)j * nv, 0.5, pj, NULL, NULL);
    return pj;
}

/* a chain's row j: drafts 0..j - 1 in the penalty window (accepted as each row is made) */
static const float *chain_row(void *ctx, int32_t j) {
    sampled_rows *c = ctx;
    const float *pj = sampled_make(c, j, j);
    if (j < c->kk) li_sampler_accept(&c->r->smp, c->tok[j]);
    return pj;
}

/* Whether each of m rows of logits can be drawn from (li_sampler_logits_usable) */
static bool rows_usable(const float *rows, int32_t m, int32_t nv) {
    for (int32_t j = 0; j < m; j++)
        if (!li_sampler_logits_usable(rows + (size_t)j * nv, nv)) return false;
    return true;
}

/* A sampled round with a row that cannot be drawn from (NaN or Inf in the
 * model) keeps none of its drafts: the token comes from row 0 alone, as
 * without speculation, and a bad row 0 ends r with "error" there
 * (li_engine_sample_one). Returns 0, the drafts accepted. */
static int32_t sample_root_only(li_engine *e, req *r, const float *rows, int64_t p0) {
    r->num_computed = p0 + 1;
    li_engine_sample_one(e, r, rows);
    return 0;
}

/* Temperature > 0: rejection sampling (li_spec_verify_chain_rows) against the
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
    if (!rows_usable(rows, m, nv)) return sample_root_only(e, r, rows, p0);
    sampled_rows src = {e, r, rows, draft, NULL, gen0, kk, false};
    int32_t next = -1;
    int32_t a = li_spec_verify_chain_rows(chain_row, &src, q, nv, draft, kk, sampler_uniform, &r->smp,
                                          e->sp.vscratch, &next);
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
        li_engine_take_token(e, r, tok, lp, row);
        if (!r->live) break;
        accepted += j < a;
    }
    return accepted;
}

/* ---- speculation: trees (Medusa) ------------------------------------------------------ */

/* Medusa drafts from the hidden state that predicted a request's last
 * token: row `row` of the step's hidden rows, kept after r took a token. */
void li_spec_step_keep_hidden(li_engine *e, req *r, int32_t row) {
    if (e->sp.captured && r->live) { /* EAGLE: the captured rows of that batch row */
        const int32_t br = e->b_rows[row];
        const size_t w = (size_t)e->sp.eagle->inproj.in_width;
        if (!r->eg) r->eg = li_xmalloc(w * sizeof *r->eg);
        memcpy(r->eg, e->sp.captured + (size_t)br * w, w * sizeof *r->eg);
        r->eg_pos = e->b_pos[br];
    }
    if (!e->sp.hidden || !r->live) return;
    const size_t E = (size_t)e->model->hp.n_embd;
    if (!r->hid) r->hid = li_xmalloc(E * sizeof *r->hid);
    memcpy(r->hid, e->sp.hidden + (size_t)row * E, E * sizeof *r->hid);
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
void li_spec_step_tree_fit(li_engine *e, int32_t nb) {
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
                e->sp.mv_off_d[runs] = k0 + (size_t)dst[j] * w;
                e->sp.mv_off_s[runs] = k0 + (size_t)src[j] * w;
                e->sp.mv_off_d[runs + 1] = v0 + (size_t)dst[j] * w;
                e->sp.mv_off_s[runs + 1] = v0 + (size_t)src[j] * w;
            }
        }
        e->be->ops->buffer_copy(e->be, (li_buffer *)buf, buf, e->sp.mv_off_d, e->sp.mv_off_s, runs, w);
    }
}

/* The penalties see the tokens before a draft: its branch (depth dd, the
 * ancestors' tokens) after the request's kept tokens. */
static void tree_window(req *r, const int32_t *tok, int32_t node, int32_t dd) {
    for (int32_t j = dd - 1, x = node; j >= 0; j--, x = r->d_parent[x]) r->toks[r->n_toks + j] = tok[x];
    li_sampler_window_reset(&r->smp, r->toks, r->n_toks + dd);
}

/* a tree's row j (the root's, or node j - 1's): its branch in the penalty window */
static const float *tree_row(void *ctx, int32_t j) {
    sampled_rows *c = ctx;
    const int32_t dd = j ? c->depth[j - 1] : 0;
    if (c->pen) tree_window(c->r, c->tok, j - 1, dd);
    return sampled_make(c, j, dd);
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
    li_spec_step_drop(r);
    const int64_t P = r->num_computed, gen0 = r->n_toks - r->n_prompt;
    *verified = n;
    *last = 0;
    if (r->smp.p.temperature > 0 && !rows_usable(rows, n + 1, nv)) {
        a = sample_root_only(e, r, rows, P);
    } else if (r->smp.p.temperature > 0) {
        const li_sampling_params *sp = &r->smp.p;
        const bool pen = sp->repeat_penalty != 1.0f || sp->presence_penalty != 0 || sp->frequency_penalty != 0;
        sampled_rows src = {e, r, rows, tok, depth, gen0, n, pen};
        int32_t next = -1;
        a = li_spec_verify_tree_rows(tree_row, &src, NULL, nv, tok, r->d_parent, n, sampler_uniform, &r->smp,
                                     e->sp.vscratch, path, &next);
        li_sampler_window_reset(&r->smp, r->toks, r->n_toks); /* tree_row's windows: the branches' */
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
            li_engine_take_token(e, r, t, lp, row);
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
            const int32_t t = li_engine_sample_one(e, r, rows + (size_t)(cur + 1) * nv);
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

void li_spec_step_verify(li_engine *e, req *r, int32_t m, const float *rows, int32_t row0) {
    int32_t draft[LI_SPEC_MAX_TOKENS];
    const int32_t k = r->n_draft;
    const int64_t p0 = r->num_computed; /* before this step's tokens */
    int32_t verified, accepted = 0, last = -1;
    if (!r->d_tree) {
        memcpy(draft, r->toks + r->n_toks - k, (size_t)k * sizeof *draft);
        li_spec_step_drop(r);
    }
    if (r->d_tree) {
        accepted = verify_tree(e, r, m, rows, &verified, &last);
    } else if (r->smp.p.temperature > 0) {
        verified = LI_MIN(m - 1, k);
        accepted = verify_sampled(e, r, LI_MIN(m, k + 1), rows, draft, r->d_q >= 0 ? e->sp.sq + r->d_q : NULL);
    } else {
        /* row j checks draft j: m rows check min(m, k) drafts (a row past the
         * last draft gives the bonus token) */
        verified = LI_MIN(m, k);
        for (int32_t j = 0; j < m; j++) {
            r->num_computed = p0 + j + 1; /* row j's input is valid: the last token, or an accepted draft */
            last = j;
            const int32_t tok = li_engine_sample_one(e, r, rows + (size_t)j * e->model->hp.n_vocab);
            if (!r->live || j >= k || tok != draft[j]) break;
            accepted++;
        }
    }
    /* the row the last token came from (sampled chains: rows 0..accepted gave tokens) */
    li_spec_step_keep_hidden(e, r, row0 + (last >= 0 ? last : accepted));
    r->spec_drafted += verified;
    r->spec_accepted += accepted;
    r->spec_drafted_by[r->d_method] += verified;
    r->spec_accepted_by[r->d_method] += accepted;
    e->st.spec_drafted += verified;
    e->st.spec_accepted += accepted;
    e->st.spec_drafted_by[r->d_method] += verified;
    e->st.spec_accepted_by[r->d_method] += accepted;
    e->st.spec_rounds_by[r->d_method]++;
    /* the draft's KV holds what its steps wrote up to the first rejected input */
    if (r->d_method == LI_SPEC_DRAFT) r->d_valid = LI_MIN(r->d_hi, r->num_computed);
    li_proposer *p = e->sp.prop[r->d_method];
    if (p && p->ops->on_verified) p->ops->on_verified(p, r->res.id, verified, accepted);
    li_spec_step_eagle_settle(r);
}

/* ---- the batch and the costs --------------------------------------------------------- */

void li_spec_step_tree_batch(li_engine *e, const req *r, int64_t row0, int32_t n) {
    int32_t depth[LI_SPEC_MAX_TOKENS];
    tree_depths(r, n - 1, depth);
    for (int32_t j = 1; j < n; j++) {
        e->b_pos[row0 + j] = (int32_t)(r->num_computed + depth[j - 1]);
        e->sp.b_parent[row0 + j] = (int32_t)(row0 + 1 + r->d_parent[j - 1]);
    }
}

void li_spec_step_costs(li_spec_step *sp, double dt, int64_t n, int64_t n_logits) {
    sp->ema_step = ema(sp->ema_step, dt);
    if (n) sp->ema_token = ema(sp->ema_token, dt / (double)n);
    /* a row count's first pass runs cold (its shapes' first GEMMs, scratch
     * faulted in) and can read 1.5x: taken as the average, it priced that
     * count, and every count above it, out of a policy's reach for good.
     * Only passes whose every row takes logits, as a draft's rows do: a
     * prefill chunk's rows skip the output head (28M of this model's 135M
     * multiply-adds a row) and priced drafts' rows below their cost */
    if (n >= 1 && n <= sp->calib_top && n_logits == n) {
        sp->level = ema(sp->level, dt / sp->calib[n - 1]);
    } else if (n >= 1 && n <= LI_SPEC_COST_ROWS && n_logits == n) {
        if (sp->seen_rows[n - 1]) sp->ema_rows[n - 1] = ema(sp->ema_rows[n - 1], dt);
        sp->seen_rows[n - 1] = true;
    }
}

void li_spec_step_verify_cost(li_spec_step *sp, bool sampled, double dt, int32_t m) {
    if (m > 0) sp->ema_verify[sampled] = ema(sp->ema_verify[sampled], dt / (double)m);
}

/* ---- the cost curve, timed up front -------------------------------------------------- */

/* The row counts timed: the policy interpolates between them (spec_adaptive's
 * row_estimates), and the curve bends where the kernels change tiles. */
static const int32_t calib_rows[] = {1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64};

/* Positions of context before the timed rows: a step's rows attend to
 * their requests' contexts, and at position 0 a row's attention cost was
 * left out of the curve (session 33: at context 256 a pass of 8 rows read
 * 2.4x one row's, at context 1 2.2x, so drafts were priced too cheap). */
#define CALIB_CTX 256

/* The batch arrays' first n entries: positions [p, p + n) of the scratch
 * sequence seq, arbitrary tokens */
static void calib_fill(li_engine *e, const li_kv_seq *seq, int64_t p, int64_t n) {
    const int32_t n_vocab = e->model->hp.n_vocab;
    for (int64_t i = 0; i < n; i++) {
        e->b_tokens[i] = (int32_t)(((p + i) * 7919 + 11) % n_vocab);
        e->b_pos[i] = (int32_t)(p + i);
        e->b_seq[i] = 0;
        e->b_slot[i] = li_kv_seq_slot(&e->tgt.kv, seq, p + i);
    }
}

void li_spec_step_calibrate(li_engine *e) {
    li_spec_step *sp = &e->sp;
    li_kv_cache *kv = &e->tgt.kv;
    /* empty blocks only: a cached prefix is worth more than a curve */
    const int64_t room = (int64_t)kv->n_free * kv->block_size, T = e->cfg.max_batched_tokens;
    int64_t n_max = LI_MIN((int64_t)LI_SPEC_COST_ROWS, room);
    n_max = LI_MIN(n_max, LI_MIN(T, (int64_t)e->max_rows));
    if (n_max < 1) return;
    const int64_t p0 = LI_MAX((int64_t)0, LI_MIN((int64_t)CALIB_CTX, room - n_max)); /* what fits */
    li_kv_seq seq;
    li_kv_seq_init(&seq);
    if (li_kv_seq_reserve(kv, &seq, p0 + n_max)) {
        li_kv_seq_release(kv, &seq);
        li_kv_seq_free(&seq);
        return;
    }
    const double t0 = li_time_now();
    li_error err = {0};
    int rc = 0;
    /* the context, untimed, in passes of at most T tokens */
    for (int64_t c0 = 0; c0 < p0 && !rc; c0 += T) {
        const int64_t nc = LI_MIN(T, p0 - c0);
        calib_fill(e, &seq, c0, nc);
        li_batch cb = {.n = nc, .tokens = e->b_tokens, .pos = e->b_pos, .seq = e->b_seq, .slot = e->b_slot,
                       .block_table = seq.blocks, .n_seqs = 1, .bt_stride = seq.n_blocks, .no_logits = true};
        rc = e->tp ? li_tp_run(e->tp, &cb, &err) : li_runner_run(&e->tgt, &cb, &err);
    }
    calib_fill(e, &seq, p0, n_max);
    for (int64_t i = 0; i < n_max; i++) e->b_rows[i] = (int32_t)i;
    /* a pass as a step's: every row's logits, the hidden rows Medusa reads,
     * the rows EAGLE captures */
    li_batch b = {.tokens = e->b_tokens, .pos = e->b_pos, .seq = e->b_seq, .slot = e->b_slot,
                  .block_table = seq.blocks, .n_seqs = 1, .bt_stride = seq.n_blocks, .logit_rows = e->b_rows,
                  .hidden = sp->prop[LI_SPEC_MEDUSA] ? LI_HIDDEN_POST_NORM : LI_HIDDEN_NONE,
                  .capture = sp->eagle ? sp->eagle->f.feature_layer : NULL,
                  .n_capture = sp->eagle ? sp->eagle->f.n_features : 0};
    int32_t top = 0;
    /* the first pass runs cold (scratch faulted in, weights not in cache):
     * untimed. Then CALIB_SWEEPS sweeps over the counts, each count's
     * fastest pass kept: on a shared machine one pass can read 1.3x (a
     * curve with T(32) above T(48) priced 40 drafts below 30) */
    enum { CALIB_SWEEPS = 3 };
    double best[LI_ARRAY_LEN(calib_rows)];
    for (size_t i = 0; i < LI_ARRAY_LEN(calib_rows); i++) best[i] = HUGE_VAL;
    for (int sweep = 0; sweep <= CALIB_SWEEPS && !rc; sweep++)
        for (size_t i = 0; i < LI_ARRAY_LEN(calib_rows) && !rc; i++) {
            const int64_t n = sweep ? calib_rows[i] : n_max;
            if (n > n_max) break;
            b.n = b.n_logits = n;
            const double t = li_time_now();
            rc = e->tp ? li_tp_run(e->tp, &b, &err) : li_runner_run(&e->tgt, &b, &err);
            if (!sweep) break;
            if (!rc) best[i] = LI_MIN(best[i], li_time_now() - t);
        }
    /* linear between the counts timed (a policy interpolates the same way) */
    for (size_t i = 0; i < LI_ARRAY_LEN(calib_rows) && best[i] < HUGE_VAL; i++) {
        const int32_t n = calib_rows[i];
        sp->calib[n - 1] = best[i];
        for (int32_t m = top + 1; m < n; m++)
            sp->calib[m - 1] = best[i - 1] + (best[i] - best[i - 1]) * (double)(m - top) / (double)(n - top);
        top = n;
    }
    if (top) sp->calib_top = top, sp->level = 1;
    li_kv_seq_release(kv, &seq);
    li_kv_seq_free(&seq);
    e->st.time_calibrate += li_time_now() - t0;
    e->st.calibrated_rows = LI_MAX(e->st.calibrated_rows, top);
    if (rc)
        li_log_warn("speculation: timing the row-cost curve failed (%d rows timed): %s", top, err.msg);
    else if (top)
        li_log_info("speculation: forward passes timed at 1-%d rows, %.3f ms to %.3f ms (%.0f ms)", top,
                    sp->calib[0] * 1e3, sp->calib[top - 1] * 1e3, (li_time_now() - t0) * 1e3);
}
