/* policy_wire.c — msgpack packing and strict unpacking of the policy
 * contract (see policy_wire.h and docs/policy-protocol.md). */
#include "policy/policy_wire.h"

#include "policy/policy_lua.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const state_names[3] = {"waiting", "running", "preempted"};
static const struct {
    unsigned bit;
    const char *name;
} hook_names[] = {
    {LI_POLICY_HOOK_SCHEDULE, "schedule"}, {LI_POLICY_HOOK_ADMIT, "admit"},
    {LI_POLICY_HOOK_ON_FINISH, "on_finish"}, {LI_POLICY_HOOK_EVICT, "evict"},
    {LI_POLICY_HOOK_SPECULATE, "speculate"},
};

/* ======================================================================
 * Packing
 * ====================================================================== */

void li_wire_frame_begin(msgpack_sbuffer *sb) {
    sb->size = 0;
    static const char zero[4] = {0};
    msgpack_sbuffer_write(sb, zero, 4);
}

void li_wire_msg_begin(msgpack_sbuffer *sb, msgpack_packer *pk, uint32_t n_fields, const char *type, int64_t seq) {
    li_wire_frame_begin(sb);
    msgpack_pack_map(pk, n_fields);
    li_wire_pack_str(pk, "type");
    li_wire_pack_str(pk, type);
    if (seq < 0) return;
    li_wire_pack_str(pk, "seq");
    msgpack_pack_int64(pk, seq);
}

void li_wire_frame_end(msgpack_sbuffer *sb) {
    uint32_t n = (uint32_t)(sb->size - 4);
    unsigned char *b = (unsigned char *)sb->data;
    b[0] = (unsigned char)(n >> 24);
    b[1] = (unsigned char)(n >> 16);
    b[2] = (unsigned char)(n >> 8);
    b[3] = (unsigned char)n;
}

