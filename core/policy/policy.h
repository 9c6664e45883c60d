/* policy.h — the contract between the engine and a scheduling policy.
 *
 * Each step the engine fills an li_step_state (a read-only view of every
 * live request and of the KV pool), asks the policy for an li_plan, then
 * validates and applies the plan itself: a policy proposes, C disposes.
 * Two implementations share this vtable: in-process LuaJIT (policy_lua.c)
 * and an isolated `luainfer policy-host` child over a Unix socket
 * (policy_proc.c). The msgpack form of both structs is documented in
 * docs/policy-protocol.md. */
#ifndef LI_POLICY_H
#define LI_POLICY_H

#include "util/common.h"

typedef enum li_req_state {
    LI_REQ_WAITING = 0,   /* admitted, nothing computed yet */
    LI_REQ_RUNNING = 1,   /* holds KV blocks, being computed or decoded */
    LI_REQ_PREEMPTED = 2, /* lost its blocks; recomputes from scratch when scheduled */
} li_req_state;

/* One live request as a policy sees it. */
typedef struct li_req_view {
    int64_t id;
    li_req_state state;
    double arrival;          /* seconds since engine start */
    int32_t priority;        /* larger = more important (default 0) */
    const char *tenant;      /* never NULL ("" by default) */
    int64_t prompt_len;
    int64_t num_tokens;      /* prompt + generated so far */
    int64_t num_computed;    /* tokens whose KV is cached; catches up with num_tokens */
    int64_t num_generated;
    int64_t max_tokens;
    int64_t cached_len;      /* prefix-cache hit at admission, tokens */
    int32_t n_blocks;        /* KV blocks held */
    int32_t n_preemptions;
    double spec_acceptance;  /* speculative acceptance rate, -1 when unknown */
    int32_t projected_blocks;/* KV blocks it still needs, beyond n_blocks, to reach its
                              * end (max_tokens or max_model_len): an upper bound */
    double slo_ttft_ms;      /* latency objectives, ms; 0 = none */
    double slo_tpot_ms;
    double first_scheduled;  /* engine clock when a step first computed its tokens; -1 before */
    double first_token;      /* engine clock of its first sampled token; -1 before */
    const uint64_t *prefix_hash; /* (n_prefix_hash, 2) chain hashes (lo, hi) of the prompt's full
                              * KV blocks but the last token's, as the prefix cache computes them;
                              * owned by the engine, valid during the call; none without caching */
    int32_t n_prefix_hash;
} li_req_view;

typedef struct li_step_state {
    int64_t step;
    double now;              /* seconds since engine start */
    const li_req_view *reqs; /* waiting, running and preempted requests (the engine: in arrival order) */
    int32_t n_reqs;
    int32_t kv_free_blocks, kv_total_blocks, kv_cached_blocks, block_size;
    int32_t max_num_seqs, max_batched_tokens;
    int32_t kv_running_need; /* sum of the running requests' projected_blocks */
} li_step_state;

typedef struct li_plan_run {
    int64_t id;
    int32_t n_tokens; /* new tokens to compute this step (>= 1) */
} li_plan_run;

typedef struct li_plan {
    li_plan_run *run;  /* in the order they should be batched */
    int32_t n_run, cap_run;
    int64_t *preempt;  /* running requests to preempt first (recompute) */
    int32_t n_preempt, cap_preempt;
} li_plan;

/* The most entries a plan's run list, and its preempt list, may have: the
 * same limit in-process and isolated (policy_wire.h sizes the host's reply
 * frame for it). Far above any max_num_seqs; longer is a broken policy. */
#define LI_PLAN_MAX_ENTRIES (1 << 18)

void li_plan_init(li_plan *p);
void li_plan_free(li_plan *p);
void li_plan_clear(li_plan *p);
void li_plan_add_run(li_plan *p, int64_t id, int32_t n_tokens);
void li_plan_add_preempt(li_plan *p, int64_t id);

/* The built-in FCFS (fcfs.c): the engine's fallback, making the plans
 * lua/luainfer/policy.lua's M.fcfs makes. A pure function of st, whose
 * requests it takes in the order given (arrival); clears plan first. */
void li_policy_fcfs_plan(const li_step_state *st, li_plan *plan);

/* Engine settings a policy file may set in its `config` table. */
typedef struct li_policy_config {
    int32_t block_size;        /* 0 = engine default */
    char kv_dtype[8];          /* "" = engine default */
    int32_t max_num_seqs;      /* 0 = engine default */
    int32_t max_batched_tokens;/* 0 = engine default */
} li_policy_config;

