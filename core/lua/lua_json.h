/* lua_json.h — the `luainfer.json` Lua module (JSON through cJSON). */
#ifndef LI_LUA_JSON_H
#define LI_LUA_JSON_H

#include <lua.h>

int li_lua_open_json(lua_State *L);
/* Makes require("luainfer.json") available in L. */
void li_lua_preload_json(lua_State *L);

#endif
