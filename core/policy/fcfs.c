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

/* Running requests first (in the views' order: arrival), then preempted,
 * then waiting ones; a running request short of blocks preempts the
 * latest-arrived running ones, and itself when not one token fits.
 *
 * Queued requests are admitted against projected blocks (docs/kv-cache.md,
 * "Admission under pressure"): `headroom` is the free blocks less what the
 * running set still needs to reach its ends. A queued request whose own
 * projection exceeds it would, carried on, force a preemption later, so it
 * waits, and the queue behind it (no overtaking), unless
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
    int32_t victims = st->n_reqs;
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
    for (int pass = 0; pass < 2; pass++) {
        const li_req_state want_state = pass == 0 ? LI_REQ_PREEMPTED : LI_REQ_WAITING;
        for (int32_t i = 0; i < st->n_reqs && budget > 0 && seqs > 0; i++) {
            const li_req_view *r = &st->reqs[i];
            if (r->state != want_state) continue;
            int64_t want = LI_MIN(r->num_tokens - r->num_computed, budget);
            if (want <= 0) continue;
            /* it cannot be carried to its end beside the running set */
            if (pressure && r->projected_blocks > headroom && plan->n_run > 0) return;
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
        }
    }
}
