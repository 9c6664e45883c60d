/* mp_read.h — type-checked reads from decoded msgpack objects.
 *
 * Shared by the server's methods (server/api.c) and the policy wire protocol
 * (policy/policy_wire.c). Input is outside bytes: every reader accepts a NULL
 * or wrongly typed object and answers false (or NULL), never crashes. The two
 * protocols differ in what they accept, so those choices are parameters:
 * `bin_ok` (RPC clients may send text as bin; the policy wire never does) and
 * `float_max` (the largest float taken as an integer). li_mp_scan_feed
 * frames a byte stream before msgpack-c unpacks it. */
#ifndef LI_MP_READ_H
#define LI_MP_READ_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The deepest nesting of arrays and maps a scan can follow. */
#define LI_MP_MAX_DEPTH 32

/* Resumable scan of one msgpack object at the start of a buffer: the frame
 * length once complete, with limits on size and nesting checked from the
 * headers alone (nothing is allocated from a declared length). Used before
 * msgpack-c sees outside bytes, because msgpack-c allocates an array's or
 * map's declared count up front. */
typedef struct li_mp_scan {
    size_t pos;
    int depth;
    uint64_t left[LI_MP_MAX_DEPTH + 1];
} li_mp_scan;

enum { LI_SCAN_MORE = 0, LI_SCAN_DONE = 1, LI_SCAN_ERROR = -1, LI_SCAN_TOO_LARGE = -2 };
/* max_depth is capped at LI_MP_MAX_DEPTH; *why says what broke a limit. */
int li_mp_scan_feed(li_mp_scan *s, const uint8_t *buf, size_t len, size_t max_frame, int max_depth,
                    size_t *frame_len, const char **why);

/* 2^53: beyond it a double (a Lua number) no longer holds every integer. */
#define LI_MP_FLOAT_EXACT 9007199254740992.0

/* The value of `key` in a map object, or NULL (not a map, or absent). Keys
 * match when str, or also bin with bin_ok. */
const msgpack_object *li_mp_read_get(const msgpack_object *map, const char *key, bool bin_ok);
/* The bytes of a str (or, with bin_ok, bin) object; n may be NULL. *p is
 * never NULL (an empty string gives ""). */
bool li_mp_read_str(const msgpack_object *o, bool bin_ok, const char **p, size_t *n);
/* Whether o is a str (or, with bin_ok, bin) object holding exactly want. */
bool li_mp_read_str_is(const msgpack_object *o, bool bin_ok, const char *want);
/* An integer that fits int64_t, or a float with an integral value in
 * [-float_max, float_max] (float_max below 2^63). */
bool li_mp_read_int(const msgpack_object *o, double float_max, int64_t *v);
/* Any integer, or a finite float. */
bool li_mp_read_num(const msgpack_object *o, double *v);

#endif
