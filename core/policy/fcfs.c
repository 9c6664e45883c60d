/* fcfs.c — the built-in FCFS: the engine's fallback when a policy is absent,
 * fails or schedules nothing, and the reference that lua/luainfer/policy.lua's
 * M.fcfs is tested against (tests/unit/test_fcfs.c). A pure function of the
 * step state: the engine's views already count a waiting request's
 * prefix-cache hit as computed blocks, so nothing here reads the engine. */
#include "policy/policy.h"

/* KV blocks a request must newly get to compute n more tokens. */
static int32_t blocks_needed(const li_req_view *r, int64_t n, int64_t bs) {
    const int64_t need = (r->num_computed + n + bs - 1) / bs - r->n_blocks;
    return need > 0 ? (int32_t)need : 0;
}

/* Whether the pool is under pressure: a request is preempted now, or one
 * that lives was preempted before. Admission is then conservative. */
static bool under_pressure(const li_step_state *st) {
    for (int32_t i = 0; i < st->n_reqs; i++)
        if (st->reqs[i].state == LI_REQ_PREEMPTED || st->reqs[i].n_preemptions > 0) return true;
    return false;
}

/* ---- the projected peak ----------------------------------------------------------
 * Under pressure a queued request is admitted only if the running set and
 * those admitted before it, each carried to its end, never need more blocks
 * at once than the pool has. Each member is modelled as computing one token
 * per step from num_tokens (a prefill's rest in this step) up to its end,
 * then freeing everything it holds: the sum of the members' extra blocks
 * rises between finishes and drops at each, so its peak is at some member's
 * last step and n checks of n members give it. Against the sum of the
 * members' projections (each at its end at once) this lets a request in
 * that will finish before another reaches its end: at 16 MiB the sum held
 * the batch at 1-2 of 16 for most of the run.
 *
 * It is an estimate: a member that is not scheduled every step (token or
 * seqs budget) lives longer than modelled, and then preemption is still the
 * safety net. Above FCFS_PEAK_MAX members the sum of projections (a bound
 * the peak never exceeds) decides instead: the cost stays O(n) a request. */
#define FCFS_PEAK_MAX 256

typedef struct peak_member {
    int64_t base, end; /* tokens: KV after step t is min(end, base + t) */
    int32_t held;      /* blocks held now */
    int32_t proj;      /* projected_blocks: it never takes more than these */
    int32_t life;      /* steps until it finishes (end - base), >= 1 */
} peak_member;

typedef struct peak_set {
    peak_member m[FCFS_PEAK_MAX];
    int64_t x[FCFS_PEAK_MAX]; /* extra blocks all members need at m[j]'s last step */
    int32_t n;
    int64_t avail; /* blocks free for the members: free now + what victims give back */
} peak_set;

/* The member a request becomes: its end is the KV of prompt + max_tokens - 1
 * tokens, or the end its projection gives (context, pool) if that is less. */
static peak_member peak_of(const li_req_view *r, int64_t bs) {
    int64_t end = LI_MIN(r->prompt_len + r->max_tokens - 1, ((int64_t)r->n_blocks + r->projected_blocks) * bs);
    end = LI_MAX(end, r->num_tokens);
    return (peak_member){.base = r->num_tokens - 1, .end = end, .held = r->n_blocks, .proj = r->projected_blocks,
                         .life = (int32_t)LI_MIN(end - (r->num_tokens - 1), INT32_MAX)};
}

/* Blocks member m needs beyond those it holds during step t (a finished one
 * gives its blocks back: negative). A member never returns blocks early, nor
 * takes more than its projection: so the peak never exceeds the sum of the
 * projections, and this test never holds a request that one would admit. */
static int64_t peak_extra(const peak_member *m, int64_t t, int64_t bs) {
    if (t > m->life) return -(int64_t)m->held;
    const int64_t need = LI_MIN((LI_MIN(m->end, m->base + t) + bs - 1) / bs - m->held, m->proj);
    return need > 0 ? need : 0;
}

/* Whether c fits beside the members: at each member's last step and at its
 * own, all of them together need no more extra blocks than are free. */
static bool peak_fits(const peak_set *ps, const peak_member *c, int64_t bs) {
    int64_t xc = peak_extra(c, c->life, bs);
    for (int32_t j = 0; j < ps->n; j++) xc += peak_extra(&ps->m[j], c->life, bs);
    if (xc > ps->avail) return false;
    for (int32_t j = 0; j < ps->n; j++)
        if (ps->x[j] + peak_extra(c, ps->m[j].life, bs) > ps->avail) return false;
    return true;
}

/* c joins the members (the caller checks ps->n < FCFS_PEAK_MAX). */
static void peak_add(peak_set *ps, const peak_member *c, int64_t bs) {
    int64_t xc = peak_extra(c, c->life, bs);
    for (int32_t j = 0; j < ps->n; j++) {
        xc += peak_extra(&ps->m[j], c->life, bs);
        ps->x[j] += peak_extra(c, ps->m[j].life, bs);
    }
    ps->m[ps->n] = *c;
    ps->x[ps->n++] = xc;
}

