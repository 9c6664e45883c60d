/* test_gguf.c — the GGUF reader on files built byte by byte in memory.
 *
 * A small writer (section "GGUF writer") assembles header, metadata, tensor
 * infos, alignment padding and data, so each test states exactly the bytes it
 * feeds the parser. Valid files must parse to the values written; each
 * handcrafted corruption must fail with LI_EINVAL and a message naming the
 * problem, and never crash (the sanitizer build runs this file too). The real
 * default model is checked when present. */
#define _GNU_SOURCE
#include "model/gguf.h"
#include "test_util.h"
#include "types.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ==== GGUF writer ======================================================== */

typedef struct wbuf {
    uint8_t *p;
    size_t n, cap;
} wbuf;

static void w_bytes(wbuf *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        if (!b->p) abort();
    }
    if (n) memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void w_u8(wbuf *b, uint8_t v) { w_bytes(b, &v, 1); }
static void w_u16(wbuf *b, uint16_t v) { w_bytes(b, &v, 2); }
static void w_u32(wbuf *b, uint32_t v) { w_bytes(b, &v, 4); }
static void w_u64(wbuf *b, uint64_t v) { w_bytes(b, &v, 8); }
static void w_f32(wbuf *b, float v) { w_bytes(b, &v, 4); }
static void w_f64(wbuf *b, double v) { w_bytes(b, &v, 8); }
static void w_str(wbuf *b, const char *s) {
    w_u64(b, strlen(s));
    w_bytes(b, s, strlen(s));
}

/* A file under construction: metadata and tensor infos are serialized as
 * they are added; gb_finish lays out header, padding and data. */
typedef struct gbuild {
    uint32_t magic, version;
    wbuf kv, ti, data;
    uint64_t n_kv, n_tensors;
    size_t alignment;  /* used to place tensor data; the file says so only if a kv does */
    bool n_kv_set, n_tensors_set;
    uint64_t n_kv_override, n_tensors_override;
} gbuild;

static void gb_init(gbuild *g) {
    memset(g, 0, sizeof *g);
    g->magic = 0x46554747u;
    g->version = 3;
    g->alignment = 32;
}
static void gb_free(gbuild *g) {
    free(g->kv.p);
    free(g->ti.p);
    free(g->data.p);
}

/* key + type tag; the caller writes the value into g->kv */
static wbuf *gb_key(gbuild *g, const char *key, uint32_t type) {
    w_str(&g->kv, key);
    w_u32(&g->kv, type);
    g->n_kv++;
    return &g->kv;
}
static void gb_u32(gbuild *g, const char *key, uint32_t v) { w_u32(gb_key(g, key, LI_GGUF_UINT32), v); }
static void gb_string(gbuild *g, const char *key, const char *v) { w_str(gb_key(g, key, LI_GGUF_STRING), v); }

/* tensor info; its data is appended (offset chosen by the alignment) unless
 * offset_override is not UINT64_MAX, in which case nbytes of data are still
 * appended but the recorded offset is the override */
static uint64_t gb_tensor_ex(gbuild *g, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                             size_t nbytes, uint64_t offset_override) {
    while (g->data.n % g->alignment) w_u8(&g->data, 0);
    uint64_t off = g->data.n;
    for (size_t i = 0; i < nbytes; i++) w_u8(&g->data, (uint8_t)(i * 7 + g->n_tensors));
    w_str(&g->ti, name);
    w_u32(&g->ti, n_dims);
    /* absurd n_dims (a corruption test) come with one dimension written */
    for (uint32_t d = 0; d < (n_dims <= 8 ? n_dims : 1); d++) w_u64(&g->ti, ne[d]);
    w_u32(&g->ti, type);
    w_u64(&g->ti, offset_override != UINT64_MAX ? offset_override : off);
    g->n_tensors++;
    return off;
}
static uint64_t gb_tensor(gbuild *g, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                          size_t nbytes) {
    return gb_tensor_ex(g, name, n_dims, ne, type, nbytes, UINT64_MAX);
}

/* The finished file; the caller frees it. */
static uint8_t *gb_finish(gbuild *g, size_t *size) {
    wbuf f = {0};
    w_u32(&f, g->magic);
    w_u32(&f, g->version);
    w_u64(&f, g->n_tensors_set ? g->n_tensors_override : g->n_tensors);
    w_u64(&f, g->n_kv_set ? g->n_kv_override : g->n_kv);
    w_bytes(&f, g->kv.p, g->kv.n);
    w_bytes(&f, g->ti.p, g->ti.n);
    if (g->data.n) {
        while (f.n % g->alignment) w_u8(&f, 0);
        w_bytes(&f, g->data.p, g->data.n);
    }
    *size = f.n;
    return f.p ? f.p : calloc(1, 1);
}

/* Parses a built file: returns the li_gguf_init_from_memory result. On
 * success the caller owns *out and *buf. */
static int gb_parse(gbuild *g, li_gguf *out, uint8_t **buf, li_error *err) {
    size_t size;
    *buf = gb_finish(g, &size);
    memset(err, 0, sizeof *err);
    return li_gguf_init_from_memory(out, *buf, size, err);
}

/* Expects the built file to be rejected with LI_EINVAL and a message that
 * contains `needle`. */