void li_wire_pack_str(msgpack_packer *pk, const char *s) {
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static void kv_int(msgpack_packer *pk, const char *k, int64_t v) {
    li_wire_pack_str(pk, k);
    msgpack_pack_int64(pk, v);
}

static void kv_num(msgpack_packer *pk, const char *k, double v) {
    li_wire_pack_str(pk, k);
    msgpack_pack_double(pk, v);
}

static void kv_str(msgpack_packer *pk, const char *k, const char *v) {
    li_wire_pack_str(pk, k);
    li_wire_pack_str(pk, v);
}

/* with_hashes: the prompt's block hashes as `prefix_hashes` (bin, 16 bytes
 * a block: lo, hi little-endian), in state messages only (optional: older
 * hosts ignore the key, and a request without it has none). */
static void pack_req(msgpack_packer *pk, const li_req_view *r, bool with_hashes) {
    bool spec = r->spec_acceptance >= 0;
    /* the optional numbers travel only when set (older hosts ignore them) */
    const bool ttft = r->slo_ttft_ms > 0, tpot = r->slo_tpot_ms > 0;
    const bool sched = r->first_scheduled >= 0, first = r->first_token >= 0;
    const bool hashes = with_hashes && r->prefix_hash && r->n_prefix_hash > 0;
    msgpack_pack_map(pk, 14 + (uint32_t)spec + (uint32_t)ttft + (uint32_t)tpot + (uint32_t)sched + (uint32_t)first +
                             (uint32_t)hashes);
    kv_int(pk, "id", r->id);
    kv_str(pk, "state", state_names[(unsigned)r->state < 3 ? r->state : 0]);
    kv_num(pk, "arrival", r->arrival);
    kv_int(pk, "priority", r->priority);
    kv_str(pk, "tenant", r->tenant ? r->tenant : "");
    kv_int(pk, "prompt_len", r->prompt_len);
    kv_int(pk, "num_tokens", r->num_tokens);
    kv_int(pk, "num_computed", r->num_computed);
    kv_int(pk, "num_generated", r->num_generated);
    kv_int(pk, "max_tokens", r->max_tokens);
    kv_int(pk, "cached_len", r->cached_len);
    kv_int(pk, "blocks", r->n_blocks);
    kv_int(pk, "preemptions", r->n_preemptions);
    if (spec) kv_num(pk, "spec_acceptance", r->spec_acceptance);
    kv_int(pk, "projected_blocks", r->projected_blocks);
    if (ttft) kv_num(pk, "slo_ttft_ms", r->slo_ttft_ms);
    if (tpot) kv_num(pk, "slo_tpot_ms", r->slo_tpot_ms);
    if (sched) kv_num(pk, "first_scheduled", r->first_scheduled);
    if (first) kv_num(pk, "first_token", r->first_token);
    if (hashes) {
        li_wire_pack_str(pk, "prefix_hashes");
        msgpack_pack_bin(pk, (size_t)r->n_prefix_hash * 16);
        for (int32_t b = 0; b < 2 * r->n_prefix_hash; b++) {
            unsigned char le[8];
            for (int k = 0; k < 8; k++) le[k] = (unsigned char)(r->prefix_hash[b] >> (8 * k));
            msgpack_pack_bin_body(pk, le, 8);
        }
    }
}

void li_wire_pack_req(msgpack_packer *pk, const li_req_view *r) { pack_req(pk, r, false); }

void li_wire_pack_state(msgpack_packer *pk, const li_step_state *st) {
    msgpack_pack_map(pk, 5);
    kv_int(pk, "step", st->step);
    kv_num(pk, "now", st->now);
    li_wire_pack_str(pk, "kv");
    msgpack_pack_map(pk, 5);
    kv_int(pk, "free_blocks", st->kv_free_blocks);
    kv_int(pk, "total_blocks", st->kv_total_blocks);
    kv_int(pk, "cached_blocks", st->kv_cached_blocks);
    kv_int(pk, "block_size", st->block_size);
    kv_int(pk, "running_need", st->kv_running_need);
    li_wire_pack_str(pk, "budget");
    msgpack_pack_map(pk, 2);
    kv_int(pk, "max_num_seqs", st->max_num_seqs);
    kv_int(pk, "max_batched_tokens", st->max_batched_tokens);
    li_wire_pack_str(pk, "requests");
    int32_t n = st->n_reqs > 0 ? st->n_reqs : 0;
    msgpack_pack_array(pk, (size_t)n);
    for (int32_t i = 0; i < n; i++) pack_req(pk, &st->reqs[i], true);
}

void li_wire_pack_plan(msgpack_packer *pk, const li_plan *p) {
    msgpack_pack_map(pk, 2);
    li_wire_pack_str(pk, "run");
    msgpack_pack_array(pk, (size_t)p->n_run);
    for (int32_t i = 0; i < p->n_run; i++) {
        msgpack_pack_map(pk, 2);
        kv_int(pk, "id", p->run[i].id);
        kv_int(pk, "tokens", p->run[i].n_tokens);
    }
    li_wire_pack_str(pk, "preempt");
    msgpack_pack_array(pk, (size_t)p->n_preempt);
    for (int32_t i = 0; i < p->n_preempt; i++) msgpack_pack_int64(pk, p->preempt[i]);
}

void li_wire_pack_config(msgpack_packer *pk, const li_policy_config *c) {
    int n = (c->block_size > 0) + (c->kv_dtype[0] != 0) + (c->max_num_seqs > 0) + (c->max_batched_tokens > 0);
    msgpack_pack_map(pk, (size_t)n);
    if (c->block_size > 0) kv_int(pk, "block_size", c->block_size);
    if (c->kv_dtype[0]) kv_str(pk, "kv_dtype", c->kv_dtype);
    if (c->max_num_seqs > 0) kv_int(pk, "max_num_seqs", c->max_num_seqs);
    if (c->max_batched_tokens > 0) kv_int(pk, "max_batched_tokens", c->max_batched_tokens);
}

void li_wire_pack_hooks(msgpack_packer *pk, unsigned hooks) {
    size_t n = 0;
    for (size_t i = 0; i < LI_ARRAY_LEN(hook_names); i++) n += (hooks & hook_names[i].bit) != 0;
    msgpack_pack_array(pk, n);
    for (size_t i = 0; i < LI_ARRAY_LEN(hook_names); i++)
        if (hooks & hook_names[i].bit) li_wire_pack_str(pk, hook_names[i].name);
}

/* ======================================================================
 * Unpacking (outside bytes: everything checked)
 * ====================================================================== */

bool li_wire_is(const msgpack_object *msg, const char *type) {
    const char *s;
    size_t n;
    if (!li_wire_str(li_wire_get(msg, "type"), &s, &n)) return false;
    return n == strlen(type) && memcmp(s, type, n) == 0;
}

void li_wire_state_free(li_wire_state *ws) {
    free(ws->reqs);
    free(ws->strs);
    free(ws->hashes);
    memset(ws, 0, sizeof *ws);
}

/* Reads an integer field into *out within [lo, hi]; absent = dflt (or an
 * error when required). */
static int field_int(const msgpack_object *m, const char *key, int64_t lo, int64_t hi, bool required, int64_t dflt,
                     int64_t *out, const char *what, li_error *err) {
    const msgpack_object *o = li_wire_get(m, key);
    if (!o || o->type == MSGPACK_OBJECT_NIL) {
        if (required) return li_error_set(err, LI_EINVAL, "%s: missing integer field '%s'", what, key);
        *out = dflt;
        return 0;
    }
    int64_t v;
    if (!li_wire_int(o, &v) || v < lo || v > hi)
        return li_error_set(err, LI_EINVAL, "%s: field '%s' must be an integer in [%lld, %lld]", what, key,
                            (long long)lo, (long long)hi);
    *out = v;
    return 0;
}

/* Request fields, decoded in one pass over the map (a request is the bulk
 * of a state message: no per-field key search). */
enum {
    RF_ID, RF_STATE, RF_ARRIVAL, RF_PRIORITY, RF_TENANT, RF_PROMPT_LEN, RF_NUM_TOKENS, RF_NUM_COMPUTED,
    RF_NUM_GENERATED, RF_MAX_TOKENS, RF_CACHED_LEN, RF_BLOCKS, RF_PREEMPTIONS, RF_SPEC, RF_PROJECTED,
    RF_SLO_TTFT, RF_SLO_TPOT, RF_FIRST_SCHED, RF_FIRST_TOKEN, RF_PREFIX_HASHES, RF__N
};
static const char *const req_keys[RF__N] = {
    "id", "state", "arrival", "priority", "tenant", "prompt_len", "num_tokens", "num_computed",
    "num_generated", "max_tokens", "cached_len", "blocks", "preemptions", "spec_acceptance",
    "projected_blocks", "slo_ttft_ms", "slo_tpot_ms", "first_scheduled", "first_token", "prefix_hashes",
};

static int req_key(const msgpack_object *k) {
    for (int i = 0; i < RF__N; i++)
        if (li_mp_read_str_is(k, false, req_keys[i])) return i;
    return -1;
}

/* with_hashes: prefix_hashes is read into ws->hashes, v->prefix_hash an
 * index there until the caller fixes it up (state messages only). */
static int unpack_req(const msgpack_object *o, li_req_view *v, li_wire_state *ws, bool with_hashes, li_error *err);

int li_wire_unpack_req(const msgpack_object *o, li_req_view *v, li_wire_state *ws, li_error *err) {
    return unpack_req(o, v, ws, false, err);
}

static int unpack_req(const msgpack_object *o, li_req_view *v, li_wire_state *ws, bool with_hashes, li_error *err) {
    if (!o || o->type != MSGPACK_OBJECT_MAP) return li_error_set(err, LI_EINVAL, "request: expected a map");
    memset(v, 0, sizeof *v);
    v->spec_acceptance = -1;
    const int64_t BIG = (int64_t)1 << 53;
    const msgpack_object *f[RF__N] = {0};
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        int k = req_key(&o->via.map.ptr[i].key);
        if (k >= 0) f[k] = &o->via.map.ptr[i].val; /* unknown keys: ignored (newer engines may add some) */
    }
    for (int k = 0; k < RF__N; k++)
        if (f[k] && f[k]->type == MSGPACK_OBJECT_NIL) f[k] = NULL;
    int64_t x;
    if (!f[RF_ID] || !li_wire_int(f[RF_ID], &x) || x < 0 || x > BIG)
        return li_error_set(err, LI_EINVAL, "request: 'id' must be an integer in [0, 2^53]");
    v->id = x;
    const char *s;
    size_t n;
    if (!li_wire_str(f[RF_STATE], &s, &n))
        return li_error_set(err, LI_EINVAL, "request %lld: missing 'state'", (long long)v->id);
    int st = -1;
    for (int i = 0; i < 3; i++)
        if (n == strlen(state_names[i]) && !memcmp(s, state_names[i], n)) st = i;
    if (st < 0) return li_error_set(err, LI_EINVAL, "request %lld: unknown state", (long long)v->id);
    v->state = (li_req_state)st;
    if (f[RF_ARRIVAL] && !li_wire_num(f[RF_ARRIVAL], &v->arrival))
        return li_error_set(err, LI_EINVAL, "request %lld: 'arrival' must be a number", (long long)v->id);
    if (f[RF_SPEC] && !li_wire_num(f[RF_SPEC], &v->spec_acceptance))
        return li_error_set(err, LI_EINVAL, "request %lld: 'spec_acceptance' must be a number", (long long)v->id);
    /* objectives in [0, a day] ms; times >= 0 (absent: none, not yet) */
    v->first_scheduled = v->first_token = -1;
    static const struct {
        int k;
        double hi;
    } nums[] = {{RF_SLO_TTFT, LI_WIRE_MAX_SLO_MS}, {RF_SLO_TPOT, LI_WIRE_MAX_SLO_MS}, {RF_FIRST_SCHED, 1e15},
                {RF_FIRST_TOKEN, 1e15}};
    double *const num_dst[] = {&v->slo_ttft_ms, &v->slo_tpot_ms, &v->first_scheduled, &v->first_token};
    for (size_t i = 0; i < LI_ARRAY_LEN(nums); i++) {
        const msgpack_object *fo = f[nums[i].k];
        double d;
        if (!fo) continue;
        if (!li_wire_num(fo, &d) || !(d >= 0 && d <= nums[i].hi))
            return li_error_set(err, LI_EINVAL, "request %lld: '%s' must be a number in [0, %g]", (long long)v->id,
                                req_keys[nums[i].k], nums[i].hi);
        *num_dst[i] = d;
    }
    static const struct {
        int k;
        int64_t lo, hi;
    } ints[] = {
        {RF_PRIORITY, INT32_MIN, INT32_MAX}, {RF_PROMPT_LEN, 0, (int64_t)1 << 53}, {RF_NUM_TOKENS, 0, (int64_t)1 << 53},
        {RF_NUM_COMPUTED, 0, (int64_t)1 << 53}, {RF_NUM_GENERATED, 0, (int64_t)1 << 53},
        {RF_MAX_TOKENS, 0, (int64_t)1 << 53}, {RF_CACHED_LEN, 0, (int64_t)1 << 53}, {RF_BLOCKS, 0, INT32_MAX},
        {RF_PREEMPTIONS, 0, INT32_MAX}, {RF_PROJECTED, 0, INT32_MAX},
    };
    int64_t val[RF__N] = {0};
    for (size_t i = 0; i < LI_ARRAY_LEN(ints); i++) {
        const msgpack_object *fo = f[ints[i].k];
        if (!fo) continue;
        if (!li_wire_int(fo, &x) || x < ints[i].lo || x > ints[i].hi)
            return li_error_set(err, LI_EINVAL, "request %lld: '%s' must be an integer in [%lld, %lld]",
                                (long long)v->id, req_keys[ints[i].k], (long long)ints[i].lo, (long long)ints[i].hi);
        val[ints[i].k] = x;
    }
    v->priority = (int32_t)val[RF_PRIORITY];
    v->prompt_len = val[RF_PROMPT_LEN];
    v->num_tokens = val[RF_NUM_TOKENS];
    v->num_computed = val[RF_NUM_COMPUTED];
    v->num_generated = val[RF_NUM_GENERATED];
    v->max_tokens = val[RF_MAX_TOKENS];
    v->cached_len = val[RF_CACHED_LEN];
    v->n_blocks = (int32_t)val[RF_BLOCKS];
    v->n_preemptions = (int32_t)val[RF_PREEMPTIONS];
    v->projected_blocks = (int32_t)val[RF_PROJECTED];
    /* tenant: copied, NUL-terminated; stored as an offset until the arena stops growing */
    const char *t = "";
    size_t tl = 0;
    if (f[RF_TENANT] && !li_wire_str(f[RF_TENANT], &t, &tl))
        return li_error_set(err, LI_EINVAL, "request %lld: 'tenant' must be a string", (long long)v->id);
    if (tl > 4096) return li_error_set(err, LI_EINVAL, "request: tenant longer than 4096 bytes");
    if (memchr(t, 0, tl)) return li_error_set(err, LI_EINVAL, "request: tenant contains a NUL byte");
    if (ws->n_strs + tl + 1 > ws->cap_strs) {
        ws->cap_strs = (ws->n_strs + tl + 1) * 2 + 256;
        ws->strs = li_xrealloc(ws->strs, ws->cap_strs);
    }
    memcpy(ws->strs + ws->n_strs, t, tl);
    ws->strs[ws->n_strs + tl] = 0;
    v->tenant = (const char *)(uintptr_t)ws->n_strs; /* fixed up by the caller */
    ws->n_strs += tl + 1;
    const msgpack_object *ph = f[RF_PREFIX_HASHES];
    if (with_hashes && ph) {
        if (ph->type != MSGPACK_OBJECT_BIN || ph->via.bin.size % 16 || ph->via.bin.size > 16 * LI_WIRE_MAX_HASHES)
            return li_error_set(err, LI_EINVAL, "request %lld: 'prefix_hashes' must be bin of 16-byte hashes, at most %d",
                                (long long)v->id, LI_WIRE_MAX_HASHES);
        const size_t nw = ph->via.bin.size / 8;
        if (ws->n_hashes + nw > ws->cap_hashes) {
            ws->cap_hashes = (ws->n_hashes + nw) * 2 + 64;
            ws->hashes = li_xrealloc(ws->hashes, ws->cap_hashes * sizeof *ws->hashes);
        }
        const unsigned char *b = (const unsigned char *)ph->via.bin.ptr;
        for (size_t w = 0; w < nw; w++) {
            uint64_t x = 0;
            for (int k = 0; k < 8; k++) x |= (uint64_t)b[8 * w + (size_t)k] << (8 * k);
            ws->hashes[ws->n_hashes + w] = x;
        }
        v->prefix_hash = (const uint64_t *)(uintptr_t)ws->n_hashes; /* fixed up by unpack_state */
        v->n_prefix_hash = (int32_t)(nw / 2);
        ws->n_hashes += nw;
    }
    (void)BIG;
    return 0;
}

