/* test_policy_wire.c — corrupt input from a policy host (the engine side of
 * docs/policy-protocol.md, "Wire format"):
 *  - frames: empty, over the 16 MiB reply limit, truncated, not msgpack, not a
 *    map, trailing bytes, huge declared counts (refused before msgpack-c
 *    allocates for them), nesting past the limit; byte-by-byte delivery;
 *  - plans: wrong types, out-of-range ids and token counts, NaN, fractions,
 *    a preempt list that is not a list; each is an error with a message
 *    (the step falls back); tokens = 0 is skipped; unknown ids pass the
 *    decoder (the engine drops them when it applies the plan);
 *  - a host's start: wrong protocol version, a load reply before the hello,
 *    a failed load, a malformed config, stale replies;
 *  - replies: an error reply (a policy error) vs an unexpected type (a
 *    protocol error), admit without a boolean, eviction orders with junk;
 *  - through policy_proc.c's socket, with this program as a fake
 *    `luainfer policy-host` sending each kind of corrupt reply: the call
 *    fails with a clear error, the host is replaced, the next call works. */
#define _POSIX_C_SOURCE 200809L
#include "policy/policy_lua.h"
#include "policy/policy_proc.h"
#include "policy/policy_wire.h"
#include "test_util.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- msgpack from a compact description ------------------------------------------------
 * Space-separated items: mN (map of N pairs), aN (array of N), s (a char *
 * argument), i (int), L (long long), d (double), n (nil), t / f (booleans),
 * r (raw msgpack bytes: const char *, size_t). */

static void pack_v(msgpack_packer *pk, const char *fmt, va_list ap) {
    for (const char *c = fmt; *c; c++) {
        switch (*c) {
        case 'm': msgpack_pack_map(pk, strtoul(c + 1, NULL, 10)); break;
        case 'a': msgpack_pack_array(pk, strtoul(c + 1, NULL, 10)); break;
        case 's': li_wire_pack_str(pk, va_arg(ap, const char *)); break;
        case 'i': msgpack_pack_int(pk, va_arg(ap, int)); break;
        case 'L': msgpack_pack_int64(pk, va_arg(ap, long long)); break;
        case 'd': msgpack_pack_double(pk, va_arg(ap, double)); break;
        case 'n': msgpack_pack_nil(pk); break;
        case 't': msgpack_pack_true(pk); break;
        case 'f': msgpack_pack_false(pk); break;
        case 'r': {
            const char *p = va_arg(ap, const char *);
            size_t n = va_arg(ap, size_t);
            msgpack_sbuffer_write(pk->data, p, n);
            break;
        }
        default: break; /* digits and spaces */
        }
    }
}

/* A whole frame (length prefix + body) in sb. */
static void frame_of_v(msgpack_sbuffer *sb, const char *fmt, va_list ap) {
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    li_wire_frame_begin(sb);
    pack_v(&pk, fmt, ap);
    li_wire_frame_end(sb);
}

static void frame_of(msgpack_sbuffer *sb, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    frame_of_v(sb, fmt, ap);
    va_end(ap);
}

/* ---- the reader ------------------------------------------------------------------------ */

static li_wire_reader rd;
static msgpack_sbuffer sb;
static li_error err;

/* Bytes into the reader; then its next frame (1), "more" (0) or an error. */
static int feed(const char *p, size_t n, const msgpack_object **m) {
    size_t room;
    char *dst = li_wire_reader_space(&rd, &room);
    if (n > room) n = room;
    memcpy(dst, p, n);
    li_wire_reader_commit(&rd, n);
    memset(&err, 0, sizeof err);
    return li_wire_reader_next(&rd, m, &err);
}

/* A frame packed from fmt, through a fresh reader: its map, or NULL with err. */
static const msgpack_object *msg(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    frame_of_v(&sb, fmt, ap);
    va_end(ap);
    li_wire_reader_reset(&rd);
    const msgpack_object *m = NULL;
    return feed(sb.data, sb.size, &m) == 1 ? m : NULL;
}

/* A frame of raw body bytes: reader_next's result, err set. */
static int raw_frame(const char *body, size_t n) {
    char buf[4096];
    buf[0] = (char)(n >> 24), buf[1] = (char)(n >> 16), buf[2] = (char)(n >> 8), buf[3] = (char)n;
    memcpy(buf + 4, body, n);
    li_wire_reader_reset(&rd);
    const msgpack_object *m;
    return feed(buf, n + 4, &m);
}

