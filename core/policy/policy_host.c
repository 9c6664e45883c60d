/* policy_host.c — `luainfer policy-host`: the child side of the isolated
 * policy mode.
 *
 * Owns: one in-process Lua policy (policy_lua.c) and the socket to the
 * engine. It answers one frame at a time, in order, with blocking I/O: the
 * host does nothing else, and the engine side enforces the deadline (a host
 * stuck in Lua is simply killed). It dies with its parent (PDEATHSIG) and
 * exits when the engine closes the socket. Protocol: policy_wire.h and
 * docs/policy-protocol.md. */
#define _POSIX_C_SOURCE 200809L
#include "policy/policy_proc.h"
#include "policy/policy_wire.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct host {
    int fd;
    li_policy *pol;
    li_policy_lua_opts lopts;
    msgpack_sbuffer sb;
    msgpack_packer pk;
    li_wire_state ws;
    li_plan plan;
    li_wire_spec spec;         /* the last speculate call */
    li_evict_candidate *cands; /* (cap_cands) evict candidates and order */
    int32_t *order, cap_cands;
    char *buf;
    size_t cap;
} host;

/* ---- blocking frame I/O ---------------------------------------------------------- */

/* 0 = read n bytes, 1 = clean EOF before any byte, -1 = error */
static int read_full(int fd, void *dst, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)dst + got, n - got);
        if (r > 0) got += (size_t)r;
        else if (r == 0) return got == 0 ? 1 : -1;
        else if (errno != EINTR) return -1;
    }
    return 0;
}

static int write_full(int fd, const void *src, size_t n) {
    size_t put = 0;
    while (put < n) {
        ssize_t w = send(fd, (const char *)src + put, n - put, MSG_NOSIGNAL);
        if (w > 0) put += (size_t)w;
        else if (w < 0 && errno != EINTR) return -1;
    }
    return 0;
}

static int send_frame(host *h) {
    li_wire_frame_end(&h->sb);
    return write_full(h->fd, h->sb.data, h->sb.size);
}

/* ---- replies ------------------------------------------------------------------------ */

static void pack_policy_info(host *h) {
    msgpack_packer *pk = &h->pk;
    li_wire_pack_str(pk, "name");
    li_wire_pack_str(pk, h->pol ? h->pol->name : "");
    li_wire_pack_str(pk, "config");
    li_policy_config none = {0};
    li_wire_pack_config(pk, h->pol ? &h->pol->config : &none);
    li_wire_pack_str(pk, "hooks");
    li_wire_pack_hooks(pk, h->pol ? li_policy_lua_hooks(h->pol) : 0);
}

static int reply_error(host *h, int64_t seq, const char *msg) {
    li_wire_msg_begin(&h->sb, &h->pk, 3, "error", seq);
    li_wire_pack_str(&h->pk, "message");
    li_wire_pack_str(&h->pk, msg);
    return send_frame(h);
}

static int send_hello(host *h, const char *load_error) {
    msgpack_packer *pk = &h->pk;
    li_wire_msg_begin(&h->sb, pk, 8, "hello", -1);
    li_wire_pack_str(pk, "version");
    msgpack_pack_int(pk, LI_WIRE_VERSION);
    li_wire_pack_str(pk, "pid");
    msgpack_pack_int64(pk, (int64_t)getpid());
    li_wire_pack_str(pk, "ok");
    if (load_error) msgpack_pack_false(pk);
    else msgpack_pack_true(pk);
    li_wire_pack_str(pk, "error");
    if (load_error) li_wire_pack_str(pk, load_error);
    else msgpack_pack_nil(pk);
    pack_policy_info(h);
    return send_frame(h);
}

/* ---- message handlers ------------------------------------------------------------------ */