int li_wire_unpack_state(const msgpack_object *o, li_wire_state *ws, li_step_state *st, li_error *err) {
    if (!o || o->type != MSGPACK_OBJECT_MAP) return li_error_set(err, LI_EINVAL, "state: expected a map");
    memset(st, 0, sizeof *st);
    int64_t x;
    if (field_int(o, "step", INT64_MIN, INT64_MAX, false, 0, &x, "state", err)) return err->code;
    st->step = x;
    const msgpack_object *now = li_wire_get(o, "now");
    if (now && !li_wire_num(now, &st->now)) return li_error_set(err, LI_EINVAL, "state: 'now' must be a number");
    const msgpack_object *kv = li_wire_get(o, "kv"), *bu = li_wire_get(o, "budget");
    if (!kv || kv->type != MSGPACK_OBJECT_MAP || !bu || bu->type != MSGPACK_OBJECT_MAP)
        return li_error_set(err, LI_EINVAL, "state: 'kv' and 'budget' must be maps");
    struct {
        const msgpack_object *m;
        const char *key;
        int32_t *dst;
    } f[] = {
        {kv, "free_blocks", &st->kv_free_blocks},   {kv, "total_blocks", &st->kv_total_blocks},
        {kv, "cached_blocks", &st->kv_cached_blocks}, {kv, "block_size", &st->block_size},
        {bu, "max_num_seqs", &st->max_num_seqs},    {bu, "max_batched_tokens", &st->max_batched_tokens},
    };
    for (size_t i = 0; i < LI_ARRAY_LEN(f); i++) {
        if (field_int(f[i].m, f[i].key, 0, INT32_MAX, false, 0, &x, "state", err)) return err->code;
        *f[i].dst = (int32_t)x;
    }
    /* added after version 1 first shipped: optional, 0 when absent */
    if (field_int(kv, "running_need", 0, INT32_MAX, false, 0, &x, "state", err)) return err->code;
    st->kv_running_need = (int32_t)x;
    const msgpack_object *rs = li_wire_get(o, "requests");
    if (!rs || rs->type != MSGPACK_OBJECT_ARRAY) return li_error_set(err, LI_EINVAL, "state: 'requests' must be an array");
    uint32_t n = rs->via.array.size;
    if (n > LI_WIRE_MAX_REQS) return li_error_set(err, LI_ERANGE, "state: more than %d requests", LI_WIRE_MAX_REQS);
    if ((int32_t)n > ws->cap_reqs) {
        ws->cap_reqs = (int32_t)n * 2 + 16;
        ws->reqs = li_xrealloc(ws->reqs, (size_t)ws->cap_reqs * sizeof *ws->reqs);
    }
    ws->n_strs = ws->n_hashes = 0;
    for (uint32_t i = 0; i < n; i++)
        if (unpack_req(&rs->via.array.ptr[i], &ws->reqs[i], ws, true, err)) return err->code;
    for (uint32_t i = 0; i < n; i++) {
        li_req_view *v = &ws->reqs[i];
        v->tenant = ws->strs + (uintptr_t)v->tenant;
        v->prefix_hash = v->n_prefix_hash ? ws->hashes + (uintptr_t)v->prefix_hash : NULL;
    }
    st->reqs = ws->reqs;
    st->n_reqs = (int32_t)n;
    return 0;
}