static void test_frames(void) {
    const msgpack_object *m;
    /* a good frame delivered one byte at a time: "more" until the last byte */
    frame_of(&sb, "m2 s s s L", "type", "plan", "seq", 2LL);
    li_wire_reader_reset(&rd);
    int r = 0;
    size_t i;
    for (i = 0; i < sb.size && r == 0; i++) r = feed(sb.data + i, 1, &m);
    CHECK(r == 1 && i == sb.size && li_wire_is(m, "plan"), "byte by byte: %d after %zu of %zu bytes", r, i, sb.size);
    /* two frames in one read */
    msgpack_sbuffer two;
    msgpack_sbuffer_init(&two);
    msgpack_sbuffer_write(&two, sb.data, sb.size);
    frame_of(&sb, "m1 s s", "type", "order");
    msgpack_sbuffer_write(&two, sb.data, sb.size);
    li_wire_reader_reset(&rd);
    CHECK(feed(two.data, two.size, &m) == 1 && li_wire_is(m, "plan"), "first of two frames");
    CHECK(li_wire_reader_next(&rd, &m, &err) == 1 && li_wire_is(m, "order"), "second of two frames");
    CHECK(li_wire_reader_next(&rd, &m, &err) == 0, "then nothing");
    /* a frame whose length says more than has come: wait */
    li_wire_reader_reset(&rd);
    CHECK(feed(two.data, 7, &m) == 0, "a partial frame waits for more");
    msgpack_sbuffer_destroy(&two);

    /* broken streams: errors with a message, nothing allocated from a declared size */
    li_wire_reader_reset(&rd);
    CHECK(feed("\xff\xff\xff\xff\x80", 5, &m) == LI_ERANGE && strstr(err.msg, "limit"), "over 4 GiB: %s", err.msg);
    li_wire_reader_reset(&rd);
    CHECK(feed("\x01\x00\x00\x01\x80", 5, &m) == LI_ERANGE && strstr(err.msg, "16777216"), "a reply over 16 MiB: %s",
          err.msg);
    li_wire_reader_reset(&rd);
    CHECK(feed("\x01\x00\x00\x00\x80", 5, &m) == 0, "a reply of 16 MiB is waited for");
    CHECK(raw_frame("", 0) < 0 && strstr(err.msg, "empty"), "empty frame: %s", err.msg);
    CHECK(raw_frame("\x93\x01\x02\x03", 4) < 0 && strstr(err.msg, "not a msgpack map"), "array frame: %s", err.msg);
    CHECK(raw_frame("\x81\xa1x", 3) < 0 && strstr(err.msg, "truncated"), "truncated body: %s", err.msg);
    CHECK(raw_frame("\x80\xc0", 2) < 0 && strstr(err.msg, "after"), "trailing bytes: %s", err.msg);
    CHECK(raw_frame("\x81\xc1\xc1", 3) < 0 && strstr(err.msg, "not msgpack"), "0xc1: %s", err.msg);
    static const char huge_array[] = "\x81\xa3run\xdd\xff\xff\xff\xff\x80\x80\x80\x80";
    CHECK(raw_frame(huge_array, sizeof huge_array - 1) < 0 && strstr(err.msg, "declares more"),
          "array of 2^32 - 1 in 13 bytes: %s", err.msg);
    static const char huge_map[] = "\x81\xa5order\xdf\x7f\xff\xff\xff";
    CHECK(raw_frame(huge_map, sizeof huge_map - 1) < 0 && strstr(err.msg, "declares more"), "huge map: %s", err.msg);
    static const char huge_str[] = "\x81\xa7message\xdb\xff\xff\xff\xf0" "abc";
    CHECK(raw_frame(huge_str, sizeof huge_str - 1) < 0 && strstr(err.msg, "declares more"), "huge str: %s", err.msg);
    char deep[64] = "\x81\xa1x";
    size_t n = 3;
    for (int d = 0; d < LI_WIRE_MAX_DEPTH; d++) deep[n++] = '\x91';
    deep[n++] = '\xc0';
    CHECK(raw_frame(deep, n) < 0 && strstr(err.msg, "nesting"), "nesting %d + 1 deep: %s", LI_WIRE_MAX_DEPTH, err.msg);
    n = 3;
    for (int d = 0; d < LI_WIRE_MAX_DEPTH - 1; d++) deep[n++] = '\x91';
    deep[n++] = '\xc0';
    CHECK(raw_frame(deep, n) == 1, "nesting %d deep is fine: %s", LI_WIRE_MAX_DEPTH, err.msg);
}

/* ---- plans ------------------------------------------------------------------------------ */

static li_plan plan;

/* Decodes the plan of a reply packed from fmt; 0 or the error code. */
static int plan_ofv(const char *fmt, va_list ap) {
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    li_wire_msg_begin(&sb, &pk, 3, "plan", 2);
    li_wire_pack_str(&pk, "plan");
    pack_v(&pk, fmt, ap);
    li_wire_frame_end(&sb);
    li_wire_reader_reset(&rd);
    const msgpack_object *m;
    li_plan_clear(&plan);
    if (feed(sb.data, sb.size, &m) != 1) return err.code;
    memset(&err, 0, sizeof err);
    if (li_wire_check_reply(m, "plan", &err)) return err.code;
    return li_wire_unpack_plan(li_wire_get(m, "plan"), &plan, &err);
}

static int plan_of(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = plan_ofv(fmt, ap);
    va_end(ap);
    return rc;
}

/* A plan the decoder must refuse, with `needle` in its message. */
static void bad_plan(const char *needle, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = plan_ofv(fmt, ap);
    va_end(ap);
    CHECK(rc != 0 && err.code == rc && strstr(err.msg, needle), "\"%s\" refused with '%s': %d %s", fmt, needle, rc,
          err.msg);
}

static void test_plans(void) {
    CHECK(plan_of("m2 s a3 m2 s i s i m2 s d s d m2 s i s i s a1 i", "run", "id", 3, "tokens", 1, "id", 5.0, "tokens",
                  64.0, "id", 8, "tokens", 0, "preempt", 13) == 0,
          "a plan: %s", err.msg);
    CHECK(plan.n_run == 2 && plan.run[0].id == 3 && plan.run[0].n_tokens == 1 && plan.run[1].id == 5 &&
              plan.run[1].n_tokens == 64 && plan.n_preempt == 1 && plan.preempt[0] == 13,
          "entries (tokens = 0 skipped, integral floats taken): %d run, %d preempt", plan.n_run, plan.n_preempt);
    CHECK(plan_of("m3 s n s n s m1 s i", "run", "preempt", "speculate", "later", 1) == 0 && plan.n_run == 0 &&
              plan.n_preempt == 0,
          "nil lists and unknown keys: %s", err.msg);
    /* ids the engine does not know pass the decoder: apply_plan drops them (plans_trimmed) */
    CHECK(plan_of("m2 s a2 m2 s L s i m2 s i s L s a1 L", "run", "id", 1LL << 53, "tokens", 1, "id", 0, "tokens",
                  (long long)INT32_MAX, "preempt", 1LL << 53) == 0 &&
              plan.n_run == 2 && plan.run[0].id == (1LL << 53) && plan.run[1].n_tokens == INT32_MAX,
          "the largest id and token count: %s", err.msg);

    bad_plan("plan: expected a map", "s", "run everything");
    bad_plan("'run' must be an array", "m1 s s", "run", "all");
    bad_plan("'run' must be an array", "m1 s m0", "run");
    bad_plan("run[1] must be a map", "m1 s a1 a2 i i", "run", 3, 1);
    bad_plan("run[1].id must be a request id", "m1 s a1 m2 s s s i", "run", "id", "3", "tokens", 1);
    bad_plan("run[2].id", "m1 s a2 m2 s i s i m2 s i s i", "run", "id", 3, "tokens", 1, "id", -1, "tokens", 1);
    bad_plan("run[1].id", "m1 s a1 m2 s L s i", "run", "id", (1LL << 53) + 1, "tokens", 1);
    bad_plan("run[1].id", "m1 s a1 m2 s d s i", "run", "id", 3.5, "tokens", 1);
    bad_plan("run[1].id", "m1 s a1 m1 s i", "run", "tokens", 1);
    bad_plan("run[1].tokens must be an integer in [0, 2^31)", "m1 s a1 m2 s i s i", "run", "id", 3, "tokens", -1);
    bad_plan("run[1].tokens", "m1 s a1 m2 s i s L", "run", "id", 3, "tokens", 1LL << 31);
    bad_plan("run[1].tokens", "m1 s a1 m2 s i s d", "run", "id", 3, "tokens", 1.5);
    bad_plan("run[1].tokens", "m1 s a1 m2 s i s d", "run", "id", 3, "tokens", (double)NAN);
    bad_plan("run[1].tokens", "m1 s a1 m2 s i s d", "run", "id", 3, "tokens", (double)INFINITY);
    bad_plan("run[1].tokens", "m1 s a1 m2 s i s t", "run", "id", 3, "tokens");
    bad_plan("'preempt' must be an array", "m1 s m1 s i", "preempt", "1", 13);
    bad_plan("preempt[2] must be a request id", "m1 s a2 i s", "preempt", 13, "x");
    bad_plan("preempt[1]", "m1 s a1 i", "preempt", -4);
}

