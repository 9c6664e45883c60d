/* fuzz_gguf.c — the GGUF reader on arbitrary bytes.
 *
 * Whatever the input, li_gguf_init_from_memory must either fail with
 * LI_EINVAL and a "gguf: ..." message, or succeed with every string, array
 * and tensor range inside the buffer; we touch the first and last byte of
 * each range so the sanitizers catch any that is not. A parsed file then
 * goes through the EAGLE draft and Medusa heads checks (spec/eagle_file.h,
 * spec/medusa_file.h) against a base made of the file's own claims, so the
 * fuzzer reaches their tensor and vocabulary checks: each must fail with a
 * one-line message or hand back tensors of the right shape. Invariant
 * breaks abort() so the fuzzer records them as crashes. */
#include "model/gguf.h"
#include "spec/eagle_file.h"
#include "spec/medusa_file.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile uint8_t sink;

static void fail(const char *what) {
    fprintf(stderr, "fuzz_gguf: invariant broken: %s\n", what);
    abort();
}

/* The range [p, p+n) must lie in [buf, buf+size); touch its ends. */
static void touch(const uint8_t *buf, size_t size, const void *ptr, uint64_t n, const char *what) {
    const uint8_t *p = ptr;
    if (n == 0) return;
    if (!p || p < buf || n > size || (size_t)(p - buf) > size - n) fail(what);
    sink ^= p[0];
    sink ^= p[n - 1];
}