#define EXPECT_REJECT(g, needle) expect_reject(g, needle, __LINE__)
static void expect_reject(gbuild *g, const char *needle, int line) {
    li_gguf gg;
    uint8_t *buf;
    li_error err;
    int rc = gb_parse(g, &gg, &buf, &err);
    if (rc == 0) li_gguf_free(&gg);
    bool ok = rc == LI_EINVAL && strstr(err.msg, needle) != NULL && strncmp(err.msg, "gguf: ", 6) == 0;
    if (ok) {
        t_passed++;
    } else {
        t_failed++;
        fprintf(stderr, "FAIL %s:%d: expected rejection mentioning '%s', got rc=%d msg='%s'\n", __FILE__, line,
                needle, rc, err.msg);
    }
    free(buf);
    gb_free(g);
}

static const char *source_dir(void) {
    const char *s = getenv("LUAINFER_SOURCE_DIR");
    if (s && *s) return s;
#ifdef LI_SOURCE_DIR
    return LI_SOURCE_DIR;
#else
    return ".";
#endif
}

/* ==== valid files ======================================================== */

/* A file with a kv of every value type, arrays of every element type
 * (strings and an empty array too), and tensors of types F32, Q4_0, Q8_0.
 * The last tensor ends exactly at end of file, so every proper prefix is a
 * truncated file. */
static void build_valid(gbuild *g, uint32_t version) {
    gb_init(g);
    g->version = version;
    w_u8(gb_key(g, "t.u8", LI_GGUF_UINT8), 200);
    w_u8(gb_key(g, "t.i8", LI_GGUF_INT8), (uint8_t)-100);
    w_u16(gb_key(g, "t.u16", LI_GGUF_UINT16), 60000);
    w_u16(gb_key(g, "t.i16", LI_GGUF_INT16), (uint16_t)-30000);
    w_u32(gb_key(g, "t.u32", LI_GGUF_UINT32), 4000000000u);
    w_u32(gb_key(g, "t.i32", LI_GGUF_INT32), (uint32_t)-2000000000);
    w_f32(gb_key(g, "t.f32", LI_GGUF_FLOAT32), 1.5f);
    w_u8(gb_key(g, "t.bool", LI_GGUF_BOOL), 1);
    gb_string(g, "t.str", "hello gguf");
    w_u64(gb_key(g, "t.u64", LI_GGUF_UINT64), 0xFEDCBA9876543210ull);
    w_u64(gb_key(g, "t.i64", LI_GGUF_INT64), (uint64_t)-5);
    w_f64(gb_key(g, "t.f64", LI_GGUF_FLOAT64), -2.25);
    gb_string(g, "t.empty_str", "");
    /* arrays of each fixed-size type: n elements 1, 2, ... */
    static const uint32_t fixed[] = {LI_GGUF_UINT8,   LI_GGUF_INT8,   LI_GGUF_UINT16, LI_GGUF_INT16,
                                     LI_GGUF_UINT32,  LI_GGUF_INT32,  LI_GGUF_FLOAT32, LI_GGUF_BOOL,
                                     LI_GGUF_UINT64,  LI_GGUF_INT64,  LI_GGUF_FLOAT64};
    static const size_t fsize[] = {1, 1, 2, 2, 4, 4, 4, 1, 8, 8, 8};
    for (size_t i = 0; i < LI_ARRAY_LEN(fixed); i++) {
        char key[32];
        snprintf(key, sizeof key, "arr.%s", li_gguf_vtype_name(fixed[i]));
        wbuf *b = gb_key(g, key, LI_GGUF_ARRAY);
        w_u32(b, fixed[i]);
        w_u64(b, 3);
        for (int e = 0; e < 3; e++) {
            uint8_t elem[8] = {0};
            elem[0] = (uint8_t)(e + 1);
            w_bytes(b, elem, fsize[i]);
        }
    }
    wbuf *b = gb_key(g, "arr.strings", LI_GGUF_ARRAY);
    w_u32(b, LI_GGUF_STRING);
    w_u64(b, 4);
    w_str(b, "a");
    w_str(b, "");
    w_str(b, "<|im_start|>");
    w_str(b, "\xc4\xa0the");
    b = gb_key(g, "arr.empty", LI_GGUF_ARRAY);
    w_u32(b, LI_GGUF_UINT32);
    w_u64(b, 0);
    b = gb_key(g, "arr.empty_strings", LI_GGUF_ARRAY);
    w_u32(b, LI_GGUF_STRING);
    w_u64(b, 0);

    gb_tensor(g, "w.f32", 2, (uint64_t[]){4, 3}, LI_TYPE_F32, 4 * 3 * 4);
    gb_tensor(g, "w.q4_0", 2, (uint64_t[]){64, 2}, LI_TYPE_Q4_0, 4 * 18);
    gb_tensor(g, "w.q8_0", 4, (uint64_t[]){32, 1, 1, 1}, LI_TYPE_Q8_0, 34);
}