/* An idle cached KV block the prefix cache may evict. */
typedef struct li_evict_candidate {
    int32_t block;
    double last_access; /* engine clock of its last hit or release */
    uint32_t hits;      /* prefix hits since it was filled */
    int32_t depth;      /* block index in its sequence (0 = first block of a prompt) */
} li_evict_candidate;

/* ---- speculation: what the speculate hook sees and returns ---------------- */

/* One request that can draft this step (in decode, room for drafts). */
typedef struct li_spec_cand {
    int64_t id;
    int32_t want_method;       /* index into li_spec_state.methods: the request's own ask, else
                                * the engine's default */
    int32_t want_k;            /* 0 = off */
    int32_t max_k;             /* the most drafts that fit now (KV slots held, max_tokens) */
    float temperature;
    const double *acceptance;  /* (n_methods) accepted / drafted so far per method, -1 unknown */
    const int64_t *drafted;    /* (n_methods) drafts verified so far per method */
    int32_t ngram;             /* the drafts n-gram lookup makes now (0..max_k: its latest
                                * match's continuation; 0 = no match), -1 = not known */
    int32_t ngram_match;       /* how many last tokens that match covers (its n-gram, measured
                                * back to LI_SPEC_NGRAM_MATCH_MAX; 0 = no match), -1 = not known */
    /* the policy's answer, preset to the want: a method index (-1 = off) and k */
    int32_t method, k;
} li_spec_cand;

/* The step costs the speculate hook sees: forward passes of 1..64 tokens */
#define LI_SPEC_COST_ROWS 64

typedef struct li_spec_state {
    const char *const *methods;  /* (n_methods) names: "ngram", "draft", "layerskip" */
    const bool *available;       /* (n_methods) which this engine can draft with */
    int32_t n_methods;
    int32_t batch_size;          /* running requests */
    double step_time;            /* seconds per step's forward pass (moving average) */
    double token_time;           /* forward seconds per computed token (moving average) */
    const double *draft_time;    /* (n_methods) proposer seconds per draft token (moving average) */
    /* (LI_SPEC_COST_ROWS) [n - 1]: seconds of a forward pass that computed n
     * tokens (moving average per n), 0 = no such step yet; NULL = none */
    const double *row_time;
    /* (2) seconds of verification per row a drafted request's step
     * verifies (moving averages): [0] greedy, [1] sampled; 0 = none yet;
     * NULL = not known */
    const double *verify_time;
} li_spec_state;

typedef struct li_policy li_policy;

typedef struct li_policy_ops {
    const char *kind; /* "lua", "process" */
    /* Fills plan (cleared by the caller). An error means: use the fallback
     * for this step. */
    int (*schedule)(li_policy *p, const li_step_state *st, li_plan *plan, li_error *err);
    /* Admission: *accept = false rejects the request with `reason`. Errors
     * mean accept. Optional (NULL: accept all). */
    int (*admit)(li_policy *p, const li_req_view *req, const li_step_state *st, bool *accept, char *reason,
                 size_t reason_cap, li_error *err);
    /* Eviction order for the prefix cache: fills order[0..*n_order) with
     * candidate block ids, most evictable first (at least `need` wanted).
     * Ids that are not candidates are ignored; blocks in use are never
     * evicted whatever comes back; a short answer is completed in LRU order.
     * Optional (NULL: LRU). */
    int (*evict)(li_policy *p, const li_evict_candidate *cands, int32_t n_cands, int32_t need, int32_t *order,
                 int32_t *n_order, li_error *err);
    /* Called once per finished request. Optional. */
    void (*on_finish)(li_policy *p, const li_req_view *req, const char *finish_reason);
    /* Replaces the policy with a new file (path) or source text; on failure
     * the old one stays in place and err says why. */
    int (*reload)(li_policy *p, const char *path, const char *source, li_error *err);
    void (*free)(li_policy *p);
    /* Speculation: for each candidate, sets method (-1 = off) and k
     * (preset to the request's want; the engine clamps k to max_k and turns
     * an unavailable method off, counting it in plans_trimmed). An error
     * keeps the wants. Optional (NULL: the wants stand). */
    int (*speculate)(li_policy *p, const li_step_state *st, const li_spec_state *ss, li_spec_cand *cands, int32_t n,
                     li_error *err);
} li_policy_ops;

struct li_policy {
    const li_policy_ops *ops;
    li_policy_config config;
    char name[256];    /* file the policy came from, for logs */
    bool has_schedule; /* false: the engine uses its built-in FCFS */
    bool has_evict;    /* false: the prefix cache evicts in LRU order */
    bool has_speculate;/* the speculate hook is there: it has the last word on drafts */
};

#endif
