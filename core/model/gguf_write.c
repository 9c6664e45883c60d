/* gguf_write.c — GGUF v3 writer. Owns: serializing metadata and tensor
 * infos, laying out aligned tensor data, and the temp-file-and-rename
 * write. The format is the one gguf.c reads (little-endian, strings as u64
 * length + bytes). */
#define _GNU_SOURCE
#include "model/gguf_write.h"
#include "types.h"
#include "util/tmpguard.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GGUF_MAGIC 0x46554747u /* "GGUF" */
#define GGUF_VERSION 3u
#define GGUF_DEFAULT_ALIGNMENT 32

/* ------------------------------------------------------------------------
 * the metadata buffer
 * ---------------------------------------------------------------------- */

static void put(li_gguf_writer *w, const void *p, size_t n) {
    if (w->kv_len + n > w->kv_cap) {
        w->kv_cap = LI_MAX(w->kv_len + n, 2 * w->kv_cap + 256);
        w->kv = li_xrealloc(w->kv, w->kv_cap);
    }
    memcpy(w->kv + w->kv_len, p, n);
    w->kv_len += n;
}

static void put_u32(li_gguf_writer *w, uint32_t v) { put(w, &v, 4); }
static void put_u64(li_gguf_writer *w, uint64_t v) { put(w, &v, 8); }

static void put_str(li_gguf_writer *w, const char *s, uint64_t len) {
    put_u64(w, len);
    put(w, s, (size_t)len);
}

void li_gguf_writer_init(li_gguf_writer *w) {
    memset(w, 0, sizeof *w);
    w->alignment = GGUF_DEFAULT_ALIGNMENT;
}

void li_gguf_writer_free(li_gguf_writer *w) {
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        free(w->tensors[i].name);
        free(w->tensors[i].data);
    }
    free(w->tensors);
    free(w->kv);
    memset(w, 0, sizeof *w);
}

/* Walks the serialized keys: each kv starts with its key string; the value
 * that follows is skipped by its type. Used for duplicate checks only. */
static size_t skip_value(const uint8_t *p, uint32_t t) {
    if (t == LI_GGUF_STRING) {
        uint64_t n;
        memcpy(&n, p, 8);
        return 8 + (size_t)n;
    }
    if (t != LI_GGUF_ARRAY) return li_gguf_vtype_size((li_gguf_vtype)t);
    uint32_t et;
    uint64_t n;
    memcpy(&et, p, 4);
    memcpy(&n, p + 4, 8);
    size_t at = 12;
    if (et != LI_GGUF_STRING) return at + (size_t)n * li_gguf_vtype_size((li_gguf_vtype)et);
    for (uint64_t i = 0; i < n; i++) at += skip_value(p + at, LI_GGUF_STRING);
    return at;
}

bool li_gguf_writer_has_kv(const li_gguf_writer *w, const char *key) {
    const size_t kl = strlen(key);
    size_t at = 0;
    for (uint64_t i = 0; i < w->n_kv; i++) {
        uint64_t n;
        memcpy(&n, w->kv + at, 8);
        const bool hit = n == kl && !memcmp(w->kv + at + 8, key, kl);
        at += 8 + (size_t)n;
        uint32_t t;
        memcpy(&t, w->kv + at, 4);
        at += 4;
        if (hit) return true;
        at += skip_value(w->kv + at, t);
    }
    return false;
}

static int begin_kv(li_gguf_writer *w, const char *key, uint64_t key_len, uint32_t type, li_error *err) {
    char k[256];
    if (key_len == 0 || key_len >= sizeof k) return li_error_set(err, LI_EINVAL, "gguf write: bad key length %llu",
                                                               (unsigned long long)key_len);
    memcpy(k, key, (size_t)key_len);
    k[key_len] = 0;
    if (li_gguf_writer_has_kv(w, k)) return li_error_set(err, LI_EINVAL, "gguf write: duplicate key '%s'", k);
    put_str(w, key, key_len);
    put_u32(w, type);
    w->n_kv++;
    return 0;
}

/* ------------------------------------------------------------------------
 * metadata
 * ---------------------------------------------------------------------- */

