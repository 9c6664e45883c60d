/* gguf.c — GGUF v2/v3 reader. Owns: parsing and validating the header,
 * metadata key/values and tensor infos of a GGUF file mapped into memory.
 *
 * The parser walks a bounded cursor; every read checks the remaining bytes,
 * every count is checked against what the remaining bytes could possibly
 * hold before anything is allocated, so a hostile header cannot make us
 * allocate gigabytes or read past the mapping. */
#define _GNU_SOURCE
#include "gguf.h"
#include "../../kernels/types.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4

typedef struct cursor {
    const uint8_t *p;
    size_t pos, size;
    li_error *err;
    const char *what; /* what is being read, for messages */
} cursor;

static int need(cursor *c, size_t n) {
    if (n > c->size - c->pos)
        return li_error_set(c->err, LI_EINVAL,
                            "gguf: truncated file: %s needs %zu bytes at offset %zu, file has %zu",
                            c->what, n, c->pos, c->size);
    return 0;
}

#define READ_FN(name, T)                                   \
    static int name(cursor *c, T *out) {                   \
        if (need(c, sizeof(T))) return LI_EINVAL;          \
        memcpy(out, c->p + c->pos, sizeof(T));             \
        c->pos += sizeof(T);                               \
        return 0;                                          \
    }
READ_FN(rd_u32, uint32_t)
READ_FN(rd_u64, uint64_t)

static int rd_str(cursor *c, li_str *s) {
    uint64_t len;
    if (rd_u64(c, &len)) return LI_EINVAL;
    if (len > c->size - c->pos)
        return li_error_set(c->err, LI_EINVAL,
                            "gguf: %s: string length %llu at offset %zu runs past end of file",
                            c->what, (unsigned long long)len, c->pos - 8);
    s->ptr = (const char *)(c->p + c->pos);
    s->len = len;
    c->pos += len;
    return 0;
}