static size_t elem_size(li_gguf_vtype t) {
    switch (t) {
    case LI_GGUF_UINT8: case LI_GGUF_INT8: case LI_GGUF_BOOL: return 1;
    case LI_GGUF_UINT16: case LI_GGUF_INT16: return 2;
    case LI_GGUF_UINT32: case LI_GGUF_INT32: case LI_GGUF_FLOAT32: return 4;
    case LI_GGUF_UINT64: case LI_GGUF_INT64: case LI_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

static int64_t claim(const li_gguf *g, const char *key) {
    uint64_t v = 0;
    li_error e;
    return li_gguf_get_u64(g, key, &v, &e) || v > INT32_MAX ? 0 : (int64_t)v;
}

static void check_drafts(const li_gguf *g) {
    li_error err = {0};
    uint64_t hash = 0;
    (void)li_gguf_get_hex64(g, "eagle.base.vocab_hash", &hash);
    const li_eagle_base eb = {.name = NULL, .n_embd = claim(g, "eagle.n_embd"), .n_vocab = claim(g, "eagle.n_vocab"),
                              .n_layer = claim(g, "eagle.base.n_layer"), .head_dim = claim(g, "eagle.head_dim"),
                              .vocab_hash = hash};
    li_eagle_file ef;
    int rc = li_eagle_file_check(g, "fuzz", &eb, &ef, &err);
    if (rc && strncmp(err.msg, "eagle: ", 7)) fail("eagle check: message");
    /* the file alone (luainfer info): the base claimed above is the file's own */
    li_eagle_file ef0;
    li_error e0 = {0};
    if ((li_eagle_file_check(g, "fuzz", NULL, &ef0, &e0) != 0) != (rc != 0)) fail("eagle check: without a base");
    if (!rc) {
        for (int t = 0; t < LI_EAGLE_N_TENSORS; t++)
            if (!ef.t[t] || ef.t[t]->ne[0] < 1) fail("eagle check: tensor");
        if (ef.n_draft < 1 || ef.n_draft > ef.n_vocab) fail("eagle check: draft vocabulary");
        for (int32_t i = 0; ef.vocab && i < ef.n_draft; i++)
            if (ef.vocab[i] < 0 || ef.vocab[i] >= ef.n_vocab || (i && ef.vocab[i] <= ef.vocab[i - 1]))
                fail("eagle check: vocabulary ids");
    }
    hash = 0;
    (void)li_gguf_get_hex64(g, "medusa.base.vocab_hash", &hash);
    const li_medusa_base mb = {.name = NULL, .n_embd = claim(g, "medusa.n_embd"),
                               .n_vocab = claim(g, "medusa.n_vocab"), .vocab_hash = hash};
    li_medusa_file mf;
    err = (li_error){0};
    rc = li_medusa_file_check(g, "fuzz", &mb, &mf, &err);
    if (rc && strncmp(err.msg, "medusa: ", 8)) fail("medusa check: message");
    li_medusa_file mf0;
    e0 = (li_error){0};
    if ((li_medusa_file_check(g, "fuzz", NULL, &mf0, &e0) != 0) != (rc != 0)) fail("medusa check: without a base");
    if (!rc)
        for (int32_t k = 0; k < mf.n_heads; k++)
            if (!mf.w[k] || !mf.b[k] || mf.w[k]->ne[0] != mf.n_embd) fail("medusa check: head");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* our own copy: the parser keeps pointers into it until li_gguf_free */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    if (size) memcpy(buf, data, size);
    li_gguf g;
    li_error err = {0};
    int rc = li_gguf_init_from_memory(&g, buf, size, &err);
    if (rc != 0) {
        if (rc != LI_EINVAL) fail("error code is not LI_EINVAL");
        if (strncmp(err.msg, "gguf: ", 6) != 0) fail("error message missing");
        free(buf);
        return 0;
    }
    if (g.alignment == 0 || (g.alignment & (g.alignment - 1))) fail("alignment");
    if (g.n_tensors && (g.data_offset > size || g.data_offset % g.alignment)) fail("data offset");
    for (uint64_t i = 0; i < g.n_kv; i++) {
        const li_gguf_kv *kv = &g.kv[i];
        if (kv->key.len == 0) fail("empty key");
        touch(buf, size, kv->key.ptr, kv->key.len, "key");
        if (kv->type == LI_GGUF_STRING) {
            touch(buf, size, kv->v.str.ptr, kv->v.str.len, "string value");
        } else if (kv->type == LI_GGUF_ARRAY) {
            if (kv->v.arr.type == LI_GGUF_STRING) {
                if (kv->v.arr.n && !kv->v.arr.strs) fail("string array without strings");
                for (uint64_t j = 0; j < kv->v.arr.n; j++)
                    touch(buf, size, kv->v.arr.strs[j].ptr, kv->v.arr.strs[j].len, "array string");
            } else {
                size_t es = elem_size(kv->v.arr.type);
                if (!es) fail("array element type");
                if (kv->v.arr.n > size / es) fail("array count");
                touch(buf, size, kv->v.arr.data, kv->v.arr.n * es, "array data");
            }
        } else if ((unsigned)kv->type >= LI_GGUF_VTYPE_COUNT) {
            fail("value type");
        }
        /* the lookups must find this key (first match: keys are unique) */
        char key[256];
        if (kv->key.len < sizeof key && !memchr(kv->key.ptr, 0, kv->key.len)) {
            memcpy(key, kv->key.ptr, kv->key.len);
            key[kv->key.len] = 0;
            if (li_gguf_find_kv(&g, key) != kv) fail("find_kv");
            uint64_t u;
            float f;
            li_str s;
            li_error e2;
            (void)li_gguf_get_u64(&g, key, &u, &e2);
            (void)li_gguf_get_f32(&g, key, &f, &e2);
            (void)li_gguf_get_str(&g, key, &s, &e2);
            (void)li_gguf_get_arr(&g, key, LI_GGUF_STRING, &e2);
        }
    }
    for (uint64_t i = 0; i < g.n_tensors; i++) {
        const li_gguf_tensor *t = &g.tensors[i];
        touch(buf, size, t->name.ptr, t->name.len, "tensor name");
        if (t->n_dims < 1 || t->n_dims > 4) fail("n_dims");
        for (int d = 0; d < 4; d++)
            if (t->ne[d] < 1) fail("dimension");
        if (t->nbytes == 0) fail("tensor size");
        if (t->offset % g.alignment) fail("tensor offset alignment");
        if ((const uint8_t *)t->data != buf + g.data_offset + t->offset) fail("tensor data pointer");
        touch(buf, size, t->data, t->nbytes, "tensor data");
    }
    check_drafts(&g);
    li_gguf_free(&g);
    free(buf);
    return 0;
}
