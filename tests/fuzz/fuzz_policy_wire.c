/* fuzz_policy_wire.c — what the engine reads from an isolated policy host,
 * on arbitrary bytes, through the functions policy_proc.c runs on its
 * socket (policy_wire.c): the frame reader fed in uneven pieces (as recv
 * hands them over), msgpack unpacking, the start of a host (hello, then the
 * reply to its first load: li_wire_take_async) and every reply a call takes
 * (li_wire_check_reply, then the plan, admit, order or reload decoder).
 *
 * The engine's side is a host being started (its load sent as seq 1) and,
 * for evict, 8 candidate blocks. Each frame is taken as the engine takes
 * frames while it waits for a reply, and then as the reply to each kind of
 * call. A host that cannot be used is replaced (a fresh start state), as
 * the engine does; a broken stream ends the input, as it ends the host.
 *
 * Invariants (abort() = a crash the fuzzer records):
 *  - a frame the reader yields is a map;
 *  - a decoded plan has only what the protocol allows (ids in [0, 2^53],
 *    tokens in [1, 2^31), at most 2^20 entries of each kind), and packing it
 *    and reading it back through a fresh reader gives the same plan;
 *  - an eviction order has at most one entry per candidate, each a block id;
 *  - a decoded config is in its documented ranges, hooks are known bits;
 *  - an admit reason fits its buffer and is empty when accepted;
 *  - speculate choices (for 8 candidates and 3 methods) are all taken or
 *    none: methods in [-1, 3), k in [0, 2^20]; a speculate call decoded
 *    as the host decodes it has its counts and fields in range;
 *  - a failure has a code and a message; check_reply fails only with
 *    LI_EINVAL (the host's error reply) or LI_EIO (a protocol error). */
#define _GNU_SOURCE
#include "policy/policy_lua.h"
#include "policy/policy_wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_CANDS 8
#define ID_MAX ((int64_t)1 << 53)

static void fail(const char *what) {
    fprintf(stderr, "fuzz_policy_wire: invariant broken: %s\n", what);
    abort();
}

static void check_err(int rc, const li_error *err) {
    if (rc == 0) return;
    if (err->code != rc || !err->msg[0]) fail("an error without its code or message");
}

static void check_plan(const li_plan *p) {
    if (p->n_run < 0 || p->n_run > LI_WIRE_MAX_ENTRIES || p->n_preempt < 0 || p->n_preempt > LI_WIRE_MAX_ENTRIES)
        fail("plan entry count out of range");
    for (int32_t i = 0; i < p->n_run; i++)
        if (p->run[i].id < 0 || p->run[i].id > ID_MAX || p->run[i].n_tokens < 1) fail("plan run entry out of range");
    for (int32_t i = 0; i < p->n_preempt; i++)
        if (p->preempt[i] < 0 || p->preempt[i] > ID_MAX) fail("plan preempt id out of range");
}

/* Packs plan as a host would and reads it back: the same entries. */
static void check_plan_round_trip(const li_plan *p) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    li_wire_msg_begin(&sb, &pk, 3, "plan", 2);
    li_wire_pack_str(&pk, "plan");
    li_wire_pack_plan(&pk, p);
    li_wire_frame_end(&sb);

    li_wire_reader rd;
    li_wire_reader_init(&rd);
    size_t room;
    char *dst = li_wire_reader_space(&rd, &room);
    if (room < sb.size) { /* a big plan: feed it in pieces */
        size_t put = 0;
        while (put < sb.size) {
            size_t k = LI_MIN(room, sb.size - put);
            memcpy(dst, sb.data + put, k);
            li_wire_reader_commit(&rd, k);
            put += k;
            dst = li_wire_reader_space(&rd, &room);
        }
    } else {
        memcpy(dst, sb.data, sb.size);
        li_wire_reader_commit(&rd, sb.size);
    }
    const msgpack_object *m;
    li_error err = {0};
    if (li_wire_reader_next(&rd, &m, &err) != 1) fail("a packed plan does not read back as a frame");
    if (li_wire_check_reply(m, "plan", &err)) fail("a packed plan is not a plan reply");
    li_plan q;
    li_plan_init(&q);
    if (li_wire_unpack_plan(li_wire_get(m, "plan"), &q, &err)) fail("a packed plan does not decode");
    bool same = q.n_run == p->n_run && q.n_preempt == p->n_preempt;
    for (int32_t i = 0; same && i < p->n_run; i++) /* field by field: li_plan_run has padding */
        same = q.run[i].id == p->run[i].id && q.run[i].n_tokens == p->run[i].n_tokens;
    for (int32_t i = 0; same && i < p->n_preempt; i++) same = q.preempt[i] == p->preempt[i];
    if (!same) fail("a plan changes when packed and read back");
    li_plan_free(&q);
    li_wire_reader_free(&rd);
    msgpack_sbuffer_destroy(&sb);
}

static void check_config(const li_policy_config *c, unsigned hooks) {
    if (c->block_size < 0 || c->block_size > (1 << 16) || c->max_num_seqs < 0 || c->max_num_seqs > (1 << 20) ||
        c->max_batched_tokens < 0 || c->max_batched_tokens > (1 << 24) ||
        !memchr(c->kv_dtype, 0, sizeof c->kv_dtype))
        fail("config out of range");
    unsigned known = LI_POLICY_HOOK_SCHEDULE | LI_POLICY_HOOK_ADMIT | LI_POLICY_HOOK_ON_FINISH |
                     LI_POLICY_HOOK_EVICT | LI_POLICY_HOOK_SPECULATE;
    if (hooks & ~known) fail("unknown hook bits");
}

