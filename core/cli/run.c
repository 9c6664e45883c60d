/* run.c — `luainfer run SCRIPT.lua [ARGS...]`: a LuaJIT script with the
 * luainfer module (engines, tokenizers, chat templates) and no server. The
 * script gets its arguments in the global `arg`, as the luajit binary does. */
#include "cli/cli.h"
#include "lua/lua_engine.h"
#include "lua/lua_env.h"
#include "lua/lua_json.h"
#include "server/lua_client.h"

#include <lauxlib.h>
#include <lua.h>
#include <stdio.h>
#include <string.h>

int li_cmd_run(int argc, char **argv) {
    if (argc < 1 || !strcmp(argv[0], "--help") || !strcmp(argv[0], "-h")) {
        fprintf(argc < 1 ? stderr : stdout,
                "usage: luainfer run SCRIPT.lua [ARGS...]\n"
                "Runs a Lua script with require(\"luainfer\") available (see lua/luainfer/init.lua).\n");
        return argc < 1 ? 2 : 0;
    }
    li_error err = {0};
    lua_State *L = li_lua_new(&err);
    if (!L) return li_runtime_fail(&err);
    li_lua_preload_core(L);
    li_lua_preload_net(L);
    li_lua_preload_json(L);
    lua_createtable(L, argc, 1);
    for (int i = 0; i < argc; i++) {
        lua_pushstring(L, argv[i]);
        lua_rawseti(L, -2, i);
    }
    lua_setglobal(L, "arg");
    int status = 0;
    if (luaL_loadfile(L, argv[0]) != 0) {
        fprintf(stderr, "luainfer: error: %s\n", lua_tostring(L, -1));
        status = 1;
    } else {
        for (int i = 1; i < argc; i++) lua_pushstring(L, argv[i]);
        if (li_lua_pcall(L, argc - 1, 0, &err) != 0) status = li_runtime_fail(&err);
    }
    lua_close(L);
    return status;
}
