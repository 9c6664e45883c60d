/* engine.c — the step loop. Owns: requests, the runners (runner.c: the
 * target, whose KV cache is the block pool, and an optional draft over
 * storage following it), the flat batch. Asks, and glues to the policy:
 * the prefix-cache manager (kv/prefix_cache.c), a request's output stream
 * (output.c: text, stop strings, events), the speculation step (spec_step.c:
 * drafting through the proposers, verification, rollback, acceptance) and the
 * built-in FCFS (policy/fcfs.c).
 *
 * C owns every byte of state; the policy only proposes a plan. Validation
 * drops unknown or finished ids, clamps token counts to what remains, trims
 * to the step budgets and the free KV blocks, and counts every change. A plan
 * that ends up computing nothing while work is pending is replaced by the
 * built-in FCFS for that step, so a broken policy slows nothing down and
 * loses no request. */
#define _GNU_SOURCE
#include "engine/engine_internal.h"
#include "tokenizer/tokenizer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef li_engine_req req;

void li_engine_config_default(li_engine_config *c) {
    *c = (li_engine_config){
        .block_size = 16, .kv_dtype = LI_TYPE_F16, .kv_memory = (size_t)256 << 20,
        .max_num_seqs = 64, .max_batched_tokens = 512, .max_model_len = 0, .prefix_caching = true,
        .spec_tokens = 0, .spec_ngram_max = 4, .spec_ngram_min = 2, .spec_disable_batch = 4,
        .spec_method = LI_SPEC_NGRAM, .spec_layers = 0, .tensor_parallel = 1, .eagle_idle_steps = 16,
        .spec_calibrate = false, .device_sampling = true,
    };
}

double li_engine_now(const li_engine *e) { return e->mclock_on ? e->mclock : li_time_now() - e->t0; }

/* The prefix cache stamps hits and releases with the engine clock. */
static double engine_clock(const void *e) { return li_engine_now(e); }

req *li_engine_find(li_engine *e, int64_t id) {
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
    free(r->eg);
    free(r->e_pend);
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
static void finish(li_engine *e, req *r, const char *reason) {
    if (!r->live) return;
    li_spec_step_release(e, r);
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
                         .n_preemptions = r->res.n_preemptions, .spec_acceptance = li_spec_step_acceptance(r),
                         .slo_ttft_ms = r->slo_ttft_ms, .slo_tpot_ms = r->slo_tpot_ms,
                         .first_scheduled = r->res.t_first_scheduled, .first_token = r->res.t_first_token};
        e->policy->ops->on_finish(e->policy, &v, reason);
    }
    li_output_finish(r->res.id, reason, r->on_event, r->ud);
}

/* At the end of a step, or when it ends early: no draft outlives the step,
 * nor the blocks taken for drafts past the accepted ones. */
static void drop_all_drafts(li_engine *e) {
    for (int32_t i = 0; i < e->n_reqs; i++) {
        req *r = e->reqs[i];
        li_spec_step_drop(r);
        if (r->seq.n_blocks) li_kv_seq_trim(&e->tgt.kv, &r->seq, r->n_toks);
    }
}

