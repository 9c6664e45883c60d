/* lua_env.c — LuaJIT state setup and protected calls into lua/luainfer. */
#include "lua/lua_env.h"

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

const char *li_lua_dir(void) {
    const char *env = getenv("LUAINFER_LUA_PATH");
    return env && *env ? env : LI_SOURCE_DIR "/lua";
}

static int traceback(lua_State *L) {
    const char *msg = lua_tostring(L, 1);
    luaL_traceback(L, L, msg ? msg : "(error object is not a string)", 1);
    return 1;
}

int li_lua_pcall(lua_State *L, int nargs, int nresults, li_error *err) {
    int base = lua_gettop(L) - nargs;
    lua_pushcfunction(L, traceback);
    lua_insert(L, base);
    int rc = lua_pcall(L, nargs, nresults, base);
    lua_remove(L, base);
    if (rc != 0) {
        const char *m = lua_tostring(L, -1);
        li_error_set(err, LI_EINVAL, "lua: %s", m ? m : "unknown error");
        lua_pop(L, 1);
        return LI_EINVAL;
    }
    return 0;
}

lua_State *li_lua_new(li_error *err) {
    lua_State *L = luaL_newstate();
    if (!L) {
        li_error_set(err, LI_ENOMEM, "lua: cannot create a state");
        return NULL;
    }
    luaL_openlibs(L);
    lua_getglobal(L, "package");
    lua_pushfstring(L, "%s/?.lua;%s/?/init.lua", li_lua_dir(), li_lua_dir());
    lua_setfield(L, -2, "path");
    lua_pop(L, 1);
    return L;
}

int li_chat_format(lua_State *L, const char *tmpl, const li_chat_msg *msgs, int n, bool add_generation_prompt,
                   char **out, li_error *err) {
    *out = NULL;
    lua_checkstack(L, 8);
    lua_getglobal(L, "require");
    lua_pushstring(L, "luainfer.chat");
    if (li_lua_pcall(L, 1, 1, err)) return LI_EINVAL;
    lua_getfield(L, -1, "format");
    lua_remove(L, -2);
    if (tmpl) lua_pushstring(L, tmpl);
    else lua_pushnil(L);
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        lua_createtable(L, 0, 2);
        lua_pushstring(L, msgs[i].role);
        lua_setfield(L, -2, "role");
        lua_pushstring(L, msgs[i].content);
        lua_setfield(L, -2, "content");
        lua_rawseti(L, -2, i + 1);
    }
    lua_createtable(L, 0, 1);
    lua_pushboolean(L, add_generation_prompt);
    lua_setfield(L, -2, "add_generation_prompt");
    if (li_lua_pcall(L, 3, 3, err)) return LI_EINVAL;
    size_t len;
    const char *s = lua_tolstring(L, -3, &len);
    if (!s) {
        lua_pop(L, 3);
        return li_error_set(err, LI_EINVAL, "lua: chat.format returned no string");
    }
    /* a template of no family chat.lua knows is rendered as ChatML: say so
     * once, since the prompt may then not be what the model was trained on */
    static atomic_bool warned;
    if (tmpl && !lua_toboolean(L, -1) && !atomic_exchange(&warned, true))
        li_log_warn("chat template not recognised (no known family's markers in it): formatting as %s",
                    lua_tostring(L, -2) ? lua_tostring(L, -2) : "chatml");
    *out = li_xmalloc(len + 1);
    memcpy(*out, s, len + 1);
    lua_pop(L, 3);
    return 0;
}