size_t li_gguf_vtype_size(li_gguf_vtype t) {
    switch (t) {
    case LI_GGUF_UINT8: case LI_GGUF_INT8: case LI_GGUF_BOOL: return 1;
    case LI_GGUF_UINT16: case LI_GGUF_INT16: return 2;
    case LI_GGUF_UINT32: case LI_GGUF_INT32: case LI_GGUF_FLOAT32: return 4;
    case LI_GGUF_UINT64: case LI_GGUF_INT64: case LI_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

const char *li_gguf_vtype_name(li_gguf_vtype t) {
    static const char *names[] = {"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
                                  "bool", "string", "array", "uint64", "int64", "float64"};
    return (unsigned)t < LI_GGUF_VTYPE_COUNT ? names[t] : "invalid";
}

bool li_str_eq(li_str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && memcmp(s.ptr, c, n) == 0;
}

/* Reads one scalar (non-string, non-array) into kv->v. */
static void scalar_decode(li_gguf_vtype t, const uint8_t *p, li_gguf_kv *kv) {
    switch (t) {
    case LI_GGUF_UINT8: kv->v.u64 = p[0]; break;
    case LI_GGUF_BOOL: kv->v.u64 = p[0] != 0; break;
    case LI_GGUF_INT8: kv->v.i64 = (int8_t)p[0]; break;
    case LI_GGUF_UINT16: { uint16_t x; memcpy(&x, p, 2); kv->v.u64 = x; break; }
    case LI_GGUF_INT16: { int16_t x; memcpy(&x, p, 2); kv->v.i64 = x; break; }
    case LI_GGUF_UINT32: { uint32_t x; memcpy(&x, p, 4); kv->v.u64 = x; break; }
    case LI_GGUF_INT32: { int32_t x; memcpy(&x, p, 4); kv->v.i64 = x; break; }
    case LI_GGUF_FLOAT32: { float x; memcpy(&x, p, 4); kv->v.f64 = x; break; }
    case LI_GGUF_UINT64: { uint64_t x; memcpy(&x, p, 8); kv->v.u64 = x; break; }
    case LI_GGUF_INT64: { int64_t x; memcpy(&x, p, 8); kv->v.i64 = x; break; }
    case LI_GGUF_FLOAT64: { double x; memcpy(&x, p, 8); kv->v.f64 = x; break; }
    default: break;
    }
}

static int parse_kv(cursor *c, li_gguf_kv *kv, uint64_t idx) {
    c->what = "metadata key";
    if (rd_str(c, &kv->key)) return LI_EINVAL;
    if (kv->key.len == 0)
        return li_error_set(c->err, LI_EINVAL, "gguf: metadata entry %llu has an empty key",
                            (unsigned long long)idx);
    uint32_t t;
    c->what = "metadata value type";
    if (rd_u32(c, &t)) return LI_EINVAL;
    if (t >= LI_GGUF_VTYPE_COUNT)
        return li_error_set(c->err, LI_EINVAL, "gguf: key '%.*s' has unknown value type %u",
                            (int)LI_MIN(kv->key.len, 128), kv->key.ptr, t);
    kv->type = (li_gguf_vtype)t;
    c->what = "metadata value";
    if (t == LI_GGUF_STRING) return rd_str(c, &kv->v.str);
    if (t != LI_GGUF_ARRAY) {
        size_t sz = li_gguf_vtype_size(kv->type);
        if (need(c, sz)) return LI_EINVAL;
        scalar_decode(kv->type, c->p + c->pos, kv);
        c->pos += sz;
        return 0;
    }
    uint32_t et;
    uint64_t n;
    if (rd_u32(c, &et) || rd_u64(c, &n)) return LI_EINVAL;
    if (et >= LI_GGUF_VTYPE_COUNT || et == LI_GGUF_ARRAY)
        return li_error_set(c->err, LI_EINVAL, "gguf: key '%.*s' is an array of %s (type %u)",
                            (int)LI_MIN(kv->key.len, 128), kv->key.ptr,
                            et == LI_GGUF_ARRAY ? "arrays, which is not supported" : "an unknown type",
                            et);
    kv->v.arr.type = (li_gguf_vtype)et;
    kv->v.arr.n = n;
    kv->v.arr.data = c->p + c->pos;
    kv->v.arr.strs = NULL;
    if (et == LI_GGUF_STRING) {
        /* each string takes at least 8 bytes (its length): bound n first */
        if (n > (c->size - c->pos) / 8)
            return li_error_set(c->err, LI_EINVAL,
                                "gguf: key '%.*s': array of %llu strings cannot fit in the file",
                                (int)LI_MIN(kv->key.len, 128), kv->key.ptr, (unsigned long long)n);
        kv->v.arr.strs = li_xmalloc((size_t)(n ? n : 1) * sizeof(li_str));
        for (uint64_t i = 0; i < n; i++)
            if (rd_str(c, &kv->v.arr.strs[i])) return LI_EINVAL;
        return 0;
    }
    size_t bytes;
    if (li_mul_overflow((size_t)n, li_gguf_vtype_size(kv->v.arr.type), &bytes) || n > SIZE_MAX ||
        need(c, bytes))
        return li_error_set(c->err, LI_EINVAL,
                            "gguf: key '%.*s': array of %llu %s runs past end of file",
                            (int)LI_MIN(kv->key.len, 128), kv->key.ptr, (unsigned long long)n,
                            li_gguf_vtype_name(kv->v.arr.type));
    c->pos += bytes;
    return 0;
}

static int parse_tensor_info(cursor *c, li_gguf_tensor *t, uint64_t idx) {
    c->what = "tensor name";
    if (rd_str(c, &t->name)) return LI_EINVAL;
    c->what = "tensor info";
    if (rd_u32(c, &t->n_dims)) return LI_EINVAL;
    const int nl = (int)LI_MIN(t->name.len, 128);
    if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS)
        return li_error_set(c->err, LI_EINVAL, "gguf: tensor %llu '%.*s' has %u dimensions (1..%d allowed)",
                            (unsigned long long)idx, nl, t->name.ptr, t->n_dims, GGUF_MAX_DIMS);
    size_t nel = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t ne;
        if (rd_u64(c, &ne)) return LI_EINVAL;
        if (ne == 0 || ne > (uint64_t)INT64_MAX || li_mul_overflow(nel, (size_t)ne, &nel))
            return li_error_set(c->err, LI_EINVAL, "gguf: tensor '%.*s' has invalid dimension %u = %llu",
                                nl, t->name.ptr, d, (unsigned long long)ne);
        t->ne[d] = (int64_t)ne;
    }
    /* later code counts elements in int64_t */
    if (nel > (size_t)INT64_MAX)
        return li_error_set(c->err, LI_EINVAL, "gguf: tensor '%.*s' element count overflows", nl, t->name.ptr);
    if (rd_u32(c, &t->type) || rd_u64(c, &t->offset)) return LI_EINVAL;
    const li_type_traits *tr = li_type_info(t->type);
    /* our scaled code types (FP8/INT8 KV, u4) are rows of the table but no
     * GGUF type: a file that uses their ids is refused, naming them */
    if (tr && !tr->gguf)
        return li_error_set(c->err, LI_EINVAL, "gguf: tensor '%.*s' has type %s (%u), which is not a GGUF type",
                            nl, t->name.ptr, tr->name, t->type);
    /* retired ids keep a slot in the traits table but have no block layout */
    if (!tr || tr->blck_size <= 0 || tr->type_size == 0)
        return li_error_set(c->err, LI_EINVAL, "gguf: tensor '%.*s' has unknown type %u", nl, t->name.ptr,
                            t->type);
    if (t->ne[0] % tr->blck_size != 0)
        return li_error_set(c->err, LI_EINVAL,
                            "gguf: tensor '%.*s': row length %lld is not a multiple of %s block size %lld",
                            nl, t->name.ptr, (long long)t->ne[0], tr->name, (long long)tr->blck_size);
    size_t blocks = nel / (size_t)tr->blck_size;
    if (li_mul_overflow(blocks, tr->type_size, &t->nbytes))
        return li_error_set(c->err, LI_EINVAL, "gguf: tensor '%.*s' byte size overflows", nl, t->name.ptr);
    return 0;
}

