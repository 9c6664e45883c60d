/* test_mp_read.c — the msgpack readers shared by the server's methods and the
 * policy wire: absent and wrongly typed objects, str vs bin, the integer
 * limits for floats, finite numbers. */
#include "util/mp_read.h"
#include "test_util.h"

#include <string.h>

static msgpack_object num(msgpack_object_type type, double d) {
    msgpack_object o = {.type = type};
    o.via.f64 = d;
    return o;
}

int main(void) {
    /* a map {"a": 1, bin "b": 2} */
    msgpack_object_kv kv[2];
    memset(kv, 0, sizeof kv);
    kv[0].key.type = MSGPACK_OBJECT_STR;
    kv[0].key.via.str.ptr = "a";
    kv[0].key.via.str.size = 1;
    kv[0].val.type = MSGPACK_OBJECT_POSITIVE_INTEGER;
    kv[0].val.via.u64 = 1;
    kv[1].key.type = MSGPACK_OBJECT_BIN;
    kv[1].key.via.bin.ptr = "b";
    kv[1].key.via.bin.size = 1;
    kv[1].val.type = MSGPACK_OBJECT_POSITIVE_INTEGER;
    kv[1].val.via.u64 = 2;
    msgpack_object map = {.type = MSGPACK_OBJECT_MAP};
    map.via.map.size = 2;
    map.via.map.ptr = kv;

    CHECK(li_mp_read_get(&map, "a", false) == &kv[0].val, "str key");
    CHECK(li_mp_read_get(&map, "b", false) == NULL, "bin key refused without bin_ok");
    CHECK(li_mp_read_get(&map, "b", true) == &kv[1].val, "bin key with bin_ok");
    CHECK(li_mp_read_get(&map, "ab", true) == NULL && li_mp_read_get(&map, "", true) == NULL, "length compared");
    CHECK(li_mp_read_get(NULL, "a", true) == NULL && li_mp_read_get(&kv[0].val, "a", true) == NULL, "not a map");

    const char *p = NULL;
    size_t n = 0;
    CHECK(li_mp_read_str(&kv[0].key, false, &p, &n) && n == 1 && p[0] == 'a', "str");
    CHECK(li_mp_read_str(&kv[0].key, false, &p, NULL), "n may be NULL");
    CHECK(!li_mp_read_str(&kv[1].key, false, &p, &n), "bin refused without bin_ok");
    CHECK(li_mp_read_str(&kv[1].key, true, &p, &n) && n == 1 && p[0] == 'b', "bin with bin_ok");
    CHECK(!li_mp_read_str(NULL, true, &p, &n) && !li_mp_read_str(&kv[0].val, true, &p, &n), "absent, not text");
    /* msgpack-c's empty str and bin carry a NULL pointer; callers memcpy from it */
    const msgpack_object empty_str = {.type = MSGPACK_OBJECT_STR, .via.str = {.size = 0, .ptr = NULL}};
    const msgpack_object empty_bin = {.type = MSGPACK_OBJECT_BIN, .via.bin = {.size = 0, .ptr = NULL}};
    CHECK(li_mp_read_str(&empty_str, false, &p, &n) && p != NULL && n == 0, "empty str: \"\", not NULL");
    CHECK(li_mp_read_str(&empty_bin, true, &p, &n) && p != NULL && n == 0, "empty bin: \"\", not NULL");

    int64_t v = 0;
    msgpack_object big = {.type = MSGPACK_OBJECT_POSITIVE_INTEGER};
    big.via.u64 = (uint64_t)INT64_MAX + 1;
    msgpack_object neg = {.type = MSGPACK_OBJECT_NEGATIVE_INTEGER};
    neg.via.i64 = INT64_MIN;
    CHECK(li_mp_read_int(&kv[0].val, LI_MP_FLOAT_EXACT, &v) && v == 1, "integer");
    CHECK(li_mp_read_int(&neg, LI_MP_FLOAT_EXACT, &v) && v == INT64_MIN, "negative integer");
    CHECK(!li_mp_read_int(&big, 9.2e18, &v), "above int64");
    msgpack_object f = num(MSGPACK_OBJECT_FLOAT64, -3.0);
    CHECK(li_mp_read_int(&f, LI_MP_FLOAT_EXACT, &v) && v == -3, "integral float");
    f = num(MSGPACK_OBJECT_FLOAT32, 2.5);
    CHECK(!li_mp_read_int(&f, LI_MP_FLOAT_EXACT, &v), "fraction");
    f = num(MSGPACK_OBJECT_FLOAT64, NAN);
    CHECK(!li_mp_read_int(&f, 9.2e18, &v), "NaN");
    f = num(MSGPACK_OBJECT_FLOAT64, 1e17);
    CHECK(!li_mp_read_int(&f, LI_MP_FLOAT_EXACT, &v), "1e17 is past 2^53");
    CHECK(li_mp_read_int(&f, 9.2e18, &v) && v == 100000000000000000LL, "1e17 within 9.2e18");
    f = num(MSGPACK_OBJECT_FLOAT64, -9.3e18);
    CHECK(!li_mp_read_int(&f, 9.2e18, &v), "past -9.2e18");
    CHECK(!li_mp_read_int(NULL, 9.2e18, &v) && !li_mp_read_int(&kv[0].key, 9.2e18, &v), "absent, not a number");

    double d = 0;
    CHECK(li_mp_read_num(&big, &d) && d == 9223372036854775808.0, "any unsigned integer");
    CHECK(li_mp_read_num(&neg, &d) && d == -9223372036854775808.0, "negative integer");
    f = num(MSGPACK_OBJECT_FLOAT64, 1e300);
    CHECK(li_mp_read_num(&f, &d) && d == 1e300, "finite float");
    f = num(MSGPACK_OBJECT_FLOAT64, INFINITY);
    CHECK(!li_mp_read_num(&f, &d), "infinity");
    f = num(MSGPACK_OBJECT_FLOAT32, NAN);
    CHECK(!li_mp_read_num(&f, &d), "NaN");
    CHECK(!li_mp_read_num(NULL, &d) && !li_mp_read_num(&kv[0].key, &d), "absent, not a number");
    return t_summary("mp_read");
}