static int on_schedule(host *h, const msgpack_object *msg, int64_t seq) {
    if (!h->pol) return reply_error(h, seq, "no policy loaded");
    li_error err = {0};
    li_step_state st;
    if (li_wire_unpack_state(li_wire_get(msg, "state"), &h->ws, &st, &err)) return reply_error(h, seq, err.msg);
    li_plan_clear(&h->plan);
    if (h->pol->ops->schedule(h->pol, &st, &h->plan, &err)) return reply_error(h, seq, err.msg);
    li_wire_msg_begin(&h->sb, &h->pk, 3, "plan", seq);
    li_wire_pack_str(&h->pk, "plan");
    li_wire_pack_plan(&h->pk, &h->plan);
    return send_frame(h);
}

static int on_evict(host *h, const msgpack_object *msg, int64_t seq) {
    if (!h->pol) return reply_error(h, seq, "no policy loaded");
    const msgpack_object *c = li_wire_get(msg, "cands");
    int64_t need;
    if (!c || c->type != MSGPACK_OBJECT_ARRAY || c->via.array.size > INT32_MAX ||
        !li_wire_int(li_wire_get(msg, "need"), &need) || need < 0 || need > INT32_MAX)
        return reply_error(h, seq, "evict: want 'cands' (a list) and 'need' (an integer)");
    const int32_t n = (int32_t)c->via.array.size;
    if (n > h->cap_cands) {
        h->cap_cands = n;
        h->cands = li_xrealloc(h->cands, (size_t)n * sizeof *h->cands);
        h->order = li_xrealloc(h->order, (size_t)n * sizeof *h->order);
    }
    for (int32_t i = 0; i < n; i++) {
        const msgpack_object *r = &c->via.array.ptr[i];
        int64_t block, hits, depth;
        double last;
        if (r->type != MSGPACK_OBJECT_ARRAY || r->via.array.size != 4 || !li_wire_int(&r->via.array.ptr[0], &block) ||
            !li_wire_num(&r->via.array.ptr[1], &last) || !li_wire_int(&r->via.array.ptr[2], &hits) ||
            !li_wire_int(&r->via.array.ptr[3], &depth) || block < 0 || block > INT32_MAX || hits < 0 ||
            hits > UINT32_MAX || depth < 0 || depth > INT32_MAX)
            return reply_error(h, seq, "evict: a candidate must be [block, last_access, hits, depth]");
        h->cands[i] = (li_evict_candidate){(int32_t)block, last, (uint32_t)hits, (int32_t)depth};
    }
    int32_t n_order = 0;
    li_error err = {0};
    if (h->pol->ops->evict(h->pol, h->cands, n, (int32_t)need, h->order, &n_order, &err))
        return reply_error(h, seq, err.msg);
    li_wire_msg_begin(&h->sb, &h->pk, 3, "order", seq);
    li_wire_pack_str(&h->pk, "order");
    msgpack_pack_array(&h->pk, (size_t)n_order);
    for (int32_t i = 0; i < n_order; i++) msgpack_pack_int32(&h->pk, h->order[i]);
    return send_frame(h);
}

/* speculate: the state, then each candidate's answer (preset to its want)
 * from the policy's hook, one choice per candidate in order. */
static int on_speculate(host *h, const msgpack_object *msg, int64_t seq) {
    if (!h->pol) return reply_error(h, seq, "no policy loaded");
    li_error err = {0};
    li_step_state st;
    if (li_wire_unpack_state(li_wire_get(msg, "state"), &h->ws, &st, &err) ||
        li_wire_unpack_spec(msg, &h->spec, &err))
        return reply_error(h, seq, err.msg);
    if (h->pol->ops->speculate &&
        h->pol->ops->speculate(h->pol, &st, &h->spec.ss, h->spec.cands, h->spec.n, &err))
        return reply_error(h, seq, err.msg);
    li_wire_msg_begin(&h->sb, &h->pk, 3, "speculate", seq);
    li_wire_pack_choices(&h->pk, h->spec.cands, h->spec.n);
    return send_frame(h);
}

