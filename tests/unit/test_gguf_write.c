/* test_gguf_write.c — the GGUF writer (core/model/gguf_write.c) against the
 * reader (gguf.c): every value type and arrays (strings among them) survive
 * a round trip, tensors land aligned (32, and 64 when general.alignment says
 * so) with their bytes, the same calls give the same bytes, and bad input
 * (duplicate keys or tensors, data that does not fit the shape, a bad
 * alignment, an unwritable path) is refused without a file left behind. */
#define _GNU_SOURCE
#include "util/common.h"
#include "model/gguf.h"
#include "types.h"
#include "model/gguf_write.h"
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void build(li_gguf_writer *w, uint32_t align) {
    li_error err = {0};
    li_gguf_writer_init(w);
    if (align) li_gguf_writer_add_u32(w, "general.alignment", align, &err);
    li_gguf_writer_add_str(w, "general.architecture", "llama", &err);
    li_gguf_writer_add_u32(w, "a.u32", 123456u, &err);
    li_gguf_writer_add_f32(w, "a.f32", 0.15625f, &err);
    li_gguf_writer_add_bool(w, "a.bool", true, &err);
    static const char *strs[] = {"x", "", "hello"};
    li_str ss[3];
    for (int i = 0; i < 3; i++) ss[i] = (li_str){strs[i], strlen(strs[i])};
    li_gguf_kv arr = {.key = {"a.strs", 6}, .type = LI_GGUF_ARRAY, .v.arr = {.type = LI_GGUF_STRING, .n = 3, .strs = ss}};
    li_gguf_writer_add_kv(w, &arr, &err);
    static const int32_t ints[4] = {1, -2, 3, -4};
    li_gguf_kv iarr = {.key = {"a.ints", 6}, .type = LI_GGUF_ARRAY,
                       .v.arr = {.type = LI_GGUF_INT32, .n = 4, .data = (const uint8_t *)ints}};
    li_gguf_writer_add_kv(w, &iarr, &err);
    li_gguf_kv i64 = {.key = {"a.i64", 5}, .type = LI_GGUF_INT64, .v.i64 = -5};
    li_gguf_writer_add_kv(w, &i64, &err);
    /* 68 bytes: the next tensor starts at 96 with alignment 32, at 128 with 64 */
    float *f = li_xmalloc(17 * sizeof(float));
    for (int i = 0; i < 17; i++) f[i] = (float)i;
    li_gguf_writer_add_tensor(w, "t.f32", LI_TYPE_F32, 2, (int64_t[]){17, 1}, f, 68, &err);
    uint8_t *q = li_xcalloc(1, 34); /* one q8_0 block */
    q[2] = 7;
    li_gguf_writer_add_tensor(w, "t.q8", LI_TYPE_Q8_0, 1, (int64_t[]){32}, q, 34, &err);
    int8_t *c = li_xmalloc(3);
    c[0] = -1, c[1] = 2, c[2] = -3;
    li_gguf_writer_add_tensor(w, "t.i8", LI_TYPE_I8, 1, (int64_t[]){3}, c, 3, &err);
    CHECK(err.code == 0, "building: %s", err.msg);
}

static char *slurp(const char *path, size_t *n) {
    char *buf = NULL;
    li_error err = {0};
    li_read_file(path, 1 << 20, "file", &buf, n, &err);
    return buf;
}