static void test_valid(uint32_t version) {
    gbuild g;
    build_valid(&g, version);
    li_gguf gg;
    uint8_t *buf;
    li_error err;
    int rc = gb_parse(&g, &gg, &buf, &err);
    CHECK(rc == 0, "v%u valid file rejected: %s", version, err.msg);
    if (rc) {
        free(buf);
        gb_free(&g);
        return;
    }
    CHECK(gg.version == version, "version %u", gg.version);
    CHECK(gg.n_kv == g.n_kv, "n_kv %llu", (unsigned long long)gg.n_kv);
    CHECK(gg.n_tensors == 3, "n_tensors %llu", (unsigned long long)gg.n_tensors);
    CHECK(gg.alignment == 32, "alignment %zu", gg.alignment);
    CHECK(gg.data_offset % 32 == 0, "data offset %zu not aligned", gg.data_offset);

    const li_gguf_kv *kv;
    kv = li_gguf_find_kv(&gg, "t.u8");
    CHECK(kv && kv->type == LI_GGUF_UINT8 && kv->v.u64 == 200, "t.u8");
    kv = li_gguf_find_kv(&gg, "t.i8");
    CHECK(kv && kv->type == LI_GGUF_INT8 && kv->v.i64 == -100, "t.i8");
    kv = li_gguf_find_kv(&gg, "t.u16");
    CHECK(kv && kv->v.u64 == 60000, "t.u16");
    kv = li_gguf_find_kv(&gg, "t.i16");
    CHECK(kv && kv->v.i64 == -30000, "t.i16");
    kv = li_gguf_find_kv(&gg, "t.u32");
    CHECK(kv && kv->v.u64 == 4000000000u, "t.u32");
    kv = li_gguf_find_kv(&gg, "t.i32");
    CHECK(kv && kv->v.i64 == -2000000000, "t.i32");
    kv = li_gguf_find_kv(&gg, "t.f32");
    CHECK(kv && kv->type == LI_GGUF_FLOAT32 && kv->v.f64 == 1.5, "t.f32");
    kv = li_gguf_find_kv(&gg, "t.bool");
    CHECK(kv && kv->type == LI_GGUF_BOOL && kv->v.u64 == 1, "t.bool");
    kv = li_gguf_find_kv(&gg, "t.str");
    CHECK(kv && kv->type == LI_GGUF_STRING && li_str_eq(kv->v.str, "hello gguf"), "t.str");
    kv = li_gguf_find_kv(&gg, "t.u64");
    CHECK(kv && kv->v.u64 == 0xFEDCBA9876543210ull, "t.u64");
    kv = li_gguf_find_kv(&gg, "t.i64");
    CHECK(kv && kv->v.i64 == -5, "t.i64");
    kv = li_gguf_find_kv(&gg, "t.f64");
    CHECK(kv && kv->v.f64 == -2.25, "t.f64");
    kv = li_gguf_find_kv(&gg, "t.empty_str");
    CHECK(kv && kv->type == LI_GGUF_STRING && kv->v.str.len == 0, "t.empty_str");
    CHECK(li_gguf_find_kv(&gg, "t.missing") == NULL, "missing key found");
    CHECK(li_gguf_find_kv(&gg, "t.u") == NULL, "prefix of a key matched");

    kv = li_gguf_find_kv(&gg, "arr.uint16");
    CHECK(kv && kv->type == LI_GGUF_ARRAY && kv->v.arr.type == LI_GGUF_UINT16 && kv->v.arr.n == 3 &&
              kv->v.arr.strs == NULL,
          "arr.uint16");
    if (kv) {
        uint16_t e2;
        memcpy(&e2, kv->v.arr.data + 2 * 2, 2);
        CHECK(e2 == 3, "arr.uint16[2] = %u", e2);
    }
    kv = li_gguf_find_kv(&gg, "arr.float64");
    CHECK(kv && kv->v.arr.type == LI_GGUF_FLOAT64 && kv->v.arr.n == 3 && kv->v.arr.data[16] == 3, "arr.float64");
    kv = li_gguf_get_arr(&gg, "arr.strings", LI_GGUF_STRING, &err);
    CHECK(kv && kv->v.arr.n == 4 && kv->v.arr.strs, "arr.strings");
    if (kv && kv->v.arr.strs) {
        CHECK(li_str_eq(kv->v.arr.strs[0], "a"), "strs[0]");
        CHECK(kv->v.arr.strs[1].len == 0, "strs[1]");
        CHECK(li_str_eq(kv->v.arr.strs[2], "<|im_start|>"), "strs[2]");
        CHECK(li_str_eq(kv->v.arr.strs[3], "\xc4\xa0the"), "strs[3]");
    }
    kv = li_gguf_find_kv(&gg, "arr.empty");
    CHECK(kv && kv->v.arr.n == 0, "arr.empty");
    kv = li_gguf_find_kv(&gg, "arr.empty_strings");
    CHECK(kv && kv->v.arr.n == 0 && kv->v.arr.type == LI_GGUF_STRING, "arr.empty_strings");

    /* typed getters */
    uint32_t u32 = 0;
    uint64_t u64 = 0;
    float f = 0;
    bool bl = false;
    li_str s = {0};
    CHECK(li_gguf_get_u32(&gg, "t.u8", &u32, &err) == 0 && u32 == 200, "get_u32(u8)");
    CHECK(li_gguf_get_u32(&gg, "t.u64", &u32, &err) == LI_EINVAL && strstr(err.msg, "out of range"),
          "get_u32(big u64): %s", err.msg);
    CHECK(li_gguf_get_u64(&gg, "t.i64", &u64, &err) == LI_EINVAL && strstr(err.msg, "non-negative"),
          "get_u64(negative): %s", err.msg);
    CHECK(li_gguf_get_u64(&gg, "t.str", &u64, &err) == LI_EINVAL && strstr(err.msg, "t.str"),
          "get_u64(string): %s", err.msg);
    CHECK(li_gguf_get_u32(&gg, "t.absent", &u32, &err) == 1, "get_u32(absent) != 1");
    CHECK(li_gguf_get_f32(&gg, "t.f64", &f, &err) == 0 && f == -2.25f, "get_f32(f64)");
    CHECK(li_gguf_get_f32(&gg, "t.i16", &f, &err) == 0 && f == -30000.0f, "get_f32(i16)");
    CHECK(li_gguf_get_f32(&gg, "t.bool", &f, &err) == LI_EINVAL, "get_f32(bool)");
    CHECK(li_gguf_get_bool(&gg, "t.bool", &bl, &err) == 0 && bl, "get_bool");
    CHECK(li_gguf_get_bool(&gg, "t.u8", &bl, &err) == LI_EINVAL && strstr(err.msg, "bool"), "get_bool(u8)");
    CHECK(li_gguf_get_str(&gg, "t.str", &s, &err) == 0 && li_str_eq(s, "hello gguf"), "get_str");
    CHECK(li_gguf_get_str(&gg, "t.u8", &s, &err) == LI_EINVAL && strstr(err.msg, "string"), "get_str(u8)");
    err.msg[0] = 0;
    CHECK(li_gguf_get_arr(&gg, "arr.uint8", LI_GGUF_INT32, &err) == NULL && strstr(err.msg, "int32"),
          "get_arr(wrong elem type): %s", err.msg);
    CHECK(li_gguf_get_arr(&gg, "t.u8", LI_GGUF_UINT8, &err) == NULL, "get_arr(scalar)");
    CHECK(li_gguf_get_arr(&gg, "arr.absent", LI_GGUF_UINT8, &err) == NULL, "get_arr(absent)");

    /* tensors: shapes, sizes, offsets and data pointers */
    const li_gguf_tensor *t = li_gguf_find_tensor(&gg, "w.f32");
    CHECK(t && t->n_dims == 2 && t->ne[0] == 4 && t->ne[1] == 3 && t->ne[2] == 1 && t->ne[3] == 1 &&
              t->type == LI_TYPE_F32 && t->nbytes == 48 && t->offset == 0,
          "w.f32");
    if (t) CHECK(t->data == buf + gg.data_offset, "w.f32 data pointer");
    t = li_gguf_find_tensor(&gg, "w.q4_0");
    CHECK(t && t->type == LI_TYPE_Q4_0 && t->nbytes == 72 && t->offset == 64, "w.q4_0 (offset %llu)",
          t ? (unsigned long long)t->offset : 0ull);
    if (t) {
        CHECK(t->data == buf + gg.data_offset + 64, "w.q4_0 data pointer");
        CHECK(((const uint8_t *)t->data)[1] == 7 + 1, "w.q4_0 data bytes");
    }
    t = li_gguf_find_tensor(&gg, "w.q8_0");
    CHECK(t && t->n_dims == 4 && t->type == LI_TYPE_Q8_0 && t->nbytes == 34 && t->offset == 160, "w.q8_0");
    if (t) CHECK((const uint8_t *)t->data + t->nbytes == buf + gg.size, "w.q8_0 does not end at EOF");
    CHECK(li_gguf_find_tensor(&gg, "w.q8") == NULL, "prefix of a tensor name matched");
    li_gguf_free(&gg);
    CHECK(gg.kv == NULL && gg.tensors == NULL, "li_gguf_free did not clear");
    free(buf);
    gb_free(&g);
}