int li_wire_unpack_plan(const msgpack_object *o, li_plan *plan, li_error *err) {
    if (!o || o->type != MSGPACK_OBJECT_MAP) return li_error_set(err, LI_EINVAL, "plan: expected a map");
    const msgpack_object *run = li_wire_get(o, "run"), *pre = li_wire_get(o, "preempt");
    const int64_t BIG = (int64_t)1 << 53;
    if (run && run->type != MSGPACK_OBJECT_NIL) {
        if (run->type != MSGPACK_OBJECT_ARRAY) return li_error_set(err, LI_EINVAL, "plan: 'run' must be an array");
        if (run->via.array.size > LI_WIRE_MAX_ENTRIES)
            return li_error_set(err, LI_ERANGE, "plan: more than %d run entries", LI_WIRE_MAX_ENTRIES);
        for (uint32_t i = 0; i < run->via.array.size; i++) {
            const msgpack_object *e = &run->via.array.ptr[i];
            int64_t id, tok;
            if (e->type != MSGPACK_OBJECT_MAP) return li_error_set(err, LI_EINVAL, "plan: run[%u] must be a map", i + 1);
            if (!li_wire_int(li_wire_get(e, "id"), &id) || id < 0 || id > BIG)
                return li_error_set(err, LI_EINVAL, "plan: run[%u].id must be a request id", i + 1);
            if (!li_wire_int(li_wire_get(e, "tokens"), &tok) || tok < 0 || tok > INT32_MAX)
                return li_error_set(err, LI_EINVAL, "plan: run[%u].tokens must be an integer in [0, 2^31)", i + 1);
            if (tok > 0) li_plan_add_run(plan, id, (int32_t)tok);
        }
    }
    if (pre && pre->type != MSGPACK_OBJECT_NIL) {
        if (pre->type != MSGPACK_OBJECT_ARRAY) return li_error_set(err, LI_EINVAL, "plan: 'preempt' must be an array");
        if (pre->via.array.size > LI_WIRE_MAX_ENTRIES)
            return li_error_set(err, LI_ERANGE, "plan: more than %d preempt entries", LI_WIRE_MAX_ENTRIES);
        for (uint32_t i = 0; i < pre->via.array.size; i++) {
            int64_t id;
            if (!li_wire_int(&pre->via.array.ptr[i], &id) || id < 0 || id > BIG)
                return li_error_set(err, LI_EINVAL, "plan: preempt[%u] must be a request id", i + 1);
            li_plan_add_preempt(plan, id);
        }
    }
    return 0;
}