static void put_scalar(li_gguf_writer *w, uint32_t t, const li_gguf_kv *kv) {
    uint8_t b[8];
    switch (t) {
    case LI_GGUF_UINT8: case LI_GGUF_BOOL: b[0] = (uint8_t)kv->v.u64; break;
    case LI_GGUF_INT8: b[0] = (uint8_t)(int8_t)kv->v.i64; break;
    case LI_GGUF_UINT16: { uint16_t x = (uint16_t)kv->v.u64; memcpy(b, &x, 2); break; }
    case LI_GGUF_INT16: { int16_t x = (int16_t)kv->v.i64; memcpy(b, &x, 2); break; }
    case LI_GGUF_UINT32: { uint32_t x = (uint32_t)kv->v.u64; memcpy(b, &x, 4); break; }
    case LI_GGUF_INT32: { int32_t x = (int32_t)kv->v.i64; memcpy(b, &x, 4); break; }
    case LI_GGUF_FLOAT32: { float x = (float)kv->v.f64; memcpy(b, &x, 4); break; } /* read from f32: exact */
    case LI_GGUF_UINT64: memcpy(b, &kv->v.u64, 8); break;
    case LI_GGUF_INT64: memcpy(b, &kv->v.i64, 8); break;
    case LI_GGUF_FLOAT64: memcpy(b, &kv->v.f64, 8); break;
    default: return;
    }
    put(w, b, li_gguf_vtype_size((li_gguf_vtype)t));
}

int li_gguf_writer_add_kv(li_gguf_writer *w, const li_gguf_kv *kv, li_error *err) {
    int rc = begin_kv(w, kv->key.ptr, kv->key.len, kv->type, err);
    if (rc) return rc;
    if (kv->type == LI_GGUF_STRING) {
        put_str(w, kv->v.str.ptr, kv->v.str.len);
    } else if (kv->type == LI_GGUF_ARRAY) {
        put_u32(w, kv->v.arr.type);
        put_u64(w, kv->v.arr.n);
        if (kv->v.arr.type == LI_GGUF_STRING)
            for (uint64_t i = 0; i < kv->v.arr.n; i++) put_str(w, kv->v.arr.strs[i].ptr, kv->v.arr.strs[i].len);
        else
            /* raw little-endian elements */
            put(w, kv->v.arr.data, (size_t)kv->v.arr.n * li_gguf_vtype_size((li_gguf_vtype)kv->v.arr.type));
    } else {
        put_scalar(w, kv->type, kv);
    }
    if (kv->type == LI_GGUF_UINT32 && li_str_eq(kv->key, "general.alignment")) {
        if (kv->v.u64 == 0 || (kv->v.u64 & (kv->v.u64 - 1)))
            return li_error_set(err, LI_EINVAL, "gguf write: general.alignment %llu is not a power of two",
                                (unsigned long long)kv->v.u64);
        w->alignment = (size_t)kv->v.u64;
    }
    return 0;
}

int li_gguf_writer_add_str(li_gguf_writer *w, const char *key, const char *val, li_error *err) {
    li_gguf_kv kv = {.key = {key, strlen(key)}, .type = LI_GGUF_STRING, .v.str = {val, strlen(val)}};
    return li_gguf_writer_add_kv(w, &kv, err);
}

int li_gguf_writer_add_u32(li_gguf_writer *w, const char *key, uint32_t val, li_error *err) {
    li_gguf_kv kv = {.key = {key, strlen(key)}, .type = LI_GGUF_UINT32, .v.u64 = val};
    return li_gguf_writer_add_kv(w, &kv, err);
}

int li_gguf_writer_add_f32(li_gguf_writer *w, const char *key, float val, li_error *err) {
    li_gguf_kv kv = {.key = {key, strlen(key)}, .type = LI_GGUF_FLOAT32, .v.f64 = val};
    return li_gguf_writer_add_kv(w, &kv, err);
}

int li_gguf_writer_add_bool(li_gguf_writer *w, const char *key, bool val, li_error *err) {
    li_gguf_kv kv = {.key = {key, strlen(key)}, .type = LI_GGUF_BOOL, .v.u64 = val};
    return li_gguf_writer_add_kv(w, &kv, err);
}

/* ------------------------------------------------------------------------
 * tensors
 * ---------------------------------------------------------------------- */