static void preempt(li_engine *e, req *r) {
    li_spec_step_drop(r);
    li_spec_step_release(e, r);
    release_seq(e, r);
    r->num_computed = 0;
    r->d_valid = 0;
    r->eg_pos = -1;
    li_spec_step_eagle_reset(r, 0);
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
                            "engine: speculation needs batch-invariant kernels; the '%s' backend is not "
                            "(" LI_BATCH_INVARIANT_HINT ")",
                            be->ops->name);
    if (c.eagle_lazy && !c.eagle)
        return li_error_set(err, LI_EINVAL, "engine: eagle_lazy needs an EAGLE draft (eagle)");
    if (c.eagle_idle_steps < 0)
        return li_error_set(err, LI_EINVAL, "engine: eagle_idle_steps must be >= 0, got %d", c.eagle_idle_steps);
    if (c.spec_disable_batch < 0)
        return li_error_set(err, LI_EINVAL, "engine: spec_disable_batch must be >= 0, got %d", c.spec_disable_batch);
    if (c.spec_ngram_min < 1 || c.spec_ngram_max < c.spec_ngram_min || c.spec_ngram_max > 64)
        return li_error_set(err, LI_EINVAL, "engine: want 1 <= spec_ngram_min <= spec_ngram_max <= 64, got %d and %d",
                            c.spec_ngram_min, c.spec_ngram_max);
    if ((int)c.spec_method < 0 || c.spec_method >= LI_SPEC_N_METHODS)
        return li_error_set(err, LI_EINVAL, "engine: spec_method %d is not ngram, draft, layerskip, medusa or eagle", (int)c.spec_method);
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
    if (c.eagle && c.medusa)
        return li_error_set(err, LI_EUNSUP, "engine: an EAGLE draft with Medusa heads is not supported yet");
    li_medusa_tree mtree = {0};
    if (c.medusa) {
        li_medusa *h = c.medusa;
        if (be->ops->batch_variant)
            return li_error_set(err, LI_EINVAL,
                                "engine: Medusa needs batch-invariant kernels; the '%s' backend is not "
                                "(" LI_BATCH_INVARIANT_HINT ")",
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
    if (c.eagle) {
        if (be->ops->batch_variant)
            return li_error_set(err, LI_EINVAL,
                                "engine: EAGLE needs batch-invariant kernels; the '%s' backend is not "
                                "(" LI_BATCH_INVARIANT_HINT ")",
                                be->ops->name);
        if (c.tensor_parallel > 1)
            return li_error_set(err, LI_EUNSUP, "engine: tensor_parallel %d with an EAGLE draft is not supported yet",
                                c.tensor_parallel);
        if (c.eagle->f.n_embd != m->hp.n_embd || c.eagle->f.n_vocab != m->hp.n_vocab)
            return li_error_set(err, LI_EINVAL,
                                "engine: an EAGLE draft of n_embd %d, n_vocab %d for a model of n_embd %d, n_vocab %d",
                                c.eagle->f.n_embd, c.eagle->f.n_vocab, m->hp.n_embd, m->hp.n_vocab);
    }
    if (c.spec_tokens && c.spec_method == LI_SPEC_EAGLE && !c.eagle)
        return li_error_set(err, LI_EINVAL, "engine: spec_method 'eagle' needs an EAGLE draft (--eagle FILE)");
    if (c.tensor_parallel > 1 && c.spec_layers)
        return li_error_set(err, LI_EUNSUP, "engine: tensor_parallel %d with layerskip (spec_layers) is not supported yet",
                            c.tensor_parallel);
    /* one block id holds a block of tokens in the target's storage and the
     * draft's: the budget pays for both */
    const size_t bpt_t = li_runner_kv_bytes_per_token(m, c.kv_dtype);
    if (!bpt_t) /* not a KV dtype: say which, not that the budget holds nothing */
        return li_error_set(err, LI_EUNSUP, "engine: kv_dtype %s (type %d) is not a KV cache dtype (f32, f16, bf16, fp8 or int8)",
                            li_type_name(c.kv_dtype), (int)c.kv_dtype);
    const size_t bpt = bpt_t + (draft ? li_runner_kv_bytes_per_token(draft, c.kv_dtype) : 0) +
                       (c.eagle ? li_runner_kv_bytes_per_token(&c.eagle->m, c.kv_dtype) : 0);
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
    if ((rc = li_spec_step_init(&e->sp, m, draft, be, &e->draft.kv, &e->tgt.kv, &c, &mtree, err))) {
        li_runner_free(&e->draft);
        target_free(e);
        free(e);
        return rc;
    }
    li_prefix_cache_init(&e->pc, &e->tgt.kv, c.prefix_caching, engine_clock, e);
    e->t0 = li_time_now();
    e->next_id = 1;
    li_plan_init(&e->plan);
    li_plan_init(&e->fallback);
    const size_t S = (size_t)c.max_num_seqs, T = (size_t)c.max_batched_tokens;
    /* logit rows: one per request, or one per verified position with
     * speculation (a request may ask for it on an engine without a default) */
    e->max_rows = e->sp.prop[LI_SPEC_NGRAM] ? LI_MAX(S, LI_MIN(T, S * (size_t)(LI_SPEC_MAX_TOKENS + 1))) : S;
    e->batch_req = li_xmalloc(S * sizeof *e->batch_req);
    e->batch_n = li_xmalloc(S * sizeof *e->batch_n);
    e->b_tokens = li_xmalloc(T * sizeof(int32_t));
    e->b_pos = li_xmalloc(T * sizeof(int32_t));
    e->b_seq = li_xmalloc(T * sizeof(int32_t));
    e->b_rows = li_xmalloc(e->max_rows * sizeof(int32_t));
    e->b_ids = li_xmalloc(e->max_rows * LI_TOPK_MAX * sizeof(int32_t));
    e->b_cvals = li_xmalloc(e->max_rows * LI_TOPK_MAX * sizeof(float));
    e->b_lse = li_xmalloc(e->max_rows * sizeof(float));
    e->b_eoff = li_xmalloc(e->max_rows * sizeof(int32_t));
    e->b_scale = li_xmalloc(e->max_rows * sizeof(float));
    e->b_lse_t = li_xmalloc(e->max_rows * sizeof(float));
    e->b_en = li_xmalloc(e->max_rows * sizeof(int32_t));
    e->b_slot = li_xmalloc(T * sizeof(int64_t));
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
    free(e->b_ids);
    free(e->b_cvals);
    free(e->b_lse);
    free(e->b_eoff);
    free(e->b_scale);
    free(e->b_lse_t);
    free(e->b_en);
    free(e->b_eids);
    free(e->b_evals);
    free(e->b_gidx);
    free(e->b_slot);
    free(e->ev_cand);
    li_spec_step_free(&e->sp);
    li_prefix_cache_free(&e->pc);
    li_runner_free(&e->draft); /* a follower goes before its pool */
    target_free(e);
    free(e);
}

void li_engine_set_policy(li_engine *e, li_policy *p) {
    e->policy = p;
    /* the first policy that prices drafts: the curve it prices them on */
    if (p && p->has_speculate && e->cfg.spec_calibrate && !e->st.calibrated_rows && e->sp.prop[LI_SPEC_NGRAM])
        li_spec_step_calibrate(e);
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
    li_spec_step_eagle_reset(r, hit); /* cached blocks hold their EAGLE KV */
    r->res.cached_tokens = hit;
}

/* Blocks the step just filled join the cache (all tokens here are verified:
 * speculative tokens must be accepted before they reach this point), as far
 * as an EAGLE draft's KV is complete, or zeroed while it waits (eagle_lazy):
 * a hit must find the same bits whatever the slots held. */
static void prefix_register(li_engine *e, req *r) {
    const int64_t upto = e->sp.eagle ? LI_MIN(r->num_computed, LI_MAX(r->e_done, r->e_zero)) : r->num_computed;
    li_prefix_register(&e->pc, &r->pfx, &r->seq, upto, r->toks, r->cache_salt);
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
        .n_preemptions = r->res.n_preemptions, .spec_acceptance = li_spec_step_acceptance(r),
        .slo_ttft_ms = r->slo_ttft_ms, .slo_tpot_ms = r->slo_tpot_ms,
        .first_scheduled = r->res.t_first_scheduled, .first_token = r->res.t_first_token,
    };
    v->projected_blocks = projected_blocks(e, r, v->n_blocks);
    prefix_view(e, r, v);
}

