/* engine.h — continuous batching over a paged KV cache, steered by a policy.
 *
 * A request is `num_computed` catching up with `num_tokens`: prompt tokens
 * wait to be computed (chunked prefill), each sampled token adds one more.
 * Every li_engine_step():
 *   1 gather state  2 ask the policy for a plan  3 validate + apply it
 *   4 build one flat batch  5 forward  6 sample  7 emit  8 free finished
 * The engine is single-threaded: callers (CLI, server's engine thread, Lua
 * scripts) own the thread that steps it. */
#ifndef LI_ENGINE_H
#define LI_ENGINE_H

#include "kv/kv_cache.h"
#include "model/forward.h"
#include "policy/policy.h"
#include "sample/sampler.h"
#include "engine/event.h"
#include "spec/proposer.h"

typedef struct li_engine li_engine;

typedef struct li_engine_config {
    int32_t block_size;          /* tokens per KV block (default 16) */
    li_type kv_dtype;            /* default F16 */
    size_t kv_memory;            /* KV budget in bytes (default 256 MiB) */
    int32_t max_num_seqs;        /* requests per step (default 64) */
    int32_t max_batched_tokens;  /* tokens per step (default 512) */
    int64_t max_model_len;       /* positions per request (default: the model's context) */
    bool prefix_caching;         /* reuse full KV blocks across requests (default on) */
    /* speculation: a request in decode drafts up to spec_tokens tokens with
     * spec_method's proposer (spec/proposer.h; n-gram lookup finds its last
     * n tokens, n from spec_ngram_max down to spec_ngram_min, earlier in its
     * own tokens, and drafts greedy requests only); one forward pass
     * verifies them. 0 = off (default); a request's own speculation and a
     * policy's speculate hook override it per request. */
    int32_t spec_tokens;         /* 0..16 */
    int32_t spec_ngram_max, spec_ngram_min; /* default 4 and 2 */
    int32_t spec_disable_batch;  /* no drafts in a step with more running requests than
                                  * this (vLLM's speculative_disable_by_batch_size): a
                                  * compute-bound batch gains nothing from verifying
                                  * drafts. Default 4; 0 = never disable */
    /* the proposer drafting for requests that do not name one
     * (spec/proposer.h): ngram (default), draft (needs a draft model) or
     * layerskip (the target's first spec_layers blocks) */
    li_spec_method spec_method;
    int32_t spec_layers;         /* layerskip: 1..n_layer-1; 0 = no layerskip proposer */
    /* tensor parallel (docs/parallel.md, engine/tp.h): the target split over
     * this many ranks, threads of the CPU backend, at most its KV head count;
     * 0 or 1 = one rank (default). No draft model or layerskip with it yet */
    int32_t tensor_parallel;
    /* Medusa heads (spec/medusa.h; li_medusa_load against the target),
     * borrowed, or NULL: method medusa drafts a tree of their top-k that one
     * tree pass verifies. The engine prepares them on its backend unless
     * they are (then for >= max_num_seqs rows). Not with a draft model or
     * tensor parallelism yet. medusa_tree: li_medusa_tree_parse's path list,
     * NULL = the default */
    struct li_medusa *medusa;
    const char *medusa_tree;
    /* an EAGLE draft (spec/eagle.h; li_eagle_load against the target),
     * borrowed, or NULL: method eagle drafts a chain with it. The engine
     * prepares it on its backend unless it is; its one-layer KV follows the
     * pool (the budget pays for it) and every target pass captures its
     * feature blocks and runs the draft over the same rows (docs/eagle.md).
     * Not with Medusa heads or tensor parallelism yet */
    struct li_eagle *eagle;
    /* EAGLE: a request that has not drafted with the draft for this many
     * steps (counted from its arrival), or over this many positions past its
     * prompt (drafts of other proposers make many a step), stops paying for
     * the draft's KV: the
     * rows its catch-up would compute are zeroed instead (docs/speculation.md,
     * "Idle requests"). Drafts later attend to zeros there; tokens are the
     * same either way. 0 = always compute (default 16) */
    int32_t eagle_idle_steps;
    /* EAGLE: a request's draft KV of its prompt waits until it first drafts
     * with EAGLE (up to LI_EAGLE_LAZY_MAX positions; its input rows are kept
     * until then), so a request that never does, or goes idle first, does
     * not pay for it. Blocks that join the prefix cache before then hold
     * zeros in the draft's KV (for good if it never drafts): a later request
     * hitting them drafts from zeros there. Off by default
     * (docs/speculation.md, "Idle requests") */
    bool eagle_lazy;
    /* a policy with a speculate hook prices drafts by what forward passes
     * of each row count cost (li_spec_state.row_time): with this, when such
     * a policy is set, the engine first times passes of 1 to 64 rows on a
     * scratch sequence (about 0.3 s on two cores; docs/speculation.md, "The
     * cost curve, timed up front"), so its first steps are priced on
     * measured costs, not on guesses. Default false: spec_adaptive.lua
     * measured no faster with it (its first drafts rely on the guesses'
     * optimism, docs/benchmarks.md, "Session 27") */
    bool spec_calibrate;
    /* greedy rows sampled where the logits live: on a device backend with an
     * argmax op, a step whose every row is plain greedy (no penalties,
     * bias, ban or logprobs, no drafts) copies back one id a row instead
     * of the logits (issue 20). Default true; events then carry no logits
     * (li_event.logits NULL), so a caller reading them turns it off */
    bool device_sampling;
} li_engine_config;

