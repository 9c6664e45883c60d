/* lua_json.c — `luainfer.json`: JSON for scripts and benchmarks (their
 * --json output), through cJSON rather than a hand-rolled encoder.
 *
 *   local json = require("luainfer.json")
 *   print(json.encode({ name = "batching", rows = { { seqs = 8, tput = 412.5 } } }, true))
 *   local t = json.decode('{"a": [1, 2, null]}')   -- t.a[3] == json.null
 *
 * Encoding: nil and json.null -> null; booleans; numbers (NaN and +-inf are
 * an error: JSON has no such values); strings (bytes, escaped by cJSON;
 * one holding a NUL byte is an error, never cut short); a
 * table -> an array when it is a sequence 1..n with n >= 1, else an object
 * with its keys (strings or numbers) sorted, so the same table always gives
 * the same text; json.array(t) marks a table (empty included) as an array.
 * Nesting deeper than 64 or a cycle is an error. Decoding: objects and
 * arrays -> tables, null -> json.null. */
#include "lua/lua_engine.h"
#include "lua/lua_json.h"

#include <cjson/cJSON.h>
#include <lauxlib.h>
#include <lua.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JSON_MAX_DEPTH 64
#define ARRAY_MT "luainfer.json.array"

static int null_tostring(lua_State *L) {
    lua_pushliteral(L, "json.null");
    return 1;
}

/* pushes json.null: one sentinel table kept in the registry */
static void push_null(lua_State *L) { lua_getfield(L, LUA_REGISTRYINDEX, "luainfer.json.null"); }

static bool is_null(lua_State *L, int idx) {
    push_null(L);
    bool r = lua_rawequal(L, idx, -1);
    lua_pop(L, 1);
    return r;
}

static bool marked_array(lua_State *L, int idx) {
    if (!lua_getmetatable(L, idx)) return false;
    luaL_getmetatable(L, ARRAY_MT);
    bool r = lua_rawequal(L, -1, -2);
    lua_pop(L, 2);
    return r;
}

/* n >= 1 when the table at idx is exactly the sequence 1..n, else 0 */
static size_t sequence_len(lua_State *L, int idx) {
    size_t n = lua_objlen(L, idx), count = 0;
    if (n == 0) return 0;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        if (lua_type(L, -1) != LUA_TNUMBER) {
            lua_pop(L, 1);
            return 0;
        }
        double k = lua_tonumber(L, -1);
        if (k != floor(k) || k < 1 || k > (double)n) {
            lua_pop(L, 1);
            return 0;
        }
        count++;
    }
    return count == n ? n : 0;
}

typedef struct okey {
    char *s;  /* the key as text */
    bool num; /* it was a number key, worth d */
    double d;
} okey;

static int key_cmp(const void *a, const void *b) { return strcmp(((const okey *)a)->s, ((const okey *)b)->s); }

static cJSON *encode(lua_State *L, int idx, int depth);

static cJSON *encode_table(lua_State *L, int idx, int depth) {
    size_t n = sequence_len(L, idx);
    if (n || marked_array(L, idx)) {
        cJSON *a = cJSON_CreateArray();
        for (size_t i = 1; i <= n; i++) {
            lua_rawgeti(L, idx, (int)i);
            cJSON *v = encode(L, lua_gettop(L), depth + 1);
            if (!v) { /* keep the error message, drop the value under it */
                lua_remove(L, -2);
                cJSON_Delete(a);
                return NULL;
            }
            lua_pop(L, 1);
            cJSON_AddItemToArray(a, v);
        }
        return a;
    }
    /* an object: collect the keys (as text, and the number a number key
     * was), sort by text, then look each one up as the type it had */
    size_t cap = 16, count = 0;
    okey *keys = li_xmalloc(cap * sizeof *keys);
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        int kt = lua_type(L, -1);
        if (kt != LUA_TSTRING && kt != LUA_TNUMBER) {
            lua_pop(L, 1);
            for (size_t i = 0; i < count; i++) free(keys[i].s);
            free(keys);
            lua_pushfstring(L, "json.encode: a %s key can't be an object key", lua_typename(L, kt));
            return NULL;
        }
        lua_pushvalue(L, -1); /* tolstring on the key itself would break lua_next */
        size_t len;
        const char *s = lua_tolstring(L, -1, &len);
        if (count == cap) keys = li_xrealloc(keys, (cap *= 2) * sizeof *keys);
        keys[count] = (okey){.s = li_xmalloc(len + 1), .num = kt == LUA_TNUMBER,
                             .d = kt == LUA_TNUMBER ? lua_tonumber(L, -2) : 0};
        memcpy(keys[count++].s, s, len + 1);
        lua_pop(L, 1);
    }
    qsort(keys, count, sizeof *keys, key_cmp);
    cJSON *o = cJSON_CreateObject();
    bool ok = true;
    for (size_t i = 0; i < count; i++) {
        if (keys[i].num) lua_pushnumber(L, keys[i].d);
        else lua_pushstring(L, keys[i].s);
        lua_rawget(L, idx);
        cJSON *v = ok ? encode(L, lua_gettop(L), depth + 1) : NULL;
        if (v) lua_pop(L, 1);
        else if (ok) { /* keep the error message, drop the value under it */
            lua_remove(L, -2);
            ok = false;
        } else lua_pop(L, 1);
        if (v) cJSON_AddItemToObject(o, keys[i].s, v);
        free(keys[i].s);
    }
    free(keys);
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* The value at idx as a cJSON tree, or NULL with an error message pushed. */
static cJSON *encode(lua_State *L, int idx, int depth) {
    if (depth > JSON_MAX_DEPTH) {
        lua_pushfstring(L, "json.encode: nesting deeper than %d (a cycle?)", JSON_MAX_DEPTH);
        return NULL;
    }
    switch (lua_type(L, idx)) {
    case LUA_TNIL: return cJSON_CreateNull();
    case LUA_TBOOLEAN: return cJSON_CreateBool(lua_toboolean(L, idx));
    case LUA_TNUMBER: {
        double d = lua_tonumber(L, idx);
        if (!isfinite(d)) {
            lua_pushliteral(L, "json.encode: NaN and infinities have no JSON form");
            return NULL;
        }
        /* cJSON prints 15 significant digits when its epsilon test calls
         * that close enough (2^53 comes out as 9.00719925474099e+15): print
         * the shortest text that reads back as exactly d, as a raw item */
        char buf[32];
        for (int prec = 15; prec <= 17; prec++) {
            snprintf(buf, sizeof buf, "%.*g", prec, d);
            if (strtod(buf, NULL) == d) break;
        }
        return cJSON_CreateRaw(buf);
    }
    case LUA_TSTRING: {
        size_t len;
        const char *str = lua_tolstring(L, idx, &len);
        if (strlen(str) != len) { /* cJSON takes C strings: refuse rather than cut the text */
            lua_pushliteral(L, "json.encode: a string with a NUL byte (cJSON would cut it there)");
            return NULL;
        }
        return cJSON_CreateString(str);
    }
    case LUA_TTABLE:
        if (is_null(L, idx)) return cJSON_CreateNull();
        return encode_table(L, idx, depth);
    default:
        lua_pushfstring(L, "json.encode: a %s has no JSON form", luaL_typename(L, idx));
        return NULL;
    }
}

