/* mp_read.c — type-checked reads from decoded msgpack objects (mp_read.h). */
#include "util/mp_read.h"

#include <math.h>
#include <string.h>

static bool key_is(const msgpack_object *k, const char *key, size_t n, bool bin_ok) {
    if (k->type == MSGPACK_OBJECT_STR) return k->via.str.size == n && !memcmp(k->via.str.ptr, key, n);
    if (bin_ok && k->type == MSGPACK_OBJECT_BIN) return k->via.bin.size == n && !memcmp(k->via.bin.ptr, key, n);
    return false;
}

const msgpack_object *li_mp_read_get(const msgpack_object *map, const char *key, bool bin_ok) {
    if (!map || map->type != MSGPACK_OBJECT_MAP) return NULL;
    size_t n = strlen(key);
    for (uint32_t i = 0; i < map->via.map.size; i++)
        if (key_is(&map->via.map.ptr[i].key, key, n, bin_ok)) return &map->via.map.ptr[i].val;
    return NULL;
}

bool li_mp_read_str(const msgpack_object *o, bool bin_ok, const char **p, size_t *n) {
    if (!o) return false;
    if (o->type == MSGPACK_OBJECT_STR) {
        *p = o->via.str.ptr;
        if (n) *n = o->via.str.size;
        return true;
    }
    if (bin_ok && o->type == MSGPACK_OBJECT_BIN) {
        *p = o->via.bin.ptr;
        if (n) *n = o->via.bin.size;
        return true;
    }
    return false;
}

bool li_mp_read_int(const msgpack_object *o, double float_max, int64_t *v) {
    if (!o) return false;
    switch (o->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        if (o->via.u64 > (uint64_t)INT64_MAX) return false;
        *v = (int64_t)o->via.u64;
        return true;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        *v = o->via.i64;
        return true;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: {
        double d = o->via.f64;
        /* written so that NaN fails too */
        if (!(d >= -float_max && d <= float_max) || d != floor(d)) return false;
        *v = (int64_t)d;
        return true;
    }
    default:
        return false;
    }
}

bool li_mp_read_num(const msgpack_object *o, double *v) {
    if (!o) return false;
    switch (o->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        *v = (double)o->via.u64;
        return true;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        *v = (double)o->via.i64;
        return true;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        *v = o->via.f64;
        return isfinite(*v);
    default:
        return false;
    }
}