static int on_admit(host *h, const msgpack_object *msg, int64_t seq) {
    if (!h->pol) return reply_error(h, seq, "no policy loaded");
    li_error err = {0};
    li_wire_state one = {0};
    li_req_view req;
    int rc = li_wire_unpack_req(li_wire_get(msg, "req"), &req, &one, &err);
    if (rc == 0) req.tenant = one.strs + (uintptr_t)req.tenant;
    li_step_state st, *stp = NULL;
    const msgpack_object *so = li_wire_get(msg, "state");
    if (rc == 0 && so && so->type != MSGPACK_OBJECT_NIL) {
        rc = li_wire_unpack_state(so, &h->ws, &st, &err);
        stp = &st;
    }
    if (rc) {
        li_wire_state_free(&one);
        return reply_error(h, seq, err.msg);
    }
    bool accept = true;
    char reason[256] = "";
    rc = h->pol->ops->admit(h->pol, &req, stp, &accept, reason, sizeof reason, &err);
    li_wire_state_free(&one);
    if (rc) return reply_error(h, seq, err.msg);
    li_wire_msg_begin(&h->sb, &h->pk, 4, "admit", seq);
    li_wire_pack_str(&h->pk, "accept");
    if (accept) msgpack_pack_true(&h->pk);
    else msgpack_pack_false(&h->pk);
    li_wire_pack_str(&h->pk, "reason");
    li_wire_pack_str(&h->pk, reason);
    return send_frame(h);
}

static void on_finish(host *h, const msgpack_object *msg) {
    if (!h->pol) return;
    li_error err = {0};
    li_wire_state one = {0};
    li_req_view req;
    if (li_wire_unpack_req(li_wire_get(msg, "req"), &req, &one, &err) == 0) {
        req.tenant = one.strs + (uintptr_t)req.tenant;
        const char *s;
        size_t n;
        char reason[64] = "";
        if (li_wire_str(li_wire_get(msg, "finish_reason"), &s, &n))
            snprintf(reason, sizeof reason, "%.*s", (int)LI_MIN(n, sizeof reason - 1), s);
        h->pol->ops->on_finish(h->pol, &req, reason);
    } else {
        li_log_warn("policy-host: bad on_finish message: %s", err.msg);
    }
    li_wire_state_free(&one);
}

