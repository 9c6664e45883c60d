/* test_safetensors.c — the safetensors reader on files built byte by byte.
 *
 * Each test writes the 8-byte length, a JSON header and a data area it
 * states exactly, so every corruption is one the test names: truncated
 * files, a header length past EOF or over the limit, bad JSON, offsets out
 * of range or backwards, overlapping tensors, holes, unknown and unsupported
 * dtypes, shape/size mismatches, duplicate names. Valid files must parse to
 * what was written; bad ones must fail with the right code and a one-line
 * "safetensors: FILE: ..." message, never crash (the sanitizer build runs
 * this too). Files written by the real `safetensors` package are checked by
 * tests/integration/test_hf.py. */
#define _GNU_SOURCE
#include "model/safetensors.h"
#include "test_util.h"
#include "types.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ==== building files ======================================================= */

typedef struct file {
    uint8_t *p;
    size_t n;
} file;

/* [u64 len][header][data] with the header length taken from the string. */
static file make(const char *header, const void *data, size_t data_len) {
    size_t h = strlen(header);
    file f = {malloc(8 + h + data_len + 1), 8 + h + data_len};
    uint64_t len = h;
    for (int i = 0; i < 8; i++) f.p[i] = (uint8_t)(len >> (8 * i));
    memcpy(f.p + 8, header, h);
    if (data_len) memcpy(f.p + 8 + h, data, data_len);
    return f;
}

static void set_len(file *f, uint64_t len) {
    for (int i = 0; i < 8; i++) f->p[i] = (uint8_t)(len >> (8 * i));
}

static uint8_t zeros[4096];

/* Parses f and expects failure with code, the file name and `needle` in a
 * one-line message. */
static void expect_fail(const char *what, file f, int code, const char *needle) {
    li_safetensors st;
    li_error err = {0};
    int rc = li_safetensors_init_from_memory(&st, f.p, f.n, "t.safetensors", &err);
    CHECK(rc == code, "%s: rc %d, expected %d (%s)", what, rc, code, err.msg);
    CHECK(!strncmp(err.msg, "safetensors: t.safetensors: ", 28), "%s: message '%s'", what, err.msg);
    CHECK(strstr(err.msg, needle) != NULL, "%s: message '%s' lacks '%s'", what, err.msg, needle);
    CHECK(!strchr(err.msg, '\n'), "%s: message has a newline", what);
    if (rc == 0) li_safetensors_free(&st);
    free(f.p);
}

/* ==== valid files ============================================================ */

static void test_valid(void) {
    /* an F32 (2, 3) at [0, 24), a BF16 (4) at [24, 32), an F16 scalar at
     * [32, 34), metadata, and the writer's space padding */
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t b[4] = {0x3F80, 0x4000, 0xC000, 0x0000}; /* 1, 2, -2, 0 in BF16 */
    uint16_t c = 0x3C00;                              /* 1 in F16 */
    uint8_t data[34];
    memcpy(data, a, 24);
    memcpy(data + 24, b, 8);
    memcpy(data + 32, &c, 2);
    file f = make("{\"__metadata__\":{\"format\":\"pt\"},"
                  "\"z.weight\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
                  "\"a.weight\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                  "\"s\":{\"dtype\":\"F16\",\"shape\":[],\"data_offsets\":[32,34]}}    ",
                  data, sizeof data);
    li_safetensors st;
    li_error err = {0};
    int rc = li_safetensors_init_from_memory(&st, f.p, f.n, "ok.safetensors", &err);
    CHECK(rc == 0, "valid file: %s", err.msg);
    if (rc == 0) {
        CHECK(st.n_tensors == 3, "n_tensors %d", st.n_tensors);
        const li_st_tensor *t = li_safetensors_find(&st, "a.weight");
        CHECK(t && t->type == LI_TYPE_F32 && t->n_dims == 2 && t->shape[0] == 2 && t->shape[1] == 3 &&
                  t->n_elem == 6 && t->nbytes == 24,
              "a.weight fields");
        CHECK(t && t->data == f.p + st.data_offset && !memcmp(t->data, a, 24), "a.weight data");
        t = li_safetensors_find(&st, "z.weight");
        CHECK(t && t->type == LI_TYPE_BF16 && t->n_dims == 1 && t->shape[0] == 4 && t->begin == 24 && t->end == 32,
              "z.weight fields");
        CHECK(t && !memcmp(t->data, b, 8), "z.weight data");
        t = li_safetensors_find(&st, "s");
        CHECK(t && t->type == LI_TYPE_F16 && t->n_dims == 0 && t->n_elem == 1 && t->nbytes == 2, "scalar");
        CHECK(li_safetensors_find(&st, "__metadata__") == NULL, "metadata is not a tensor");
        CHECK(li_safetensors_find(&st, "missing") == NULL, "missing tensor");
        li_safetensors_free(&st);
    }
    free(f.p);

    /* no tensors at all, and a zero-size tensor */
    f = make("{}", NULL, 0);
    rc = li_safetensors_init_from_memory(&st, f.p, f.n, "empty", &err);
    CHECK(rc == 0 && st.n_tensors == 0, "empty header: %s", err.msg);
    if (rc == 0) li_safetensors_free(&st);
    free(f.p);
    f = make("{\"e\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[0,0]},"
             "\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
             zeros, 4);
    rc = li_safetensors_init_from_memory(&st, f.p, f.n, "zero", &err);
    CHECK(rc == 0 && st.n_tensors == 2, "zero-size tensor: %s", err.msg);
    if (rc == 0) li_safetensors_free(&st);
    free(f.p);
}