#define LI_SPEC_MAX_TOKENS LI_SPEC_MAX_DRAFT

void li_engine_config_default(li_engine_config *c);


typedef struct li_request_params {
    const int32_t *prompt;   /* (n_prompt) token ids, copied */
    int64_t n_prompt;
    li_sampling_params sampling;
    int64_t max_tokens;
    int32_t n;               /* samples of this prompt (0 or 1: one). Ids are
                              * consecutive from *id; the samples share the
                              * prompt's KV blocks (copy-on-write) */
    const char *const *stop; /* stop strings, copied */
    int n_stop;
    const int32_t *stop_token_ids; /* (n_stop_token_ids <= 64) tokens that end the request like
                                    * end-of-generation (not in the output); copied */
    int n_stop_token_ids;
    int64_t min_tokens;      /* until this many are generated, end-of-generation and stop
                              * tokens cannot be drawn and stop strings do not stop (vLLM's
                              * min_tokens); <= max_tokens */
    bool ignore_eos;
    int32_t priority;
    const char *tenant;      /* copied; NULL = "" */
    const char *cache_salt;  /* copied; requests with different salts never share
                              * prefix-cache blocks (tenant isolation). NULL = "" */
    li_event_fn on_event;    /* called on the engine's thread; may be NULL */
    void *ud;
    /* the request's own speculation (`speculation = {method, k}`), when
     * spec_set: k in [0, LI_SPEC_MAX_TOKENS] (0 = off) with spec_method;
     * else the engine's spec_method and spec_tokens. A policy's speculate
     * hook has the last word. */
    bool spec_set;
    li_spec_method spec_method;
    int32_t spec_k;
    /* latency objectives, ms (0 = none; at most a day): only policies read them */
    double slo_ttft_ms, slo_tpot_ms;
} li_request_params;

#define LI_ENGINE_MAX_SLO_MS 86400000.0 /* an SLO of at most a day */

/* Per-request result, kept until li_engine_release(). */
typedef struct li_request_result {
    int64_t id;
    bool finished;
    const char *finish_reason;
    const int32_t *tokens;   /* generated ids */
    int64_t n_tokens;
    const char *text;        /* generated text (stop string removed) */
    size_t text_len;
    int64_t n_prompt;
    double t_arrival, t_first_token, t_finish; /* engine clock, seconds */
    int32_t n_preemptions;
    int64_t cached_tokens;   /* prompt tokens served from the prefix cache */
    double t_first_scheduled; /* engine clock when a step first computed its tokens (its first
                               * prefill chunk); -1 before. Queueing delay = this - t_arrival */
} li_request_result;

typedef struct li_engine_stats {
    int64_t steps;
    int64_t tokens_computed;   /* forward-pass tokens (prefill + decode) */
    int64_t tokens_device_sampled; /* tokens sampled where the logits live (device_sampling) */
    int64_t tokens_device_undecided; /* rows whose fetched candidates could not decide: their logits read back */
    int64_t tokens_generated;  /* sampled tokens */
    int64_t preemptions;
    int64_t policy_errors;     /* schedule() failed: fallback used */
    int64_t plans_trimmed;     /* plan entries dropped or shortened by validation */
    int64_t fallback_steps;    /* steps run by the built-in FCFS */
    int64_t requests_finished;
    int64_t requests_rejected;
    int32_t n_waiting, n_running, n_preempted;
    int32_t kv_free_blocks, kv_total_blocks, block_size;
    size_t kv_bytes, kv_bytes_per_token; /* the target's KV storage */
    size_t kv_draft_bytes;     /* the draft's KV storage (0 without a draft); kv_memory covers both */
    int64_t prefix_query_tokens; /* tokens looked up in the prefix cache */
    int64_t prefix_hit_tokens;   /* of those, found cached */
    int64_t prefix_evictions;    /* cached blocks evicted */
    int32_t kv_cached_blocks;    /* blocks holding hashed (reusable) content */
    int64_t spec_drafted;        /* draft tokens verified by a forward pass */
    int64_t spec_accepted;       /* of those, accepted */
    double time_policy;        /* seconds in the policy */
    double time_forward;       /* seconds in forward passes */
    double time_total;         /* seconds in li_engine_step */
    /* spec_drafted / spec_accepted by proposer (li_spec_method) */
    int64_t spec_drafted_by[LI_SPEC_N_METHODS];
    int64_t spec_accepted_by[LI_SPEC_N_METHODS];
    int64_t spec_rounds_by[LI_SPEC_N_METHODS]; /* verified draft runs (request-steps) */
    double time_propose;       /* seconds in proposers (model drafts' forward passes) */
    int64_t draft_sync_tokens; /* positions a draft model or EAGLE draft computed to catch up with its
                                * requests */
    int64_t draft_sync_dropped; /* EAGLE positions zeroed instead of computed: rows of requests idle
                                 * for eagle_idle_steps steps or positions, and (eagle_lazy) rows of
                                 * requests that ended or were preempted before drafting with EAGLE */
    double time_draft_sync;    /* ... and the seconds it took (apart from time_propose: the two add up) */
    double time_calibrate;     /* seconds timing the row-cost curve (spec_calibrate) */
    double time_verify;        /* seconds verifying drafted requests' rows (sampling them, the
                                * rejection test, taking the tokens) */
    int32_t calibrated_rows;   /* the largest row count it timed (0: not run) */
    int64_t livelock_steps;    /* steps taken from a policy whose plans made no progress (FCFS ran) */
    int32_t tensor_parallel;   /* ranks of the target (1 without tensor parallelism) */
    double time_allreduce;     /* seconds of time_forward rank 0 spent in all-reduces (0 with one rank) */
    int64_t spec_tree_moves;   /* accepted tree drafts off the top-1 chain whose KV rows were moved to
                                * their position's slot (Medusa) */
} li_engine_stats;

