/* request_json.c — a JSON body as msgpack, so that HTTP's parameters go
 * through the same parser as msgpack-RPC's (request.h). */
#include "request/request.h"

#include <cjson/cJSON.h>
#include <jansson.h>
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

/* ---- JSON text through jansson (the HTTP request path) --------------------------- */

static bool pack_jansson(msgpack_packer *pk, const json_t *j, int depth, int max_depth) {
    if (depth > max_depth) return false;
    switch (json_typeof(j)) {
    case JSON_NULL: msgpack_pack_nil(pk); break;
    case JSON_TRUE: msgpack_pack_true(pk); break;
    case JSON_FALSE: msgpack_pack_false(pk); break;
    case JSON_INTEGER: msgpack_pack_int64(pk, (int64_t)json_integer_value(j)); break;
    case JSON_REAL: {
        /* as the cJSON path: 5.0 is the integer 5 */
        double v = json_real_value(j);
        if (isfinite(v) && v == floor(v) && fabs(v) < 9007199254740992.0) msgpack_pack_int64(pk, (int64_t)v);
        else msgpack_pack_double(pk, v);
        break;
    }
    case JSON_STRING: {
        const size_t n = json_string_length(j); /* embedded NULs included */
        msgpack_pack_str(pk, n);
        msgpack_pack_str_body(pk, json_string_value(j), n);
        break;
    }
    case JSON_ARRAY: {
        const size_t n = json_array_size(j);
        msgpack_pack_array(pk, n);
        for (size_t i = 0; i < n; i++)
            if (!pack_jansson(pk, json_array_get(j, i), depth + 1, max_depth)) return false;
        break;
    }
    case JSON_OBJECT: {
        msgpack_pack_map(pk, json_object_size(j));
        const char *key;
        size_t key_len;
        json_t *v;
        void *tmp;
        json_object_keylen_foreach_safe((json_t *)j, tmp, key, key_len, v) {
            msgpack_pack_str(pk, key_len);
            msgpack_pack_str_body(pk, key, key_len);
            if (!pack_jansson(pk, v, depth + 1, max_depth)) return false;
        }
        break;
    }
    }
    return true;
}

int li_request_pack_json_text(msgpack_packer *pk, const char *text, size_t n, int max_depth, li_error *err) {
    json_error_t je;
    /* JSON_ALLOW_NUL: "\u0000" is kept (lengths travel with the strings);
     * JSON_REJECT_DUPLICATES: a key given twice is an error, as in msgpack */
    json_t *j = json_loadb(text, n, JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, &je);
    if (!j) {
        if (strstr(je.text, "maximum parsing depth"))
            return li_error_set(err, 400, "the request body nests deeper than %d levels", max_depth);
        return li_error_set(err, 400, "the request body is not valid JSON: %s (line %d, column %d)", je.text, je.line,
                            je.column);
    }
    int rc = 0;
    if (!json_is_object(j)) rc = li_error_set(err, 400, "the request body must be a JSON object");
    else if (!pack_jansson(pk, j, 0, max_depth))
        rc = li_error_set(err, 400, "the request body nests deeper than %d levels", max_depth);
    json_decref(j);
    return rc;
}