/* ---- a host's start and its replies --------------------------------------------------------- */

static void test_start(void) {
    li_wire_start s = {.load_seq = 1};
    const msgpack_object *m;
    m = msg("m2 s s s i", "type", "hello", "version", 2);
    CHECK(m && !li_wire_take_async(&s, m) && strstr(s.error, "protocol 2, not 1"), "version 2: %s", s.error);
    s = (li_wire_start){.load_seq = 1};
    m = msg("m2 s s s s", "type", "hello", "version", "1");
    CHECK(m && !li_wire_take_async(&s, m) && strstr(s.error, "protocol -1"), "version as a string: %s", s.error);
    s = (li_wire_start){.load_seq = 1};
    m = msg("m1 s s", "type", "hello");
    CHECK(m && !li_wire_take_async(&s, m), "no version: %s", s.error);
    /* a load reply before the hello */
    s = (li_wire_start){.load_seq = 1};
    m = msg("m3 s s s i s t", "type", "reload", "seq", 1, "ok");
    CHECK(m && !li_wire_take_async(&s, m) && strstr(s.error, "before its hello"), "no hello: %s", s.error);
    /* hello, stale replies (ignored), then the load */
    s = (li_wire_start){.load_seq = 7};
    CHECK(li_wire_take_async(&s, msg("m2 s s s i", "type", "hello", "version", 1)) && s.hello && !s.ready, "hello");
    CHECK(li_wire_take_async(&s, msg("m3 s s s i s t", "type", "reload", "seq", 6, "ok")) && !s.ready, "stale reload");
    CHECK(li_wire_take_async(&s, msg("m2 s s s i", "type", "plan", "seq", 3)) && !s.ready, "stale plan");
    CHECK(li_wire_take_async(&s, msg("m1 s i", "junk", 1)) && !s.ready, "a map without a type");
    li_wire_start ok = s;
    m = msg("m4 s s s i s f s s", "type", "reload", "seq", 7, "ok", "error", "x.lua:3: boom");
    CHECK(!li_wire_take_async(&s, m) && !strcmp(s.error, "x.lua:3: boom"),
          "failed load: %s", s.error);
    s = ok;
    m = msg("m3 s s s i s i", "type", "reload", "seq", 7, "ok", 1);
    CHECK(!li_wire_take_async(&s, m) && strstr(s.error, "'ok'"), "ok not a boolean: %s", s.error);
    s = ok;
    CHECK(!li_wire_take_async(&s, msg("m4 s s s i s t s m1 s i", "type", "reload", "seq", 7, "ok", "config",
                                      "block_size", -1)) &&
              strstr(s.error, "malformed reload reply") && strstr(s.error, "block_size"),
          "bad config: %s", s.error);
    s = ok;
    CHECK(!li_wire_take_async(&s, msg("m4 s s s i s t s m1 s s", "type", "reload", "seq", 7, "ok", "config",
                                      "kv_dtype", "a-very-long-name")),
          "long kv_dtype: %s", s.error);
    s = ok;
    CHECK(li_wire_take_async(&s, msg("m5 s s s i s t s m2 s i s s s a4 s s i s", "type", "reload", "seq", 7, "ok",
                                     "config", "max_num_seqs", 8, "kv_dtype", "f16", "hooks", "schedule", "nope", 3,
                                     "evict")) &&
              s.ready && s.config.max_num_seqs == 8 && !strcmp(s.config.kv_dtype, "f16") &&
              s.hooks == (LI_POLICY_HOOK_SCHEDULE | LI_POLICY_HOOK_EVICT),
          "ready: %s (hooks %u)", s.error, s.hooks);
}

static void test_replies(void) {
    const msgpack_object *m = msg("m3 s s s i s s", "type", "error", "seq", 2, "message", "schedule: x.lua:3: boom");
    CHECK(li_wire_check_reply(m, "plan", &err) == LI_EINVAL && !strcmp(err.msg, "schedule: x.lua:3: boom"),
          "error reply: %s", err.msg);
    m = msg("m2 s s s i", "type", "error", "seq", 2);
    CHECK(li_wire_check_reply(m, "plan", &err) == LI_EINVAL && !strcmp(err.msg, "error"), "bare error: %s", err.msg);
    m = msg("m2 s s s i", "type", "order", "seq", 2);
    CHECK(li_wire_check_reply(m, "plan", &err) == LI_EIO && strstr(err.msg, "neither 'plan' nor 'error'"),
          "unexpected type: %s", err.msg);
    m = msg("m2 s i s i", "type", 5, "seq", 2);
    CHECK(li_wire_check_reply(m, "plan", &err) == LI_EIO, "type not a string: %s", err.msg);
    /* a host's error text with NULs (found by fuzz_policy_wire): shown as
     * '?', never an empty message; an empty text gives the default */
    {
        static const char nul_err[] = "\x00\x00\x00\x1c\x83\xa4type\xa6reload\xa2ok\xc2\xa5" "error\xa4\x00\x00" "ab";
        static const char empty_err[] = "\x00\x00\x00\x18\x83\xa4type\xa6reload\xa2ok\xc2\xa5" "error\xa0";
        li_policy_config cfg;
        unsigned hooks;
        li_wire_reader_reset(&rd);
        CHECK(feed(nul_err, sizeof nul_err - 1, &m) == 1, "NUL error frame: %s", err.msg);
        CHECK(li_wire_decode_reload(m, &cfg, &hooks, &err) == LI_EINVAL && !strcmp(err.msg, "??ab"),
              "NULs in a load error: '%s'", err.msg);
        li_wire_reader_reset(&rd);
        CHECK(feed(empty_err, sizeof empty_err - 1, &m) == 1, "empty error frame: %s", err.msg);
        CHECK(li_wire_decode_reload(m, &cfg, &hooks, &err) == LI_EINVAL && !strcmp(err.msg, "policy failed to load"),
              "an empty load error: '%s'", err.msg);
    }

    bool accept = true;
    char reason[8];
    m = msg("m3 s s s i s i", "type", "admit", "seq", 3, "accept", 1);
    CHECK(li_wire_decode_admit(m, &accept, reason, sizeof reason, &err) == LI_EIO && accept &&
              strstr(err.msg, "accept"),
          "accept = 1: %s", err.msg);
    m = msg("m4 s s s i s f s s", "type", "admit", "seq", 3, "accept", "reason", "a long reason");
    CHECK(li_wire_decode_admit(m, &accept, reason, sizeof reason, &err) == 0 && !accept && !strcmp(reason, "a long "),
          "reason cut to its buffer: '%s'", reason);
    m = msg("m4 s s s i s f s i", "type", "admit", "seq", 3, "accept", "reason", 5);
    CHECK(li_wire_decode_admit(m, &accept, reason, sizeof reason, &err) == 0 && !accept && !reason[0],
          "a reason that is not a string: none");

    int32_t order[4], n = -1;
    m = msg("m2 s s s m0", "type", "order", "order");
    CHECK(li_wire_decode_order(m, 4, order, &n, &err) == LI_EIO && n == 0 && strstr(err.msg, "order"), "order map: %s",
          err.msg);
    m = msg("m2 s s s a9 s i L d d n i i i", "type", "order", "order", "x", -1, 1LL << 31, 5.0, 2.5, 7, 3, 9);
    CHECK(li_wire_decode_order(m, 4, order, &n, &err) == 0 && n == 4 && order[0] == 5 && order[1] == 7 &&
              order[2] == 3 && order[3] == 9,
          "junk skipped, at most one per candidate: %d", n);
    m = msg("m2 s s s a3 i i i", "type", "order", "order", 2, 1, 0);
    CHECK(li_wire_decode_order(m, 2, order, &n, &err) == 0 && n == 2, "capped at the candidates: %d", n);
}

