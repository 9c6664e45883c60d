/* lua_env.h — creating the engine's LuaJIT states and calling the luainfer
 * Lua library (lua/luainfer/) from C. */
#ifndef LI_LUA_ENV_H
#define LI_LUA_ENV_H

#include "request/request.h" /* li_chat_msg */
#include "util/common.h"

typedef struct lua_State lua_State;

/* Directory of the luainfer Lua library: $LUAINFER_LUA_PATH, else lua/
 * under the source tree the binary was built from. */
const char *li_lua_dir(void);
/* A state with the standard libraries and package.path set to li_lua_dir(). */
lua_State *li_lua_new(li_error *err);
/* Runs `fn` under pcall with a traceback; on error fills err and pops. */
int li_lua_pcall(lua_State *L, int nargs, int nresults, li_error *err);

/* Formats messages with luainfer.chat for the given GGUF template (may be
 * NULL). *out is malloc'd. */
int li_chat_format(lua_State *L, const char *tmpl, const li_chat_msg *msgs, int n, bool add_generation_prompt,
                   char **out, li_error *err);

#endif