void li_engine_gather(li_engine *e, li_step_state *st) {
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
    r->eg_pos = -1;
    r->e_used = -1; /* set when first scheduled */
    r->e_lazy = e->cfg.eagle_lazy;
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
            return li_error_set(err, LI_EINVAL, "request: speculation method %d is not ngram, draft, layerskip, medusa or eagle",
                                (int)p->spec_method);
        if (p->spec_k && !e->sp.prop[LI_SPEC_NGRAM])
            return li_error_set(err, LI_EINVAL,
                                "request: speculation needs batch-invariant kernels; the '%s' backend is not "
                                "(" LI_BATCH_INVARIANT_HINT ")",
                                e->be->ops->name);
        if (p->spec_k && !e->sp.prop[p->spec_method])
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
        li_engine_gather(e, &st);
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
    e->sp.asked |= p->spec_set && p->spec_k > 0;
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
    req *r = li_engine_find(e, id);
    if (!r || !r->live) return 1;
    if (e->in_step) r->cancel_pending = true;
    else finish(e, r, "cancelled");
    return 0;
}

const li_request_result *li_engine_result(li_engine *e, int64_t id) {
    req *r = li_engine_find(e, id);
    if (!r) return NULL;
    sync_result(r);
    return &r->res;
}

void li_engine_release(li_engine *e, int64_t id) {
    req *r = li_engine_find(e, id);
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
            req *r = plan->run[i].n_tokens > 0 ? li_engine_find(e, plan->run[i].id) : NULL;
            if (r) r->plan_mark = mark;
        }
    for (int32_t i = 0; i < plan->n_preempt; i++) {
        req *r = li_engine_find(e, plan->preempt[i]);
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
        req *r = li_engine_find(e, pr->id);
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

bool li_engine_ends_on(const li_engine *e, const req *r, int32_t tok) {
    return (!r->ignore_eos && li_tokenizer_is_eog(e->model->tok, tok)) || is_stop_id(r, tok);
}

/* While min_tokens are not out, the end-of-generation and stop ids cannot
 * be drawn. */
static void ban_for_min_tokens(req *r) {
    const bool hold = r->n_toks - r->n_prompt < r->min_tokens;
    li_sampler_ban(&r->smp, hold ? r->ban : NULL, hold ? r->n_ban : 0);
}

/* Ends r with "error" when a row of its logits has no finite maximum
 * (li_sampler_logits_usable): drawn from, it would give id 0, the
 * end-of-text token of many vocabularies, and a model whose weights hold
 * NaN would answer every request with nothing and "stop". */
void li_engine_fail_logits(li_engine *e, req *r) {
    li_log_warn("engine: request %lld: the model's logits for position %lld hold no finite value (NaN or Inf in "
                "its weights or activations); the request ends with finish_reason \"error\"",
                (long long)r->res.id, (long long)r->n_toks);
    flush_text(e, r);
    finish(e, r, "error");
}

/* Samples r's next token from logits and appends it; returns it, or -1
 * when it ended the request without being appended (end-of-generation or
 * a stop token). */
int32_t li_engine_sample_one(li_engine *e, req *r, const float *logits) {
    if (!li_sampler_logits_usable(logits, e->model->hp.n_vocab)) {
        li_engine_fail_logits(e, r);
        return -1;
    }
    float lp = 0;
    ban_for_min_tokens(r);
    int32_t tok = li_sampler_sample(&r->smp, logits, r->smp.p.n_logprobs ? r->top : NULL, &lp);
    return li_engine_take_token(e, r, tok, lp, logits);
}

/* A token chosen from logits (the sampler's draw, or a verifier's) joins r:
 * end-of-generation or a stop id ends r (-1), else it is accepted into the
 * penalty window, appended and emitted; length limits end r after it. */
int32_t li_engine_take_token(li_engine *e, req *r, int32_t tok, float lp, const float *logits) {
    if (r->res.t_first_token < 0) r->res.t_first_token = li_engine_now(e);
    if (li_engine_ends_on(e, r, tok)) {
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

/* The parent's prompt is computed: its waiting samples take its blocks
 * (shared, copy-on-write) and draw their first token from the same logits. */
static void fork_samples(li_engine *e, req *parent, const float *logits, int32_t row) {
    for (int32_t i = 0; i < e->n_reqs; i++) {
        req *c = e->reqs[i];
        if (c->fork_of != parent || !c->live) continue;
        c->fork_of = NULL;
        li_kv_seq_fork(&e->tgt.kv, &parent->seq, &c->seq);
        c->num_computed = parent->num_computed;
        c->d_valid = parent->d_valid; /* the blocks' draft KV comes with them */
        li_spec_step_eagle_fork(e, c, parent);
        li_prefix_seq_fork(&c->pfx, &parent->pfx);
        c->state = LI_REQ_RUNNING;
        if (c->res.t_first_scheduled < 0) c->res.t_first_scheduled = parent->res.t_first_scheduled;
        li_engine_sample_one(e, c, logits);
        li_spec_step_keep_hidden(e, c, row);
    }
}

/* r's samples still waiting for its prompt (n > 1) */
static bool has_forks(const li_engine *e, const req *r) {
    for (int32_t i = 0; i < e->n_reqs; i++)
        if (e->reqs[i]->fork_of == r && e->reqs[i]->live) return true;
    return false;
}

/* Samples the step where the logits are (engine.h's device_sampling):
 * the target's logits are device memory, nothing is drafted, and a request
 * whose row is sampled draws from its largest logits alone
 * (li_sampler_cand_need; its min_tokens ban, if any, is set first), and
 * the raw logits of the ids its penalties, bias or ban edit (gathered). A
 * row that needs its logits (more than LI_SAMPLER_EDIT_MAX edited ids, or
 * a backend without gather), or that its candidates cannot decide, reads
 * them (step_logits). Returns the candidates a row it
 * fetched into e->b_cvals / e->b_ids (with each row's lse in e->b_lse when
 * a row asks for it; 1 without: greedy ids alone, by argmax), or 0: the
 * host reads every row's logits. */
_Static_assert(LI_SAMPLER_CAND_WIDE <= LI_TOPK_MAX, "the sampler's widest fetch is a backend's topk");

static int32_t device_sampled(li_engine *e, int32_t nb, int64_t n_logits) {
    if (!e->cfg.device_sampling || e->tp || e->logits || n_logits <= 0) return 0;
    int32_t k = 0, row = 0;
    int64_t ne = 0; /* edited ids, all rows */
    bool any_lse = false, any_scale = false;
    const bool gathers = li_forward_can_gather(&e->tgt.fw);
    for (int32_t i = 0; i < nb; i++) {
        req *r = e->batch_req[i];
        if (r->n_draft) return 0;
        if (r->num_computed + e->batch_n[i] != r->n_toks) continue; /* no row sampled */
        ban_for_min_tokens(r);
        bool lse;
        const int32_t need = li_sampler_cand_need(&r->smp, &lse);
        if (need > LI_TOPK_MAX) return 0;
        if (ne + LI_SAMPLER_EDIT_MAX > e->b_ecap) {
            e->b_ecap = LI_MAX(2 * e->b_ecap, ne + LI_SAMPLER_EDIT_MAX);
            e->b_eids = li_xrealloc(e->b_eids, (size_t)e->b_ecap * sizeof *e->b_eids);
            e->b_evals = li_xrealloc(e->b_evals, (size_t)e->b_ecap * sizeof *e->b_evals);
            e->b_gidx = li_xrealloc(e->b_gidx, (size_t)e->b_ecap * sizeof *e->b_gidx);
        }
        const int32_t n_e = need ? li_sampler_edit_ids(&r->smp, e->b_eids + ne, LI_SAMPLER_EDIT_MAX) : -1;
        const float sc = need ? li_sampler_cand_scale(&r->smp) : 0.0f;
        e->b_scale[row] = sc > 0 ? sc : 1.0f;
        any_scale |= sc > 0;
        e->b_eoff[row] = (int32_t)ne;
        e->b_en[row] = n_e > 0 && !gathers ? -1 : n_e; /* no gather op: its logits */
        for (int32_t j = 0; j < e->b_en[row]; j++)
            e->b_gidx[ne + j] = (int64_t)row * e->model->hp.n_vocab + e->b_eids[ne + j];
        ne += LI_MAX(e->b_en[row], 0);
        row++;
        if (n_e < 0 || e->b_en[row - 1] < 0) continue;
        k = LI_MAX(k, need); /* need <= n_vocab */
        any_lse |= lse;
    }
    if (!k) return 0; /* every sampled row needs its logits */
    li_error err = {0};
    e->b_has_lse = any_lse; /* topk with each row's lse, even for greedy ids */
    e->b_has_lse_t = any_scale;
    const li_logit_fetch q = {
        .k = k, .vals = e->b_cvals, .ids = e->b_ids, .lse = any_lse ? e->b_lse : NULL,
        .lse_scale = any_scale ? e->b_scale : NULL, .lse_t = e->b_lse_t, .gidx = e->b_gidx, .n_gather = ne,
        .gout = e->b_evals,
    };
    const int rc = k == 1 && !any_lse && !ne ? li_forward_argmax(&e->tgt.fw, e->model, e->b_ids, &err)
                                             : li_forward_topk(&e->tgt.fw, e->model, &q, &err);
    return rc ? 0 : k; /* an error: the host reads the logits */
}

/* Row `row` of the step's logits, copied back from the device when a step
 * sampled there needs them (forks, a row its candidates cannot decide):
 * that row alone, or every row once more than LI_ROW_FETCHES did (one
 * transfer then costs less than many). */
#define LI_ROW_FETCHES 4
static const float *step_logits(li_engine *e, int32_t row) {
    if (!e->logits && ++e->row_fetches > LI_ROW_FETCHES) e->logits = li_runner_logits(&e->tgt);
    return e->logits ? e->logits + (size_t)row * (size_t)e->model->hp.n_vocab : li_runner_logits_row(&e->tgt, row);
}

/* r's token from the k candidates device_sampled fetched for `row`; false,
 * nothing taken, when they cannot decide it (a tie at its top_k boundary,
 * a NaN, a draw the logits not fetched could change): its logits do. */
static bool take_device_token(li_engine *e, req *r, int32_t row, int32_t k) {
    const int32_t n_e = e->b_en[row];
    if (n_e < 0) return false; /* its logits decide (penalties over too many ids, or no gather op) */
    float lp = 0.0f;
    const li_sampler_cands cd = {
        .vals = e->b_cvals + (size_t)row * k, .ids = e->b_ids + (size_t)row * k, .n = k,
        .lse = e->b_has_lse ? e->b_lse[row] : NAN, .lse_t = e->b_has_lse_t ? e->b_lse_t[row] : NAN,
        .edit_ids = e->b_eids + e->b_eoff[row],
        .edit_vals = e->b_evals + e->b_eoff[row], .n_edit = n_e,
    };
    /* a top value that is not finite goes to the host, whose logits end
     * the request (li_engine_sample_one): the shortcut would take its id */
    const int32_t tok = k == 1 && !e->b_has_lse && !n_e && isfinite(cd.vals[0])
                            ? e->b_ids[row]
                            : li_sampler_sample_cand(&r->smp, &cd, r->smp.p.n_logprobs ? r->top : NULL, &lp);
    if (tok < 0) {
        e->st.tokens_device_undecided++;
        return false;
    }
    e->st.tokens_device_sampled++;
    li_engine_take_token(e, r, tok, lp, NULL);
    return true;
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

/* The batch just computed in the clock's terms: one pass over the step's
 * rows (before its tokens are sampled: num_computed is still the start). */
static void step_shape(li_engine *e, int32_t nb) {
    li_step_shape *s = &e->last_shape;
    for (int32_t i = 0; i < nb; i++) {
        const double n = e->batch_n[i], p0 = (double)e->batch_req[i]->num_computed;
        if (n == 1) s->decode_rows++;
        else s->prefill_tokens += (int64_t)n;
        s->context += n * p0 + n * (n + 1) / 2; /* positions p0 .. p0+n-1 attend to p+1 each */
    }
}

void li_engine_last_step(const li_engine *e, li_step_shape *out) { *out = e->last_shape; }

/* Charges the batch just computed (its shape taken before its tokens are
 * sampled, so first tokens and finishes are stamped at the step's end,
 * first_scheduled at its start). Only with the model clock. */
static void model_clock_step(li_engine *e) {
    const li_step_cost *c = &e->mcost;
    const li_step_shape *s = &e->last_shape;
    e->mclock += c->a + c->b * (double)s->prefill_tokens + c->c * (double)s->decode_rows + c->d * s->context;
    e->mclock += c->policy_scale * (e->st.time_policy - e->mclock_policy);
    e->mclock_policy = e->st.time_policy;
}

int li_engine_step(li_engine *e, li_error *err) {
    double t_start = li_time_now();
    e->step_no++;
    e->st.steps++;
    memset(&e->last_shape, 0, sizeof e->last_shape);
    if (!li_engine_has_work(e)) return 0;
    e->in_step = true;

    /* 0: drafts for decodes that speculate (the batch small enough) */
    if (e->sp.prop[LI_SPEC_NGRAM] && (e->cfg.spec_tokens || e->sp.asked || (e->policy && e->policy->has_speculate)))
        li_spec_step_propose(e);

    /* 1-2: state and plan */
    li_step_state st;
    li_engine_gather(e, &st);
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
            li_engine_gather(e, &st); /* the plan's preemptions and cache hits changed it */
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
    if (e->sp.b_parent) li_spec_step_tree_fit(e, nb);
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
            if (e->sp.b_parent) e->sp.b_parent[k] = -1;
        }
        if (r->n_draft && r->d_tree) { /* draft j - 1 at P + depth, below its parent (forward.h) */
            li_spec_step_tree_batch(e, r, k - e->batch_n[i], e->batch_n[i]);
            any_tree = true;
        }
        if (r->n_draft) /* every computed position of a drafted request is verified */
            for (int32_t j = e->batch_n[i]; j > 0; j--) e->b_rows[n_logits++] = (int32_t)(k - j);
        else if (r->num_computed + e->batch_n[i] == r->n_toks)
            e->b_rows[n_logits++] = (int32_t)k - 1;
    }
    li_batch b = {.n = k, .tokens = e->b_tokens, .pos = e->b_pos, .seq = e->b_seq, .slot = e->b_slot,
                  .block_table = e->b_tables, .n_seqs = nb, .bt_stride = stride, .logit_rows = e->b_rows,
                  .n_logits = n_logits, .parent = any_tree ? e->sp.b_parent : NULL,
                  .hidden = e->sp.prop[LI_SPEC_MEDUSA] ? LI_HIDDEN_POST_NORM : LI_HIDDEN_NONE,
                  .capture = e->sp.eagle ? e->sp.eagle->f.feature_layer : NULL,
                  .n_capture = e->sp.eagle ? e->sp.eagle->f.n_features : 0};
    /* 5: forward */
    double tf = li_time_now();
    int rc = e->tp ? li_tp_run(e->tp, &b, err) : li_runner_run(&e->tgt, &b, err);
    e->logits = e->tgt.logits; /* NULL while device logits stay there (device_sampled) */
    e->row_fetches = 0;
    e->sp.hidden = !rc && e->sp.prop[LI_SPEC_MEDUSA] ? li_forward_hidden(&e->tgt.fw, e->model) : NULL;
    const double dtf = li_time_now() - tf;
    /* EAGLE: the rows wait for the draft, or it catches up (time_draft_sync) */
    e->sp.captured = !rc && e->sp.eagle ? li_forward_captured(&e->tgt.fw) : NULL;
    if (e->sp.captured) {
        li_error eerr = {0};
        if (li_spec_step_eagle_sync(e, nb, &eerr)) { /* drafts suffer, tokens do not */
            li_log_warn("speculation: the EAGLE draft's pass failed: %s", eerr.msg);
            e->sp.captured = NULL;
        }
    }
    step_shape(e, nb);
    if (e->mclock_on) model_clock_step(e);
    e->st.time_forward += dtf;
    li_spec_step_costs(&e->sp, dtf, k, b.no_logits ? 0 : b.n_logits);
    if (rc) {
        drop_all_drafts(e);
        for (int32_t i = 0; i < nb; i++) finish(e, e->batch_req[i], "error");
        e->in_step = false;
        return rc;
    }
    e->st.tokens_computed += k;
    /* 6-7: sample and emit (a step sampled on the device has no drafts) */
    const int32_t on_device = device_sampled(e, nb, b.n_logits); /* candidates a row, 0: none */
    if (!on_device && !e->logits && b.n_logits) e->logits = li_runner_logits(&e->tgt);
    int32_t li = 0;
    for (int32_t i = 0; i < nb; i++) {
        req *r = e->batch_req[i];
        if (r->n_draft) {
            const int32_t m = e->batch_n[i];
            const bool sampled = r->smp.p.temperature > 0;
            const double tv = li_time_now();
            li_spec_step_verify(e, r, m, e->logits + (size_t)li * e->model->hp.n_vocab, li);
            const double dtv = li_time_now() - tv;
            e->st.time_verify += dtv;
            li_spec_step_verify_cost(&e->sp, sampled, dtv, m);
            li += m;
            if (r->live) prefix_register(e, r);
            continue;
        }
        r->num_computed += e->batch_n[i];
        li_spec_step_eagle_settle(r);
        prefix_register(e, r);
        if (r->num_computed != r->n_toks) continue;
        const int32_t row = li++;
        if (r->num_computed == r->n_prompt && has_forks(e, r)) fork_samples(e, r, step_logits(e, row), row);
        if (!on_device || !take_device_token(e, r, row, on_device)) li_engine_sample_one(e, r, step_logits(e, row));
        li_spec_step_keep_hidden(e, r, row);
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

void li_engine_draft_observe(li_engine *e, li_proposer_observe_fn fn, void *ud) {
    if (e->sp.prop[LI_SPEC_DRAFT]) li_proposer_model_observe(e->sp.prop[LI_SPEC_DRAFT], fn, ud);
    if (e->sp.prop[LI_SPEC_EAGLE]) li_proposer_model_observe(e->sp.prop[LI_SPEC_EAGLE], fn, ud);
}