/* general.alignment = 64: padding before the data and tensor offsets follow it. */
static void test_custom_alignment(void) {
    gbuild g;
    gb_init(&g);
    g.alignment = 64;
    gb_string(&g, "general.architecture", "llama");
    gb_u32(&g, "general.alignment", 64);
    gb_tensor(&g, "a", 1, (uint64_t[]){3}, LI_TYPE_F32, 12);
    gb_tensor(&g, "b", 1, (uint64_t[]){5}, LI_TYPE_F32, 20);
    li_gguf gg;
    uint8_t *buf;
    li_error err;
    int rc = gb_parse(&g, &gg, &buf, &err);
    CHECK(rc == 0, "alignment 64 rejected: %s", err.msg);
    if (rc == 0) {
        CHECK(gg.alignment == 64, "alignment %zu", gg.alignment);
        CHECK(gg.data_offset % 64 == 0, "data offset %zu", gg.data_offset);
        const li_gguf_tensor *t = li_gguf_find_tensor(&gg, "b");
        CHECK(t && t->offset == 64 && t->data == buf + gg.data_offset + 64, "b at offset 64");
        li_gguf_free(&gg);
    }
    free(buf);
    gb_free(&g);

    /* a file with metadata only and no tensors */
    gb_init(&g);
    gb_string(&g, "general.architecture", "llama");
    rc = gb_parse(&g, &gg, &buf, &err);
    CHECK(rc == 0 && gg.n_tensors == 0 && gg.n_kv == 1, "kv-only file: %s", err.msg);
    if (rc == 0) li_gguf_free(&gg);
    free(buf);
    gb_free(&g);

    /* an empty file body: no kvs, no tensors */
    gb_init(&g);
    rc = gb_parse(&g, &gg, &buf, &err);
    CHECK(rc == 0 && gg.n_tensors == 0 && gg.n_kv == 0, "empty GGUF: %s", err.msg);
    if (rc == 0) li_gguf_free(&gg);
    free(buf);
    gb_free(&g);
}