int li_wire_unpack_config(const msgpack_object *o, li_policy_config *c, li_error *err) {
    memset(c, 0, sizeof *c);
    if (!o || o->type == MSGPACK_OBJECT_NIL) return 0;
    if (o->type != MSGPACK_OBJECT_MAP) return li_error_set(err, LI_EINVAL, "config: expected a map");
    int64_t x;
    if (field_int(o, "block_size", 0, 1 << 16, false, 0, &x, "config", err)) return err->code;
    c->block_size = (int32_t)x;
    if (field_int(o, "max_num_seqs", 0, 1 << 20, false, 0, &x, "config", err)) return err->code;
    c->max_num_seqs = (int32_t)x;
    if (field_int(o, "max_batched_tokens", 0, 1 << 24, false, 0, &x, "config", err)) return err->code;
    c->max_batched_tokens = (int32_t)x;
    const msgpack_object *d = li_wire_get(o, "kv_dtype");
    if (d && d->type != MSGPACK_OBJECT_NIL) {
        const char *s;
        size_t n;
        if (!li_wire_str(d, &s, &n) || n >= sizeof c->kv_dtype || memchr(s, 0, n))
            return li_error_set(err, LI_EINVAL, "config: 'kv_dtype' must be a short string");
        memcpy(c->kv_dtype, s, n);
        c->kv_dtype[n] = 0;
    }
    return 0;
}

unsigned li_wire_unpack_hooks(const msgpack_object *o) {
    unsigned bits = 0;
    if (!o || o->type != MSGPACK_OBJECT_ARRAY) return 0;
    for (uint32_t i = 0; i < o->via.array.size; i++) {
        const char *s;
        size_t n;
        if (!li_wire_str(&o->via.array.ptr[i], &s, &n)) continue;
        for (size_t k = 0; k < LI_ARRAY_LEN(hook_names); k++)
            if (n == strlen(hook_names[k].name) && !memcmp(s, hook_names[k].name, n)) bits |= hook_names[k].bit;
    }
    return bits;
}

/* ======================================================================
 * Frames from a byte stream (the engine reading a host)
 * ====================================================================== */

int li_wire_frame_unpack(msgpack_unpacked *u, const char *body, size_t n, li_error *err) {
    msgpack_unpacked_destroy(u);
    msgpack_unpacked_init(u);
    if (n == 0) return li_error_set(err, LI_EINVAL, "an empty frame");
    /* msgpack-c allocates an array's or map's declared count before it sees
     * the items: the headers are scanned first (allocating nothing), so every
     * declared item is in the frame and the nesting is bounded */
    li_mp_scan scan = {0};
    size_t end = 0;
    const char *why = "";
    int sc = li_mp_scan_feed(&scan, (const uint8_t *)body, n, n, LI_WIRE_MAX_DEPTH, &end, &why);
    if (sc == LI_SCAN_MORE)
        return li_error_set(err, LI_EINVAL, "a frame of %zu bytes with a truncated msgpack object", n);
    if (sc == LI_SCAN_TOO_LARGE)
        return li_error_set(err, LI_EINVAL, "a frame of %zu bytes that declares more than it holds", n);
    if (sc < 0) return li_error_set(err, LI_EINVAL, "a frame with %s", why);
    if (end != n) return li_error_set(err, LI_EINVAL, "a frame with %zu bytes after its msgpack object", n - end);
    size_t off = 0;
    if (msgpack_unpack_next(u, body, n, &off) != MSGPACK_UNPACK_SUCCESS || off != n)
        return li_error_set(err, LI_EINVAL, "a frame of %zu bytes that is not one msgpack object", n);
    if (u->data.type != MSGPACK_OBJECT_MAP) return li_error_set(err, LI_EINVAL, "a frame that is not a msgpack map");
    return 0;
}

void li_wire_reader_init(li_wire_reader *r) {
    memset(r, 0, sizeof *r);
    msgpack_unpacked_init(&r->msg);
}

void li_wire_reader_free(li_wire_reader *r) {
    msgpack_unpacked_destroy(&r->msg);
    free(r->buf);
    free(r->frame);
    memset(r, 0, sizeof *r);
}

void li_wire_reader_reset(li_wire_reader *r) { r->len = 0; }

char *li_wire_reader_space(li_wire_reader *r, size_t *room) {
    if (r->cap - r->len < 65536) {
        r->cap = r->cap * 2 + 65536;
        r->buf = li_xrealloc(r->buf, r->cap);
    }
    *room = r->cap - r->len;
    return r->buf + r->len;
}

void li_wire_reader_commit(li_wire_reader *r, size_t n) { r->len += n; }