/* Running requests first (in the views' order: arrival), then preempted,
 * then waiting ones; a running request short of blocks preempts the
 * latest-arrived running ones, and itself when not one token fits.
 *
 * Queued requests are admitted against projected blocks (docs/kv-cache.md,
 * "Admission under pressure"): a queued request that would, carried on beside
 * the running set and those admitted before it, make them need more blocks
 * at once than the pool has (their projected peak, above) would force a
 * preemption later, so it waits, and the queue behind it (no overtaking).
 * Past FCFS_PEAK_MAX members `headroom` decides: the free blocks less what
 * the running set still needs to reach its ends. Unless
 *  - the pool is not under pressure: while no live request has been
 *    preempted, admission is optimistic (a request may stop long before
 *    max_tokens, and reserving the bound would serialize them);
 *  - nothing runs this step (the progress guarantee: the head always runs).
 * So a preempted request resumes only when it can finish, and once one is
 * preempted no newcomer takes the blocks it needs. */
void li_policy_fcfs_plan(const li_step_state *st, li_plan *plan) {
    li_plan_clear(plan);
    const int64_t bs = st->block_size;
    int64_t budget = st->max_batched_tokens;
    int32_t seqs = st->max_num_seqs, free_blocks = st->kv_free_blocks;
    int64_t headroom = (int64_t)st->kv_free_blocks - st->kv_running_need;
    /* Victims go latest-arrived first, so the running requests this plan
     * preempts are always all of those from index `victims` on: one frontier
     * instead of a mark per request, and no scratch memory. */
    int32_t victims = st->n_reqs, self_victim = -1; /* a running request short of one token */
    for (int32_t i = 0; i < victims && budget > 0 && seqs > 0; i++) {
        const li_req_view *r = &st->reqs[i];
        if (r->state != LI_REQ_RUNNING) continue;
        int64_t want = LI_MIN(r->num_tokens - r->num_computed, budget);
        if (want <= 0) continue;
        int32_t need = blocks_needed(r, want, bs);
        while (need > free_blocks && victims - 1 > i) {
            const li_req_view *v = &st->reqs[--victims];
            if (v->state != LI_REQ_RUNNING) continue;
            li_plan_add_preempt(plan, v->id);
            free_blocks += v->n_blocks;
            headroom += (int64_t)v->n_blocks + v->projected_blocks;
        }
        if (need > free_blocks) {
            /* a prefill chunk can shrink to what fits; a decode cannot */
            const int64_t fit = (int64_t)(r->n_blocks + free_blocks) * bs - r->num_computed;
            if (fit <= 0) {
                li_plan_add_preempt(plan, r->id);
                self_victim = i;
                free_blocks += r->n_blocks;
                headroom += (int64_t)r->n_blocks + r->projected_blocks;
                continue;
            }
            want = fit;
            need = blocks_needed(r, want, bs);
        }
        li_plan_add_run(plan, r->id, (int32_t)want);
        budget -= want;
        seqs--;
        free_blocks -= need;
    }
    const bool pressure = plan->n_preempt > 0 || under_pressure(st);
    /* the members: every running request this plan does not preempt, then
     * each one admitted; past FCFS_PEAK_MAX of them (`over`) headroom decides */
    peak_set ps;
    ps.n = 0;
    ps.avail = st->kv_free_blocks;
    bool over = false;
    if (pressure)
        for (int32_t i = 0; i < st->n_reqs; i++) {
            const li_req_view *r = &st->reqs[i];
            if (r->state != LI_REQ_RUNNING) continue;
            if (i >= victims || i == self_victim) ps.avail += r->n_blocks;
            else if (ps.n == FCFS_PEAK_MAX) over = true;
            else {
                const peak_member m = peak_of(r, bs);
                peak_add(&ps, &m, bs);
            }
        }
    for (int pass = 0; pass < 2; pass++) {
        const li_req_state want_state = pass == 0 ? LI_REQ_PREEMPTED : LI_REQ_WAITING;
        for (int32_t i = 0; i < st->n_reqs && budget > 0 && seqs > 0; i++) {
            const li_req_view *r = &st->reqs[i];
            if (r->state != want_state) continue;
            int64_t want = LI_MIN(r->num_tokens - r->num_computed, budget);
            if (want <= 0) continue;
            /* it cannot be carried to its end beside the running set */
            if (pressure && plan->n_run > 0) {
                const peak_member m = peak_of(r, bs);
                const bool fits = !over && ps.n < FCFS_PEAK_MAX ? peak_fits(&ps, &m, bs)
                                                                : r->projected_blocks <= headroom;
                if (!fits) return;
            }
            int32_t need = blocks_needed(r, want, bs);
            if (need > free_blocks) {
                want = (int64_t)(r->n_blocks + free_blocks) * bs - r->num_computed;
                if (want <= 0) return; /* FCFS: nobody overtakes the head of the queue */
                need = blocks_needed(r, want, bs);
            }
            li_plan_add_run(plan, r->id, (int32_t)want);
            budget -= want;
            seqs--;
            free_blocks -= need;
            headroom -= r->projected_blocks;
            if (pressure && !over && ps.n < FCFS_PEAK_MAX) {
                const peak_member m = peak_of(r, bs);
                peak_add(&ps, &m, bs);
            } else over = true;
        }
    }
}