/* ==== corrupt files ====================================================== */

static void test_header(void) {
    gbuild g;
    build_valid(&g, 3);
    g.magic = 0x46554746u;
    EXPECT_REJECT(&g, "bad magic");
    build_valid(&g, 1);
    EXPECT_REJECT(&g, "unsupported version 1");
    build_valid(&g, 4);
    EXPECT_REJECT(&g, "unsupported version 4");
    build_valid(&g, 0);
    EXPECT_REJECT(&g, "unsupported version 0");

    build_valid(&g, 3);
    g.n_kv_set = true;
    g.n_kv_override = UINT64_MAX;
    EXPECT_REJECT(&g, "metadata count");
    build_valid(&g, 3);
    g.n_kv_set = true;
    g.n_kv_override = 1ull << 40;
    EXPECT_REJECT(&g, "metadata count");
    build_valid(&g, 3);
    g.n_tensors_set = true;
    g.n_tensors_override = UINT64_MAX;
    EXPECT_REJECT(&g, "tensor count");
    build_valid(&g, 3);
    g.n_tensors_set = true;
    g.n_tensors_override = 1ull << 33;
    EXPECT_REJECT(&g, "tensor count");

    /* one kv more than the file holds: the parser runs into the tensor infos */
    build_valid(&g, 3);
    g.n_kv_set = true;
    g.n_kv_override = g.n_kv + 1;
    {
        li_gguf gg;
        uint8_t *buf;
        li_error err;
        int rc = gb_parse(&g, &gg, &buf, &err);
        CHECK(rc == LI_EINVAL && strncmp(err.msg, "gguf: ", 6) == 0, "n_kv+1: rc=%d %s", rc, err.msg);
        if (rc == 0) li_gguf_free(&gg);
        free(buf);
        gb_free(&g);
    }
}

/* Every proper prefix of a valid file is rejected with a message. */
static void test_truncation(void) {
    gbuild g;
    build_valid(&g, 3);
    size_t size;
    uint8_t *full = gb_finish(&g, &size);
    int bad = 0;
    for (size_t n = 0; n < size; n++) {
        /* a fresh exact-size copy, so the sanitizer sees any overread */
        uint8_t *p = malloc(n ? n : 1);
        memcpy(p, full, n);
        li_gguf gg;
        li_error err = {0};
        int rc = li_gguf_init_from_memory(&gg, p, n, &err);
        if (rc == 0) li_gguf_free(&gg);
        if (rc != LI_EINVAL || strncmp(err.msg, "gguf: ", 6) != 0) {
            if (bad++ < 5)
                fprintf(stderr, "FAIL truncation at %zu of %zu: rc=%d msg='%s'\n", n, size, rc, err.msg);
        }
        free(p);
    }
    CHECK(bad == 0, "%d of %zu prefixes not rejected", bad, size);
    /* spot-check what the messages say at a few places */
    struct { size_t n; const char *needle; } at[] = {
        {0, "truncated"}, {3, "truncated"}, {23, "truncated"}, {size - 1, "past end of file"}};
    for (size_t i = 0; i < LI_ARRAY_LEN(at); i++) {
        li_gguf gg;
        li_error err = {0};
        uint8_t *p = malloc(at[i].n ? at[i].n : 1);
        memcpy(p, full, at[i].n);
        int rc = li_gguf_init_from_memory(&gg, p, at[i].n, &err);
        if (rc == 0) li_gguf_free(&gg);
        CHECK(rc == LI_EINVAL && strstr(err.msg, at[i].needle), "prefix %zu: '%s' lacks '%s'", at[i].n, err.msg,
              at[i].needle);
        free(p);
    }
    free(full);
    gb_free(&g);
}