int li_wire_reader_next(li_wire_reader *r, const msgpack_object **msg, li_error *err) {
    if (r->len < 4) return 0;
    const unsigned char *h = (const unsigned char *)r->buf;
    size_t n = (size_t)h[0] << 24 | (size_t)h[1] << 16 | (size_t)h[2] << 8 | h[3];
    if (n > LI_WIRE_MAX_REPLY)
        return li_error_set(err, LI_ERANGE, "a frame of %zu bytes (the limit is %zu)", n, LI_WIRE_MAX_REPLY);
    if (r->len - 4 < n) return 0;
    if (n > r->frame_cap) {
        r->frame_cap = n + 4096;
        r->frame = li_xrealloc(r->frame, r->frame_cap);
    }
    if (n) memcpy(r->frame, r->buf + 4, n); /* frame is still NULL before the first non-empty one */
    memmove(r->buf, r->buf + 4 + n, r->len - 4 - n);
    r->len -= 4 + n;
    if (li_wire_frame_unpack(&r->msg, r->frame, n, err)) return err->code;
    *msg = &r->msg.data;
    return 1;
}

/* ======================================================================
 * The engine's checks of a host's replies
 * ====================================================================== */

int li_wire_check_hello(const msgpack_object *m, li_error *err) {
    int64_t v = -1; /* -1: the version field is missing */
    if (!li_wire_is(m, "hello")) return li_error_set(err, LI_EIO, "policy host sent no hello");
    if (!li_wire_int(li_wire_get(m, "version"), &v) || v != LI_WIRE_VERSION)
        return li_error_set(err, LI_EIO, "policy host speaks protocol %lld, not %d", (long long)v, LI_WIRE_VERSION);
    return 0;
}

bool li_wire_take_async(li_wire_start *s, const msgpack_object *m) {
    int64_t seq;
    li_error e = {0};
    if (li_wire_is(m, "hello")) {
        if (li_wire_check_hello(m, &e)) {
            snprintf(s->error, sizeof s->error, "%s", e.msg);
            return false;
        }
        s->hello = true;
        return true;
    }
    if (!li_wire_is(m, "reload") || !li_wire_int(li_wire_get(m, "seq"), &seq) || seq != s->load_seq)
        return true; /* a stale reply: ignored */
    if (li_wire_decode_reload(m, &s->config, &s->hooks, &e)) {
        snprintf(s->error, sizeof s->error, "%s", e.msg);
        return false;
    }
    if (!s->hello) {
        snprintf(s->error, sizeof s->error, "policy host answered before its hello");
        return false;
    }
    s->ready = true;
    return true;
}

/* The host's text (an error message) in err, cut to what a log line holds. */
/* A host's error text as err's message: at most 480 bytes, a NUL shown as
 * '?' (it would end the C string early), dflt when the text is missing or
 * empty, so an error always says something. */
static int host_text(const msgpack_object *m, const char *key, const char *dflt, int code, li_error *err) {
    const char *s = NULL;
    size_t n = 0;
    if (!li_wire_str(li_wire_get(m, key), &s, &n) || n == 0) return li_error_set(err, code, "%s", dflt);
    char text[481];
    n = LI_MIN(n, sizeof text - 1);
    for (size_t i = 0; i < n; i++) text[i] = s[i] ? s[i] : '?';
    text[n] = 0;
    return li_error_set(err, code, "%s", text);
}

int li_wire_check_reply(const msgpack_object *m, const char *want, li_error *err) {
    if (li_wire_is(m, want)) return 0;
    if (li_wire_is(m, "error")) return host_text(m, "message", "error", LI_EINVAL, err);
    return li_error_set(err, LI_EIO, "a reply that is neither '%s' nor 'error'", want);
}

int li_wire_decode_reload(const msgpack_object *m, li_policy_config *cfg, unsigned *hooks, li_error *err) {
    const msgpack_object *ok = li_wire_get(m, "ok");
    if (!ok || ok->type != MSGPACK_OBJECT_BOOLEAN)
        return li_error_set(err, LI_EIO, "a reload reply without a boolean 'ok'");
    if (!ok->via.boolean) return host_text(m, "error", "policy failed to load", LI_EINVAL, err);
    li_error e = {0};
    if (li_wire_unpack_config(li_wire_get(m, "config"), cfg, &e))
        return li_error_set(err, LI_EIO, "a malformed reload reply: %s", e.msg);
    *hooks = li_wire_unpack_hooks(li_wire_get(m, "hooks"));
    return 0;
}

int li_wire_decode_admit(const msgpack_object *m, bool *accept, char *reason, size_t cap, li_error *err) {
    if (reason && cap) reason[0] = 0;
    const msgpack_object *a = li_wire_get(m, "accept");
    if (!a || a->type != MSGPACK_OBJECT_BOOLEAN)
        return li_error_set(err, LI_EIO, "an admit reply without a boolean 'accept'");
    *accept = a->via.boolean;
    const char *s;
    size_t n;
    if (!*accept && reason && cap && li_wire_str(li_wire_get(m, "reason"), &s, &n))
        snprintf(reason, cap, "%.*s", (int)LI_MIN(n, 4096), s);
    return 0;
}

int li_wire_decode_order(const msgpack_object *m, int32_t max, int32_t *order, int32_t *n_order, li_error *err) {
    *n_order = 0;
    const msgpack_object *o = li_wire_get(m, "order");
    if (!o || o->type != MSGPACK_OBJECT_ARRAY)
        return li_error_set(err, LI_EIO, "an evict reply without an 'order' array");
    for (uint32_t i = 0; i < o->via.array.size && *n_order < max; i++) {
        int64_t id;
        if (!li_wire_int(&o->via.array.ptr[i], &id) || id < 0 || id > INT32_MAX) continue; /* not a block id */
        order[(*n_order)++] = (int32_t)id;
    }
    return 0;
}

/* ======================================================================
 * speculate
 * ====================================================================== */