static void check_roundtrip(uint32_t align) {
    char path[] = "/tmp/li_gguf_write_XXXXXX";
    const int fd = mkstemp(path);
    close(fd);
    li_gguf_writer w;
    build(&w, align);
    li_error err = {0};
    const size_t want = li_gguf_writer_size(&w);
    CHECK(li_gguf_writer_write(&w, path, &err) == 0, "write: %s", err.msg);
    li_gguf g;
    CHECK(li_gguf_open(&g, path, &err) == 0, "read back: %s", err.msg);
    uint32_t u = 0;
    float f = 0;
    bool b = false;
    li_str s;
    CHECK(g.size == want, "size %zu == li_gguf_writer_size %zu", g.size, want);
    CHECK(li_gguf_get_u32(&g, "a.u32", &u, &err) == 0 && u == 123456u, "u32");
    CHECK(li_gguf_get_f32(&g, "a.f32", &f, &err) == 0 && f == 0.15625f, "f32");
    CHECK(li_gguf_get_bool(&g, "a.bool", &b, &err) == 0 && b, "bool");
    CHECK(li_gguf_get_str(&g, "general.architecture", &s, &err) == 0 && li_str_eq(s, "llama"), "string");
    const li_gguf_kv *a = li_gguf_get_arr(&g, "a.strs", LI_GGUF_STRING, &err);
    CHECK(a && a->v.arr.n == 3 && li_str_eq(a->v.arr.strs[0], "x") && a->v.arr.strs[1].len == 0 &&
              li_str_eq(a->v.arr.strs[2], "hello"), "string array");
    const li_gguf_kv *ia = li_gguf_get_arr(&g, "a.ints", LI_GGUF_INT32, &err);
    CHECK(ia && ia->v.arr.n == 4 && !memcmp(ia->v.arr.data, (int32_t[]){1, -2, 3, -4}, 16), "int32 array");
    const li_gguf_kv *k64 = li_gguf_find_kv(&g, "a.i64");
    CHECK(k64 && k64->type == LI_GGUF_INT64 && k64->v.i64 == -5, "int64");
    const size_t al = align ? align : 32;
    CHECK(g.alignment == al, "alignment %zu", g.alignment);
    const li_gguf_tensor *t = li_gguf_find_tensor(&g, "t.f32"), *tq = li_gguf_find_tensor(&g, "t.q8"),
                         *ti = li_gguf_find_tensor(&g, "t.i8");
    CHECK(t && t->ne[0] == 17 && t->ne[1] == 1 && t->type == LI_TYPE_F32 && ((const float *)t->data)[14] == 14.0f,
          "f32 tensor");
    CHECK(tq && tq->nbytes == 34 && ((const uint8_t *)tq->data)[2] == 7, "q8_0 tensor");
    CHECK(ti && ti->nbytes == 3 && ((const int8_t *)ti->data)[2] == -3, "i8 tensor");
    for (uint64_t i = 0; i < g.n_tensors; i++)
        CHECK((g.data_offset + g.tensors[i].offset) % al == 0, "tensor %llu aligned to %zu",
              (unsigned long long)i, al);
    li_gguf_free(&g);
    /* the same calls, the same bytes */
    char path2[] = "/tmp/li_gguf_write_XXXXXX";
    close(mkstemp(path2));
    li_gguf_writer w2;
    build(&w2, align);
    li_gguf_writer_write(&w2, path2, &err);
    size_t n1, n2;
    char *b1 = slurp(path, &n1), *b2 = slurp(path2, &n2);
    CHECK(b1 && b2 && n1 == n2 && !memcmp(b1, b2, n1), "deterministic bytes (alignment %zu)", al);
    free(b1), free(b2);
    li_gguf_writer_free(&w);
    li_gguf_writer_free(&w2);
    unlink(path);
    unlink(path2);
}

static void check_refusals(void) {
    li_gguf_writer w;
    li_error err = {0};
    li_gguf_writer_init(&w);
    CHECK(li_gguf_writer_add_u32(&w, "k", 1, &err) == 0, "first key");
    CHECK(li_gguf_writer_add_str(&w, "k", "again", &err) == LI_EINVAL && strstr(err.msg, "duplicate key"),
          "duplicate key refused: %s", err.msg);
    CHECK(li_gguf_writer_has_kv(&w, "k") && !li_gguf_writer_has_kv(&w, "kk"), "has_kv");
    CHECK(li_gguf_writer_add_u32(&w, "general.alignment", 48, &err) == LI_EINVAL, "alignment 48 refused");
    CHECK(li_gguf_writer_add_tensor(&w, "t", LI_TYPE_F32, 1, (int64_t[]){4}, li_xmalloc(15), 15, &err) == LI_EINVAL,
          "15 bytes for 4 f32 refused: %s", err.msg);
    CHECK(li_gguf_writer_add_tensor(&w, "q", LI_TYPE_Q8_0, 1, (int64_t[]){33}, li_xmalloc(34), 34, &err) == LI_EINVAL,
          "33 elements of q8_0 refused");
    CHECK(li_gguf_writer_add_tensor(&w, "t", LI_TYPE_F32, 1, (int64_t[]){1}, li_xmalloc(4), 4, &err) == 0, "tensor");
    CHECK(li_gguf_writer_add_tensor(&w, "t", LI_TYPE_F32, 1, (int64_t[]){1}, li_xmalloc(4), 4, &err) == LI_EINVAL,
          "duplicate tensor refused");
    CHECK(li_gguf_writer_add_tensor(&w, "u4", 66, 1, (int64_t[]){2}, li_xmalloc(1), 1, &err) == LI_EINVAL,
          "a non-GGUF type refused");
    CHECK(li_gguf_writer_write(&w, "/nonexistent-dir/x.gguf", &err) == LI_EIO && strstr(err.msg, "cannot write"),
          "unwritable path: %s", err.msg);
    li_gguf_writer_free(&w);
}

int main(void) {
    check_roundtrip(0);
    check_roundtrip(64);
    check_refusals();
    return t_summary("gguf_write");
}
