/* lua_client.h — `luainfer.net`: blocking sockets and msgpack for Lua
 * clients of the server (lua/luainfer/client.lua). */
#ifndef LI_SERVER_LUA_CLIENT_H
#define LI_SERVER_LUA_CLIENT_H

typedef struct lua_State lua_State;

/* Makes require("luainfer.net") available in L (sockets + msgpack). */
void li_lua_preload_net(lua_State *L);
int luaopen_luainfer_net(lua_State *L);

#endif