/* A policy whose plans make no progress (no token sampled, no request
 * finished, and every step preempting or computing nothing) for this many
 * steps in a row loses the next ones to the built-in FCFS: this many, then
 * twice as many on each trip in a row, up to LI_ENGINE_LIVELOCK_MAX_LOSS. */
#define LI_ENGINE_LIVELOCK_STEPS 8
#define LI_ENGINE_LIVELOCK_MAX_LOSS 1024

/* li_engine_init_runners without a draft. */
int li_engine_init(li_engine **out, li_model *m, li_backend *be, const li_engine_config *cfg, li_error *err);
/* An engine over target and, when draft is not NULL, a draft model (same
 * n_vocab, else LI_EINVAL) on the same backend (runner.h). Both must stay
 * loaded and prepared on be while the engine lives. The KV budget pays for
 * both storages: blocks = kv_memory / (target's + draft's bytes per block). */
int li_engine_init_runners(li_engine **out, li_model *target, li_model *draft, li_backend *be,
                           const li_engine_config *cfg, li_error *err);
void li_engine_free(li_engine *e);
/* The policy steering the engine (NULL: built-in FCFS). Not owned. */
void li_engine_set_policy(li_engine *e, li_policy *p);
li_policy *li_engine_policy(li_engine *e);

/* Queues a request; *id receives its id. A rejection by the policy's admit
 * hook returns LI_EINVAL with the policy's reason in err. */
int li_engine_add(li_engine *e, const li_request_params *p, int64_t *id, li_error *err);
/* Cancels a live request (its blocks are freed now); 1 if unknown. */
int li_engine_cancel(li_engine *e, int64_t id);
/* One engine step; returns 0, or an error that failed the step's requests. */
int li_engine_step(li_engine *e, li_error *err);
bool li_engine_has_work(const li_engine *e);
/* Result of a request (live or finished); NULL if unknown or released. */
const li_request_result *li_engine_result(li_engine *e, int64_t id);
void li_engine_release(li_engine *e, int64_t id);
void li_engine_stats_get(const li_engine *e, li_engine_stats *st);
const li_engine_config *li_engine_get_config(const li_engine *e);
li_model *li_engine_model(li_engine *e);
double li_engine_now(const li_engine *e);

/* ---- the model clock (bench replay: load-independent time) -------------- */
/* What one step costs on the model clock, in seconds:
 *   a + b * prefill_tokens + c * decode_rows + d * context
 * prefill_tokens: tokens of the batch's rows computing more than one
 * token; decode_rows: rows computing one; context: the positions every
 * computed token attends to (sum of pos + 1). policy_scale times the
 * policy's measured wall time this step is added (0: the clock ignores it,
 * so a replay's times depend on the trace, policy and this model only). */
typedef struct {
    double a, b, c, d;
    double policy_scale;
} li_step_cost;
/* Switches e's clock to the model clock, starting at `start` seconds (< 0:
 * at its current time); cost NULL: back to wall time from now on,
 * continuous. From then on li_engine_now moves only by the step costs and
 * li_engine_clock_advance. */
void li_engine_set_model_clock(li_engine *e, const li_step_cost *cost, double start);
/* Model clock only: moves it forward to t (an idle wait); earlier t, or a
 * wall clock, leave it. */
void li_engine_clock_advance(li_engine *e, double t);
/* The last step's computed batch in the model clock's terms (all zero when
 * it computed nothing): what serve's --step-log records per step, read-only. */
typedef struct {
    int64_t prefill_tokens, decode_rows;
    double context;
} li_step_shape;
void li_engine_last_step(const li_engine *e, li_step_shape *out);

/* ---- the draft runner (internal: for tests) ----------------------------- */
/* fn sees the logits of every first draft step of the draft model or the
 * EAGLE draft (the request's last token at its position, over the draft's
 * KV of everything before it); NULL stops. Nothing without either. */
void li_engine_draft_observe(li_engine *e, li_proposer_observe_fn fn, void *ud);

#endif
