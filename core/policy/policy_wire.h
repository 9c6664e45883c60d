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
#define LI_WIRE_MAX_FRAME ((size_t)64 << 20) /* bytes in one frame */
#define LI_WIRE_MAX_REQS (1 << 20)           /* requests in one state */
#define LI_WIRE_MAX_ENTRIES (1 << 20)        /* run or preempt entries in one plan */

/* ---- packing ---------------------------------------------------------------- */

/* Starts a frame in sb (clears it, reserves the length prefix); finish with
 * li_wire_frame_end, which patches the length. */
void li_wire_frame_begin(msgpack_sbuffer *sb);
void li_wire_frame_end(msgpack_sbuffer *sb);

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
} li_wire_state;

void li_wire_state_free(li_wire_state *ws);
int li_wire_unpack_req(const msgpack_object *o, li_req_view *v, li_wire_state *ws, li_error *err);
/* st->reqs points into ws; valid until the next unpack into ws. */
int li_wire_unpack_state(const msgpack_object *o, li_wire_state *ws, li_step_state *st, li_error *err);
/* Appends to plan (strict: ids >= 0, tokens in [0, 2^31), arrays only). */
int li_wire_unpack_plan(const msgpack_object *o, li_plan *plan, li_error *err);
int li_wire_unpack_config(const msgpack_object *o, li_policy_config *c, li_error *err);
unsigned li_wire_unpack_hooks(const msgpack_object *o);

#endif