void li_wire_pack_spec(msgpack_packer *pk, const li_spec_state *ss, const li_spec_cand *c, int32_t n) {
    const int32_t nm = LI_MIN(ss->n_methods, LI_WIRE_MAX_METHODS);
    li_wire_pack_str(pk, "spec");
    msgpack_pack_map(pk, 8);
    li_wire_pack_str(pk, "methods");
    msgpack_pack_array(pk, (size_t)nm);
    for (int32_t m = 0; m < nm; m++) li_wire_pack_str(pk, ss->methods[m]);
    li_wire_pack_str(pk, "available");
    msgpack_pack_array(pk, (size_t)nm);
    for (int32_t m = 0; m < nm; m++) {
        if (ss->available[m]) msgpack_pack_true(pk);
        else msgpack_pack_false(pk);
    }
    kv_int(pk, "batch_size", ss->batch_size);
    kv_num(pk, "step_time", ss->step_time);
    kv_num(pk, "token_time", ss->token_time);
    li_wire_pack_str(pk, "draft_time");
    msgpack_pack_array(pk, (size_t)nm);
    for (int32_t m = 0; m < nm; m++) msgpack_pack_double(pk, ss->draft_time[m]);
    li_wire_pack_str(pk, "row_time");
    msgpack_pack_array(pk, LI_SPEC_COST_ROWS);
    for (int32_t r = 0; r < LI_SPEC_COST_ROWS; r++) msgpack_pack_double(pk, ss->row_time ? ss->row_time[r] : 0);
    li_wire_pack_str(pk, "verify_time");
    msgpack_pack_array(pk, 2);
    for (int s = 0; s < 2; s++) msgpack_pack_double(pk, ss->verify_time ? ss->verify_time[s] : 0);
    li_wire_pack_str(pk, "cands");
    msgpack_pack_array(pk, (size_t)n);
    for (int32_t i = 0; i < n; i++) {
        msgpack_pack_array(pk, 9);
        msgpack_pack_int64(pk, c[i].id);
        msgpack_pack_int32(pk, c[i].want_method);
        msgpack_pack_int32(pk, c[i].want_k);
        msgpack_pack_int32(pk, c[i].max_k);
        msgpack_pack_double(pk, c[i].temperature);
        msgpack_pack_array(pk, (size_t)nm);
        for (int32_t m = 0; m < nm; m++) msgpack_pack_double(pk, c[i].acceptance[m]);
        msgpack_pack_array(pk, (size_t)nm);
        for (int32_t m = 0; m < nm; m++) msgpack_pack_int64(pk, c[i].drafted[m]);
        msgpack_pack_int32(pk, c[i].ngram);
        msgpack_pack_int32(pk, c[i].ngram_match);
    }
}

void li_wire_spec_free(li_wire_spec *w) {
    free(w->cands);
    free(w->acc);
    free(w->drafted);
    memset(w, 0, sizeof *w);
}

/* A number array of exactly n finite entries in [lo, hi] into out. */
static bool num_array(const msgpack_object *o, int32_t n, double lo, double hi, double *out) {
    if (!o || o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != (uint32_t)n) return false;
    for (int32_t i = 0; i < n; i++)
        if (!li_wire_num(&o->via.array.ptr[i], &out[i]) || !(out[i] >= lo && out[i] <= hi)) return false;
    return true;
}

#define SPEC_BAD(...) return li_error_set(err, LI_EINVAL, "speculate: " __VA_ARGS__)

