/* safetensors.c — .safetensors reader. Owns: mapping a file, parsing and
 * validating its JSON header (cJSON, bounded by the declared length) and
 * the tensor table that points into the mapping.
 *
 * Checks, in order: the file holds the 8-byte length, the length is at most
 * LI_ST_MAX_HEADER and inside the file, the header is one JSON object
 * (trailing whitespace allowed, as the reference writer pads with spaces),
 * every entry has a known dtype, a shape of non-negative integers whose
 * element count does not overflow, data_offsets [begin, end] with
 * begin <= end <= data size and end - begin == elements * dtype size; then,
 * sorted by begin, the tensors must tile the data area exactly (no overlap,
 * no hole, nothing after the last), and names must be unique. */
#define _GNU_SOURCE
#include "safetensors.h"
#include "../../kernels/types.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Integers in JSON come to us as doubles: exact up to 2^53. */
#define ST_MAX_INT 9007199254740992.0

/* ==== dtypes ==================================================================== */

typedef struct st_dtype {
    const char *name;
    int type;       /* li_type, or -1: a valid safetensors dtype we do not load */
    size_t size;
} st_dtype;

static const st_dtype DTYPES[] = {
    {"F32", LI_TYPE_F32, 4},  {"F16", LI_TYPE_F16, 2},  {"BF16", LI_TYPE_BF16, 2},
    {"F64", -1, 8},           {"I64", -1, 8},           {"U64", -1, 8},
    {"I32", LI_TYPE_I32, 4},  {"U32", -1, 4},           {"I16", -1, 2}, /* I32: AWQ / GPTQ packed codes */
    {"U16", -1, 2},           {"I8", -1, 1},            {"U8", -1, 1},
    {"BOOL", -1, 1},          {"F8_E4M3", -1, 1},       {"F8_E5M2", -1, 1},
    {"C64", -1, 8},
};

static const st_dtype *find_dtype(const char *s) {
    for (size_t i = 0; i < LI_ARRAY_LEN(DTYPES); i++)
        if (!strcmp(DTYPES[i].name, s)) return &DTYPES[i];
    return NULL;
}

/* ==== header parsing ============================================================== */

/* A name fit for a one-line message: control bytes become '?', at most 80 bytes. */
typedef struct st_name {
    char s[84];
} st_name;

static st_name show(const char *name) {
    st_name o;
    size_t k = 0;
    for (; name && name[k] && k < 80; k++) o.s[k] = (unsigned char)name[k] < 0x20 || name[k] == 0x7F ? '?' : name[k];
    o.s[k] = 0;
    return o;
}

/* A JSON number that is an exact non-negative integer (<= 2^53). */
static bool json_uint(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return false;
    double d = j->valuedouble;
    if (!(d >= 0) || d > ST_MAX_INT || floor(d) != d) return false;
    *out = (uint64_t)d;
    return true;
}