int li_gguf_writer_add_tensor(li_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                              const int64_t *ne, void *data, size_t nbytes, li_error *err) {
    size_t want = 0;
    int64_t rows = 1;
    for (uint32_t d = 1; d < n_dims && d < 4; d++) rows *= ne[d];
    if (!li_type_get(type) || n_dims == 0 || n_dims > 4 || ne[0] <= 0 || rows <= 0 ||
        !li_type_row_size(type, ne[0], &want) || li_mul_overflow(want, (size_t)rows, &want) || want != nbytes) {
        free(data);
        return li_error_set(err, LI_EINVAL, "gguf write: tensor '%s': %s data of %zu bytes does not fit its shape",
                            name, li_type_name(type), nbytes);
    }
    for (uint64_t i = 0; i < w->n_tensors; i++)
        if (!strcmp(w->tensors[i].name, name)) {
            free(data);
            return li_error_set(err, LI_EINVAL, "gguf write: duplicate tensor '%s'", name);
        }
    if (w->n_tensors == w->tensors_cap) {
        w->tensors_cap = w->tensors_cap ? 2 * w->tensors_cap : 64;
        w->tensors = li_xrealloc(w->tensors, (size_t)w->tensors_cap * sizeof *w->tensors);
    }
    li_gguf_wtensor *t = &w->tensors[w->n_tensors++];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    if (!t->name) abort();
    t->n_dims = n_dims;
    for (int d = 0; d < 4; d++) t->ne[d] = d < (int)n_dims ? ne[d] : 1;
    t->type = type;
    t->data = data;
    t->nbytes = nbytes;
    return 0;
}

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* The header, metadata and tensor infos, then each tensor's offset. */
static size_t header_size(const li_gguf_writer *w) {
    size_t at = 4 + 4 + 8 + 8 + w->kv_len;
    for (uint64_t i = 0; i < w->n_tensors; i++) at += 8 + strlen(w->tensors[i].name) + 4 + 8 * w->tensors[i].n_dims + 4 + 8;
    return at;
}

size_t li_gguf_writer_size(const li_gguf_writer *w) {
    size_t at = align_up(header_size(w), w->alignment);
    for (uint64_t i = 0; i < w->n_tensors; i++) at = align_up(at, w->alignment) + w->tensors[i].nbytes;
    return at;
}

/* ------------------------------------------------------------------------
 * the file
 * ---------------------------------------------------------------------- */

static bool fput(FILE *f, const void *p, size_t n) { return n == 0 || fwrite(p, 1, n, f) == n; }

static bool fpad(FILE *f, size_t n) {
    static const uint8_t zeros[64];
    while (n) {
        const size_t c = LI_MIN(n, sizeof zeros);
        if (!fput(f, zeros, c)) return false;
        n -= c;
    }
    return true;
}

static bool write_all(const li_gguf_writer *w, FILE *f) {
    const uint32_t magic = GGUF_MAGIC, version = GGUF_VERSION;
    bool ok = fput(f, &magic, 4) && fput(f, &version, 4) && fput(f, &w->n_tensors, 8) && fput(f, &w->n_kv, 8) &&
              fput(f, w->kv, w->kv_len);
    uint64_t off = 0;
    for (uint64_t i = 0; ok && i < w->n_tensors; i++) {
        const li_gguf_wtensor *t = &w->tensors[i];
        const uint64_t nl = strlen(t->name);
        off = align_up((size_t)off, w->alignment);
        ok = fput(f, &nl, 8) && fput(f, t->name, (size_t)nl) && fput(f, &t->n_dims, 4) &&
             fput(f, t->ne, 8 * (size_t)t->n_dims) && fput(f, &t->type, 4) && fput(f, &off, 8);
        off += t->nbytes;
    }
    size_t at = header_size(w);
    ok = ok && fpad(f, align_up(at, w->alignment) - at);
    at = 0;
    for (uint64_t i = 0; ok && i < w->n_tensors; i++) {
        ok = fpad(f, align_up(at, w->alignment) - at) && fput(f, w->tensors[i].data, w->tensors[i].nbytes);
        at = align_up(at, w->alignment) + w->tensors[i].nbytes;
    }
    return ok;
}

int li_gguf_writer_write(const li_gguf_writer *w, const char *path, li_error *err) {
    char *tmp = NULL;
    if (asprintf(&tmp, "%s.tmp.%ld", path, (long)getpid()) < 0) abort();
    FILE *f = fopen(tmp, "wb");
    const int guard = f ? li_tmpguard_add(tmp) : -1; /* SIGINT / SIGTERM while writing remove it */
    if (!f) {
        int e = errno;
        free(tmp);
        return li_error_set(err, LI_EIO, "cannot write '%s': %s", path, strerror(e));
    }
    bool ok = write_all(w, f);
    int e = ok ? 0 : errno;
    if (fflush(f) != 0 && ok) ok = false, e = errno;
    if (ok && !w->scratch && fsync(fileno(f)) != 0) ok = false, e = errno;
    if (fclose(f) != 0 && ok) ok = false, e = errno;
    if (ok && rename(tmp, path) != 0) ok = false, e = errno;
    if (!ok) unlink(tmp);
    li_tmpguard_release(guard);
    free(tmp);
    if (!ok) return li_error_set(err, LI_EIO, "cannot write '%s': %s", path, strerror(e ? e : EIO));
    return 0;
}