static void test_metadata(void) {
    gbuild g;
    wbuf *b;

    gb_init(&g);
    gb_u32(&g, "dup.key", 1);
    gb_string(&g, "other", "x");
    gb_u32(&g, "dup.key", 2);
    EXPECT_REJECT(&g, "duplicate metadata key 'dup.key'");

    gb_init(&g);
    gb_u32(&g, "", 1);
    EXPECT_REJECT(&g, "empty key");

    gb_init(&g);
    w_u32(gb_key(&g, "bad.type", 13), 0);
    EXPECT_REJECT(&g, "unknown value type 13");
    gb_init(&g);
    w_u32(gb_key(&g, "bad.type", 0xFFFFFFFFu), 0);
    EXPECT_REJECT(&g, "unknown value type");

    /* nested arrays */
    gb_init(&g);
    b = gb_key(&g, "nested", LI_GGUF_ARRAY);
    w_u32(b, LI_GGUF_ARRAY);
    w_u64(b, 1);
    w_u32(b, LI_GGUF_UINT8);
    w_u64(b, 1);
    w_u8(b, 0);
    EXPECT_REJECT(&g, "arrays, which is not supported");

    gb_init(&g);
    b = gb_key(&g, "arr.bad", LI_GGUF_ARRAY);
    w_u32(b, 99);
    w_u64(b, 0);
    EXPECT_REJECT(&g, "unknown type");

    /* key length past end of file */
    gb_init(&g);
    w_u64(&g.kv, 1000000);
    w_bytes(&g.kv, "abcdefghijklmnopqrstuvwxyz", 26);
    g.n_kv = 1;
    EXPECT_REJECT(&g, "past end of file");
    gb_init(&g);
    w_u64(&g.kv, UINT64_MAX);
    w_bytes(&g.kv, "abcdefghijklmnopqrstuvwxyz", 26);
    g.n_kv = 1;
    EXPECT_REJECT(&g, "past end of file");

    /* string value length past end of file */
    gb_init(&g);
    b = gb_key(&g, "s", LI_GGUF_STRING);
    w_u64(b, 0x7FFFFFFFFFFFFFFFull);
    w_bytes(b, "xyzxyzxyzxyzxyzxyz", 18);
    EXPECT_REJECT(&g, "past end of file");

    /* array of strings with a huge count */
    gb_init(&g);
    b = gb_key(&g, "strs", LI_GGUF_ARRAY);
    w_u32(b, LI_GGUF_STRING);
    w_u64(b, 1ull << 60);
    w_str(b, "one");
    EXPECT_REJECT(&g, "cannot fit in the file");
    /* ... with a count that fits the bound but strings that do not */
    gb_init(&g);
    b = gb_key(&g, "strs", LI_GGUF_ARRAY);
    w_u32(b, LI_GGUF_STRING);
    w_u64(b, 3);
    w_str(b, "one");
    w_u64(b, 500);
    w_bytes(b, "twotwotwotwotwotwo", 18);
    EXPECT_REJECT(&g, "past end of file");

    /* fixed-size arrays with huge counts: plain, and overflowing n * size */
    gb_init(&g);
    b = gb_key(&g, "nums", LI_GGUF_ARRAY);
    w_u32(b, LI_GGUF_UINT32);
    w_u64(b, 1000);
    w_u32(b, 7);
    EXPECT_REJECT(&g, "past end of file");
    gb_init(&g);
    b = gb_key(&g, "nums", LI_GGUF_ARRAY);
    w_u32(b, LI_GGUF_UINT64);
    w_u64(b, (1ull << 61) + 1);
    w_u64(b, 7);
    EXPECT_REJECT(&g, "past end of file");

    /* scalar value cut off by end of file */
    gb_init(&g);
    b = gb_key(&g, "f64", LI_GGUF_FLOAT64);
    w_u32(b, 0);
    EXPECT_REJECT(&g, "truncated");
}

static void test_alignment(void) {
    gbuild g;
    static const uint32_t bad[] = {0, 3, 48, 1u << 21, 0x80000000u};
    for (size_t i = 0; i < LI_ARRAY_LEN(bad); i++) {
        gb_init(&g);
        gb_u32(&g, "general.alignment", bad[i]);
        gb_tensor(&g, "a", 1, (uint64_t[]){8}, LI_TYPE_F32, 32);
        EXPECT_REJECT(&g, "power of two");
    }
    gb_init(&g);
    w_u64(gb_key(&g, "general.alignment", LI_GGUF_UINT64), 32);
    EXPECT_REJECT(&g, "general.alignment must be uint32, is uint64");
    gb_init(&g);
    gb_string(&g, "general.alignment", "32");
    EXPECT_REJECT(&g, "general.alignment must be uint32, is string");

    /* alignment 1 is a power of two: allowed, no padding */
    gb_init(&g);
    g.alignment = 1;
    gb_u32(&g, "general.alignment", 1);
    gb_tensor(&g, "a", 1, (uint64_t[]){1}, LI_TYPE_F32, 4);
    gb_tensor(&g, "b", 1, (uint64_t[]){1}, LI_TYPE_F32, 4);
    li_gguf gg;
    uint8_t *buf;
    li_error err;
    int rc = gb_parse(&g, &gg, &buf, &err);
    CHECK(rc == 0 && gg.alignment == 1 && li_gguf_find_tensor(&gg, "b")->offset == 4, "alignment 1: %s",
          err.msg);
    if (rc == 0) li_gguf_free(&gg);
    free(buf);
    gb_free(&g);
}

