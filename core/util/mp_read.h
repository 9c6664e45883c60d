/* mp_read.h — type-checked reads from decoded msgpack objects.
 *
 * Shared by the server's methods (server/api.c) and the policy wire protocol
 * (policy/policy_wire.c). Input is outside bytes: every reader accepts a NULL
 * or wrongly typed object and answers false (or NULL), never crashes. The two
 * protocols differ in what they accept, so those choices are parameters:
 * `bin_ok` (RPC clients may send text as bin; the policy wire never does) and
 * `float_max` (the largest float taken as an integer). */
#ifndef LI_MP_READ_H
#define LI_MP_READ_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* 2^53: beyond it a double (a Lua number) no longer holds every integer. */
#define LI_MP_FLOAT_EXACT 9007199254740992.0

/* The value of `key` in a map object, or NULL (not a map, or absent). Keys
 * match when str, or also bin with bin_ok. */
const msgpack_object *li_mp_read_get(const msgpack_object *map, const char *key, bool bin_ok);
/* The bytes of a str (or, with bin_ok, bin) object; n may be NULL. */
bool li_mp_read_str(const msgpack_object *o, bool bin_ok, const char **p, size_t *n);
/* An integer that fits int64_t, or a float with an integral value in
 * [-float_max, float_max] (float_max below 2^63). */
bool li_mp_read_int(const msgpack_object *o, double float_max, int64_t *v);
/* Any integer, or a finite float. */
bool li_mp_read_num(const msgpack_object *o, double *v);

#endif
