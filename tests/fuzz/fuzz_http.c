/* fuzz_http.c — the HTTP front (http-parser, routing, JSON → msgpack, the
 * OpenAI parameter parser, /metrics) on arbitrary bytes, with no socket and
 * no engine (li_http_process_bytes on a detached server).
 *
 * Invariants: every response starts with "HTTP/1.1 <3 digits> ", and a
 * declared Content-Length matches the bytes that follow its header (an
 * answer to HEAD declares its GET body's length and sends no body). */
#define _GNU_SOURCE
#include "server/http.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void fail(const char *what) {
    fprintf(stderr, "fuzz_http: invariant broken: %s\n", what);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *out;
    size_t n;
    li_http_process_bytes(data, size, &out, &n);
    size_t off = 0;
    bool may_head = memmem(data, size, "HEAD", 4) != NULL;
    while (off < n) {
        if (n - off < 13 || memcmp(out + off, "HTTP/1.1 ", 9)) fail("response does not start with HTTP/1.1");
        for (int i = 9; i < 12; i++)
            if (out[off + i] < '0' || out[off + i] > '9') fail("status is not 3 digits");
        const char *end = memmem(out + off, n - off, "\r\n\r\n", 4);
        if (!end) fail("response header not terminated");
        size_t body = (size_t)(end - out) + 4;
        const char *cl = memmem(out + off, body - off, "Content-Length: ", 16);
        if (!cl) break; /* streamed (chunked): the rest belongs to it */
        size_t len = strtoul(cl + 16, NULL, 10);
        if (may_head && (body == n || (n - body >= 9 && !memcmp(out + body, "HTTP/1.1 ", 9)))) {
            off = body; /* bodiless: the end, or the next response, follows the header */
            continue;
        }
        if (len > n - body) fail("Content-Length larger than the body");
        off = body + len;
    }
    free(out);
    return 0;
}
