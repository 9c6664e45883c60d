/* policy_wire.h — the msgpack form of the policy contract (protocol v1).
 *
 * Shared by the engine side (policy_proc.c) and the host (policy_host.c).
 * A frame is a 4-byte big-endian length followed by one msgpack map; the
 * maps mirror the Lua tables a policy sees and returns. The schema is
 * documented in docs/policy-protocol.md. Every unpack function treats its
 * input as outside bytes: types, ranges and sizes are checked. */
#ifndef LI_POLICY_WIRE_H
#define LI_POLICY_WIRE_H

#include "policy/policy.h"
#include "util/mp_read.h"

#include <msgpack.h>

#define LI_WIRE_VERSION 1
#define LI_WIRE_MAX_FRAME ((size_t)64 << 20) /* bytes in one engine -> host frame */
/* Bytes in one host -> engine frame: room for the largest plan the
 * conversion accepts (LI_WIRE_MAX_ENTRIES run entries of at most
 * LI_WIRE_RUN_BYTES and as many preempt ids of at most 9 bytes: 8.9 MB) or an
 * eviction order of 2^20 blocks, and a bound on what msgpack-c unpacks them
 * into (up to ~16 bytes per byte) */
#define LI_WIRE_MAX_REPLY ((size_t)16 << 20)
#define LI_WIRE_MAX_REQS (1 << 20)           /* requests in one state */
#define LI_WIRE_MAX_HASHES (1 << 20)         /* prefix_hashes of one request */
#define LI_WIRE_MAX_ENTRIES LI_PLAN_MAX_ENTRIES /* run or preempt entries in one plan: both modes */
#define LI_WIRE_RUN_BYTES 25                 /* {"id": uint64, "tokens": uint32} */
#define LI_WIRE_MAX_SLO_MS 86400000.0      /* slo_ttft_ms, slo_tpot_ms: a day, as the engine takes */
#define LI_WIRE_MAX_DEPTH 16                 /* nesting of arrays and maps in one frame */
_Static_assert((size_t)LI_WIRE_MAX_ENTRIES * (LI_WIRE_RUN_BYTES + 9) + 4096 < LI_WIRE_MAX_REPLY,
               "the largest legal plan must fit in one host reply frame");

/* ---- packing ---------------------------------------------------------------- */

/* Starts a frame in sb (clears it, reserves the length prefix); finish with
 * li_wire_frame_end, which patches the length. */
void li_wire_frame_begin(msgpack_sbuffer *sb);
void li_wire_frame_end(msgpack_sbuffer *sb);
/* Starts a frame holding one message: a map of n_fields fields, the first
 * two of which, {type, seq}, are packed here (seq < 0: no seq field, as in
 * hello and on_finish). */
void li_wire_msg_begin(msgpack_sbuffer *sb, msgpack_packer *pk, uint32_t n_fields, const char *type, int64_t seq);

void li_wire_pack_str(msgpack_packer *pk, const char *s);
void li_wire_pack_req(msgpack_packer *pk, const li_req_view *r);
void li_wire_pack_state(msgpack_packer *pk, const li_step_state *st);
void li_wire_pack_plan(msgpack_packer *pk, const li_plan *p);
void li_wire_pack_config(msgpack_packer *pk, const li_policy_config *c);
/* hooks: LI_POLICY_HOOK_* bits as an array of names */
void li_wire_pack_hooks(msgpack_packer *pk, unsigned hooks);

/* ---- unpacking --------------------------------------------------------------- */

/* Type-checked readers (util/mp_read.h), false or NULL when absent or of the
 * wrong type. The wire's choices: keys and strings are str only, a float is
 * an integer while exact (|v| <= 2^53), a number is finite. */
static inline const msgpack_object *li_wire_get(const msgpack_object *map, const char *key) {
    return li_mp_read_get(map, key, false);
}
static inline bool li_wire_str(const msgpack_object *o, const char **s, size_t *len) {
    return li_mp_read_str(o, false, s, len);
}
static inline bool li_wire_int(const msgpack_object *o, int64_t *v) { return li_mp_read_int(o, LI_MP_FLOAT_EXACT, v); }
static inline bool li_wire_num(const msgpack_object *o, double *v) { return li_mp_read_num(o, v); }
/* `type` field of a message compared with name. */
bool li_wire_is(const msgpack_object *msg, const char *type);