/* ==== corrupt files =========================================================== */

#define ONE(dtype, shape, b, e) "{\"w\":{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":[" b "," e "]}}"

static void test_truncated(void) {
    file f = make(ONE("F32", "[4]", "0", "16"), zeros, 16);
    f.n = 5;
    expect_fail("shorter than the length", f, LI_EINVAL, "truncated");

    f = make(ONE("F32", "[4]", "0", "16"), zeros, 16);
    set_len(&f, f.n - 7); /* past EOF by one */
    expect_fail("header length past EOF", f, LI_EINVAL, "runs past the end");

    f = make(ONE("F32", "[4]", "0", "16"), zeros, 16);
    set_len(&f, UINT64_MAX);
    expect_fail("huge header length", f, LI_EINVAL, "limit");

    f = make(ONE("F32", "[4]", "0", "16"), zeros, 16);
    set_len(&f, (uint64_t)LI_ST_MAX_HEADER + 1);
    expect_fail("header length over the limit", f, LI_EINVAL, "limit");

    f = make(ONE("F32", "[4]", "0", "16"), zeros, 16);
    f.n -= 3; /* the data area lost its last bytes */
    expect_fail("truncated data", f, LI_EINVAL, "past the data area");

    f = make(ONE("F32", "[4]", "0", "16"), zeros, 16);
    set_len(&f, 10); /* the JSON is cut */
    expect_fail("header cut short", f, LI_EINVAL, "JSON");
}

static void test_bad_json(void) {
    expect_fail("unterminated", make("{\"w\":{\"dtype\":", NULL, 0), LI_EINVAL, "not valid JSON");
    expect_fail("array header", make("[1,2]", NULL, 0), LI_EINVAL, "not a JSON object");
    expect_fail("garbage after", make("{} x", NULL, 0), LI_EINVAL, "after the header");
    expect_fail("two objects", make("{}{}", NULL, 0), LI_EINVAL, "after the header");
    file f = make("{\"a\":1}  ", NULL, 0);
    f.p[8 + 7] = 0;
    expect_fail("NUL byte", f, LI_EINVAL, "NUL");
    expect_fail("entry not object", make("{\"w\":[1]}", NULL, 0), LI_EINVAL, "not an object");
    expect_fail("no dtype", make("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", zeros, 4), LI_EINVAL, "dtype");
    expect_fail("no shape", make("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", zeros, 4), LI_EINVAL, "shape");
    expect_fail("no offsets", make("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", zeros, 4), LI_EINVAL, "data_offsets");
    expect_fail("three offsets", make(ONE("F32", "[1]", "0", "4,8"), zeros, 8), LI_EINVAL, "data_offsets");
    expect_fail("string offset", make(ONE("F32", "[1]", "\"0\"", "4"), zeros, 4), LI_EINVAL, "data_offsets");
    expect_fail("metadata not object", make("{\"__metadata__\":3}", NULL, 0), LI_EINVAL, "__metadata__");
    expect_fail("metadata value not string", make("{\"__metadata__\":{\"k\":1}}", NULL, 0), LI_EINVAL,
                "__metadata__");
}