/* ---- duplicate detection: an open-addressing set of names --------------------
 * A hostile header may declare millions of entries; pairwise comparison
 * would be quadratic, so names are hashed (xxHash) into a table twice the
 * size of the count. */

typedef struct name_set {
    const li_str **slots;
    size_t mask;
} name_set;

static void name_set_init(name_set *ns, uint64_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    ns->slots = li_xcalloc(cap, sizeof *ns->slots);
    ns->mask = cap - 1;
}

/* Inserts s; false if an equal name was already there. */
static bool name_set_add(name_set *ns, const li_str *s) {
    size_t h = (size_t)XXH3_64bits(s->ptr, (size_t)s->len) & ns->mask;
    for (;; h = (h + 1) & ns->mask) {
        const li_str *o = ns->slots[h];
        if (!o) {
            ns->slots[h] = s;
            return true;
        }
        if (o->len == s->len && !memcmp(o->ptr, s->ptr, s->len)) return false;
    }
}

static int parse(li_gguf *g, li_error *err) {
    cursor c = {.p = g->buf, .pos = 0, .size = g->size, .err = err, .what = "header"};
    uint32_t magic;
    if (rd_u32(&c, &magic)) return LI_EINVAL;
    if (magic != GGUF_MAGIC)
        return li_error_set(err, LI_EINVAL, "gguf: bad magic 0x%08x (not a GGUF file)", magic);
    if (rd_u32(&c, &g->version)) return LI_EINVAL;
    if (g->version != 2 && g->version != 3)
        return li_error_set(err, LI_EINVAL, "gguf: unsupported version %u (2 and 3 are supported)",
                            g->version);
    if (rd_u64(&c, &g->n_tensors) || rd_u64(&c, &g->n_kv)) return LI_EINVAL;
    /* a kv needs at least 8+1+4+1 bytes, a tensor info 8+1+4+8+4+8: reject
     * counts the file cannot hold before allocating for them */
    size_t rest = g->size - c.pos;
    if (g->n_kv > rest / 13)
        return li_error_set(err, LI_EINVAL, "gguf: metadata count %llu cannot fit in a %zu-byte file",
                            (unsigned long long)g->n_kv, g->size);
    if (g->n_tensors > rest / 33)
        return li_error_set(err, LI_EINVAL, "gguf: tensor count %llu cannot fit in a %zu-byte file",
                            (unsigned long long)g->n_tensors, g->size);
    g->kv = li_xcalloc((size_t)g->n_kv + 1, sizeof *g->kv);
    name_set ns;
    name_set_init(&ns, g->n_kv);
    for (uint64_t i = 0; i < g->n_kv; i++) {
        if (parse_kv(&c, &g->kv[i], i)) {
            free(ns.slots);
            return LI_EINVAL;
        }
        if (!name_set_add(&ns, &g->kv[i].key)) {
            free(ns.slots);
            return li_error_set(err, LI_EINVAL, "gguf: duplicate metadata key '%.*s'",
                                (int)LI_MIN(g->kv[i].key.len, 128), g->kv[i].key.ptr);
        }
    }
    free(ns.slots);
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const li_gguf_kv *al = li_gguf_find_kv(g, "general.alignment");
    if (al) {
        if (al->type != LI_GGUF_UINT32)
            return li_error_set(err, LI_EINVAL, "gguf: general.alignment must be uint32, is %s",
                                li_gguf_vtype_name(al->type));
        if (al->v.u64 == 0 || (al->v.u64 & (al->v.u64 - 1)) != 0 || al->v.u64 > 1u << 20)
            return li_error_set(err, LI_EINVAL, "gguf: general.alignment %llu is not a power of two <= 1 MiB",
                                (unsigned long long)al->v.u64);
        g->alignment = (size_t)al->v.u64;
    }
    g->tensors = li_xcalloc((size_t)g->n_tensors + 1, sizeof *g->tensors);
    name_set_init(&ns, g->n_tensors);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        if (parse_tensor_info(&c, &g->tensors[i], i)) {
            free(ns.slots);
            return LI_EINVAL;
        }
        if (!name_set_add(&ns, &g->tensors[i].name)) {
            free(ns.slots);
            return li_error_set(err, LI_EINVAL, "gguf: duplicate tensor name '%.*s'",
                                (int)LI_MIN(g->tensors[i].name.len, 128), g->tensors[i].name.ptr);
        }
    }
    free(ns.slots);
    /* the data section starts at the next multiple of the alignment */
    size_t off = c.pos;
    size_t pad = (g->alignment - off % g->alignment) % g->alignment;
    if (li_add_overflow(off, pad, &g->data_offset) || (g->n_tensors > 0 && g->data_offset > g->size))
        return li_error_set(err, LI_EINVAL, "gguf: truncated file: data section would start at %zu, file has %zu",
                            off + pad, g->size);
    size_t avail = g->size - LI_MIN(g->data_offset, g->size);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        li_gguf_tensor *t = &g->tensors[i];
        const int nl = (int)LI_MIN(t->name.len, 128);
        if (t->offset % g->alignment != 0)
            return li_error_set(err, LI_EINVAL, "gguf: tensor '%.*s' offset %llu is not aligned to %zu", nl,
                                t->name.ptr, (unsigned long long)t->offset, g->alignment);
        size_t end;
        if (t->offset > avail || li_add_overflow((size_t)t->offset, t->nbytes, &end) || end > avail)
            return li_error_set(err, LI_EINVAL,
                                "gguf: tensor '%.*s' (%zu bytes at data offset %llu) extends past end of file",
                                nl, t->name.ptr, t->nbytes, (unsigned long long)t->offset);
        t->data = g->buf + g->data_offset + t->offset;
    }
    return 0;
}