/* One frame, as the engine takes it. */
static void take_frame(const msgpack_object *m, li_wire_start *start, li_plan *plan) {
    if (m->type != MSGPACK_OBJECT_MAP) fail("the reader yielded a frame that is not a map");

    /* while the engine waits for a reply: a hello, the load's reply, or stale */
    if (!li_wire_take_async(start, m)) {
        if (!start->error[0]) fail("an unusable host without a reason");
        *start = (li_wire_start){.load_seq = start->load_seq + 1}; /* a new host */
    } else if (start->ready) {
        check_config(&start->config, start->hooks);
    }

    /* as a speculate call reaches a host */
    {
        li_wire_spec ws = {0};
        li_error err = {0};
        int rc = li_wire_unpack_spec(m, &ws, &err);
        check_err(rc, &err);
        if (rc == 0) {
            if (ws.ss.n_methods < 1 || ws.ss.n_methods > LI_WIRE_MAX_METHODS || ws.n < 0 || ws.n > LI_WIRE_MAX_REQS)
                fail("speculate call counts out of range");
            for (int32_t i = 0; i < ws.n; i++) {
                const li_spec_cand *c = &ws.cands[i];
                if (c->want_method < -1 || c->want_method >= ws.ss.n_methods || c->max_k < 0 || c->want_k < 0 ||
                    c->id < 0 || c->id > ID_MAX || c->ngram < -1 || c->ngram > c->max_k || c->ngram_match < -1 ||
                    c->ngram_match > (1 << 20))
                    fail("speculate candidate out of range");
                for (int32_t k = 0; k < ws.ss.n_methods; k++)
                    if (!(c->acceptance[k] >= -1 && c->acceptance[k] <= 1) || c->drafted[k] < 0)
                        fail("speculate acceptance or drafted out of range");
            }
            for (int32_t k = 0; k < ws.ss.n_methods; k++)
                if (strlen(ws.ss.methods[k]) < 1 || strlen(ws.ss.methods[k]) > LI_WIRE_MAX_METHOD_NAME)
                    fail("speculate method name out of range");
        }
        li_wire_spec_free(&ws);
    }

    /* as the reply to each kind of call */
    static const char *const wants[] = {"plan", "admit", "order", "reload", "speculate"};
    for (size_t w = 0; w < LI_ARRAY_LEN(wants); w++) {
        li_error err = {0};
        int rc = li_wire_check_reply(m, wants[w], &err);
        check_err(rc, &err);
        if (rc != 0 && rc != LI_EINVAL && rc != LI_EIO) fail("check_reply failed with an unexpected code");
        if (rc) continue;
        if (w == 0) {
            li_plan_clear(plan);
            rc = li_wire_unpack_plan(li_wire_get(m, "plan"), plan, &err);
            check_err(rc, &err);
            if (rc == 0) {
                check_plan(plan);
                check_plan_round_trip(plan);
            }
        } else if (w == 1) {
            bool accept = true;
            char reason[256];
            rc = li_wire_decode_admit(m, &accept, reason, sizeof reason, &err);
            check_err(rc, &err);
            if (rc == 0 && (!memchr(reason, 0, sizeof reason) || (accept && reason[0])))
                fail("admit reason not terminated, or given with an accept");
        } else if (w == 2) {
            int32_t order[N_CANDS], n = -1;
            rc = li_wire_decode_order(m, N_CANDS, order, &n, &err);
            check_err(rc, &err);
            if (n < 0 || n > N_CANDS || (rc && n)) fail("order count out of range");
            for (int32_t i = 0; i < n; i++)
                if (order[i] < 0) fail("order entry is not a block id");
        } else if (w == 4) {
            li_spec_cand c[N_CANDS];
            for (int32_t i = 0; i < N_CANDS; i++) c[i] = (li_spec_cand){.id = i, .method = 7, .k = 77};
            rc = li_wire_decode_choices(m, c, N_CANDS, 3, &err);
            check_err(rc, &err);
            for (int32_t i = 0; i < N_CANDS; i++) {
                if (rc && (c[i].method != 7 || c[i].k != 77)) fail("a refused speculate reply changed a candidate");
                if (!rc && (c[i].method < -1 || c[i].method >= 3 || c[i].k < 0 || c[i].k > LI_WIRE_MAX_SPEC_K ||
                            (c[i].k == 0 && c[i].method != -1)))
                    fail("a speculate choice out of range");
            }
        } else {
            li_policy_config cfg;
            unsigned hooks = 0;
            rc = li_wire_decode_reload(m, &cfg, &hooks, &err);
            check_err(rc, &err);
            if (rc == 0) check_config(&cfg, hooks);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    li_wire_reader rd;
    li_wire_reader_init(&rd);
    li_wire_start start = {.load_seq = 1};
    li_plan plan;
    li_plan_init(&plan);
    /* uneven pieces, as recv hands them over */
    size_t off = 0, step = 1;
    bool broken = false;
    while (off < size && !broken) {
        size_t room;
        char *dst = li_wire_reader_space(&rd, &room);
        size_t k = LI_MIN(LI_MIN(step, size - off), room);
        memcpy(dst, data + off, k);
        li_wire_reader_commit(&rd, k);
        off += k;
        step = step * 3 + 1;
        for (;;) {
            const msgpack_object *m;
            li_error err = {0};
            int rc = li_wire_reader_next(&rd, &m, &err);
            if (rc == 0) break;
            if (rc < 0) {
                check_err(rc, &err);
                broken = true;
                break;
            }
            take_frame(m, &start, &plan);
        }
    }
    li_plan_free(&plan);
    li_wire_reader_free(&rd);
    return 0;
}