static int l_encode(lua_State *L) {
    lua_settop(L, 2);
    bool pretty = lua_toboolean(L, 2);
    cJSON *j = encode(L, 1, 0);
    if (!j) return lua_error(L);
    char *s = pretty ? cJSON_Print(j) : cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!s) return luaL_error(L, "json.encode: out of memory");
    lua_pushstring(L, s);
    cJSON_free(s);
    return 1;
}

static void push_json(lua_State *L, const cJSON *j, int depth) {
    luaL_checkstack(L, 4, "json.decode: nesting too deep");
    if (depth > JSON_MAX_DEPTH) luaL_error(L, "json.decode: nesting deeper than %d", JSON_MAX_DEPTH);
    if (cJSON_IsNull(j)) push_null(L);
    else if (cJSON_IsBool(j)) lua_pushboolean(L, cJSON_IsTrue(j));
    else if (cJSON_IsNumber(j)) lua_pushnumber(L, j->valuedouble);
    else if (cJSON_IsString(j)) lua_pushstring(L, j->valuestring);
    else if (cJSON_IsArray(j)) {
        lua_createtable(L, cJSON_GetArraySize(j), 0);
        int i = 1;
        for (const cJSON *c = j->child; c; c = c->next) {
            push_json(L, c, depth + 1);
            lua_rawseti(L, -2, i++);
        }
        if (i == 1) luaL_setmetatable(L, ARRAY_MT);
    } else {
        lua_newtable(L);
        for (const cJSON *c = j->child; c; c = c->next) {
            push_json(L, c, depth + 1);
            lua_setfield(L, -2, c->string);
        }
    }
}

static int l_decode(lua_State *L) {
    size_t len;
    const char *s = luaL_checklstring(L, 1, &len);
    const char *end = NULL;
    /* cJSON's "nothing after the value" check wants the terminating NUL
     * inside the length; Lua strings always have one */
    cJSON *j = cJSON_ParseWithLengthOpts(s, len + 1, &end, true);
    if (!j) {
        lua_pushnil(L);
        lua_pushfstring(L, "json.decode: invalid JSON at byte %d", end ? (int)(end - s) + 1 : 1);
        return 2;
    }
    push_json(L, j, 0);
    cJSON_Delete(j);
    return 1;
}

static int l_array(lua_State *L) {
    if (lua_isnoneornil(L, 1)) lua_newtable(L);
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_settop(L, 1);
    luaL_setmetatable(L, ARRAY_MT);
    return 1;
}

int li_lua_open_json(lua_State *L) {
    luaL_newmetatable(L, ARRAY_MT);
    lua_pop(L, 1);
    lua_getfield(L, LUA_REGISTRYINDEX, "luainfer.json.null");
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        lua_newtable(L);
        lua_createtable(L, 0, 1);
        lua_pushcfunction(L, null_tostring);
        lua_setfield(L, -2, "__tostring");
        lua_setmetatable(L, -2);
        lua_pushvalue(L, -1);
        lua_setfield(L, LUA_REGISTRYINDEX, "luainfer.json.null");
    }
    lua_createtable(L, 0, 4);
    lua_pushvalue(L, -2);
    lua_setfield(L, -2, "null");
    lua_pushcfunction(L, l_encode);
    lua_setfield(L, -2, "encode");
    lua_pushcfunction(L, l_decode);
    lua_setfield(L, -2, "decode");
    lua_pushcfunction(L, l_array);
    lua_setfield(L, -2, "array");
    return 1;
}

void li_lua_preload_json(lua_State *L) { li_lua_preload(L, "luainfer.json", li_lua_open_json); }
