/* lua_engine.h — registers the C half of the `luainfer` Lua module
 * (`luainfer.core`: engine objects) in a Lua state. */
#ifndef LI_LUA_ENGINE_H
#define LI_LUA_ENGINE_H

#include "request/request.h"

typedef struct lua_State lua_State;

int li_lua_open_core(lua_State *L);
/* Makes require("luainfer.core") available in L. */
void li_lua_preload_core(lua_State *L);
/* package.preload[name] = open: require(name) opens the module on first use */
void li_lua_preload(lua_State *L, const char *name, int (*open)(lua_State *L));

/* The request table at idx (engine:add's argument) through the server's
 * parser, li_request_parse: packed as msgpack, luainfer's defaults, no
 * streaming; token ids checked against n_vocab when > 0. Never raises. */
int li_lua_request_parse(lua_State *L, int idx, int32_t n_vocab, li_gen_params *g, li_error *err);

#endif
