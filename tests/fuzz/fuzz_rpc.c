/* fuzz_rpc.c — msgpack-RPC framing and dispatch on arbitrary bytes, with no
 * socket and no engine (li_rpc_process_bytes: a detached server; generate
 * parses its parameters fully, then answers 503 for want of an engine).
 *
 * Invariants (abort() = a crash the fuzzer records):
 *  - whatever comes in, what goes out is a sequence of complete msgpack
 *    objects, each a response [1, msgid, error, result] or a notification
 *    [2, method, params];
 *  - an error is a map {code = integer, message = string}. */
#define _GNU_SOURCE
#include "server/rpc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void fail(const char *what) {
    fprintf(stderr, "fuzz_rpc: invariant broken: %s\n", what);
    abort();
}

static void check_error(const msgpack_object *e) {
    if (e->type == MSGPACK_OBJECT_NIL) return;
    const msgpack_object *code = li_mp_get(e, "code"), *msg = li_mp_get(e, "message");
    if (!code || (code->type != MSGPACK_OBJECT_POSITIVE_INTEGER && code->type != MSGPACK_OBJECT_NEGATIVE_INTEGER))
        fail("error without an integer code");
    if (!msg || msg->type != MSGPACK_OBJECT_STR) fail("error without a message string");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *out;
    size_t n;
    li_rpc_process_bytes(data, size, &out, &n);
    size_t off = 0;
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    while (off < n) {
        if (msgpack_unpack_next(&u, out, n, &off) != MSGPACK_UNPACK_SUCCESS) fail("reply is not msgpack");
        const msgpack_object *m = &u.data;
        if (m->type != MSGPACK_OBJECT_ARRAY || m->via.array.size < 3) fail("reply is not an array");
        const msgpack_object *a = m->via.array.ptr;
        if (a[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER) fail("reply type is not an integer");
        if (a[0].via.u64 == 1) {
            if (m->via.array.size != 4) fail("response is not [1, msgid, error, result]");
            check_error(&a[2]);
        } else if (a[0].via.u64 == 2) {
            if (m->via.array.size != 3 || a[1].type != MSGPACK_OBJECT_STR) fail("notification is not [2, method, params]");
            if (a[1].via.str.size == 5 && !memcmp(a[1].via.str.ptr, "error", 5)) check_error(&a[2]);
        } else {
            fail("reply type is neither 1 nor 2");
        }
    }
    msgpack_unpacked_destroy(&u);
    free(out);
    return 0;
}
