/* request_json.c — a JSON body as msgpack, so that HTTP's parameters go
 * through the same parser as msgpack-RPC's (request.h). */
#include "request/request.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

static void pack_str(msgpack_packer *pk, const char *s) {
    const size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static bool pack(msgpack_packer *pk, const cJSON *j, int depth, int max_depth) {
    if (depth > max_depth) return false;
    if (cJSON_IsNull(j)) msgpack_pack_nil(pk);
    else if (cJSON_IsTrue(j)) msgpack_pack_true(pk);
    else if (cJSON_IsFalse(j)) msgpack_pack_false(pk);
    else if (cJSON_IsNumber(j)) {
        double v = j->valuedouble;
        if (isfinite(v) && v == floor(v) && fabs(v) < 9007199254740992.0) msgpack_pack_int64(pk, (int64_t)v);
        else msgpack_pack_double(pk, v);
    } else if (cJSON_IsString(j)) pack_str(pk, j->valuestring);
    else if (cJSON_IsArray(j)) {
        msgpack_pack_array(pk, (size_t)cJSON_GetArraySize(j));
        for (const cJSON *c = j->child; c; c = c->next)
            if (!pack(pk, c, depth + 1, max_depth)) return false;
    } else if (cJSON_IsObject(j)) {
        msgpack_pack_map(pk, (size_t)cJSON_GetArraySize(j));
        for (const cJSON *c = j->child; c; c = c->next) {
            pack_str(pk, c->string ? c->string : "");
            if (!pack(pk, c, depth + 1, max_depth)) return false;
        }
    } else {
        msgpack_pack_nil(pk);
    }
    return true;
}

bool li_request_pack_json(msgpack_packer *pk, const cJSON *j, int max_depth) { return pack(pk, j, 0, max_depth); }