/* Decoded step state: owns the request views and their tenant strings. */
typedef struct li_wire_state {
    li_req_view *reqs;
    int32_t cap_reqs;
    char *strs;        /* tenant strings, NUL-terminated */
    size_t n_strs, cap_strs;
    uint64_t *hashes;  /* (n_hashes) the requests' prefix_hashes, (lo, hi) pairs */
    size_t n_hashes, cap_hashes;
} li_wire_state;

void li_wire_state_free(li_wire_state *ws);
int li_wire_unpack_req(const msgpack_object *o, li_req_view *v, li_wire_state *ws, li_error *err);
/* st->reqs points into ws; valid until the next unpack into ws. */
int li_wire_unpack_state(const msgpack_object *o, li_wire_state *ws, li_step_state *st, li_error *err);
/* Appends to plan (strict: ids >= 0, tokens in [0, 2^31), arrays only;
 * entries of 0 tokens are skipped). On an error plan may hold a part. */
int li_wire_unpack_plan(const msgpack_object *o, li_plan *plan, li_error *err);
int li_wire_unpack_config(const msgpack_object *o, li_policy_config *c, li_error *err);
unsigned li_wire_unpack_hooks(const msgpack_object *o);

/* ---- speculate (the hook's call and reply) ------------------------------------- */

#define LI_WIRE_MAX_METHODS 8        /* proposer names in one speculate call */
#define LI_WIRE_MAX_METHOD_NAME 31   /* bytes of one name */
#define LI_WIRE_MAX_SPEC_K (1 << 20) /* k in a choice (the engine clamps to max_k) */

/* Packs the two fields of a speculate call after {type, seq}: `spec` =
 * {methods=[name...], available=[bool...], batch_size, step_time,
 * token_time, draft_time=[s...], row_time=[s...] (LI_SPEC_COST_ROWS), verify_time=[greedy s,
 * sampled s]} and `cands` = [[id, want_method, want_k,
 * max_k, temperature, [acceptance...], [drafted...]], ...]. */
void li_wire_pack_spec(msgpack_packer *pk, const li_spec_state *ss, const li_spec_cand *c, int32_t n);

/* A decoded speculate call (the host's side): owns its arrays; ss and
 * cands point into it. */
typedef struct li_wire_spec {
    char names[LI_WIRE_MAX_METHODS][LI_WIRE_MAX_METHOD_NAME + 1];
    const char *name_ptr[LI_WIRE_MAX_METHODS];
    bool avail[LI_WIRE_MAX_METHODS];
    double draft_time[LI_WIRE_MAX_METHODS];
    double row_time[LI_SPEC_COST_ROWS];
    double verify_time[2];
    li_spec_state ss;
    li_spec_cand *cands;    /* (n) */
    double *acc;            /* (n, n_methods) */
    int64_t *drafted;       /* (n, n_methods) */
    int32_t n, cap;
} li_wire_spec;

void li_wire_spec_free(li_wire_spec *w);
/* Reads a speculate call's `spec` and `cands` (every field checked: at
 * most LI_WIRE_MAX_METHODS names, LI_WIRE_MAX_REQS candidates, methods in
 * range, k and max_k in [0, LI_WIRE_MAX_SPEC_K]). Each candidate's answer
 * is preset to its want. */
int li_wire_unpack_spec(const msgpack_object *msg, li_wire_spec *w, li_error *err);
/* The reply's field after {type, seq}: `choices` = [[method, k], ...], one
 * per candidate in order (method -1: no drafts). */
void li_wire_pack_choices(msgpack_packer *pk, const li_spec_cand *c, int32_t n);
/* A speculate reply, checked whole before anything is written: exactly n
 * choices, each [method in [-1, n_methods), k in [0, LI_WIRE_MAX_SPEC_K]];
 * then each candidate's method and k are set. LI_EIO otherwise (cands left
 * as they were). */
