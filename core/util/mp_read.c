/* mp_read.c — type-checked reads from decoded msgpack objects, and the
 * allocation-free frame scan that runs before msgpack-c (mp_read.h). */
#include "util/mp_read.h"

#include <math.h>
#include <string.h>

static bool key_is(const msgpack_object *k, const char *key, size_t n, bool bin_ok) {
    const char *p;
    size_t kn;
    return li_mp_read_str(k, bin_ok, &p, &kn) && kn == n && !memcmp(p, key, n); /* p is never NULL */
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
    /* msgpack-c gives an empty string a NULL pointer; callers get "" so that
     * memcpy/memcmp of 0 bytes from it stay defined */
    if (o->type == MSGPACK_OBJECT_STR) {
        *p = o->via.str.ptr ? o->via.str.ptr : "";
        if (n) *n = o->via.str.size;
        return true;
    }
    if (bin_ok && o->type == MSGPACK_OBJECT_BIN) {
        *p = o->via.bin.ptr ? o->via.bin.ptr : "";
        if (n) *n = o->via.bin.size;
        return true;
    }
    return false;
}

bool li_mp_read_str_is(const msgpack_object *o, bool bin_ok, const char *want) {
    const char *p;
    size_t n;
    return li_mp_read_str(o, bin_ok, &p, &n) && n == strlen(want) && !memcmp(p, want, n);
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

/* ---- framing: a resumable, allocation-free scan of one object ------------- */

static uint64_t be(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = v << 8 | p[i];
    return v;
}

/* Header of the object at p (avail bytes): *hdr header bytes, *payload
 * bytes that follow, *items children (arrays: n, maps: 2n). 0 if the header
 * is incomplete, -1 if the byte is not msgpack. */
static int mp_header(const uint8_t *p, size_t avail, size_t *hdr, uint64_t *payload, uint64_t *items) {
    if (avail < 1) return 0;
    uint8_t b = p[0];
    *payload = 0;
    *items = 0;
    int ext = 0, lenbytes = 0;
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
        *hdr = 1;
        return 1;
    }
    if ((b & 0xe0) == 0xa0) { *hdr = 1; *payload = b & 0x1f; return 1; }
    if ((b & 0xf0) == 0x90) { *hdr = 1; *items = b & 0x0f; return 1; }
    if ((b & 0xf0) == 0x80) { *hdr = 1; *items = 2u * (b & 0x0f); return 1; }
    switch (b) {
    case 0xc1: return -1; /* never used */
    case 0xc4: case 0xd9: lenbytes = 1; break;           /* bin8, str8 */
    case 0xc5: case 0xda: lenbytes = 2; break;           /* bin16, str16 */
    case 0xc6: case 0xdb: lenbytes = 4; break;           /* bin32, str32 */
    case 0xc7: lenbytes = 1; ext = 1; break;             /* ext8 */
    case 0xc8: lenbytes = 2; ext = 1; break;
    case 0xc9: lenbytes = 4; ext = 1; break;
    case 0xca: *hdr = 1; *payload = 4; return 1;          /* float32 */
    case 0xcb: *hdr = 1; *payload = 8; return 1;
    case 0xcc: case 0xd0: *hdr = 1; *payload = 1; return 1;
    case 0xcd: case 0xd1: *hdr = 1; *payload = 2; return 1;
    case 0xce: case 0xd2: *hdr = 1; *payload = 4; return 1;
    case 0xcf: case 0xd3: *hdr = 1; *payload = 8; return 1;
    case 0xd4: *hdr = 2; *payload = 1; return avail >= 2; /* fixext: type byte + data */
    case 0xd5: *hdr = 2; *payload = 2; return avail >= 2;
    case 0xd6: *hdr = 2; *payload = 4; return avail >= 2;
    case 0xd7: *hdr = 2; *payload = 8; return avail >= 2;
    case 0xd8: *hdr = 2; *payload = 16; return avail >= 2;
    case 0xdc: case 0xdd: {                               /* array16/32 */
        int nb = b == 0xdc ? 2 : 4;
        if (avail < 1 + (size_t)nb) return 0;
        *hdr = 1 + (size_t)nb;
        *items = be(p + 1, nb);
        return 1;
    }
    case 0xde: case 0xdf: {                               /* map16/32 */
        int nb = b == 0xde ? 2 : 4;
        if (avail < 1 + (size_t)nb) return 0;
        *hdr = 1 + (size_t)nb;
        *items = 2 * be(p + 1, nb);
        return 1;
    }
    default: return -1;
    }
    if (avail < 1 + (size_t)lenbytes + (size_t)ext) return 0;
    *hdr = 1 + (size_t)lenbytes + (size_t)ext;
    *payload = be(p + 1, lenbytes);
    return 1;
}

int li_mp_scan_feed(li_mp_scan *s, const uint8_t *buf, size_t len, size_t max_frame, int max_depth,
                    size_t *frame_len, const char **why) {
    if (max_depth > LI_MP_MAX_DEPTH) max_depth = LI_MP_MAX_DEPTH;
    while (s->pos < len) {
        size_t hdr;
        uint64_t payload, items;
        int h = mp_header(buf + s->pos, len - s->pos, &hdr, &payload, &items);
        if (h < 0) {
            *why = "bytes that are not msgpack";
            return LI_SCAN_ERROR;
        }
        if (h == 0) break;
        /* limits from the declaration alone, before waiting for the bytes */
        if (payload > max_frame || items > 2 * (uint64_t)max_frame || s->pos + hdr + payload > max_frame) {
            *why = "frame larger than the frame limit";
            return LI_SCAN_TOO_LARGE;
        }
        if (s->pos + hdr + payload > len) break;
        s->pos += hdr + (size_t)payload;
        if (items > 0) {
            if (s->depth >= max_depth) {
                *why = "nesting deeper than the depth limit";
                return LI_SCAN_ERROR;
            }
            s->left[s->depth++] = items;
            continue;
        }
        /* an item is complete: count it against the open containers */
        for (;;) {
            if (s->depth == 0) {
                *frame_len = s->pos;
                return LI_SCAN_DONE;
            }
            if (--s->left[s->depth - 1] > 0) break;
            s->depth--;
        }
    }
    return LI_SCAN_MORE;
}
