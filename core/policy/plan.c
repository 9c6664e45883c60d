/* plan.c — li_plan: the growable arrays a policy fills each step.
 * A plan is reused across steps (clear keeps the capacity), so a steady
 * engine allocates nothing here after warm-up. */
#include "policy/policy.h"

#include <stdlib.h>
#include <string.h>

void li_plan_init(li_plan *p) { memset(p, 0, sizeof *p); }

void li_plan_free(li_plan *p) {
    free(p->run);
    free(p->preempt);
    memset(p, 0, sizeof *p);
}

void li_plan_clear(li_plan *p) {
    p->n_run = 0;
    p->n_preempt = 0;
}

void li_plan_add_run(li_plan *p, int64_t id, int32_t n_tokens) {
    if (p->n_run == p->cap_run) {
        p->cap_run = p->cap_run ? p->cap_run * 2 : 64;
        p->run = li_xrealloc(p->run, (size_t)p->cap_run * sizeof *p->run);
    }
    p->run[p->n_run++] = (li_plan_run){.id = id, .n_tokens = n_tokens};
}

void li_plan_add_preempt(li_plan *p, int64_t id) {
    if (p->n_preempt == p->cap_preempt) {
        p->cap_preempt = p->cap_preempt ? p->cap_preempt * 2 : 16;
        p->preempt = li_xrealloc(p->preempt, (size_t)p->cap_preempt * sizeof *p->preempt);
    }
    p->preempt[p->n_preempt++] = id;
}