int li_gguf_init_from_memory(li_gguf *g, const void *buf, size_t size, li_error *err) {
    memset(g, 0, sizeof *g);
    g->buf = buf;
    g->size = size;
    int rc = parse(g, err);
    if (rc) li_gguf_free(g);
    return rc;
}

int li_gguf_open(li_gguf *g, const char *path, li_error *err) {
    memset(g, 0, sizeof *g);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return li_error_set(err, LI_EIO, "cannot open model '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return li_error_set(err, LI_EIO, "model '%s' is not a regular file", path);
    }
    if (st.st_size < 24) {
        close(fd);
        return li_error_set(err, LI_EINVAL, "gguf: '%s' is too small (%lld bytes) to be a GGUF file", path,
                            (long long)st.st_size);
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return li_error_set(err, LI_EIO, "cannot map '%s': %s", path, strerror(errno));
    int rc = li_gguf_init_from_memory(g, m, (size_t)st.st_size, err);
    if (rc) {
        munmap(m, (size_t)st.st_size);
        return rc;
    }
    g->map = m;
    return 0;
}

void li_gguf_free(li_gguf *g) {
    if (g->kv)
        for (uint64_t i = 0; i < g->n_kv; i++)
            if (g->kv[i].type == LI_GGUF_ARRAY) free(g->kv[i].v.arr.strs);
    free(g->kv);
    free(g->tensors);
    if (g->map) munmap(g->map, g->size);
    memset(g, 0, sizeof *g);
}

const li_gguf_kv *li_gguf_find_kv(const li_gguf *g, const char *key) {
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (g->kv[i].key.ptr && li_str_eq(g->kv[i].key, key)) return &g->kv[i];
    return NULL;
}

const li_gguf_tensor *li_gguf_find_tensor(const li_gguf *g, const char *name) {
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (li_str_eq(g->tensors[i].name, name)) return &g->tensors[i];
    return NULL;
}

static bool is_uint(li_gguf_vtype t) {
    return t == LI_GGUF_UINT8 || t == LI_GGUF_UINT16 || t == LI_GGUF_UINT32 || t == LI_GGUF_UINT64;
}
static bool is_sint(li_gguf_vtype t) {
    return t == LI_GGUF_INT8 || t == LI_GGUF_INT16 || t == LI_GGUF_INT32 || t == LI_GGUF_INT64;
}

int li_gguf_get_u64(const li_gguf *g, const char *key, uint64_t *out, li_error *err) {
    const li_gguf_kv *kv = li_gguf_find_kv(g, key);
    if (!kv) return 1;
    if (is_uint(kv->type)) *out = kv->v.u64;
    else if (is_sint(kv->type) && kv->v.i64 >= 0) *out = (uint64_t)kv->v.i64;
    else
        return li_error_set(err, LI_EINVAL, "gguf: key '%s' must be a non-negative integer, is %s", key,
                            li_gguf_vtype_name(kv->type));
    return 0;
}

int li_gguf_get_u32(const li_gguf *g, const char *key, uint32_t *out, li_error *err) {
    uint64_t v;
    int rc = li_gguf_get_u64(g, key, &v, err);
    if (rc) return rc;
    if (v > UINT32_MAX)
        return li_error_set(err, LI_EINVAL, "gguf: key '%s' = %llu is out of range", key, (unsigned long long)v);
    *out = (uint32_t)v;
    return 0;
}

int li_gguf_get_f32(const li_gguf *g, const char *key, float *out, li_error *err) {
    const li_gguf_kv *kv = li_gguf_find_kv(g, key);
    if (!kv) return 1;
    if (kv->type == LI_GGUF_FLOAT32 || kv->type == LI_GGUF_FLOAT64) *out = (float)kv->v.f64;
    else if (is_uint(kv->type)) *out = (float)kv->v.u64;
    else if (is_sint(kv->type)) *out = (float)kv->v.i64;
    else
        return li_error_set(err, LI_EINVAL, "gguf: key '%s' must be a number, is %s", key,
                            li_gguf_vtype_name(kv->type));
    return 0;
}

int li_gguf_get_bool(const li_gguf *g, const char *key, bool *out, li_error *err) {
    const li_gguf_kv *kv = li_gguf_find_kv(g, key);
    if (!kv) return 1;
    if (kv->type != LI_GGUF_BOOL)
        return li_error_set(err, LI_EINVAL, "gguf: key '%s' must be bool, is %s", key,
                            li_gguf_vtype_name(kv->type));
    *out = kv->v.u64 != 0;
    return 0;
}

int li_gguf_get_str(const li_gguf *g, const char *key, li_str *out, li_error *err) {
    const li_gguf_kv *kv = li_gguf_find_kv(g, key);
    if (!kv) return 1;
    if (kv->type != LI_GGUF_STRING)
        return li_error_set(err, LI_EINVAL, "gguf: key '%s' must be a string, is %s", key,
                            li_gguf_vtype_name(kv->type));
    *out = kv->v.str;
    return 0;
}

const li_gguf_kv *li_gguf_get_arr(const li_gguf *g, const char *key, li_gguf_vtype elem_type,
                                  li_error *err) {
    const li_gguf_kv *kv = li_gguf_find_kv(g, key);
    if (!kv) return NULL;
    if (kv->type != LI_GGUF_ARRAY || kv->v.arr.type != elem_type) {
        li_error_set(err, LI_EINVAL, "gguf: key '%s' must be an array of %s", key,
                     li_gguf_vtype_name(elem_type));
        return NULL;
    }
    return kv;
}

bool li_gguf_copy_str(const li_gguf *g, const char *key, char *out, size_t cap) {
    li_str s;
    if (cap) out[0] = 0;
    if (!cap || li_gguf_get_str(g, key, &s, NULL)) return false;
    const size_t n = s.len < cap - 1 ? (size_t)s.len : cap - 1;
    memcpy(out, s.ptr, n);
    out[n] = 0;
    return true;
}

bool li_gguf_get_hex64(const li_gguf *g, const char *key, uint64_t *out) {
    char s[32];
    if (!li_gguf_copy_str(g, key, s, sizeof s) || strlen(s) != 16) return false;
    uint64_t v = 0;
    for (int i = 0; i < 16; i++) {
        const char c = s[i];
        const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return false;
        v = v << 4 | (uint64_t)d;
    }
    *out = v;
    return true;
}