static void test_tensors(void) {
    gbuild g;

    gb_init(&g);
    gb_tensor(&g, "dup", 1, (uint64_t[]){4}, LI_TYPE_F32, 16);
    gb_tensor(&g, "x", 1, (uint64_t[]){4}, LI_TYPE_F32, 16);
    gb_tensor(&g, "dup", 1, (uint64_t[]){4}, LI_TYPE_F32, 16);
    EXPECT_REJECT(&g, "duplicate tensor name 'dup'");

    gb_init(&g);
    gb_tensor_ex(&g, "a", 1, (uint64_t[]){8}, LI_TYPE_F32, 48, 16);
    EXPECT_REJECT(&g, "not aligned");

    /* past end: offset beyond the data, and size beyond the data */
    gb_init(&g);
    gb_tensor_ex(&g, "a", 1, (uint64_t[]){8}, LI_TYPE_F32, 32, 1 << 20);
    EXPECT_REJECT(&g, "extends past end of file");
    gb_init(&g);
    gb_tensor(&g, "a", 1, (uint64_t[]){9}, LI_TYPE_F32, 32);
    EXPECT_REJECT(&g, "extends past end of file");
    gb_init(&g);
    gb_tensor_ex(&g, "a", 1, (uint64_t[]){8}, LI_TYPE_F32, 32, 0xFFFFFFFFFFFFFFE0ull);
    EXPECT_REJECT(&g, "extends past end of file");

    static const uint32_t unknown[] = {LI_TYPE_COUNT, 200, 0xFFFFFFFFu};
    for (size_t i = 0; i < LI_ARRAY_LEN(unknown); i++) {
        gb_init(&g);
        gb_tensor(&g, "a", 1, (uint64_t[]){32}, unknown[i], 128);
        EXPECT_REJECT(&g, "unknown type");
    }
    /* retired ids (Q4_2, Q4_3) may be known by name; they must not crash */
    for (uint32_t ty = 4; ty <= 5; ty++) {
        gb_init(&g);
        gb_tensor(&g, "a", 1, (uint64_t[]){32}, ty, 128);
        li_gguf gg;
        uint8_t *buf;
        li_error err;
        if (gb_parse(&g, &gg, &buf, &err) == 0) li_gguf_free(&gg);
        t_passed++;
        free(buf);
        gb_free(&g);
    }

    gb_init(&g);
    gb_tensor(&g, "a", 0, NULL, LI_TYPE_F32, 4);
    EXPECT_REJECT(&g, "has 0 dimensions");
    gb_init(&g);
    gb_tensor(&g, "a", 5, (uint64_t[]){1, 1, 1, 1, 1}, LI_TYPE_F32, 4);
    EXPECT_REJECT(&g, "has 5 dimensions");
    gb_init(&g);
    gb_tensor(&g, "a", 0xFFFFFFFFu, (uint64_t[]){1}, LI_TYPE_F32, 4);
    EXPECT_REJECT(&g, "dimensions");
    gb_init(&g);
    gb_tensor(&g, "a", 2, (uint64_t[]){4, 0}, LI_TYPE_F32, 16);
    EXPECT_REJECT(&g, "invalid dimension 1 = 0");
    gb_init(&g);
    gb_tensor(&g, "a", 2, (uint64_t[]){1ull << 32, 1ull << 32}, LI_TYPE_F32, 16);
    EXPECT_REJECT(&g, "invalid dimension");
    gb_init(&g);
    gb_tensor(&g, "a", 4, (uint64_t[]){1 << 16, 1 << 16, 1 << 16, 1 << 16}, LI_TYPE_F32, 16);
    EXPECT_REJECT(&g, "invalid dimension 3");
    gb_init(&g);
    gb_tensor(&g, "a", 1, (uint64_t[]){UINT64_MAX}, LI_TYPE_F32, 16);
    EXPECT_REJECT(&g, "invalid dimension 0");
    /* element count fits, byte size does not */
    gb_init(&g);
    gb_tensor(&g, "a", 1, (uint64_t[]){1ull << 62}, LI_TYPE_F32, 16);
    EXPECT_REJECT(&g, "overflows");
    /* element count beyond int64 with a block type: size fits, the file does not */
    gb_init(&g);
    gb_tensor(&g, "a", 2, (uint64_t[]){1ull << 32, 3ull << 30}, LI_TYPE_Q4_0, 16);
    {
        li_gguf gg;
        uint8_t *buf;
        li_error err;
        int rc = gb_parse(&g, &gg, &buf, &err);
        CHECK(rc == LI_EINVAL, "element count beyond int64 accepted");
        if (rc == 0) li_gguf_free(&gg);
        free(buf);
        gb_free(&g);
    }

    gb_init(&g);
    gb_tensor(&g, "a", 2, (uint64_t[]){33, 2}, LI_TYPE_Q4_0, 18 * 4);
    EXPECT_REJECT(&g, "not a multiple of");
    gb_init(&g);
    gb_tensor(&g, "a", 1, (uint64_t[]){16}, LI_TYPE_Q8_0, 34);
    EXPECT_REJECT(&g, "row length 16");

    /* tensor name past end of file */
    gb_init(&g);
    w_u64(&g.ti, 1ull << 40);
    w_bytes(&g.ti, "abcdefghabcdefghabcdefghabcdefghabcdefgh", 40);
    g.n_tensors = 1;
    EXPECT_REJECT(&g, "past end of file");

    /* tensor infos end, but the padding before the data does not fit */
    gb_init(&g);
    gb_tensor(&g, "a", 1, (uint64_t[]){1}, LI_TYPE_F32, 4);
    {
        size_t size;
        uint8_t *full = gb_finish(&g, &size);
        size_t info_end = 24 + g.kv.n + g.ti.n;
        li_gguf gg;
        li_error err = {0};
        int rc = li_gguf_init_from_memory(&gg, full, info_end + 1, &err);
        if (rc == 0) li_gguf_free(&gg);
        CHECK(rc == LI_EINVAL && strstr(err.msg, "data section"), "padding cut: %s", err.msg);
        free(full);
        gb_free(&g);
    }
}