/* ---- through the engine's socket: this program as a fake policy host ----------------------------- */

static const char *host_mode(void) {
    const char *m = getenv("LI_TEST_HOST_MODE");
    return m ? m : "good";
}

static int read_full(int fd, void *dst, size_t n) {
    for (size_t got = 0; got < n;) {
        ssize_t r = read(fd, (char *)dst + got, n - got);
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

static void host_send(int fd, const char *p, size_t n) {
    for (size_t put = 0; put < n;) {
        ssize_t w = write(fd, p + put, n - put);
        if (w <= 0) _exit(1);
        put += (size_t)w;
    }
}

static void host_send_frame(int fd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    frame_of_v(&sb, fmt, ap);
    va_end(ap);
    host_send(fd, sb.data, sb.size);
}

/* Answers a schedule call the way the mode says. */
static void host_schedule(int fd, long long seq, const char *mode) {
    static const char huge[] = "\x83\xa4type\xa4plan\xa3seq\x02\xa4plan\x81\xa3run\xdd\xff\xff\xff\xff\x80\x80\x80";
    if (!strcmp(mode, "zero_frame")) {
        host_send(fd, "\0\0\0\0", 4);
    } else if (!strcmp(mode, "over_limit")) {
        host_send(fd, "\x7f\xff\xff\xff\x80", 5);
    } else if (!strcmp(mode, "huge_count")) {
        char f[64] = {0};
        f[3] = (char)(sizeof huge - 1);
        memcpy(f + 4, huge, sizeof huge - 1);
        host_send(fd, f, 4 + sizeof huge - 1);
    } else if (!strcmp(mode, "deep")) {
        static const char head[] = "\x83\xa4type\xa4plan\xa3seq\x02\xa4plan\x81\xa3run";
        char f[128] = {0};
        size_t n = 4;
        memcpy(f + n, head, sizeof head - 1);
        n += sizeof head - 1;
        for (int d = 0; d < 40; d++) f[n++] = '\x91';
        f[n++] = '\xc0';
        f[3] = (char)(n - 4);
        host_send(fd, f, n);
    } else if (!strcmp(mode, "bad_plan")) {
        host_send_frame(fd, "m3 s s s L s m1 s a1 m2 s i s i", "type", "plan", "seq", seq, "plan", "run", "id", 7,
                        "tokens", -1);
    } else if (!strcmp(mode, "not_map")) {
        host_send_frame(fd, "a3 i i i", 1, 2, 3);
    } else if (!strcmp(mode, "wrong_type")) {
        host_send_frame(fd, "m3 s s s L s a0", "type", "order", "seq", seq, "order");
    } else if (!strcmp(mode, "error_reply")) {
        host_send_frame(fd, "m3 s s s L s s", "type", "error", "seq", seq, "message", "schedule: boom");
    } else if (!strcmp(mode, "truncated")) {
        frame_of(&sb, "m3 s s s L s m0", "type", "plan", "seq", seq, "plan");
        host_send(fd, sb.data, sb.size / 2);
        _exit(0);
    } else {
        host_send_frame(fd, "m3 s s s L s m2 s a1 m2 s i s i s a1 i", "type", "plan", "seq", seq, "plan", "run", "id",
                        7, "tokens", 3, "preempt", 9);
    }
}

/* `policy-host --fd 3`: hello, then answers until the engine hangs up. */
static int fake_host(void) {
    const char *mode = host_mode();
    int fd = 3;
    msgpack_sbuffer_init(&sb);
    host_send_frame(fd, "m2 s s s i", "type", "hello", "version", strcmp(mode, "bad_version") ? 1 : 2);
    char *body = NULL;
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    for (;;) {
        unsigned char h[4];
        if (read_full(fd, h, 4)) break;
        size_t n = (size_t)h[0] << 24 | (size_t)h[1] << 16 | (size_t)h[2] << 8 | h[3];
        body = li_xrealloc(body, n + 1);
        if (read_full(fd, body, n) || li_wire_frame_unpack(&u, body, n, &err)) break;
        int64_t seq = 0;
        li_wire_int(li_wire_get(&u.data, "seq"), &seq);
        if (li_wire_is(&u.data, "reload")) {
            host_send_frame(fd, "m5 s s s L s t s m1 s i s a4 s s s s", "type", "reload", "seq", (long long)seq, "ok",
                            "config", "block_size", strcmp(mode, "bad_config") ? 16 : -1, "hooks", "schedule",
                            "admit", "evict", "speculate");
        } else if (li_wire_is(&u.data, "speculate")) {
            if (!strcmp(mode, "spec_garbage")) /* a method the engine never named */
                host_send_frame(fd, "m3 s s s L s a2 a2 i i a2 i i", "type", "speculate", "seq", (long long)seq,
                                "choices", 5, 1, 0, 1);
            else
                host_send_frame(fd, "m3 s s s L s a2 a2 i i a2 i i", "type", "speculate", "seq", (long long)seq,
                                "choices", 2, 3, -1, 0);
        } else if (li_wire_is(&u.data, "schedule")) {
            host_schedule(fd, (long long)seq, mode);
        } else if (li_wire_is(&u.data, "admit")) {
            if (!strcmp(mode, "admit_garbage"))
                host_send_frame(fd, "m3 s s s L s i", "type", "admit", "seq", (long long)seq, "accept", 1);
            else
                host_send_frame(fd, "m4 s s s L s f s s", "type", "admit", "seq", (long long)seq, "accept", "reason",
                                "no room");
        } else if (li_wire_is(&u.data, "evict")) {
            if (!strcmp(mode, "order_garbage"))
                host_send_frame(fd, "m3 s s s L s a8 s i L i d i i i", "type", "order", "seq", (long long)seq, "order",
                                "x", -1, 1LL << 31, 5, 1.0, 99, 3, 4);
            else
                host_send_frame(fd, "m3 s s s L s a2 i i", "type", "order", "seq", (long long)seq, "order", 5, 3);
        }
    }
    _exit(0); /* the engine hung up (or broke the stream): nothing to flush */
}

static const char *policy_path;

static li_policy *open_host(const char *mode, li_error *e) {
    setenv("LI_TEST_HOST_MODE", mode, 1);
    li_policy_proc_opts o = {.deadline_ms = 2000, .start_timeout_ms = 10000}; /* host: /proc/self/exe */
    li_policy *p = NULL;
    memset(e, 0, sizeof *e);
    li_policy_proc_open(&p, policy_path, &o, e);
    setenv("LI_TEST_HOST_MODE", "good", 1); /* hosts started after a failure behave */
    return p;
}

static const char *schedule(li_policy *p, char *buf, size_t cap) {
    li_req_view r = {.id = 7, .state = LI_REQ_RUNNING, .tenant = "", .prompt_len = 4, .num_tokens = 8,
                     .num_computed = 5, .spec_acceptance = -1};
    li_step_state st = {.reqs = &r, .n_reqs = 1, .kv_free_blocks = 10, .kv_total_blocks = 10, .block_size = 16,
                        .max_num_seqs = 4, .max_batched_tokens = 64};
    li_plan_clear(&plan);
    li_error e = {0};
    if (p->ops->schedule(p, &st, &plan, &e)) {
        snprintf(buf, cap, "ERR %d: %s", plan.n_run + plan.n_preempt, e.msg);
        return buf;
    }
    size_t n = 0;
    buf[0] = 0;
    for (int32_t i = 0; i < plan.n_run; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%lld:%d ", (long long)plan.run[i].id, plan.run[i].n_tokens);
    for (int32_t i = 0; i < plan.n_preempt; i++)
        n += (size_t)snprintf(buf + n, cap - n, "-%lld ", (long long)plan.preempt[i]);
    return buf;
}

static void test_fake_hosts(void) {
    char buf[1024];
    li_error e;
    li_policy *p = open_host("good", &e);
    CHECK(p != NULL, "a good fake host: %s", e.msg);
    if (!p) return; /* cannot start hosts here: the rest needs them */
    CHECK(p->config.block_size == 16 && p->has_schedule && p->has_evict, "config and hooks from the load reply");
    CHECK(!strcmp(schedule(p, buf, sizeof buf), "7:3 -9 "), "a plan through the socket: %s", buf);
    li_req_view r = {.id = 7, .tenant = "", .spec_acceptance = -1};
    bool accept = true;
    char reason[64];
    CHECK(p->ops->admit(p, &r, NULL, &accept, reason, sizeof reason, &e) == 0 && !accept && !strcmp(reason, "no room"),
          "admit: %d '%s'", accept, reason);
    li_evict_candidate c[4] = {{3, 0, 0, 0}, {5, 0, 0, 0}, {6, 0, 0, 0}, {4, 0, 0, 0}};
    int32_t order[4], n = 0;
    CHECK(p->ops->evict(p, c, 4, 2, order, &n, &e) == 0 && n == 2 && order[0] == 5 && order[1] == 3, "evict: %d", n);
    p->ops->free(p);

    /* corrupt replies to schedule: the call fails with a clear error, no half
     * plan; the host is replaced, and the next call works */
    static const struct {
        const char *mode, *want;
    } bad[] = {
        {"zero_frame", "empty frame"},        {"over_limit", "the limit is"},
        {"huge_count", "declares more than"}, {"deep", "nesting deeper"},
        {"bad_plan", "malformed plan: plan: run[1].tokens"}, {"not_map", "not a msgpack map"},
        {"wrong_type", "unexpected reply"},   {"truncated", "exited"},
    };
    for (size_t i = 0; i < LI_ARRAY_LEN(bad); i++) {
        p = open_host(bad[i].mode, &e);
        CHECK(p != NULL, "%s: open: %s", bad[i].mode, e.msg);
        if (!p) continue;
        schedule(p, buf, sizeof buf);
        CHECK(!strncmp(buf, "ERR 0: policy host ", 19) && strstr(buf, bad[i].want), "%s: %s", bad[i].mode, buf);
        li_policy_proc_stats s;
        li_policy_proc_stats_get(p, &s);
        CHECK(s.crashes == 1 && s.restarts == 1, "%s: counted as a crash (%lld) and restarted (%lld)", bad[i].mode,
              (long long)s.crashes, (long long)s.restarts);
        CHECK(li_policy_proc_wait_ready(p, 10000, &e) == 0, "%s: the new host: %s", bad[i].mode, e.msg);
        CHECK(!strcmp(schedule(p, buf, sizeof buf), "7:3 -9 "), "%s: next call: %s", bad[i].mode, buf);
        p->ops->free(p);
    }

    /* an error reply is a policy error: the host stays */
    p = open_host("error_reply", &e);
    CHECK(p && !strcmp(schedule(p, buf, sizeof buf), "ERR 0: schedule: boom"), "error reply: %s", buf);
    if (p) {
        li_policy_proc_stats s;
        li_policy_proc_stats_get(p, &s);
        CHECK(s.crashes == 0 && s.restarts == 0, "no restart for an error reply");
        p->ops->free(p);
    }
    /* admit without a boolean: an error, and the request is accepted */
    p = open_host("admit_garbage", &e);
    if (p) {
        accept = false;
        CHECK(p->ops->admit(p, &r, NULL, &accept, reason, sizeof reason, &e) != 0 && accept &&
                  strstr(e.msg, "'accept'"),
              "admit garbage: %d %s", accept, e.msg);
        p->ops->free(p);
    }
    /* an eviction order with junk: only block ids, at most one per candidate */
    p = open_host("order_garbage", &e);
    if (p) {
        CHECK(p->ops->evict(p, c, 4, 2, order, &n, &e) == 0 && n == 4 && order[0] == 5 && order[1] == 1 &&
                  order[2] == 99 && order[3] == 3,
              "order garbage: %d", n);
        p->ops->free(p);
    }
    /* speculate: the choices come back per candidate; a bad one leaves the
     * wants and replaces the host */
    {
        static const char *const names[3] = {"ngram", "draft", "layerskip"};
        bool av[3] = {true, false, true};
        double dt[3] = {0, 0, 0.004}, acc[6] = {-1, -1, -1, 0.5, -1, -1};
        int64_t dr[6] = {0, 0, 0, 10, 0, 0};
        li_req_view rv = {.id = 7, .state = LI_REQ_RUNNING, .tenant = "", .spec_acceptance = -1,
                          .first_scheduled = -1, .first_token = -1};
        li_step_state sst = {.reqs = &rv, .n_reqs = 1, .block_size = 16, .max_num_seqs = 4, .max_batched_tokens = 64};
        const li_spec_state ss = {.methods = names, .available = av, .n_methods = 3, .batch_size = 1,
                                  .step_time = 0.03, .token_time = 0.001, .draft_time = dt};
        for (int bad = 0; bad < 2; bad++) {
            li_spec_cand sc[2] = {
                {.id = 7, .want_method = 0, .want_k = 4, .max_k = 8, .acceptance = acc, .drafted = dr, .method = 0,
                 .k = 4},
                {.id = 8, .want_method = 0, .want_k = 0, .max_k = 2, .temperature = 0.7f, .acceptance = acc + 3,
                 .drafted = dr + 3, .method = -1, .k = 0},
            };
            p = open_host(bad ? "spec_garbage" : "good", &e);
            CHECK(p && p->has_speculate, "speculate: the hook is announced");
            if (!p) continue;
            int rc = p->ops->speculate(p, &sst, &ss, sc, 2, &e);
            if (!bad) {
                CHECK(rc == 0 && sc[0].method == 2 && sc[0].k == 3 && sc[1].method == -1 && sc[1].k == 0,
                      "speculate choices through the socket: %d (%d, %d) (%d, %d) %s", rc, sc[0].method, sc[0].k,
                      sc[1].method, sc[1].k, rc ? e.msg : "");
            } else {
                li_policy_proc_stats s;
                li_policy_proc_stats_get(p, &s);
                CHECK(rc != 0 && strstr(e.msg, "malformed speculate reply") && sc[0].method == 0 && sc[0].k == 4 &&
                          sc[1].method == -1 && s.crashes == 1,
                      "a bad speculate reply: refused whole, the wants stand, the host replaced: %s", e.msg);
            }
            p->ops->free(p);
        }
    }
    /* a host that cannot be used fails open() with the reason */
    p = open_host("bad_version", &e);
    CHECK(!p && strstr(e.msg, "protocol 2, not 1"), "bad version: %s", e.msg);
    if (p) p->ops->free(p);
    p = open_host("bad_config", &e);
    CHECK(!p && strstr(e.msg, "malformed reload reply") && strstr(e.msg, "block_size"), "bad config: %s", e.msg);
    if (p) p->ops->free(p);
}

/* A speculate call's row_time (the step costs per row count), verify_time
 * and each candidate's ngram and ngram_match survive a round trip; a call
 * without row_time or verify_time (an older engine) reads as nothing measured, a candidate without ngram (7 fields:
 * an older peer) or ngram_match (8) as not known; a negative row_time or verify_time, an
 * ngram past max_k or a negative ngram_match is refused. ngram_field,
 * match_field: appended to the hand-packed candidate, or -2 for none. */
static void spec_roundtrip(const li_spec_state *ss, bool with_rows, double bad, int ngram_field, int match_field,
                           li_wire_spec *w, int *rc, li_error *e) {
    static const int64_t dr[1] = {0};
    static const double acc[1] = {-1};
    li_spec_cand c = {.id = 5, .want_method = 0, .want_k = 2, .max_k = 4, .acceptance = acc, .drafted = dr,
                      .ngram = 3, .ngram_match = 17};
    msgpack_sbuffer b;
    msgpack_sbuffer_init(&b);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &b, msgpack_sbuffer_write);
    if (with_rows && bad == 0 && ngram_field == -2 && match_field == -2) {
        msgpack_pack_map(&pk, 2);
        li_wire_pack_spec(&pk, ss, &c, 1);
    } else { /* by hand: the same fields, row_time left out or broken */
        msgpack_pack_map(&pk, 2);
        li_wire_pack_str(&pk, "spec");
        msgpack_pack_map(&pk, with_rows ? 7 : 6);
        li_wire_pack_str(&pk, "methods");
        msgpack_pack_array(&pk, 1);
        li_wire_pack_str(&pk, "ngram");
        li_wire_pack_str(&pk, "available");
        msgpack_pack_array(&pk, 1);
        msgpack_pack_true(&pk);
        li_wire_pack_str(&pk, "batch_size");
        msgpack_pack_int32(&pk, 1);
        li_wire_pack_str(&pk, "step_time");
        msgpack_pack_double(&pk, 0.01);
        li_wire_pack_str(&pk, "token_time");
        msgpack_pack_double(&pk, 0.01);
        li_wire_pack_str(&pk, "draft_time");
        msgpack_pack_array(&pk, 1);
        msgpack_pack_double(&pk, 0);
        if (with_rows) {
            li_wire_pack_str(&pk, "row_time");
            msgpack_pack_array(&pk, LI_SPEC_COST_ROWS);
            for (int r = 0; r < LI_SPEC_COST_ROWS; r++) msgpack_pack_double(&pk, r == 3 ? bad : 0);
        }
        li_wire_pack_str(&pk, "cands");
        msgpack_pack_array(&pk, 1);
        msgpack_pack_array(&pk, ngram_field == -2 ? 7 : match_field == -2 ? 8 : 9);
        msgpack_pack_int64(&pk, 5);
        msgpack_pack_int32(&pk, 0);
        msgpack_pack_int32(&pk, 2);
        msgpack_pack_int32(&pk, 4);
        msgpack_pack_double(&pk, 0);
        msgpack_pack_array(&pk, 1);
        msgpack_pack_double(&pk, -1);
        msgpack_pack_array(&pk, 1);
        msgpack_pack_int64(&pk, 0);
        if (ngram_field != -2) msgpack_pack_int32(&pk, ngram_field);
        if (ngram_field != -2 && match_field != -2) msgpack_pack_int32(&pk, match_field);
    }
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    CHECK(msgpack_unpack_next(&u, b.data, b.size, NULL) == MSGPACK_UNPACK_SUCCESS, "speculate call unpacks");
    *rc = li_wire_unpack_spec(&u.data, w, e);
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&b);
}

static void test_spec_row_time(void) {
    static const char *const names[1] = {"ngram"};
    const bool av[1] = {true};
    const double dt[1] = {0};
    double rows[LI_SPEC_COST_ROWS] = {0};
    rows[0] = 0.004, rows[8] = 0.0076, rows[LI_SPEC_COST_ROWS - 1] = 0.05;
    const double vt[2] = {6e-6, 8.5e-5};
    const li_spec_state ss = {.methods = names, .available = av, .n_methods = 1, .batch_size = 1, .step_time = 0.004,
                              .token_time = 0.004, .draft_time = dt, .row_time = rows, .verify_time = vt};
    li_wire_spec w = {0};
    li_error e = {0};
    int rc;
    spec_roundtrip(&ss, true, 0, -2, -2, &w, &rc, &e);
    CHECK(rc == 0 && w.ss.row_time && !memcmp(w.ss.row_time, rows, sizeof rows), "row_time round trips: %s",
          rc ? e.msg : "");
    CHECK(rc == 0 && w.ss.verify_time && w.ss.verify_time[0] == vt[0] && w.ss.verify_time[1] == vt[1],
          "verify_time round trips: %s", rc ? e.msg : "");
    CHECK(rc == 0 && w.n == 1 && w.cands[0].ngram == 3, "ngram round trips (%d)", rc ? -9 : w.cands[0].ngram);
    CHECK(rc == 0 && w.n == 1 && w.cands[0].ngram_match == 17, "ngram_match round trips (%d)",
          rc ? -9 : w.cands[0].ngram_match);
    const double vbad[2] = {1e-5, -1};
    li_spec_state sbad = ss;
    sbad.verify_time = vbad;
    spec_roundtrip(&sbad, true, 0, -2, -2, &w, &rc, &e);
    CHECK(rc != 0 && strstr(e.msg, "verify_time"), "a negative verify_time is refused: %s", rc ? e.msg : "");
    spec_roundtrip(&ss, false, 0, 2, -2, &w, &rc, &e);
    CHECK(rc == 0 && w.cands[0].ngram == 2 && w.cands[0].ngram_match == -1,
          "a candidate of 8 fields: ngram_match not known (%d)", rc ? -9 : w.cands[0].ngram_match);
    spec_roundtrip(&ss, false, 0, 2, 40, &w, &rc, &e);
    CHECK(rc == 0 && w.cands[0].ngram_match == 40, "9 fields: ngram_match read: %s", rc ? e.msg : "");
    spec_roundtrip(&ss, false, 0, 2, -5, &w, &rc, &e);
    CHECK(rc != 0 && strstr(e.msg, "ngram_match"), "ngram_match below -1 refused: %s", e.msg);
    spec_roundtrip(&ss, false, 0, -2, -2, &w, &rc, &e);
    bool zero = rc == 0 && w.ss.row_time;
    for (int r = 0; zero && r < LI_SPEC_COST_ROWS; r++) zero = w.ss.row_time[r] == 0;
    CHECK(zero, "a call without row_time: nothing measured: %s", rc ? e.msg : "");
    CHECK(rc == 0 && w.ss.verify_time && w.ss.verify_time[0] == 0 && w.ss.verify_time[1] == 0,
          "a call without verify_time: nothing measured");
    CHECK(rc == 0 && w.n == 1 && w.cands[0].ngram == -1, "a candidate of 7 fields: ngram not known (%d)",
          rc ? -9 : w.cands[0].ngram);
    spec_roundtrip(&ss, true, -1, -2, -2, &w, &rc, &e);
    CHECK(rc != 0 && strstr(e.msg, "row_time"), "a negative row_time is refused: %s", e.msg);
    spec_roundtrip(&ss, false, 0, 4, -2, &w, &rc, &e);
    CHECK(rc == 0 && w.cands[0].ngram == 4, "ngram = max_k accepted: %s", rc ? e.msg : "");
    spec_roundtrip(&ss, false, 0, 5, -2, &w, &rc, &e);
    CHECK(rc != 0 && strstr(e.msg, "ngram"), "ngram past max_k refused: %s", e.msg);
    spec_roundtrip(&ss, false, 0, -3, -2, &w, &rc, &e);
    CHECK(rc != 0 && strstr(e.msg, "ngram"), "ngram below -1 refused: %s", e.msg);
    li_wire_spec_free(&w);
}

/* projected_blocks and kv.running_need (added to version 1) survive a round
 * trip; a state from a peer without them reads them as 0. */
static void test_projection_fields(void) {
    li_req_view r[2] = {
        {.id = 3, .state = LI_REQ_RUNNING, .tenant = "a", .prompt_len = 9, .num_tokens = 12, .num_computed = 11,
         .n_blocks = 1, .spec_acceptance = -1, .projected_blocks = 7},
        {.id = 4, .state = LI_REQ_PREEMPTED, .tenant = "", .prompt_len = 5, .num_tokens = 6, .n_preemptions = 2,
         .spec_acceptance = -1, .projected_blocks = 123456},
    };
    li_step_state st = {.step = 5, .reqs = r, .n_reqs = 2, .kv_free_blocks = 3, .kv_total_blocks = 9,
                        .block_size = 16, .max_num_seqs = 4, .max_batched_tokens = 64, .kv_running_need = 7};
    msgpack_sbuffer b;
    msgpack_sbuffer_init(&b);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &b, msgpack_sbuffer_write);
    li_wire_pack_state(&pk, &st);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    CHECK(msgpack_unpack_next(&u, b.data, b.size, NULL) == MSGPACK_UNPACK_SUCCESS, "state unpacks");
    li_wire_state ws = {0};
    li_step_state got;
    li_error e = {0};
    CHECK(li_wire_unpack_state(&u.data, &ws, &got, &e) == 0, "state decodes: %s", e.msg);
    CHECK(got.n_reqs == 2 && got.kv_running_need == 7 && got.reqs[0].projected_blocks == 7 &&
              got.reqs[1].projected_blocks == 123456 && got.reqs[1].n_preemptions == 2,
          "projection fields round trip: need %d, projected %d %d", got.kv_running_need,
          got.n_reqs > 0 ? got.reqs[0].projected_blocks : -1, got.n_reqs > 1 ? got.reqs[1].projected_blocks : -1);
    /* an older peer: the same state without the two keys */
    msgpack_sbuffer_clear(&b);
    msgpack_pack_map(&pk, 4);
    li_wire_pack_str(&pk, "step");
    msgpack_pack_int64(&pk, 1);
    li_wire_pack_str(&pk, "kv");
    msgpack_pack_map(&pk, 1);
    li_wire_pack_str(&pk, "block_size");
    msgpack_pack_int64(&pk, 16);
    li_wire_pack_str(&pk, "budget");
    msgpack_pack_map(&pk, 0);
    li_wire_pack_str(&pk, "requests");
    msgpack_pack_array(&pk, 1);
    msgpack_pack_map(&pk, 2);
    li_wire_pack_str(&pk, "id");
    msgpack_pack_int64(&pk, 8);
    li_wire_pack_str(&pk, "state");
    li_wire_pack_str(&pk, "running");
    CHECK(msgpack_unpack_next(&u, b.data, b.size, NULL) == MSGPACK_UNPACK_SUCCESS, "old state unpacks");
    CHECK(li_wire_unpack_state(&u.data, &ws, &got, &e) == 0 && got.kv_running_need == 0 && got.n_reqs == 1 &&
              got.reqs[0].projected_blocks == 0,
          "an old state reads the projection as 0: %s", e.msg);
    /* out of range */
    msgpack_sbuffer_clear(&b);
    r[0].projected_blocks = -1;
    li_wire_pack_state(&pk, &st);
    CHECK(msgpack_unpack_next(&u, b.data, b.size, NULL) == MSGPACK_UNPACK_SUCCESS, "bad state unpacks");
    CHECK(li_wire_unpack_state(&u.data, &ws, &got, &e) != 0 && strstr(e.msg, "projected_blocks"),
          "a negative projection is refused: %s", e.msg);
    msgpack_unpacked_destroy(&u);
    li_wire_state_free(&ws);
    msgpack_sbuffer_destroy(&b);
}