/* Copies a msgpack string into a new NUL-terminated buffer (NULL if absent). */
static char *dup_str(const msgpack_object *o) {
    const char *s;
    size_t n;
    if (!li_wire_str(o, &s, &n)) return NULL;
    char *d = li_xmalloc(n + 1);
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

static int on_reload(host *h, const msgpack_object *msg, int64_t seq) {
    char *source = dup_str(li_wire_get(msg, "source"));
    char *name = dup_str(li_wire_get(msg, "name"));
    char *path = dup_str(li_wire_get(msg, "path"));
    li_error err = {0};
    int rc;
    if (!source && !path) rc = li_error_set(&err, LI_EINVAL, "reload: neither 'source' nor 'path' given");
    else if (!h->pol) rc = li_policy_lua_open(&h->pol, source ? (name ? name : path) : path, source, &h->lopts, &err);
    else rc = h->pol->ops->reload(h->pol, source ? (name ? name : path) : path, source, &err);
    free(source);
    free(name);
    free(path);
    msgpack_packer *pk = &h->pk;
    li_wire_msg_begin(&h->sb, &h->pk, 7, "reload", seq);
    li_wire_pack_str(pk, "ok");
    if (rc) msgpack_pack_false(pk);
    else msgpack_pack_true(pk);
    li_wire_pack_str(pk, "error");
    if (rc) li_wire_pack_str(pk, err.msg);
    else msgpack_pack_nil(pk);
    pack_policy_info(h);
    return send_frame(h);
}

/* ---- main loop --------------------------------------------------------------------------- */

static int usage(void) {
    fprintf(stderr, "usage: luainfer policy-host --fd N [--unsafe] [--budget N] [--mem-limit BYTES] [--seed N]"
                    " [--jit-off] [POLICY.lua]\n"
                    "Runs a scheduling policy for an engine started with --policy-isolation process;\n"
                    "the engine starts it, it is not meant to be run by hand.\n");
    return 2;
}

static bool parse_ll(const char *s, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

int li_cmd_policy_host(int argc, char **argv) {
    host h = {.fd = -1};
    const char *path = NULL;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        long long v;
        bool has_val = i + 1 < argc;
        if (!strcmp(a, "--fd") && has_val && parse_ll(argv[i + 1], 0, 1 << 20, &v)) h.fd = (int)v, i++;
        else if (!strcmp(a, "--budget") && has_val && parse_ll(argv[i + 1], -1, INT64_MAX, &v))
            h.lopts.instr_budget = v, i++;
        else if (!strcmp(a, "--mem-limit") && has_val && parse_ll(argv[i + 1], 0, INT64_MAX, &v))
            h.lopts.mem_limit = (size_t)v, i++;
        else if (!strcmp(a, "--seed") && has_val && parse_ll(argv[i + 1], 0, UINT32_MAX, &v))
            h.lopts.seed = (uint32_t)v, i++;
        else if (!strcmp(a, "--unsafe")) h.lopts.allow_unsafe = true;
        else if (!strcmp(a, "--jit-off")) h.lopts.jit_off = true;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage();
        else if (a[0] != '-' && !path) path = a;
        else {
            fprintf(stderr, "luainfer policy-host: bad argument '%s'\n", a);
            return usage();
        }
    }
    if (h.fd < 0) return usage();
    /* die with the engine; a closed socket must not kill us by SIGPIPE */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() == 1) return 1;
    signal(SIGPIPE, SIG_IGN);

    msgpack_sbuffer_init(&h.sb);
    msgpack_packer_init(&h.pk, &h.sb, msgpack_sbuffer_write);
    li_plan_init(&h.plan);
    li_error err = {0};
    const char *load_error = NULL;
    if (path && li_policy_lua_open(&h.pol, path, NULL, &h.lopts, &err)) load_error = err.msg;
    int status = 0;
    if (send_hello(&h, load_error)) status = 1;

    while (status == 0) {
        unsigned char hdr[4];
        int r = read_full(h.fd, hdr, 4);
        if (r == 1) break; /* the engine closed the socket */
        if (r < 0) {
            status = 1;
            break;
        }
        size_t len = (size_t)hdr[0] << 24 | (size_t)hdr[1] << 16 | (size_t)hdr[2] << 8 | hdr[3];
        if (len > LI_WIRE_MAX_FRAME) {
            li_log_error("policy-host: frame of %zu bytes exceeds the limit", len);
            status = 2;
            break;
        }
        if (len > h.cap) {
            h.cap = len + 4096;
            h.buf = li_xrealloc(h.buf, h.cap);
        }
        if (read_full(h.fd, h.buf, len)) {
            status = 1;
            break;
        }
        msgpack_unpacked u;
        msgpack_unpacked_init(&u);
        li_error ferr = {0};
        if (li_wire_frame_unpack(&u, h.buf, len, &ferr)) {
            msgpack_unpacked_destroy(&u);
            li_log_error("policy-host: malformed frame: %s", ferr.msg);
            status = 2;
            break;
        }
        const msgpack_object *msg = &u.data;
        int64_t seq = 0;
        li_wire_int(li_wire_get(msg, "seq"), &seq);
        int wr = 0;
        if (li_wire_is(msg, "schedule")) wr = on_schedule(&h, msg, seq);
        else if (li_wire_is(msg, "admit")) wr = on_admit(&h, msg, seq);
        else if (li_wire_is(msg, "evict")) wr = on_evict(&h, msg, seq);
        else if (li_wire_is(msg, "speculate")) wr = on_speculate(&h, msg, seq);
        else if (li_wire_is(msg, "on_finish")) on_finish(&h, msg);
        else if (li_wire_is(msg, "reload")) wr = on_reload(&h, msg, seq);
        else wr = reply_error(&h, seq, "unknown message type");
        msgpack_unpacked_destroy(&u);
        if (wr) status = 1;
    }
    if (h.pol) h.pol->ops->free(h.pol);
    li_plan_free(&h.plan);
    free(h.cands);
    free(h.order);
    li_wire_state_free(&h.ws);
    li_wire_spec_free(&h.spec);
    msgpack_sbuffer_destroy(&h.sb);
    free(h.buf);
    close(h.fd);
    return status;
}