int li_wire_decode_choices(const msgpack_object *m, li_spec_cand *c, int32_t n, int32_t n_methods, li_error *err);

/* ---- frames from a byte stream ------------------------------------------------- */

/* Decodes one frame body into u (re-initialised; init it once before the
 * first call): exactly one msgpack map using all n bytes, nested at most
 * LI_WIRE_MAX_DEPTH deep. Declared sizes are checked against n by a header
 * scan before msgpack-c (which allocates a declared count up front) sees
 * the bytes. u's objects point into body. */
int li_wire_frame_unpack(msgpack_unpacked *u, const char *body, size_t n, li_error *err);

/* The engine's side of a host socket: bytes go in as they arrive (written
 * straight into the buffer), whole frames come out decoded. */
typedef struct li_wire_reader {
    char *buf;             /* bytes received, not yet framed */
    size_t len, cap;
    char *frame;           /* the body of the last frame; msg points into it */
    size_t frame_cap;
    msgpack_unpacked msg;
} li_wire_reader;

void li_wire_reader_init(li_wire_reader *r);
void li_wire_reader_free(li_wire_reader *r);
/* Forgets buffered bytes (the host they came from is gone). */
void li_wire_reader_reset(li_wire_reader *r);
/* Where the next received bytes go: at least 64 KiB of room (*room bytes);
 * li_wire_reader_commit then counts the n bytes written there. */
char *li_wire_reader_space(li_wire_reader *r, size_t *room);
void li_wire_reader_commit(li_wire_reader *r, size_t n);
/* The next whole frame: 1 and *msg (a map, valid until the next call), 0
 * when more bytes are needed, or an error when the stream is broken (a
 * length over LI_WIRE_MAX_REPLY, a body li_wire_frame_unpack refuses). */
int li_wire_reader_next(li_wire_reader *r, const msgpack_object **msg, li_error *err);

/* ---- the engine's checks of a host's replies ------------------------------------ */

/* A host while it starts: ready once its hello and the reply to its first
 * load (seq load_seq) have come. */
typedef struct li_wire_start {
    int64_t load_seq;
    bool hello, ready;
    li_policy_config config;   /* what the load reported */
    unsigned hooks;
    char error[512];           /* why the host cannot be used */
} li_wire_start;

/* Takes in a frame that is not the reply the engine waits for: a hello, the
 * reply to the pending load, or a stale reply (ignored). false when the host
 * cannot be used: a wrong protocol version, a failed or malformed load, a
 * load reply before the hello (s->error says why). */
bool li_wire_take_async(li_wire_start *s, const msgpack_object *m);

/* A hello: 0 when the host speaks LI_WIRE_VERSION. */
int li_wire_check_hello(const msgpack_object *m, li_error *err);
/* The reply to a call that wants type `want`: 0 when it is one; an `error`
 * reply is LI_EINVAL with the host's message (a policy error: the host
 * stays); anything else is LI_EIO (a protocol error). */
int li_wire_check_reply(const msgpack_object *m, const char *want, li_error *err);
/* A reload reply: 0 with the policy's config and hooks when `ok`; LI_EINVAL
 * with the host's message when the policy did not load; LI_EIO when the
 * reply is malformed (no boolean `ok`, a bad config). */
int li_wire_decode_reload(const msgpack_object *m, li_policy_config *cfg, unsigned *hooks, li_error *err);
/* An admit reply: a boolean `accept` is required; a rejection's `reason`
 * (at most 4096 bytes, cut to cap - 1) goes to reason when given. */
int li_wire_decode_admit(const msgpack_object *m, bool *accept, char *reason, size_t cap, li_error *err);
/* An order reply (evict): an `order` array is required; its first entries
 * that are block ids in [0, 2^31) go to order, at most max of them (what
 * is not a block id is skipped: the engine checks every id anyway). */
int li_wire_decode_order(const msgpack_object *m, int32_t max, int32_t *order, int32_t *n_order, li_error *err);

#endif