static int parse_entry(li_safetensors *st, const cJSON *e, li_st_tensor *t, size_t data_size, li_error *err) {
    const char *f = st->path;
    st_name shown = show(t->name);
    const char *n = shown.s;
    if (!cJSON_IsObject(e))
        return li_error_set(err, LI_EINVAL, "safetensors: %s: tensor '%.80s': entry is not an object", f, n);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt))
        return li_error_set(err, LI_EINVAL, "safetensors: %s: tensor '%.80s': no \"dtype\" string", f, n);
    const st_dtype *d = find_dtype(dt->valuestring);
    if (!d)
        return li_error_set(err, LI_EINVAL, "safetensors: %s: tensor '%.80s': unknown dtype '%.16s'", f, n,
                            show(dt->valuestring).s);
    if (d->type < 0)
        return li_error_set(err, LI_EUNSUP, "safetensors: %s: tensor '%.80s': dtype %s is not supported (BF16, F16, F32, I32)",
                            f, n, d->name);
    if (!cJSON_IsArray(sh))
        return li_error_set(err, LI_EINVAL, "safetensors: %s: tensor '%.80s': no \"shape\" array", f, n);
    int nd = cJSON_GetArraySize(sh);
    if (nd > LI_ST_MAX_DIMS)
        return li_error_set(err, LI_EINVAL, "safetensors: %s: tensor '%.80s': %d dimensions (at most %d)", f, n, nd,
                            LI_ST_MAX_DIMS);
    t->n_dims = (uint32_t)nd;
    int i = 0;
    bool zero = false;
    for (const cJSON *x = sh->child; x; x = x->next, i++) {
        uint64_t v;
        if (!json_uint(x, &v))
            return li_error_set(err, LI_EINVAL, "safetensors: %s: tensor '%.80s': shape[%d] is not a non-negative integer",
                                f, n, i);
        t->shape[i] = (int64_t)v;
        zero |= v == 0;
    }
    /* element count, overflow-safe (the size check below bounds it by the file) */
    uint64_t elems = zero ? 0 : 1, max_elems = (UINT64_MAX >> 4) / d->size;
    for (int k = 0; k < nd && !zero; k++) {
        uint64_t v = (uint64_t)t->shape[k];
        if (elems > max_elems / v)
            return li_error_set(err, LI_EINVAL, "safetensors: %s: tensor '%.80s': shape has too many elements",
                                f, n);
        elems *= v;
    }
    t->n_elem = (int64_t)elems;
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 || !json_uint(off->child, &t->begin) ||
        !json_uint(off->child->next, &t->end))
        return li_error_set(err, LI_EINVAL, "safetensors: %s: tensor '%.80s': \"data_offsets\" is not [begin, end]", f, n);
    if (t->begin > t->end)
        return li_error_set(err, LI_EINVAL, "safetensors: %s: tensor '%.80s': data_offsets [%llu, %llu] run backwards", f,
                            n, (unsigned long long)t->begin, (unsigned long long)t->end);
    if (t->end > data_size)
        return li_error_set(err, LI_EINVAL,
                            "safetensors: %s: tensor '%.80s': data_offsets end %llu is past the data area (%zu bytes)", f, n,
                            (unsigned long long)t->end, data_size);
    t->nbytes = (size_t)(t->end - t->begin);
    if ((uint64_t)t->nbytes != elems * d->size)
        return li_error_set(err, LI_EINVAL,
                            "safetensors: %s: tensor '%.80s': %zu bytes for %llu %s elements (expected %llu)", f, n,
                            t->nbytes, (unsigned long long)elems, d->name, (unsigned long long)(elems * d->size));
    t->type = (uint32_t)d->type;
    t->data = st->buf + st->data_offset + t->begin;
    return 0;
}

static int check_metadata(li_safetensors *st, const cJSON *m, li_error *err) {
    if (!cJSON_IsObject(m))
        return li_error_set(err, LI_EINVAL, "safetensors: %s: __metadata__ is not an object", st->path);
    for (const cJSON *x = m->child; x; x = x->next)
        if (!cJSON_IsString(x))
            return li_error_set(err, LI_EINVAL, "safetensors: %s: __metadata__ value '%s' is not a string", st->path,
                                show(x->string).s);
    return 0;
}

static int cmp_begin(const void *a, const void *b) {
    const li_st_tensor *x = *(li_st_tensor *const *)a, *y = *(li_st_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const li_st_tensor *)a)->name, ((const li_st_tensor *)b)->name);
}

/* The tensors must tile [0, data_size) exactly and have distinct names. */
static int check_layout(li_safetensors *st, size_t data_size, li_error *err) {
    int n = st->n_tensors;
    qsort(st->tensors, (size_t)n, sizeof *st->tensors, cmp_name);
    for (int i = 1; i < n; i++)
        if (!strcmp(st->tensors[i - 1].name, st->tensors[i].name))
            return li_error_set(err, LI_EINVAL, "safetensors: %s: tensor '%s' appears twice", st->path,
                                show(st->tensors[i].name).s);
    li_st_tensor **by = li_xmalloc(((size_t)n + 1) * sizeof *by);
    for (int i = 0; i < n; i++) by[i] = &st->tensors[i];
    qsort(by, (size_t)n, sizeof *by, cmp_begin);
    uint64_t pos = 0;
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        if (by[i]->begin < pos)
            rc = li_error_set(err, LI_EINVAL, "safetensors: %s: tensor '%s' [%llu, %llu) overlaps tensor '%s'",
                              st->path, show(by[i]->name).s, (unsigned long long)by[i]->begin,
                              (unsigned long long)by[i]->end, show(by[i - 1]->name).s);
        else if (by[i]->begin > pos)
            rc = li_error_set(err, LI_EINVAL, "safetensors: %s: tensor '%s' starts at %llu, leaving a hole after %llu",
                              st->path, show(by[i]->name).s, (unsigned long long)by[i]->begin, (unsigned long long)pos);
        pos = by[i]->end;
    }
    free(by);
    if (!rc && pos != data_size)
        rc = li_error_set(err, LI_EINVAL, "safetensors: %s: the tensors cover %llu of the %zu data bytes", st->path,
                          (unsigned long long)pos, data_size);
    return rc;
}