static void test_offsets(void) {
    expect_fail("end past data", make(ONE("F32", "[4]", "0", "16"), zeros, 12), LI_EINVAL, "past the data area");
    expect_fail("huge end", make(ONE("F32", "[4]", "0", "9007199254740992"), zeros, 16), LI_EINVAL,
                "past the data area");
    expect_fail("offset beyond 2^53", make(ONE("F32", "[4]", "0", "1e300"), zeros, 16), LI_EINVAL, "data_offsets");
    expect_fail("backwards", make(ONE("F32", "[0]", "8", "4"), zeros, 8), LI_EINVAL, "backwards");
    expect_fail("negative offset", make(ONE("F32", "[1]", "-4", "0"), zeros, 4), LI_EINVAL, "data_offsets");
    expect_fail("fractional offset", make(ONE("F32", "[1]", "0", "4.5"), zeros, 4), LI_EINVAL, "data_offsets");
    expect_fail("overlap",
                make("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                     zeros, 12),
                LI_EINVAL, "overlaps");
    expect_fail("same range twice",
                make("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                     zeros, 8),
                LI_EINVAL, "overlaps");
    expect_fail("hole",
                make("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                     "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
                     zeros, 12),
                LI_EINVAL, "hole");
    expect_fail("trailing bytes", make(ONE("F32", "[1]", "0", "4"), zeros, 8), LI_EINVAL, "cover 4 of the 8");
    expect_fail("duplicate name",
                make("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                     "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                     zeros, 8),
                LI_EINVAL, "twice");
}

static void test_dtype_shape(void) {
    expect_fail("unknown dtype", make(ONE("Q4", "[4]", "0", "16"), zeros, 16), LI_EINVAL, "unknown dtype 'Q4'");
    expect_fail("lowercase dtype", make(ONE("f32", "[4]", "0", "16"), zeros, 16), LI_EINVAL, "unknown dtype");
    expect_fail("dtype not string", make("{\"w\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", zeros, 4),
                LI_EINVAL, "dtype");
    expect_fail("unsupported dtype", make(ONE("I64", "[2]", "0", "16"), zeros, 16), LI_EUNSUP, "I64 is not supported");
    expect_fail("F64", make(ONE("F64", "[2]", "0", "16"), zeros, 16), LI_EUNSUP, "not supported");
    expect_fail("size mismatch", make(ONE("F32", "[3]", "0", "16"), zeros, 16), LI_EINVAL, "16 bytes for 3 F32");
    expect_fail("BF16 size mismatch", make(ONE("BF16", "[2,4]", "0", "8"), zeros, 8), LI_EINVAL, "expected 16");
    expect_fail("negative dim", make(ONE("F32", "[-1]", "0", "4"), zeros, 4), LI_EINVAL, "shape[0]");
    expect_fail("fractional dim", make(ONE("F32", "[2,1.5]", "0", "12"), zeros, 12), LI_EINVAL, "shape[1]");
    expect_fail("string dim", make(ONE("F32", "[\"4\"]", "0", "16"), zeros, 16), LI_EINVAL, "shape[0]");
    expect_fail("shape not array", make(ONE("F32", "4", "0", "16"), zeros, 16), LI_EINVAL, "shape");
    expect_fail("too many dims", make(ONE("F32", "[1,1,1,1,1,1,1,1,1]", "0", "4"), zeros, 4), LI_EINVAL,
                "dimensions");
    expect_fail("overflowing shape",
                make(ONE("F32", "[4294967296,4294967296,4294967296]", "0", "16"), zeros, 16), LI_EINVAL,
                "too many elements");
}

static void test_open(void) {
    li_safetensors st;
    li_error err = {0};
    int rc = li_safetensors_open(&st, "/nonexistent/x.safetensors", &err);
    CHECK(rc == LI_EIO && strstr(err.msg, "/nonexistent/x.safetensors"), "missing file: %d %s", rc, err.msg);
    rc = li_safetensors_open(&st, "/tmp", &err);
    CHECK(rc == LI_EIO && strstr(err.msg, "not a regular file"), "a directory: %d %s", rc, err.msg);

    char path[] = "/tmp/li_test_st_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp: %s", strerror(errno));
    if (fd < 0) return;
    float v[2] = {0.5f, -1.5f};
    file f = make(ONE("F32", "[2]", "0", "8"), v, 8);
    CHECK(write(fd, f.p, f.n) == (ssize_t)f.n, "write");
    rc = li_safetensors_open(&st, path, &err);
    CHECK(rc == 0, "open a valid file: %s", err.msg);
    if (rc == 0) {
        const li_st_tensor *t = li_safetensors_find(&st, "w");
        float got[2] = {0, 0};
        if (t) memcpy(got, t->data, sizeof got); /* our header is not padded: the data may be misaligned */
        CHECK(t && st.map && got[1] == -1.5f, "mapped data");
        li_safetensors_free(&st);
    }
    /* the same file cut short on disk */
    CHECK(ftruncate(fd, (off_t)f.n - 4) == 0, "ftruncate");
    rc = li_safetensors_open(&st, path, &err);
    CHECK(rc == LI_EINVAL && strstr(err.msg, path) && strstr(err.msg, "'w'"), "truncated on disk: %d %s", rc, err.msg);
    CHECK(ftruncate(fd, 0) == 0, "ftruncate");
    rc = li_safetensors_open(&st, path, &err);
    CHECK(rc == LI_EINVAL && strstr(err.msg, "truncated"), "empty file: %d %s", rc, err.msg);
    close(fd);
    unlink(path);
    free(f.p);
}

int main(void) {
    test_valid();
    test_truncated();
    test_bad_json();
    test_offsets();
    test_dtype_shape();
    test_open();
    return t_summary("safetensors");
}