/* The latency objectives and the first-scheduled / first-token times round
 * trip; absent they read as none (0) and not yet (-1); out of range, NaN or
 * not numbers they are refused by name. */
static void test_slo_fields(void) {
    li_req_view r = {.id = 3, .state = LI_REQ_RUNNING, .tenant = "", .spec_acceptance = -1, .slo_ttft_ms = 1500,
                     .slo_tpot_ms = 75.5, .first_scheduled = 0.25, .first_token = -1};
    li_step_state st = {.reqs = &r, .n_reqs = 1, .block_size = 16, .max_num_seqs = 4, .max_batched_tokens = 64};
    msgpack_sbuffer b;
    msgpack_sbuffer_init(&b);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &b, msgpack_sbuffer_write);
    li_wire_pack_state(&pk, &st);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    li_wire_state ws = {0};
    li_step_state got;
    li_error e = {0};
    CHECK(msgpack_unpack_next(&u, b.data, b.size, NULL) == MSGPACK_UNPACK_SUCCESS &&
              li_wire_unpack_state(&u.data, &ws, &got, &e) == 0,
          "slo state decodes: %s", e.msg);
    CHECK(got.n_reqs == 1 && got.reqs[0].slo_ttft_ms == 1500 && got.reqs[0].slo_tpot_ms == 75.5 &&
              got.reqs[0].first_scheduled == 0.25 && got.reqs[0].first_token == -1,
          "slo fields round trip: %g %g %g %g", got.reqs[0].slo_ttft_ms, got.reqs[0].slo_tpot_ms,
          got.reqs[0].first_scheduled, got.reqs[0].first_token);
    r = (li_req_view){.id = 3, .tenant = "", .spec_acceptance = -1, .first_scheduled = -1, .first_token = -1};
    msgpack_sbuffer_clear(&b);
    li_wire_pack_state(&pk, &st);
    CHECK(msgpack_unpack_next(&u, b.data, b.size, NULL) == MSGPACK_UNPACK_SUCCESS &&
              li_wire_unpack_state(&u.data, &ws, &got, &e) == 0 && got.reqs[0].slo_ttft_ms == 0 &&
              got.reqs[0].slo_tpot_ms == 0 && got.reqs[0].first_scheduled == -1 && got.reqs[0].first_token == -1,
          "absent slo fields: none and not yet: %s", e.msg);
    static const struct {
        const char *key;
        double v;
    } bad[] = {{"slo_ttft_ms", -1}, {"slo_tpot_ms", 1e12}, {"slo_ttft_ms", NAN}, {"first_token", -0.5},
               {"first_scheduled", INFINITY}};
    for (size_t i = 0; i < LI_ARRAY_LEN(bad) + 1; i++) {
        msgpack_sbuffer_clear(&b);
        msgpack_pack_map(&pk, 3);
        li_wire_pack_str(&pk, "id");
        msgpack_pack_int64(&pk, 8);
        li_wire_pack_str(&pk, "state");
        li_wire_pack_str(&pk, "running");
        const char *key = i < LI_ARRAY_LEN(bad) ? bad[i].key : "slo_tpot_ms";
        li_wire_pack_str(&pk, key);
        if (i < LI_ARRAY_LEN(bad)) msgpack_pack_double(&pk, bad[i].v);
        else li_wire_pack_str(&pk, "fast");
        li_req_view v;
        CHECK(msgpack_unpack_next(&u, b.data, b.size, NULL) == MSGPACK_UNPACK_SUCCESS &&
                  li_wire_unpack_req(&u.data, &v, &ws, &e) != 0 && strstr(e.msg, key),
              "a bad %s is refused by name: %s", key, e.msg);
    }
    msgpack_unpacked_destroy(&u);
    li_wire_state_free(&ws);
    msgpack_sbuffer_destroy(&b);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "policy-host")) return fake_host();
    msgpack_sbuffer_init(&sb);
    li_wire_reader_init(&rd);
    li_plan_init(&plan);
    test_frames();
    test_plans();
    test_start();
    test_replies();
    test_projection_fields();
    test_spec_row_time();
    test_slo_fields();

    char path[] = "/tmp/li_policy_wire_XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) {
        const char text[] = "return {}\n"; /* the fake host never runs it */
        CHECK(write(fd, text, sizeof text - 1) == (ssize_t)(sizeof text - 1), "policy file written");
        close(fd);
        policy_path = path;
        test_fake_hosts();
        remove(path);
    }
    li_plan_free(&plan);
    li_wire_reader_free(&rd);
    msgpack_sbuffer_destroy(&sb);
    return t_summary("test_policy_wire");
}