static int parse_header(li_safetensors *st, li_error *err) {
    const char *f = st->path;
    if (st->size < 8)
        return li_error_set(err, LI_EINVAL, "safetensors: %s: truncated file (%zu bytes, the header length needs 8)", f,
                            st->size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | st->buf[i];
    if (hlen > LI_ST_MAX_HEADER)
        return li_error_set(err, LI_EINVAL, "safetensors: %s: header length %llu is over the %u-byte limit", f,
                            (unsigned long long)hlen, LI_ST_MAX_HEADER);
    if (hlen > st->size - 8)
        return li_error_set(err, LI_EINVAL, "safetensors: %s: header length %llu runs past the end of the file (%zu bytes)",
                            f, (unsigned long long)hlen, st->size);
    if (hlen < 2 || st->buf[8] != '{')
        return li_error_set(err, LI_EINVAL, "safetensors: %s: the header is not a JSON object", f);
    st->data_offset = 8 + (size_t)hlen;
    size_t data_size = st->size - st->data_offset;
    const char *js = (const char *)st->buf + 8, *end = NULL;
    if (memchr(js, 0, (size_t)hlen))
        return li_error_set(err, LI_EINVAL, "safetensors: %s: the header holds a NUL byte", f);
    cJSON *root = cJSON_ParseWithLengthOpts(js, (size_t)hlen, &end, false);
    if (!root) {
        size_t at = end && end >= js ? (size_t)(end - js) : 0;
        return li_error_set(err, LI_EINVAL, "safetensors: %s: the header is not valid JSON (near byte %zu)", f, at + 8);
    }
    for (const char *p = end; p < js + hlen; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            cJSON_Delete(root);
            return li_error_set(err, LI_EINVAL, "safetensors: %s: bytes after the header's JSON object (at byte %zu)", f,
                                (size_t)(p - js) + 8);
        }
    int rc = 0;
    if (!cJSON_IsObject(root)) {
        rc = li_error_set(err, LI_EINVAL, "safetensors: %s: the header is not a JSON object", f);
        goto done;
    }
    int n = 0;
    for (const cJSON *e = root->child; e; e = e->next) n++;
    st->tensors = li_xcalloc((size_t)n + 1, sizeof *st->tensors);
    for (const cJSON *e = root->child; e; e = e->next) {
        if (!strcmp(e->string, "__metadata__")) {
            if ((rc = check_metadata(st, e, err))) goto done;
            continue;
        }
        li_st_tensor *t = &st->tensors[st->n_tensors++];
        t->name = strdup(e->string);
        if (!t->name) {
            rc = li_error_set(err, LI_ENOMEM, "safetensors: %s: out of memory", f);
            goto done;
        }
        if ((rc = parse_entry(st, e, t, data_size, err))) goto done;
    }
    rc = check_layout(st, data_size, err);
done:
    cJSON_Delete(root);
    return rc;
}

/* ==== open / free =================================================================== */

int li_safetensors_init_from_memory(li_safetensors *st, const void *buf, size_t size, const char *name,
                                    li_error *err) {
    memset(st, 0, sizeof *st);
    st->buf = buf;
    st->size = size;
    st->path = strdup(name ? name : "(memory)");
    if (!st->path) return li_error_set(err, LI_ENOMEM, "safetensors: out of memory");
    int rc = parse_header(st, err);
    if (rc) li_safetensors_free(st);
    return rc;
}

int li_safetensors_open(li_safetensors *st, const char *path, li_error *err) {
    memset(st, 0, sizeof *st);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return li_error_set(err, LI_EIO, "safetensors: cannot open '%s': %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return li_error_set(err, LI_EIO, "safetensors: '%s' is not a regular file", path);
    }
    size_t size = (size_t)sb.st_size;
    void *m = NULL;
    if (size) {
        m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            close(fd);
            return li_error_set(err, LI_EIO, "safetensors: cannot map '%s': %s", path, strerror(errno));
        }
    }
    close(fd);
    int rc = li_safetensors_init_from_memory(st, m ? m : "", size, path, err);
    if (rc) {
        if (m) munmap(m, size);
        return rc;
    }
    st->map = m;
    return 0;
}

void li_safetensors_free(li_safetensors *st) {
    for (int i = 0; i < st->n_tensors; i++) free(st->tensors[i].name);
    free(st->tensors);
    free(st->path);
    if (st->map) munmap(st->map, st->size);
    memset(st, 0, sizeof *st);
}

const li_st_tensor *li_safetensors_find(const li_safetensors *st, const char *name) {
    li_st_tensor key = {.name = (char *)name};
    return bsearch(&key, st->tensors, (size_t)st->n_tensors, sizeof *st->tensors, cmp_name);
}