/* ==== files on disk ====================================================== */

static void test_open(void) {
    li_gguf gg;
    li_error err = {0};
    int rc = li_gguf_open(&gg, "/nonexistent/dir/model.gguf", &err);
    CHECK(rc == LI_EIO && strstr(err.msg, "/nonexistent/dir/model.gguf"), "missing file: rc=%d %s", rc, err.msg);
    rc = li_gguf_open(&gg, "/tmp", &err);
    CHECK(rc == LI_EIO && strstr(err.msg, "not a regular file"), "directory: rc=%d %s", rc, err.msg);

    char path[] = "/tmp/test_gguf_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp: %s", strerror(errno));
    if (fd < 0) return;
    /* too small to be GGUF */
    CHECK(write(fd, "GGUF", 4) == 4, "write");
    rc = li_gguf_open(&gg, path, &err);
    CHECK(rc == LI_EINVAL && strstr(err.msg, "too small"), "tiny file: rc=%d %s", rc, err.msg);
    /* a valid file through mmap */
    gbuild g;
    build_valid(&g, 3);
    size_t size;
    uint8_t *full = gb_finish(&g, &size);
    CHECK(ftruncate(fd, 0) == 0 && pwrite(fd, full, size, 0) == (ssize_t)size, "write file");
    rc = li_gguf_open(&gg, path, &err);
    CHECK(rc == 0 && gg.map != NULL && gg.n_tensors == 3, "open valid file: %s", err.msg);
    if (rc == 0) {
        const li_gguf_tensor *t = li_gguf_find_tensor(&gg, "w.q8_0");
        CHECK(t && memcmp(t->data, full + (size - 34), 34) == 0, "mapped tensor bytes");
        li_gguf_free(&gg);
    }
    /* a corrupt file through mmap: error, and the mapping released */
    full[0] = 'X';
    CHECK(pwrite(fd, full, size, 0) == (ssize_t)size, "write file");
    rc = li_gguf_open(&gg, path, &err);
    CHECK(rc == LI_EINVAL && strstr(err.msg, "bad magic") && gg.map == NULL, "open corrupt file: %s", err.msg);
    close(fd);
    unlink(path);
    free(full);
    gb_free(&g);
}

/* The default model, when tools/setup.sh has fetched it. */
static void test_real_model(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s/models/SmolLM2-135M-Instruct.Q4_1.gguf", source_dir());
    struct stat st;
    if (stat(path, &st) != 0) {
        printf("SKIP real-model part: %s: %s (run tools/setup.sh)\n", path, strerror(errno));
        return;
    }
    li_gguf gg;
    li_error err = {0};
    int rc = li_gguf_open(&gg, path, &err);
    CHECK(rc == 0, "real model: %s", err.msg);
    if (rc) return;
    CHECK(gg.version == 3, "version %u", gg.version);
    CHECK(gg.n_tensors == 272, "n_tensors %llu", (unsigned long long)gg.n_tensors);
    CHECK(gg.n_kv == 33, "n_kv %llu", (unsigned long long)gg.n_kv);
    uint32_t blocks = 0;
    CHECK(li_gguf_get_u32(&gg, "llama.block_count", &blocks, &err) == 0 && blocks == 30, "block_count %u",
          blocks);
    li_str arch;
    CHECK(li_gguf_get_str(&gg, "general.architecture", &arch, &err) == 0 && li_str_eq(arch, "llama"), "arch");
    const li_gguf_kv *tok = li_gguf_get_arr(&gg, "tokenizer.ggml.tokens", LI_GGUF_STRING, &err);
    CHECK(tok && tok->v.arr.n == 49152, "tokenizer.ggml.tokens");
    const li_gguf_tensor *emb = li_gguf_find_tensor(&gg, "token_embd.weight");
    CHECK(emb && emb->ne[0] == 576 && emb->ne[1] == 49152, "token_embd.weight");
    int n_q4_1 = 0, in_range = 0;
    for (uint64_t i = 0; i < gg.n_tensors; i++) {
        const li_gguf_tensor *t = &gg.tensors[i];
        n_q4_1 += t->type == LI_TYPE_Q4_1;
        in_range += (const uint8_t *)t->data >= gg.buf + gg.data_offset &&
                    (const uint8_t *)t->data + t->nbytes <= gg.buf + gg.size;
    }
    CHECK(n_q4_1 == 210, "Q4_1 tensors: %d", n_q4_1);
    CHECK(in_range == 272, "tensors inside the file: %d", in_range);
    li_gguf_free(&gg);
}

int main(void) {
    test_valid(3);
    test_valid(2);
    test_custom_alignment();
    test_header();
    test_truncation();
    test_metadata();
    test_alignment();
    test_tensors();
    test_open();
    test_real_model();
    return t_summary("gguf");
}