int li_wire_unpack_spec(const msgpack_object *msg, li_wire_spec *w, li_error *err) {
    const msgpack_object *sp = li_wire_get(msg, "spec"), *cands = li_wire_get(msg, "cands");
    if (!sp || sp->type != MSGPACK_OBJECT_MAP) SPEC_BAD("missing 'spec' map");
    const msgpack_object *names = li_wire_get(sp, "methods"), *avail = li_wire_get(sp, "available");
    if (!names || names->type != MSGPACK_OBJECT_ARRAY || names->via.array.size < 1 ||
        names->via.array.size > LI_WIRE_MAX_METHODS)
        SPEC_BAD("'methods' must be a list of 1..%d names", LI_WIRE_MAX_METHODS);
    const int32_t nm = (int32_t)names->via.array.size;
    for (int32_t m = 0; m < nm; m++) {
        const char *s;
        size_t n;
        if (!li_wire_str(&names->via.array.ptr[m], &s, &n) || n < 1 || n > LI_WIRE_MAX_METHOD_NAME ||
            memchr(s, 0, n))
            SPEC_BAD("a method name must be a string of 1..%d bytes", LI_WIRE_MAX_METHOD_NAME);
        memcpy(w->names[m], s, n);
        w->names[m][n] = 0;
        w->name_ptr[m] = w->names[m];
    }
    if (!avail || avail->type != MSGPACK_OBJECT_ARRAY || avail->via.array.size != (uint32_t)nm)
        SPEC_BAD("'available' must be a list of %d booleans", nm);
    for (int32_t m = 0; m < nm; m++) {
        if (avail->via.array.ptr[m].type != MSGPACK_OBJECT_BOOLEAN) SPEC_BAD("'available' must hold booleans");
        w->avail[m] = avail->via.array.ptr[m].via.boolean;
    }
    int64_t bsz;
    double step, tok;
    if (!li_wire_int(li_wire_get(sp, "batch_size"), &bsz) || bsz < 0 || bsz > LI_WIRE_MAX_REQS)
        SPEC_BAD("'batch_size' must be an integer in [0, %d]", LI_WIRE_MAX_REQS);
    if (!li_wire_num(li_wire_get(sp, "step_time"), &step) || step < 0 ||
        !li_wire_num(li_wire_get(sp, "token_time"), &tok) || tok < 0)
        SPEC_BAD("'step_time' and 'token_time' must be numbers >= 0");
    if (!num_array(li_wire_get(sp, "draft_time"), nm, 0, 1e9, w->draft_time))
        SPEC_BAD("'draft_time' must be a list of %d numbers >= 0", nm);
    /* row_time is optional (absent: no step measured) */
    const msgpack_object *rt = li_wire_get(sp, "row_time");
    memset(w->row_time, 0, sizeof w->row_time);
    if (rt && !num_array(rt, LI_SPEC_COST_ROWS, 0, 1e9, w->row_time))
        SPEC_BAD("'row_time' must be a list of %d numbers >= 0", LI_SPEC_COST_ROWS);
    /* verify_time is optional (absent: an older engine; not measured) */
    const msgpack_object *vt = li_wire_get(sp, "verify_time");
    memset(w->verify_time, 0, sizeof w->verify_time);
    if (vt && !num_array(vt, 2, 0, 1e9, w->verify_time))
        SPEC_BAD("'verify_time' must be a list of 2 numbers >= 0 (greedy, sampled)");
    if (!cands || cands->type != MSGPACK_OBJECT_ARRAY || cands->via.array.size > LI_WIRE_MAX_REQS)
        SPEC_BAD("'cands' must be a list of at most %d candidates", LI_WIRE_MAX_REQS);
    const int32_t n = (int32_t)cands->via.array.size;
    if (n > w->cap) {
        w->cap = n;
        w->cands = li_xrealloc(w->cands, (size_t)n * sizeof *w->cands);
        w->acc = li_xrealloc(w->acc, (size_t)n * LI_WIRE_MAX_METHODS * sizeof *w->acc);
        w->drafted = li_xrealloc(w->drafted, (size_t)n * LI_WIRE_MAX_METHODS * sizeof *w->drafted);
    }
    for (int32_t i = 0; i < n; i++) {
        const msgpack_object *c = &cands->via.array.ptr[i];
        /* ngram and ngram_match, the eighth and ninth fields, are optional
         * (absent: not known; an older engine sends neither or only ngram) */
        if (c->type != MSGPACK_OBJECT_ARRAY || c->via.array.size < 7 || c->via.array.size > 9)
            SPEC_BAD("candidate %d must be [id, want_method, want_k, max_k, temperature, acceptance, drafted, ngram, "
                     "ngram_match]",
                     i);
        const msgpack_object *f = c->via.array.ptr;
        int64_t id, wm, wk, mk;
        double temp;
        if (!li_wire_int(&f[0], &id) || id < 0 || id > ((int64_t)1 << 53) || !li_wire_int(&f[1], &wm) || wm < -1 ||
            wm >= nm || !li_wire_int(&f[2], &wk) || wk < 0 || wk > LI_WIRE_MAX_SPEC_K || !li_wire_int(&f[3], &mk) ||
            mk < 0 || mk > LI_WIRE_MAX_SPEC_K || !li_wire_num(&f[4], &temp) || temp < 0 || temp > 1e6)
            SPEC_BAD("candidate %d: a field is out of range", i);
        double *acc = w->acc + (size_t)i * LI_WIRE_MAX_METHODS;
        int64_t *dr = w->drafted + (size_t)i * LI_WIRE_MAX_METHODS;
        double dd[LI_WIRE_MAX_METHODS];
        if (!num_array(&f[5], nm, -1, 1, acc) || !num_array(&f[6], nm, 0, 9e15, dd))
            SPEC_BAD("candidate %d: acceptance in [-1, 1] and drafted >= 0, one per method", i);
        for (int32_t m = 0; m < nm; m++) dr[m] = (int64_t)dd[m];
        int64_t ng = -1;
        if (c->via.array.size >= 8 && (!li_wire_int(&f[7], &ng) || ng < -1 || ng > mk))
            SPEC_BAD("candidate %d: ngram must be an integer in [-1, max_k]", i);
        int64_t match = -1;
        if (c->via.array.size == 9 && (!li_wire_int(&f[8], &match) || match < -1 || match > (1 << 20)))
            SPEC_BAD("candidate %d: ngram_match must be an integer in [-1, 2^20]", i);
        w->cands[i] = (li_spec_cand){.id = id, .want_method = (int32_t)wm, .want_k = (int32_t)wk,
                                     .max_k = (int32_t)mk, .temperature = (float)temp, .acceptance = acc,
                                     .drafted = dr, .ngram = (int32_t)ng, .ngram_match = (int32_t)match,
                                     .method = wk ? (int32_t)wm : -1,
                                     .k = (int32_t)wk};
    }
    w->n = n;
    w->ss = (li_spec_state){.methods = w->name_ptr, .available = w->avail, .n_methods = nm,
                            .batch_size = (int32_t)bsz, .step_time = step, .token_time = tok,
                            .draft_time = w->draft_time, .row_time = w->row_time,
                            .verify_time = w->verify_time};
    return 0;
}

void li_wire_pack_choices(msgpack_packer *pk, const li_spec_cand *c, int32_t n) {
    li_wire_pack_str(pk, "choices");
    msgpack_pack_array(pk, (size_t)n);
    for (int32_t i = 0; i < n; i++) {
        msgpack_pack_array(pk, 2);
        msgpack_pack_int32(pk, c[i].k ? c[i].method : -1);
        msgpack_pack_int32(pk, c[i].k);
    }
}

int li_wire_decode_choices(const msgpack_object *m, li_spec_cand *c, int32_t n, int32_t n_methods, li_error *err) {
    const msgpack_object *o = li_wire_get(m, "choices");
    if (!o || o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != (uint32_t)LI_MAX(n, 0))
        return li_error_set(err, LI_EIO, "a speculate reply without %d choices", n);
    for (int pass = 0; pass < 2; pass++) /* check everything, then write */
        for (int32_t i = 0; i < n; i++) {
            const msgpack_object *e = &o->via.array.ptr[i];
            int64_t meth, k;
            if (e->type != MSGPACK_OBJECT_ARRAY || e->via.array.size != 2 || !li_wire_int(&e->via.array.ptr[0], &meth) ||
                meth < -1 || meth >= n_methods || !li_wire_int(&e->via.array.ptr[1], &k) || k < 0 ||
                k > LI_WIRE_MAX_SPEC_K)
                return li_error_set(err, LI_EIO, "speculate choice %d must be [method in [-1, %d), k in [0, %d]]", i,
                                    n_methods, LI_WIRE_MAX_SPEC_K);
            if (pass) {
                c[i].method = k ? (int32_t)meth : -1;
                c[i].k = (int32_t)k;
            }
        }
    return 0;
}
