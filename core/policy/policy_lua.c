/* policy_lua.c — in-process LuaJIT policies.
 *
 * Owns: one lua_State per loaded policy ("core"), its sandbox environment,
 * the prebuilt state/request tables it is handed each step, and the
 * conversion of what it returns into an li_plan. It never touches engine
 * state: the engine validates and applies every plan itself.
 *
 * Shape of every call into Lua (Redis script_lua.c habits):
 *   - a C "thunk" runs under lua_pcall with a traceback handler, so even an
 *     allocation failure while building tables is caught, never a panic;
 *   - the per-call instruction budget and the memory limit are armed only
 *     while the thunk runs;
 *   - luaL_checkstack before pushing; the stack is reset after the call.
 *
 * The file is divided by banner comments: allocator and hook, sandbox, state
 * tables, plan conversion, loading, the li_policy vtable. */
#define _POSIX_C_SOURCE 200809L
#include "policy/policy_lua.h"

#include "lua/lua_env.h"

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <luajit.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define HOOK_EVERY 1000                /* instructions between two count-hook calls */
#define PLAN_MAX_ENTRIES LI_PLAN_MAX_ENTRIES
/* C stack a hook call may use below core_call before a wrapped C function
 * (gsub, tostring, sort, ...) refuses to recurse: far below the 8 MiB of the
 * engine thread and the policy host, far above honest use (~30 nested gsub). */
#define CSTACK_MAX ((size_t)256 << 10)
/* A pattern function's worst case, (subject length + 1)^(quantifiers + 1),
 * must stay under 2^PATTERN_COST_LOG2 steps: backtracking runs in C, where
 * the instruction budget cannot reach. */
#define PATTERN_COST_LOG2 26

enum { H_CONFIG, H_ADMIT, H_SCHEDULE, H_EVICT, H_SPECULATE, H_ON_FINISH, H__N };
static const char *const hook_names[H__N] = {"config", "admit", "schedule", "evict", "speculate", "on_finish"};

/* One loaded policy file: a Lua state and the registry refs into it. The
 * struct lives on the heap because it is the allocator's userdata. */
typedef struct lua_core {
    lua_State *L;
    lua_Alloc inner;    /* LuaJIT's own allocator, wrapped for accounting */
    void *inner_ud;
    size_t mem_used, mem_limit;
    bool mem_hit;       /* this call went over mem_limit */
    bool active;        /* inside a protected call: limits armed */
    int64_t budget;     /* <= 0: no instruction limit */
    int64_t count;      /* instructions so far in this call (HOOK_EVERY granularity) */
    bool tripped;       /* budget exceeded: the hook now fires on every instruction */

    int ref_env, ref_module, ref_hook[H__N];
    int ref_state;      /* the state table handed to hooks */
    int ref_update, ref_one, ref_drop, ref_export; /* the FFI updater's functions */
    int ref_spec_state, ref_spec_req;
    unsigned hooks;
    li_policy_config config;
    uintptr_t stack_base; /* an address in core_call's frame while a call runs (C stack guard) */
    size_t mem_hard;      /* past mem_limit an allocation still succeeds up to here, and the
                           * call errors at the next safe point: never a NULL inside a trace */
    bool mem_tripped;     /* the memory error was raised: the hook now fires on every instruction */
} lua_core;

typedef struct li_policy_lua {
    li_policy base;
    lua_core *core;
    li_policy_lua_opts opts;
    int32_t *order;     /* scratch: request indices in arrival order */
    int32_t cap_order;
    int64_t *ids;       /* ids that may have a table in the pool */
    int32_t n_ids, cap_ids;
    int64_t *cur;       /* scratch: this step's ids, sorted */
    int32_t cap_cur;
    int64_t *gone;      /* scratch: ids that left since the last update */
    int32_t cap_gone;
    int64_t finish_errors;
} li_policy_lua;

/* ======================================================================
 * Allocator and instruction hook
 * ====================================================================== */

/* Wraps LuaJIT's allocator (faster than malloc for its small objects) and
 * counts bytes so a policy's state cannot grow past its limit.
 *
 * Past the limit an allocation inside a call still succeeds (mem_hit is
 * set) and the error is raised at a safe point, the count hook or the end
 * of the call: a NULL returned inside a compiled trace can corrupt the VM.
 * Only past the hard cap (limit + 1/4) does the allocator say no; policy code
 * itself never runs in traces (load_chunk), so a NULL then lands in the
 * interpreter or a C function, where it is an ordinary "not enough memory". */
static void *core_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
    lua_core *c = ud;
    if (!ptr) osize = 0;
    if (nsize == 0) {
        c->inner(c->inner_ud, ptr, osize, 0);
        c->mem_used -= LI_MIN(osize, c->mem_used);
        return NULL;
    }
    /* The limit binds only inside protected calls; outside them the C side
     * pushes a few values that must never fail (a refused allocation there
     * would be a LuaJIT panic). */
    if (c->active && nsize > osize) {
        size_t after = c->mem_used - osize + nsize;
        if (after > c->mem_limit) c->mem_hit = true;
        if (after > c->mem_hard) return NULL;
    }
    void *p = c->inner(c->inner_ud, ptr, osize, nsize);
    if (!p) return NULL;
    c->mem_used = c->mem_used - osize + nsize;
    return p;
}

static lua_core *core_of(lua_State *L) {
    void *ud = NULL;
    lua_getallocf(L, &ud);
    return ud;
}

/* Count hook: errors once the call's budget is spent, or once the call
 * went over its memory limit (core_alloc). After the first trip it fires
 * on every instruction, so a policy that catches the error with pcall
 * cannot keep running: the next instruction anywhere errors again.
 *
 * LuaJIT does not run hooks inside compiled traces; that is why a sandboxed
 * policy's own functions never get compiled (load_chunk): this hook then
 * sees all of its code. With --policy-unsafe the budget is best effort. */
static void count_hook(lua_State *L, lua_Debug *ar) {
    (void)ar;
    lua_core *c = core_of(L);
    if (!c->active) return;
    if (c->mem_hit) {
        if (!c->mem_tripped) {
            c->mem_tripped = true;
            lua_sethook(L, count_hook, LUA_MASKCOUNT, 1);
        }
        luaL_where(L, 0);
        lua_pushfstring(L, "policy exceeded its memory limit (%d MiB)", (int)(c->mem_limit >> 20));
        lua_concat(L, 2);
        lua_error(L);
    }
    if (c->budget <= 0) return;
    c->count += c->tripped ? 1 : HOOK_EVERY;
    if (c->tripped || c->count > c->budget) {
        if (!c->tripped) {
            c->tripped = true;
            lua_sethook(L, count_hook, LUA_MASKCOUNT, 1);
        }
        luaL_where(L, 0);
        lua_pushfstring(L, "policy exceeded its instruction budget (%d VM instructions in one call)",
                        (int)(c->budget > 0x7fffffff ? 0x7fffffff : c->budget));
        lua_concat(L, 2);
        lua_error(L);
    }
}

static int traceback(lua_State *L) {
    const char *msg = lua_tostring(L, 1);
    if (!msg) msg = lua_isnoneornil(L, 1) ? "error (nil)" : "error object is not a string";
    luaL_traceback(L, L, msg, 1);
    return 1;
}

/* Runs fn(ud) under pcall with a traceback handler and the limits armed.
 * `what` names the hook for messages. */
static int core_call(lua_core *c, lua_CFunction fn, void *ud, const char *what, li_error *err) {
    lua_State *L = c->L;
    int top = lua_gettop(L);
    if (!lua_checkstack(L, 4)) return li_error_set(err, LI_ENOMEM, "%s: Lua stack exhausted", what);
    lua_pushcfunction(L, traceback);
    lua_pushcfunction(L, fn);
    lua_pushlightuserdata(L, ud);
    volatile char here = 0;
    c->stack_base = (uintptr_t)&here;
    c->count = 0;
    c->tripped = false;
    c->mem_hit = false;
    c->mem_tripped = false;
    c->active = true;
    int rc = lua_pcall(L, 1, 0, top + 1);
    c->active = false;
    c->stack_base = 0;
    if (c->tripped || c->mem_tripped) lua_sethook(L, count_hook, LUA_MASKCOUNT, HOOK_EVERY);
    int ret = 0;
    if (rc != 0) {
        const char *m = lua_tostring(L, -1);
        if (rc == LUA_ERRMEM || c->mem_hit)
            ret = li_error_set(err, LI_ENOMEM, "%s: policy exceeded its memory limit (%zu MiB)%s%s", what,
                               c->mem_limit >> 20, m ? ": " : "", m ? m : "");
        else if (c->tripped)
            ret = li_error_set(err, LI_ERANGE, "%s: %s", what, m ? m : "instruction budget exceeded");
        else
            ret = li_error_set(err, LI_EINVAL, "%s: %s", what, m ? m : "error");
    } else if (c->mem_hit) {
        /* over the limit without reaching a safe point (C code, the end of
         * the call): the call still fails, its result is not used */
        ret = li_error_set(err, LI_ENOMEM, "%s: policy exceeded its memory limit (%zu MiB)", what, c->mem_limit >> 20);
    }
    lua_settop(L, top);
    if (rc == LUA_ERRMEM || c->mem_hit) {
        /* twice: each full cycle also halves LuaJIT's string buffer, which
         * the bomb may have grown up to the hard cap */
        lua_gc(L, LUA_GCCOLLECT, 0);
        lua_gc(L, LUA_GCCOLLECT, 0);
    }
    return ret;
}

/* ======================================================================
 * Sandbox
 * ====================================================================== */

/* print() inside a policy goes to the engine's log (info level). */
static int sb_print(lua_State *L) {
    int n = lua_gettop(L);
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (int i = 1; i <= n; i++) {
        if (i > 1) luaL_addchar(&b, '\t');
        int t = lua_type(L, i);
        if (t == LUA_TSTRING || t == LUA_TNUMBER) {
            lua_pushvalue(L, i);
            luaL_addvalue(&b);
        } else if (t == LUA_TBOOLEAN) {
            luaL_addstring(&b, lua_toboolean(L, i) ? "true" : "false");
        } else if (t == LUA_TNIL) {
            luaL_addstring(&b, "nil");
        } else {
            lua_pushfstring(L, "%s: %p", lua_typename(L, t), lua_topointer(L, i));
            luaL_addvalue(&b);
        }
    }
    luaL_pushresult(&b);
    li_log_info("policy: %s", lua_tostring(L, -1));
    return 0;
}

/* require() in the sandbox: only the preloaded luainfer modules.
 * upvalue 1 = loaded table, upvalue 2 = env. */
static int sb_require(lua_State *L) {
    const char *name = luaL_checkstring(L, 1);
    lua_settop(L, 1);
    lua_getfield(L, lua_upvalueindex(1), name);
    if (!lua_isnil(L, -1)) return 1;
    lua_pop(L, 1);
    if (strcmp(name, "luainfer.policy") != 0)
        return luaL_error(L, "module '%s' is not available in the policy sandbox (only 'luainfer.policy'; "
                             "--policy-unsafe allows require)", name);
    char path[4096];
    snprintf(path, sizeof path, "%s/luainfer/policy.lua", li_lua_dir());
    if (luaL_loadfile(L, path) != 0) return luaL_error(L, "require '%s': %s", name, lua_tostring(L, -1));
    luaJIT_setmode(L, -1, LUAJIT_MODE_ALLFUNC | LUAJIT_MODE_OFF); /* see load_thunk */
    lua_pushvalue(L, lua_upvalueindex(2));
    lua_setfenv(L, -2);
    lua_pushvalue(L, 1);
    lua_call(L, 1, 1);
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        lua_pushboolean(L, 1);
    }
    lua_pushvalue(L, -1);
    lua_setfield(L, lua_upvalueindex(1), name);
    return 1;
}

/* C functions that call back into Lua (a gsub callback, __tostring, a sort
 * comparator, os.time's __index) recurse on the C stack, where LuaJIT has
 * no limit: `local function g() return string.gsub("x", "x", g) end`
 * overflows it. The sandbox hands out these functions wrapped: a wrapper
 * refuses to go on once the call uses more than CSTACK_MAX of C stack
 * (measured from core_call, so an error unwinding past it leaves nothing
 * to undo). The pattern functions also refuse a pattern whose worst-case
 * backtracking on this subject is too long to run uninterrupted in C. */
enum { WRAP_PLAIN, WRAP_PATTERN, WRAP_FIND };

static void guard_cstack(lua_State *L) {
    lua_core *c = core_of(L);
    volatile char here = 0;
    uintptr_t at = (uintptr_t)&here;
    if (c->active && c->stack_base > at && c->stack_base - at > CSTACK_MAX)
        luaL_error(L, "policy recursion too deep through a C function (string.gsub, tostring, table.sort, ...): "
                      "over %d KiB of C stack", (int)(CSTACK_MAX >> 10));
}

/* Quantified items of a Lua pattern (*, +, -, ?, %b, back-references),
 * counted generously: each can multiply the matcher's work by the
 * subject's length. */
static int pattern_quantifiers(const char *p, size_t len) {
    int q = 0;
    for (size_t i = 0; i < len; i++) {
        char ch = p[i];
        if (ch == '%') {
            if (i + 1 < len && (p[i + 1] == 'b' || (p[i + 1] >= '1' && p[i + 1] <= '9'))) q++;
            i++;
        } else if (ch == '[') {
            i++;
            if (i < len && p[i] == '^') i++;
            if (i < len && p[i] == ']') i++; /* a leading ']' is a member */
            while (i < len && p[i] != ']') i += p[i] == '%' ? 2 : 1;
        } else if (ch == '*' || ch == '+' || ch == '-' || ch == '?') {
            q++;
        }
    }
    return q;
}

static void guard_pattern(lua_State *L, int kind) {
    if (kind == WRAP_FIND && lua_toboolean(L, 4)) return; /* plain find: linear */
    if (lua_type(L, 1) != LUA_TSTRING && lua_type(L, 1) != LUA_TNUMBER) return; /* the function errors */
    if (lua_type(L, 2) != LUA_TSTRING) return;
    size_t n = 0, pl = 0;
    lua_tolstring(L, 1, &n);
    const char *pat = lua_tolstring(L, 2, &pl);
    int q = pattern_quantifiers(pat, pl);
    if (q > 0 && (double)(q + 1) * log2((double)n + 1) > PATTERN_COST_LOG2)
        luaL_error(L, "pattern too costly for the policy sandbox: %d quantifiers on a %d-byte string can backtrack "
                      "for more than 2^%d steps", q, (int)LI_MIN(n, (size_t)INT32_MAX), PATTERN_COST_LOG2);
}

/* upvalue 1: the wrapped function, upvalue 2: WRAP_* */
static int sb_wrapped(lua_State *L) {
    guard_cstack(L);
    int kind = (int)lua_tointeger(L, lua_upvalueindex(2));
    if (kind != WRAP_PLAIN) guard_pattern(L, kind);
    int n = lua_gettop(L);
    luaL_checkstack(L, 2, "policy call");
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, n, LUA_MULTRET);
    return lua_gettop(L);
}

/* tbl[name] = wrapped(tbl[name]) (tbl at index t) */
static void sb_wrap(lua_State *L, int t, const char *name, int kind) {
    lua_getfield(L, t, name);
    if (!lua_isfunction(L, -1)) {
        lua_pop(L, 1);
        return;
    }
    lua_pushinteger(L, kind);
    lua_pushcclosure(L, sb_wrapped, 2);
    lua_setfield(L, t, name);
}

/* The sandbox's string functions, in env.string (index t) or the real
 * string table that string methods (s:gsub()) use. */
static void sb_wrap_string(lua_State *L, int t) {
    sb_wrap(L, t, "gsub", WRAP_PATTERN);
    sb_wrap(L, t, "match", WRAP_PATTERN);
    sb_wrap(L, t, "gmatch", WRAP_PATTERN);
    sb_wrap(L, t, "find", WRAP_FIND);
    sb_wrap(L, t, "format", WRAP_PLAIN);
}

/* Shallow copy of global library `lib` into env[lib] (all fields, or only
 * `only` when non-NULL). */
static void sb_copy_lib(lua_State *L, int env, const char *lib, const char *const *only) {
    lua_getglobal(L, lib);
    if (!lua_istable(L, -1)) {
        lua_pop(L, 1);
        return;
    }
    int src = lua_gettop(L);
    lua_newtable(L);
    if (only) {
        for (int i = 0; only[i]; i++) {
            lua_getfield(L, src, only[i]);
            lua_setfield(L, -2, only[i]);
        }
    } else {
        lua_pushnil(L);
        while (lua_next(L, src)) {
            lua_pushvalue(L, -2);
            lua_insert(L, -2);
            lua_rawset(L, -4);
        }
    }
    lua_setfield(L, env, lib);
    lua_pop(L, 1);
}

/* Builds the policy's environment table and leaves it on the stack. */
static void sb_build_env(lua_State *L, const li_policy_lua_opts *o) {
    if (o->allow_unsafe) {
        /* everything, with the policy's globals kept in their own table */
        lua_newtable(L);
        lua_newtable(L);
        lua_pushvalue(L, LUA_GLOBALSINDEX);
        lua_setfield(L, -2, "__index");
        lua_setmetatable(L, -2);
        lua_pushvalue(L, -1);
        lua_setfield(L, -2, "_G");
        return;
    }
    static const char *const base_ok[] = {
        "assert", "error", "ipairs", "pairs", "next", "pcall", "xpcall", "select", "tonumber",
        "tostring", "type", "unpack", "rawget", "rawset", "rawequal", "rawlen", "setmetatable",
        "getmetatable", "_VERSION", NULL,
    };
    static const char *const os_ok[] = {"clock", "time", NULL};
    lua_newtable(L);
    int env = lua_gettop(L);
    for (int i = 0; base_ok[i]; i++) {
        lua_getglobal(L, base_ok[i]);
        lua_setfield(L, env, base_ok[i]); /* absent ones (rawlen in 5.1) stay nil */
    }
    sb_copy_lib(L, env, "string", NULL);
    sb_copy_lib(L, env, "table", NULL);
    sb_copy_lib(L, env, "math", NULL);
    sb_copy_lib(L, env, "bit", NULL);
    sb_copy_lib(L, env, "os", os_ok);
    /* string.dump is useless without load and leaks bytecode: drop it, from
     * the copy and from the real table that string methods (s:rep()) use */
    lua_getfield(L, env, "string");
    lua_pushnil(L);
    lua_setfield(L, -2, "dump");
    lua_pop(L, 1);
    lua_getglobal(L, "string");
    lua_pushnil(L);
    lua_setfield(L, -2, "dump");
    sb_wrap_string(L, lua_gettop(L));
    lua_pop(L, 1);
    /* the functions that call back into Lua, guarded (above) */
    lua_getfield(L, env, "string");
    sb_wrap_string(L, lua_gettop(L));
    lua_pop(L, 1);
    lua_getfield(L, env, "table");
    sb_wrap(L, lua_gettop(L), "sort", WRAP_PLAIN);
    lua_pop(L, 1);
    lua_getfield(L, env, "os");
    sb_wrap(L, lua_gettop(L), "time", WRAP_PLAIN);
    lua_pop(L, 1);
    sb_wrap(L, env, "tostring", WRAP_PLAIN);
    /* getmetatable("") would hand out the real string table: hide it */
    lua_pushliteral(L, "");
    if (lua_getmetatable(L, -1)) {
        lua_pushliteral(L, "string");
        lua_setfield(L, -2, "__metatable");
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    lua_pushcfunction(L, sb_print);
    lua_setfield(L, env, "print");
    lua_newtable(L); /* loaded */
    lua_pushvalue(L, env);
    lua_pushcclosure(L, sb_require, 2);
    lua_setfield(L, env, "require");
    lua_pushvalue(L, env);
    lua_setfield(L, env, "_G");
}

/* ======================================================================
 * State tables: built once, updated in place every step
 *
 * The update is Lua code (compiled by the JIT after a few steps) reading the
 * C structs through FFI: far cheaper than ~15 lua_rawset per request through
 * the C API. ffi itself stays out of the sandbox: the updater holds it as an
 * upvalue and lives only in the registry. The C side sorts by arrival and
 * lists the requests that left; the Lua side writes the tables.
 * ====================================================================== */

static const char updater_src[] =
    "local ffi, pool, tptr, S, requests, waiting, running, preempted, kv, budget,\n"
    "      sz_req, off_tenant, off_spec, sz_st, off_mbt, sz_run, sz_cand, off_ngram, sz_ss, off_rows = ...\n"
    "ffi.cdef[[\n"
    "typedef struct li_req_view_ffi {\n"
    "  int64_t id; int32_t state; double arrival; int32_t priority; const char *tenant;\n"
    "  int64_t prompt_len, num_tokens, num_computed, num_generated, max_tokens, cached_len;\n"
    "  int32_t n_blocks, n_preemptions; double spec_acceptance; int32_t projected_blocks;\n"
    "  double slo_ttft_ms, slo_tpot_ms, first_scheduled, first_token;\n"
    "  const uint8_t *prefix_hash; int32_t n_prefix_hash;\n"
    "} li_req_view_ffi;\n"
    "typedef struct li_step_state_ffi {\n"
    "  int64_t step; double now; const li_req_view_ffi *reqs; int32_t n_reqs;\n"
    "  int32_t kv_free_blocks, kv_total_blocks, kv_cached_blocks, block_size;\n"
    "  int32_t max_num_seqs, max_batched_tokens; int32_t kv_running_need;\n"
    "} li_step_state_ffi;\n"
    "]]\n"
    "if ffi.sizeof('li_req_view_ffi') ~= sz_req or ffi.offsetof('li_req_view_ffi', 'tenant') ~= off_tenant\n"
    "   or ffi.offsetof('li_req_view_ffi', 'spec_acceptance') ~= off_spec or ffi.sizeof('li_step_state_ffi') ~= sz_st\n"
    "   or ffi.offsetof('li_step_state_ffi', 'max_batched_tokens') ~= off_mbt then\n"
    "  error('internal: policy.h struct layout differs from the FFI mirror in policy_lua.c')\n"
    "end\n"
    "local cast, tonumber, fstring = ffi.cast, tonumber, ffi.string\n"
    "local st_t, rv_t = ffi.typeof('const li_step_state_ffi *'), ffi.typeof('const li_req_view_ffi *')\n"
    "local i32p, i64p = ffi.typeof('const int32_t *'), ffi.typeof('const int64_t *')\n"
    "local names = { [0] = 'waiting', 'running', 'preempted' }\n"
    "-- req.prefix_hashes, built on first read: the view index of each id this\n"
    "-- step (vidx; -1: the view of a hook call, one_v), the lists built (hcache)\n"
    "local vidx, hcache, cur, one_v = {}, {}, nil, nil\n"
    "local spool = {} -- id -> its speculation tables (spec_req), kept apart from what a policy can overwrite\n"
    "local lazy = { __index = function(t, k)\n"
    "  if k ~= 'prefix_hashes' then return nil end\n"
    "  local id = rawget(t, 'id')\n"
    "  local i = vidx[id]\n"
    "  local v = i == -1 and one_v or i ~= nil and cur ~= nil and cur[i] or nil\n"
    "  if v == nil then return {} end\n"
    "  local n, h = v.n_prefix_hash, hcache[id]\n"
    "  if h == nil or #h ~= n then\n"
    "    h = {}\n"
    "    for b = 0, n - 1 do h[b + 1] = fstring(v.prefix_hash + 16 * b, 16) end\n"
    "    hcache[id] = h\n"
    "  end\n"
    "  return h\n"
    "end }\n"
    "local nw0, nr0, np0, n0 = 0, 0, 0, 0\n"
    "local function fill(v)\n"
    "  local id = tonumber(v.id)\n"
    "  local t = pool[id]\n"
    "  if t == nil then t = setmetatable({}, lazy); pool[id] = t end\n"
    "  local tp = v.tenant\n"
    "  if tptr[id] ~= tp then\n"
    "    -- the string is re-read only when its pointer changes\n"
    "    tptr[id] = tp\n"
    "    t.tenant = tp ~= nil and fstring(tp) or ''\n"
    "  end\n"
    "  t.id = id\n"
    "  t.state = names[v.state] or 'waiting'\n"
    "  t.arrival = v.arrival\n"
    "  t.priority = v.priority\n"
    "  t.prompt_len = tonumber(v.prompt_len)\n"
    "  t.num_tokens = tonumber(v.num_tokens)\n"
    "  t.num_computed = tonumber(v.num_computed)\n"
    "  t.num_generated = tonumber(v.num_generated)\n"
    "  t.max_tokens = tonumber(v.max_tokens)\n"
    "  t.cached_len = tonumber(v.cached_len)\n"
    "  t.blocks = v.n_blocks\n"
    "  t.preemptions = v.n_preemptions\n"
    "  local sa = v.spec_acceptance\n"
    "  if sa >= 0 then t.spec_acceptance = sa else t.spec_acceptance = nil end\n"
    "  t.projected_blocks = v.projected_blocks\n"
    "  -- objectives and times: nil when none / not yet\n"
    "  local x = v.slo_ttft_ms\n"
    "  if x > 0 then t.slo_ttft_ms = x else t.slo_ttft_ms = nil end\n"
    "  x = v.slo_tpot_ms\n"
    "  if x > 0 then t.slo_tpot_ms = x else t.slo_tpot_ms = nil end\n"
    "  x = v.first_scheduled\n"
    "  if x >= 0 then t.first_scheduled = x else t.first_scheduled = nil end\n"
    "  x = v.first_token\n"
    "  if x >= 0 then t.first_token = x else t.first_token = nil end\n"
    "  return t\n"
    "end\n"
    "local function update(sp, op, gp, ngone)\n"
    "  local st, ord, gone = cast(st_t, sp), cast(i32p, op), cast(i64p, gp)\n"
    "  for i = 0, ngone - 1 do\n"
    "    local id = tonumber(gone[i])\n"
    "    pool[id] = nil; tptr[id] = nil; vidx[id] = nil; hcache[id] = nil; spool[id] = nil\n"
    "  end\n"
    "  local reqs, n = st.reqs, st.n_reqs\n"
    "  cur = reqs\n"
    "  local nw, nr, np = 0, 0, 0\n"
    "  for k = 0, n - 1 do\n"
    "    local v = reqs[ord[k]]\n"
    "    local t = fill(v)\n"
    "    vidx[t.id] = ord[k]\n"
    "    requests[k + 1] = t\n"
    "    local s = v.state\n"
    "    if s == 1 then nr = nr + 1; running[nr] = t\n"
    "    elseif s == 2 then np = np + 1; preempted[np] = t\n"
    "    else nw = nw + 1; waiting[nw] = t end\n"
    "  end\n"
    "  for i = n + 1, n0 do requests[i] = nil end\n"
    "  for i = nw + 1, nw0 do waiting[i] = nil end\n"
    "  for i = nr + 1, nr0 do running[i] = nil end\n"
    "  for i = np + 1, np0 do preempted[i] = nil end\n"
    "  n0, nw0, nr0, np0 = n, nw, nr, np\n"
    "  kv.free_blocks = st.kv_free_blocks\n"
    "  kv.total_blocks = st.kv_total_blocks\n"
    "  kv.cached_blocks = st.kv_cached_blocks\n"
    "  kv.block_size = st.block_size\n"
    "  kv.running_need = st.kv_running_need\n"
    "  budget.max_num_seqs = st.max_num_seqs\n"
    "  budget.max_batched_tokens = st.max_batched_tokens\n"
    "  S.step = tonumber(st.step)\n"
    "  S.now = st.now\n"
    "  S.requests = requests; S.waiting = waiting; S.running = running; S.preempted = preempted\n"
    "  S.kv = kv; S.budget = budget\n"
    "end\n"
    "local function one(vp)\n"
    "  one_v = cast(rv_t, vp)\n"
    "  local t = fill(one_v)\n"
    "  vidx[t.id] = -1\n"
    "  return t\n"
    "end\n"
    "local function drop(id) pool[id] = nil; tptr[id] = nil; vidx[id] = nil; hcache[id] = nil; spool[id] = nil end\n"
    "-- plan export: raw reads only, every value checked, written via FFI\n"
    "ffi.cdef[[ typedef struct li_plan_run_ffi { int64_t id; int32_t n_tokens; } li_plan_run_ffi; ]]\n"
    "if ffi.sizeof('li_plan_run_ffi') ~= sz_run then error('internal: li_plan_run layout differs') end\n"
    "local run_t, i64w = ffi.typeof('li_plan_run_ffi *'), ffi.typeof('int64_t *')\n"
    "local type, rawget, next, floor, format = type, rawget, next, math.floor, string.format\n"
    "local IDMAX, TOKMAX = 2^53, 2^31 - 1\n"
    "local function show(v)\n"
    "  local t = type(v)\n"
    "  if t == 'number' then return format('%.17g', v) end\n"
    "  if t == 'string' then return format('string \"%s\"', v:sub(1, 40)) end\n"
    "  return t\n"
    "end\n"
    "local function export(plan, rp, rcap, pp, pcap)\n"
    "  if type(plan) ~= 'table' then\n"
    "    return nil, 'schedule() must return a plan table {run = {...}, preempt = {...}}, got ' .. type(plan)\n"
    "  end\n"
    "  local run, pre = rawget(plan, 'run'), rawget(plan, 'preempt')\n"
    "  local nr, np = 0, 0\n"
    "  if run ~= nil then\n"
    "    if type(run) ~= 'table' then return nil, 'plan: run must be a table, got ' .. type(run) end\n"
    "    nr = #run\n"
    "    local count = 0\n"
    "    for _ in next, run do count = count + 1 end\n"
    "    if count ~= nr then\n"
    "      return nil, format('plan: run must be an array (%d entries, length %d)', count, nr)\n"
    "    end\n"
    "  end\n"
    "  if pre ~= nil then\n"
    "    if type(pre) ~= 'table' then return nil, 'plan: preempt must be an array of ids, got ' .. type(pre) end\n"
    "    np = #pre\n"
    "    local count = 0\n"
    "    for _ in next, pre do count = count + 1 end\n"
    "    if count ~= np then\n"
    "      return nil, format('plan: preempt must be an array (%d entries, length %d)', count, np)\n"
    "    end\n"
    "  end\n"
    "  if nr > rcap or np > pcap then return -1 - nr, np end\n"
    "  local out, k = cast(run_t, rp), 0\n"
    "  for i = 1, nr do\n"
    "    local e = rawget(run, i)\n"
    "    if type(e) ~= 'table' then\n"
    "      return nil, format('plan: run[%d] must be a table {id = ..., tokens = ...}, got %s', i, type(e))\n"
    "    end\n"
    "    local id, n = rawget(e, 'id'), rawget(e, 'tokens')\n"
    "    if id == nil then id = rawget(e, 1) end\n"
    "    if n == nil then n = rawget(e, 2) end\n"
    "    if type(id) ~= 'number' or not (id >= 0 and id <= IDMAX) or id ~= floor(id) then\n"
    "      return nil, format('plan: run[%d].id must be a request id (integer >= 0), got %s', i, show(id))\n"
    "    end\n"
    "    if type(n) ~= 'number' or not (n >= 0 and n <= TOKMAX) or n ~= floor(n) then\n"
    "      return nil, format('plan: run[%d].tokens must be an integer in [0, 2^31), got %s', i, show(n))\n"
    "    end\n"
    "    if n > 0 then out[k].id = id; out[k].n_tokens = n; k = k + 1 end\n"
    "  end\n"
    "  local po = cast(i64w, pp)\n"
    "  for i = 1, np do\n"
    "    local id = rawget(pre, i)\n"
    "    if type(id) ~= 'number' or not (id >= 0 and id <= IDMAX) or id ~= floor(id) then\n"
    "      return nil, format('plan: preempt[%d] must be a request id, got %s', i, show(id))\n"
    "    end\n"
    "    po[i - 1] = id\n"
    "  end\n"
    "  return k, np\n"
    "end\n"
    "-- speculate: state.spec and each candidate's req.speculation, kept and\n"
    "-- updated in place (built through the C API every call, they cost ~12 us\n"
    "-- a step cold: the interned keys' lookups after a forward pass evicted them)\n"
    "ffi.cdef[[\n"
    "typedef struct li_spec_cand_ffi {\n"
    "  int64_t id; int32_t want_method, want_k, max_k; float temperature;\n"
    "  const double *acceptance; const int64_t *drafted; int32_t ngram, ngram_match; int32_t method, k;\n"
    "} li_spec_cand_ffi;\n"
    "typedef struct li_spec_state_ffi {\n"
    "  const char *const *methods; const bool *available; int32_t n_methods, batch_size;\n"
    "  double step_time, token_time; const double *draft_time, *row_time, *verify_time;\n"
    "} li_spec_state_ffi;\n"
    "]]\n"
    "if ffi.sizeof('li_spec_cand_ffi') ~= sz_cand or ffi.offsetof('li_spec_cand_ffi', 'ngram') ~= off_ngram\n"
    "   or ffi.sizeof('li_spec_state_ffi') ~= sz_ss or ffi.offsetof('li_spec_state_ffi', 'row_time') ~= off_rows then\n"
    "  error('internal: policy.h speculation layouts differ from the FFI mirror in policy_lua.c')\n"
    "end\n"
    "local ss_t, cand_t = ffi.typeof('const li_spec_state_ffi *'), ffi.typeof('const li_spec_cand_ffi *')\n"
    "local mname, mptr, nm = {}, {}, 0 -- method names, re-read only when their pointers change\n"
    "-- the tables are the updater's own, set again on every call: what a policy\n"
    "-- writes into them is overwritten, whatever it wrote\n"
    "local sp, dt, av, rt, vt = {}, {}, {}, {}, {}\n"
    "local function spec_state(p, rows_max)\n"
    "  local ss = cast(ss_t, p)\n"
    "  sp.draft_time, sp.available, sp.row_time, sp.verify_time = dt, av, rt, vt\n"
    "  for m = 0, nm - 1 do local k = mname[m]; dt[k] = nil; av[k] = nil end\n"
    "  nm = ss.n_methods\n"
    "  for m = 0, nm - 1 do\n"
    "    local q = ss.methods[m]\n"
    "    if mptr[m] ~= q then mptr[m] = q; mname[m] = fstring(q) end\n"
    "    local k = mname[m]\n"
    "    dt[k] = ss.draft_time[m]\n"
    "    av[k] = ss.available[m]\n"
    "  end\n"
    "  sp.batch_size = ss.batch_size\n"
    "  sp.step_time = ss.step_time\n"
    "  sp.token_time = ss.token_time\n"
    "  local r = ss.row_time\n"
    "  for n = 1, rows_max do\n"
    "    local x = r ~= nil and r[n - 1] or 0\n"
    "    if x > 0 then rt[n] = x else rt[n] = nil end\n"
    "  end\n"
    "  local v = ss.verify_time\n"
    "  local g, z = v ~= nil and v[0] or 0, v ~= nil and v[1] or 0\n"
    "  if g > 0 then vt.greedy = g else vt.greedy = nil end\n"
    "  if z > 0 then vt.sampled = z else vt.sampled = nil end\n"
    "  S.spec = sp\n"
    "end\n"
    "local function spec_req(vp, cp)\n"
    "  local t = one(vp)\n"
    "  local c = cast(cand_t, cp)\n"
    "  local e = spool[t.id]\n"
    "  if e == nil then e = { {}, {}, {} }; spool[t.id] = e end\n"
    "  local s, acc, dr = e[1], e[2], e[3]\n"
    "  t.speculation, s.acceptance, s.drafted = s, acc, dr\n"
    "  local wm = c.want_method\n"
    "  s.method = (wm >= 0 and wm < nm) and mname[wm] or 'ngram'\n"
    "  s.k = c.want_k\n"
    "  s.max_k = c.max_k\n"
    "  s.temperature = c.temperature\n"
    "  for m = 0, nm - 1 do\n"
    "    local k = mname[m]\n"
    "    acc[k] = c.acceptance[m]\n"
    "    dr[k] = tonumber(c.drafted[m])\n"
    "  end\n"
    "  local x = c.ngram\n"
    "  if x >= 0 then s.ngram = x else s.ngram = nil end\n"
    "  x = c.ngram_match\n"
    "  if x >= 0 then s.ngram_match = x else s.ngram_match = nil end\n"
    "  return t\n"
    "end\n"
    "return update, one, drop, export, spec_state, spec_req\n";

/* Addresses travel to the FFI code as numbers: the trace compiler handles a
 * number -> pointer cast, not a lightuserdata one (x86-64 user addresses
 * fit in a double's 53 bits). */
static void push_addr(lua_State *L, const void *p) { lua_pushnumber(L, (lua_Number)(uintptr_t)p); }

static int mkref(lua_State *L) { return luaL_ref(L, LUA_REGISTRYINDEX); }
static void getref(lua_State *L, int ref) { lua_rawgeti(L, LUA_REGISTRYINDEX, ref); }

/* Creates the state tables and the updater (inside the load thunk). */
static void core_make_tables(lua_State *L, lua_core *c) {
    luaL_checkstack(L, 24, "policy state");
    if (luaL_loadbuffer(L, updater_src, sizeof updater_src - 1, "=policy_lua.c:updater") != 0) lua_error(L);
    int fn = lua_gettop(L);
    lua_pushcfunction(L, luaopen_ffi);
    lua_call(L, 0, 1);              /* ffi */
    lua_newtable(L);                /* pool: id -> request table */
    lua_newtable(L);                /* id -> tenant pointer last read */
    lua_createtable(L, 0, 8);       /* state */
    lua_pushvalue(L, -1);
    c->ref_state = mkref(L);
    for (int i = 0; i < 4; i++) lua_createtable(L, 64, 0); /* requests, waiting, running, preempted */
    lua_createtable(L, 0, 4);       /* kv */
    lua_createtable(L, 0, 2);       /* budget */
    lua_pushnumber(L, (lua_Number)sizeof(li_req_view));
    lua_pushnumber(L, (lua_Number)offsetof(li_req_view, tenant));
    lua_pushnumber(L, (lua_Number)offsetof(li_req_view, spec_acceptance));
    lua_pushnumber(L, (lua_Number)sizeof(li_step_state));
    lua_pushnumber(L, (lua_Number)offsetof(li_step_state, max_batched_tokens));
    lua_pushnumber(L, (lua_Number)sizeof(li_plan_run));
    lua_pushnumber(L, (lua_Number)sizeof(li_spec_cand));
    lua_pushnumber(L, (lua_Number)offsetof(li_spec_cand, ngram));
    lua_pushnumber(L, (lua_Number)sizeof(li_spec_state));
    lua_pushnumber(L, (lua_Number)offsetof(li_spec_state, row_time));
    lua_call(L, lua_gettop(L) - fn, 6);
    c->ref_spec_req = mkref(L);
    c->ref_spec_state = mkref(L);
    c->ref_export = mkref(L);
    c->ref_drop = mkref(L);
    c->ref_one = mkref(L);
    c->ref_update = mkref(L);
}

static void ids_reserve(int64_t **a, int32_t *cap, int32_t need) {
    if (need > *cap) {
        *cap = need * 2 + 16;
        *a = li_xrealloc(*a, (size_t)*cap * sizeof **a);
    }
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static const li_req_view *g_sort_reqs; /* qsort has no context argument in C11 */
static int cmp_arrival(const void *a, const void *b) {
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    double x = g_sort_reqs[i].arrival, y = g_sort_reqs[j].arrival;
    if (x != y) return x < y ? -1 : 1;
    return (i > j) - (i < j);
}

/* Refreshes the state table from st (runs inside a protected call). */
static void update_state(lua_State *L, li_policy_lua *p, const li_step_state *st) {
    lua_core *c = p->core;
    int32_t n = st->n_reqs > 0 ? st->n_reqs : 0;

    /* arrival order (the engine usually hands it over sorted already) */
    if (n > p->cap_order) {
        p->cap_order = n * 2 + 16;
        p->order = li_xrealloc(p->order, (size_t)p->cap_order * sizeof *p->order);
    }
    bool sorted = true;
    for (int32_t i = 0; i < n; i++) {
        p->order[i] = i;
        if (i && st->reqs[i].arrival < st->reqs[i - 1].arrival) sorted = false;
    }
    if (!sorted) {
        g_sort_reqs = st->reqs;
        qsort(p->order, (size_t)n, sizeof *p->order, cmp_arrival);
    }

    /* requests that left since the last update: their tables are dropped.
     * Steady state (same requests, same order) skips the sort. */
    int32_t n_gone = 0;
    bool same = p->n_ids == n;
    for (int32_t i = 0; same && i < n; i++) same = p->ids[i] == st->reqs[i].id;
    if (!same) {
        ids_reserve(&p->cur, &p->cap_cur, n + 1);
        for (int32_t i = 0; i < n; i++) p->cur[i] = st->reqs[i].id;
        if (n > 1) qsort(p->cur, (size_t)n, sizeof *p->cur, cmp_i64);
        for (int32_t i = 0; i < p->n_ids; i++)
            if (n == 0 || !bsearch(&p->ids[i], p->cur, (size_t)n, sizeof *p->cur, cmp_i64)) p->ids[n_gone++] = p->ids[i];
        ids_reserve(&p->gone, &p->cap_gone, n_gone + 1);
        if (n_gone) memcpy(p->gone, p->ids, (size_t)n_gone * sizeof *p->gone);
        ids_reserve(&p->ids, &p->cap_ids, n + 1);
        for (int32_t i = 0; i < n; i++) p->ids[i] = st->reqs[i].id;
        p->n_ids = n;
    }

    luaL_checkstack(L, 8, "policy state");
    getref(L, c->ref_update);
    push_addr(L, st);
    push_addr(L, p->order);
    push_addr(L, p->gone);
    lua_pushnumber(L, n_gone);
    lua_call(L, 4, 0);
}

/* Pushes the pooled table of request v, refreshed from v. */
static void push_req(lua_State *L, lua_core *c, const li_req_view *v) {
    luaL_checkstack(L, 4, "policy request");
    getref(L, c->ref_one);
    push_addr(L, v);
    lua_call(L, 1, 1);
}

/* Remembers that id has a pooled table (admit may create one for a request
 * the state does not list yet). */
static void note_id(li_policy_lua *p, int64_t id) {
    for (int32_t i = 0; i < p->n_ids; i++)
        if (p->ids[i] == id) return;
    ids_reserve(&p->ids, &p->cap_ids, p->n_ids + 1);
    p->ids[p->n_ids++] = id;
}

/* ======================================================================
 * Plan conversion: Lua table -> li_plan, every field type-checked
 *
 * The checks run in Lua (the exporter in updater_src, JIT-compiled, writing
 * straight into the plan's arrays through FFI); reading 64 entries through
 * the C API cost ~10 us, this ~1 us. Only raw reads: a plan's metatables are
 * never consulted, so no policy code runs during the conversion.
 * ====================================================================== */


static const char *lua_kind(lua_State *L, int idx) { return lua_typename(L, lua_type(L, idx)); }

/* Reads an integral number at idx into *out; false if it is not one or lies
 * outside [lo, hi]. */
static bool get_int(lua_State *L, int idx, double lo, double hi, int64_t *out) {
    if (lua_type(L, idx) != LUA_TNUMBER) return false;
    double d = lua_tonumber(L, idx);
    if (!(d >= lo && d <= hi) || d != floor(d)) return false;
    *out = (int64_t)d;
    return true;
}

static void plan_reserve(li_plan *p, int64_t n_run, int64_t n_preempt) {
    if (n_run > p->cap_run) {
        p->cap_run = (int32_t)LI_MAX(n_run, 64);
        p->run = li_xrealloc(p->run, (size_t)p->cap_run * sizeof *p->run);
    }
    if (n_preempt > p->cap_preempt) {
        p->cap_preempt = (int32_t)LI_MAX(n_preempt, 16);
        p->preempt = li_xrealloc(p->preempt, (size_t)p->cap_preempt * sizeof *p->preempt);
    }
}

/* Converts the plan at the top of the stack (inside a protected call). */
static int plan_from_lua(lua_State *L, lua_core *c, li_plan *plan, li_error *err) {
    int val = lua_gettop(L);
    plan_reserve(plan, plan->n_run + 64, plan->n_preempt + 16);
    for (int attempt = 0; attempt < 2; attempt++) {
        luaL_checkstack(L, 8, "plan");
        getref(L, c->ref_export);
        lua_pushvalue(L, val);
        push_addr(L, plan->run + plan->n_run);
        lua_pushnumber(L, plan->cap_run - plan->n_run);
        push_addr(L, plan->preempt + plan->n_preempt);
        lua_pushnumber(L, plan->cap_preempt - plan->n_preempt);
        lua_call(L, 5, 2);
        if (lua_isnil(L, -2)) {
            const char *m = lua_tostring(L, -1);
            li_error_set(err, LI_EINVAL, "%s", m ? m : "plan: invalid");
            lua_settop(L, val);
            return LI_EINVAL;
        }
        double k = lua_tonumber(L, -2), np = lua_tonumber(L, -1);
        lua_settop(L, val);
        if (k >= 0) {
            plan->n_run += (int32_t)k;
            plan->n_preempt += (int32_t)np;
            return 0;
        }
        /* -1: the arrays need room for (#run, #preempt) entries */
        double nr = -k - 1;
        if (nr > PLAN_MAX_ENTRIES || np > PLAN_MAX_ENTRIES)
            return li_error_set(err, LI_ERANGE, "plan: more than %d entries", PLAN_MAX_ENTRIES);
        plan_reserve(plan, plan->n_run + (int64_t)nr, plan->n_preempt + (int64_t)np);
    }
    return li_error_set(err, LI_EINVAL, "plan: changed size during conversion");
}

/* ======================================================================
 * Loading a policy file into a fresh core
 * ====================================================================== */

typedef struct load_ctx {
    lua_core *c;
    const li_policy_lua_opts *opts;
    const char *path, *source, *name;
    char *buf;       /* file contents (or NULL for source) */
    size_t len;
    li_error *err;   /* for errors found without a Lua error */
    int rc;
} load_ctx;

static int cfg_int(lua_State *L, int idx, const char *key, int32_t lo, int32_t hi, int32_t *out) {
    int64_t v;
    if (!get_int(L, idx, lo, hi, &v))
        return luaL_error(L, "config.%s must be an integer in [%d, %d]", key, (int)lo, (int)hi);
    *out = (int32_t)v;
    return 0;
}

static void parse_config(lua_State *L, int cfg, li_policy_config *out) {
    memset(out, 0, sizeof *out);
    lua_pushnil(L);
    while (lua_next(L, cfg)) {
        if (lua_type(L, -2) != LUA_TSTRING) luaL_error(L, "config keys must be strings");
        const char *k = lua_tostring(L, -2);
        int v = lua_gettop(L);
        if (!strcmp(k, "block_size")) cfg_int(L, v, k, 1, 1 << 16, &out->block_size);
        else if (!strcmp(k, "max_num_seqs")) cfg_int(L, v, k, 1, 1 << 20, &out->max_num_seqs);
        else if (!strcmp(k, "max_batched_tokens")) cfg_int(L, v, k, 1, 1 << 24, &out->max_batched_tokens);
        else if (!strcmp(k, "kv_dtype")) {
            size_t len = 0;
            const char *s = lua_type(L, v) == LUA_TSTRING ? lua_tolstring(L, v, &len) : NULL;
            if (!s || len == 0 || len >= sizeof out->kv_dtype)
                luaL_error(L, "config.kv_dtype must be a short string such as \"f16\"");
            memcpy(out->kv_dtype, s, len + 1);
        } else
            luaL_error(L, "config: unknown key '%s' (known: block_size, kv_dtype, max_num_seqs, max_batched_tokens)", k);
        lua_pop(L, 1);
    }
}

static int load_thunk(lua_State *L) {
    load_ctx *x = lua_touserdata(L, 1);
    lua_core *c = x->c;
    const li_policy_lua_opts *o = x->opts;
    luaL_checkstack(L, 32, "policy load");

    if (o->allow_unsafe) {
        luaL_openlibs(L);
        lua_getglobal(L, "package");
        lua_pushfstring(L, "%s/?.lua;%s/?/init.lua", li_lua_dir(), li_lua_dir());
        lua_setfield(L, -2, "path");
        lua_pop(L, 1);
    } else {
        /* jit must be opened even when hidden: luaopen_jit sets the
         * optimizer's flags and parameters. */
        static const luaL_Reg libs[] = {
            {"", luaopen_base}, {LUA_TABLIBNAME, luaopen_table}, {LUA_STRLIBNAME, luaopen_string},
            {LUA_MATHLIBNAME, luaopen_math}, {LUA_BITLIBNAME, luaopen_bit}, {LUA_OSLIBNAME, luaopen_os},
            {LUA_JITLIBNAME, luaopen_jit},
        };
        for (size_t i = 0; i < LI_ARRAY_LEN(libs); i++) {
            lua_pushcfunction(L, libs[i].func);
            lua_pushstring(L, libs[i].name);
            lua_call(L, 1, 0);
        }
    }
    luaJIT_setmode(L, 0, LUAJIT_MODE_ENGINE | (o->jit_off ? LUAJIT_MODE_OFF : LUAJIT_MODE_ON));
    /* deterministic math.random, seeded per policy */
    lua_getglobal(L, "math");
    lua_getfield(L, -1, "randomseed");
    lua_pushnumber(L, (lua_Number)(o->seed ? o->seed : LI_POLICY_LUA_DEFAULT_SEED));
    lua_call(L, 1, 0);
    lua_pop(L, 1);

    core_make_tables(L, c);
    sb_build_env(L, o);
    int env = lua_gettop(L);
    lua_pushvalue(L, env);
    c->ref_env = mkref(L);

    /* the chunk: bytecode is refused (it can break the VM) unless unsafe */
    const char *text = x->source ? x->source : x->buf;
    size_t len = x->source ? strlen(x->source) : x->len;
    if (len > 0 && text[0] == LUA_SIGNATURE[0] && !o->allow_unsafe)
        return luaL_error(L, "%s: precompiled bytecode is not accepted (--policy-unsafe allows it)", x->name);
    char chunkname[300];
    snprintf(chunkname, sizeof chunkname, "%s%s", x->source ? "=" : "@", x->name);
    if (luaL_loadbuffer(L, text, len, chunkname) != 0) {
        /* a syntax error: no traceback to add */
        li_error_set(x->err, LI_EINVAL, "%s", lua_tostring(L, -1));
        x->rc = LI_EINVAL;
        return 0;
    }
    /* A sandboxed policy's functions never get compiled: LuaJIT runs no
     * hooks in traces, so only interpreted code is bounded by the count
     * hook (instruction budget, memory safe point). The engine's own Lua
     * (the state updater) stays compiled. */
    if (!o->allow_unsafe) luaJIT_setmode(L, -1, LUAJIT_MODE_ALLFUNC | LUAJIT_MODE_OFF);
    lua_pushvalue(L, env);
    lua_setfenv(L, -2);
    lua_call(L, 0, 1);
    if (!lua_istable(L, -1))
        return luaL_error(L, "%s: the policy file must return a table of hooks, got %s", x->name, lua_kind(L, -1));
    int mod = lua_gettop(L);
    lua_pushvalue(L, mod);
    c->ref_module = mkref(L);
    for (int h = 0; h < H__N; h++) {
        c->ref_hook[h] = LUA_NOREF;
        lua_getfield(L, mod, hook_names[h]);
        if (lua_isnil(L, -1)) {
            lua_pop(L, 1);
            continue;
        }
        if (h == H_CONFIG) {
            if (!lua_istable(L, -1))
                return luaL_error(L, "%s: config must be a table, got %s", x->name, lua_kind(L, -1));
            parse_config(L, lua_gettop(L), &c->config);
            lua_pop(L, 1);
            continue;
        }
        if (!lua_isfunction(L, -1))
            return luaL_error(L, "%s: hook '%s' must be a function, got %s", x->name, hook_names[h], lua_kind(L, -1));
        c->ref_hook[h] = mkref(L);
    }
    c->hooks = (c->ref_hook[H_SCHEDULE] != LUA_NOREF ? LI_POLICY_HOOK_SCHEDULE : 0) |
               (c->ref_hook[H_ADMIT] != LUA_NOREF ? LI_POLICY_HOOK_ADMIT : 0) |
               (c->ref_hook[H_ON_FINISH] != LUA_NOREF ? LI_POLICY_HOOK_ON_FINISH : 0) |
               (c->ref_hook[H_EVICT] != LUA_NOREF ? LI_POLICY_HOOK_EVICT : 0) |
               (c->ref_hook[H_SPECULATE] != LUA_NOREF ? LI_POLICY_HOOK_SPECULATE : 0);
    return 0;
}

static void core_free(lua_core *c) {
    if (!c) return;
    if (c->L) {
        /* LuaJIT releases its arena only when its own allocator is installed */
        lua_setallocf(c->L, c->inner, c->inner_ud);
        lua_close(c->L);
    }
    free(c);
}

int li_policy_read_file(const char *path, char **out, size_t *len, li_error *err) {
    *out = NULL;
    *len = 0;
    /* O_NONBLOCK: opening a FIFO without a writer must not wait for one */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) return li_error_set(err, LI_EIO, "cannot open policy file '%s': %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        const char *what = S_ISFIFO(sb.st_mode) ? "a FIFO" : S_ISDIR(sb.st_mode) ? "a directory"
                           : S_ISCHR(sb.st_mode) || S_ISBLK(sb.st_mode) ? "a device" : "not a regular file";
        close(fd);
        return li_error_set(err, LI_EINVAL, "policy file '%s' is %s (a regular file is needed)", path, what);
    }
    if ((uint64_t)sb.st_size > LI_POLICY_FILE_MAX) {
        close(fd);
        return li_error_set(err, LI_ERANGE, "policy file '%s' is larger than %zu bytes", path, LI_POLICY_FILE_MAX);
    }
    size_t cap = (size_t)sb.st_size + 1, n = 0;
    char *buf = li_xmalloc(cap);
    for (;;) {
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            free(buf);
            close(fd);
            return li_error_set(err, LI_EIO, "cannot read policy file '%s': %s", path, strerror(e));
        }
        n += (size_t)r;
        if (r == 0 || n == cap - 1) break; /* a file growing while read is cut at its size at open */
    }
    close(fd);
    buf[n] = 0;
    *out = buf;
    *len = n;
    return 0;
}

static int read_file(const char *path, char **out, size_t *len, li_error *err) {
    return li_policy_read_file(path, out, len, err);
}

/* A new core with the policy loaded, or NULL with err set. */
static lua_core *core_new(const char *path, const char *source, const li_policy_lua_opts *o, li_error *err) {
    if (!path && !source) {
        li_error_set(err, LI_EINVAL, "policy: neither a path nor source text given");
        return NULL;
    }
    load_ctx x = {.opts = o, .path = path, .source = source, .name = path ? path : "policy"};
    if (!source && read_file(path, &x.buf, &x.len, err)) return NULL;
    lua_core *c = li_xcalloc(1, sizeof *c);
    c->mem_limit = o->mem_limit ? o->mem_limit : LI_POLICY_LUA_DEFAULT_MEM;
    c->budget = o->instr_budget == 0 ? LI_POLICY_LUA_DEFAULT_BUDGET : o->instr_budget;
    c->L = luaL_newstate();
    if (!c->L) {
        free(x.buf);
        free(c);
        li_error_set(err, LI_ENOMEM, "policy: cannot create a Lua state");
        return NULL;
    }
    c->inner = lua_getallocf(c->L, &c->inner_ud);
    c->mem_used = (size_t)lua_gc(c->L, LUA_GCCOUNT, 0) * 1024 + (size_t)lua_gc(c->L, LUA_GCCOUNTB, 0);
    lua_setallocf(c->L, core_alloc, c);
    c->mem_hard = c->mem_limit > SIZE_MAX / 2 ? SIZE_MAX : c->mem_limit + c->mem_limit / 4;
    /* always on: it is also the memory limit's safe point */
    lua_sethook(c->L, count_hook, LUA_MASKCOUNT, HOOK_EVERY);
    x.c = c;
    li_error lerr = {0};
    x.err = &lerr;
    int rc = core_call(c, load_thunk, &x, "load", &lerr);
    if (rc == 0) rc = x.rc;
    free(x.buf);
    if (rc) {
        /* "load: policies/x.lua:12: ..." reads better without the prefix */
        const char *m = strncmp(lerr.msg, "load: ", 6) == 0 ? lerr.msg + 6 : lerr.msg;
        li_error_set(err, rc, "%s", m);
        core_free(c);
        return NULL;
    }
    lua_gc(c->L, LUA_GCCOLLECT, 0);
    return c;
}

/* ======================================================================
 * The li_policy vtable
 * ====================================================================== */

typedef struct sched_ctx {
    li_policy_lua *p;
    const li_step_state *st;
    const li_req_view *req;
    li_plan *plan;
    li_error *err;
    int conv_rc;
    bool accept;
    char *reason;
    size_t reason_cap;
    const char *finish_reason;
} sched_ctx;

static int schedule_thunk(lua_State *L) {
    sched_ctx *x = lua_touserdata(L, 1);
    lua_core *c = x->p->core;
    update_state(L, x->p, x->st);
    luaL_checkstack(L, 8, "schedule");
    getref(L, c->ref_hook[H_SCHEDULE]);
    getref(L, c->ref_state);
    lua_call(L, 1, 1);
    x->conv_rc = plan_from_lua(L, c, x->plan, x->err);
    return 0;
}

static int lua_schedule(li_policy *pp, const li_step_state *st, li_plan *plan, li_error *err) {
    li_policy_lua *p = (li_policy_lua *)pp;
    if (!(p->core->hooks & LI_POLICY_HOOK_SCHEDULE))
        return li_error_set(err, LI_EUNSUP, "policy %s has no schedule hook", pp->name);
    sched_ctx x = {.p = p, .st = st, .plan = plan, .err = err};
    int rc = core_call(p->core, schedule_thunk, &x, "schedule", err);
    if (rc == 0 && x.conv_rc) rc = x.conv_rc;
    if (rc) li_plan_clear(plan);
    return rc;
}

static int admit_thunk(lua_State *L) {
    sched_ctx *x = lua_touserdata(L, 1);
    lua_core *c = x->p->core;
    if (x->st) update_state(L, x->p, x->st);
    push_req(L, c, x->req);
    int req = lua_gettop(L);
    luaL_checkstack(L, 8, "admit");
    getref(L, c->ref_hook[H_ADMIT]);
    lua_pushvalue(L, req);
    getref(L, c->ref_state);
    lua_call(L, 2, 2);
    x->accept = lua_toboolean(L, -2);
    if (!x->accept && x->reason && x->reason_cap) {
        const char *r = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "rejected by policy";
        snprintf(x->reason, x->reason_cap, "%s", r);
    }
    return 0;
}

static int lua_admit(li_policy *pp, const li_req_view *req, const li_step_state *st, bool *accept, char *reason,
                     size_t reason_cap, li_error *err) {
    li_policy_lua *p = (li_policy_lua *)pp;
    *accept = true;
    if (reason && reason_cap) reason[0] = 0;
    if (!(p->core->hooks & LI_POLICY_HOOK_ADMIT)) return 0;
    sched_ctx x = {.p = p, .st = st, .req = req, .reason = reason, .reason_cap = reason_cap};
    int rc = core_call(p->core, admit_thunk, &x, "admit", err);
    note_id(p, req->id);
    if (rc == 0) *accept = x.accept;
    return rc;
}

static int finish_thunk(lua_State *L) {
    sched_ctx *x = lua_touserdata(L, 1);
    lua_core *c = x->p->core;
    push_req(L, c, x->req);
    int req = lua_gettop(L);
    luaL_checkstack(L, 8, "on_finish");
    lua_createtable(L, 0, 6);
    int stats = lua_gettop(L);
    lua_pushstring(L, x->finish_reason ? x->finish_reason : "");
    lua_setfield(L, stats, "finish_reason");
    static const char *const f[] = {"num_generated", "num_tokens", "prompt_len", "preemptions", "arrival"};
    const double v[] = {(double)x->req->num_generated, (double)x->req->num_tokens, (double)x->req->prompt_len,
                        (double)x->req->n_preemptions, x->req->arrival};
    for (int i = 0; i < 5; i++) {
        lua_pushnumber(L, v[i]);
        lua_setfield(L, stats, f[i]);
    }
    /* the request is gone: its pooled table is dropped */
    getref(L, c->ref_drop);
    lua_pushnumber(L, (lua_Number)x->req->id);
    lua_call(L, 1, 0);
    getref(L, c->ref_hook[H_ON_FINISH]);
    lua_pushvalue(L, req);
    lua_pushvalue(L, stats);
    lua_call(L, 2, 0);
    return 0;
}

static void lua_on_finish(li_policy *pp, const li_req_view *req, const char *finish_reason) {
    li_policy_lua *p = (li_policy_lua *)pp;
    if (!(p->core->hooks & LI_POLICY_HOOK_ON_FINISH)) return;
    sched_ctx x = {.p = p, .req = req, .finish_reason = finish_reason};
    li_error err = {0};
    if (core_call(p->core, finish_thunk, &x, "on_finish", &err)) {
        /* no return path for this error: log, but not once per request forever */
        p->finish_errors++;
        if (p->finish_errors <= 10 || p->finish_errors % 1000 == 0)
            li_log_warn("policy %s: %s (%lld on_finish errors)", pp->name, err.msg, (long long)p->finish_errors);
    }
}

typedef struct evict_ctx {
    li_policy_lua *p;
    const li_evict_candidate *c;
    int32_t n, need;
    int32_t *order, n_order;
} evict_ctx;

static int evict_thunk(lua_State *L) {
    evict_ctx *x = lua_touserdata(L, 1);
    lua_core *c = x->p->core;
    luaL_checkstack(L, 8, "evict");
    getref(L, c->ref_hook[H_EVICT]);
    lua_createtable(L, x->n, 0);
    for (int32_t i = 0; i < x->n; i++) {
        lua_createtable(L, 0, 4);
        lua_pushnumber(L, x->c[i].block);
        lua_setfield(L, -2, "block");
        lua_pushnumber(L, x->c[i].last_access);
        lua_setfield(L, -2, "last_access");
        lua_pushnumber(L, x->c[i].hits);
        lua_setfield(L, -2, "hits");
        lua_pushnumber(L, x->c[i].depth);
        lua_setfield(L, -2, "depth");
        lua_rawseti(L, -2, i + 1);
    }
    lua_pushnumber(L, x->need);
    lua_call(L, 2, 1);
    if (!lua_istable(L, -1)) return luaL_error(L, "evict must return a list of block ids, got %s", luaL_typename(L, -1));
    int32_t n = (int32_t)lua_objlen(L, -1);
    for (int32_t i = 0; i < n && x->n_order < x->n; i++) {
        lua_rawgeti(L, -1, i + 1);
        bool is_num = lua_type(L, -1) == LUA_TNUMBER;
        lua_Number v = lua_tonumber(L, -1);
        lua_pop(L, 1);
        /* anything but a block id is skipped: C validates what remains */
        if (!is_num || v != v || v < 0 || v > INT32_MAX || v != (lua_Number)(int32_t)v) continue;
        x->order[x->n_order++] = (int32_t)v;
    }
    return 0;
}

static int lua_evict(li_policy *pp, const li_evict_candidate *cands, int32_t n_cands, int32_t need, int32_t *order,
                     int32_t *n_order, li_error *err) {
    li_policy_lua *p = (li_policy_lua *)pp;
    *n_order = 0;
    if (!(p->core->hooks & LI_POLICY_HOOK_EVICT)) return 0;
    evict_ctx x = {.p = p, .c = cands, .n = n_cands, .need = need, .order = order};
    int rc = core_call(p->core, evict_thunk, &x, "evict", err);
    *n_order = rc ? 0 : x.n_order;
    return rc;
}

/* ---- speculate ------------------------------------------------------------ */

typedef struct spec_ctx {
    li_policy_lua *p;
    const li_step_state *st;
    const li_spec_state *ss;
    li_spec_cand *c;
    int32_t n;
} spec_ctx;

/* speculate(req, state) per candidate: req.speculation = {method, k, max_k,
 * temperature, acceptance = {name = rate}, drafted = {name = n}, ngram,
 * ngram_match (each absent when not known)}, state.spec
 * = {batch_size, step_time, token_time, draft_time = {name = s},
 * available = {name = bool}, row_time = {[n] = s}, verify_time = {greedy = s, sampled = s}}
 * (verify_time's entries absent until measured). It returns nothing (the want stands), false
 * or 0 (off), k, or method, k. Both tables are kept and updated in place, as
 * the request tables are (the FFI updater's spec_state and spec_req). */
static int spec_thunk(lua_State *L) {
    spec_ctx *x = lua_touserdata(L, 1);
    lua_core *c = x->p->core;
    const li_spec_state *ss = x->ss;
    update_state(L, x->p, x->st);
    luaL_checkstack(L, 16, "speculate");
    getref(L, c->ref_spec_state);
    push_addr(L, ss);
    lua_pushnumber(L, LI_SPEC_COST_ROWS);
    lua_call(L, 2, 0);
    getref(L, c->ref_state);
    int state = lua_gettop(L);
    for (int32_t i = 0; i < x->n; i++) {
        li_spec_cand *k = &x->c[i];
        const li_req_view *v = NULL;
        for (int32_t j = 0; j < x->st->n_reqs && !v; j++)
            if (x->st->reqs[j].id == k->id) v = &x->st->reqs[j];
        if (!v) continue;
        lua_settop(L, state);
        getref(L, c->ref_spec_req);
        push_addr(L, v);
        push_addr(L, k);
        lua_call(L, 2, 1);
        int req = lua_gettop(L);
        getref(L, c->ref_hook[H_SPECULATE]);
        lua_pushvalue(L, req);
        lua_pushvalue(L, state);
        lua_call(L, 2, 2);
        /* (method, k), (k), (false / 0) or nothing */
        int a = lua_gettop(L) - 1, b = a + 1;
        if (lua_isnil(L, a) && lua_isnil(L, b)) continue;
        if (lua_type(L, a) == LUA_TBOOLEAN && !lua_toboolean(L, a)) {
            k->method = -1, k->k = 0;
            continue;
        }
        int kidx = b;
        if (lua_type(L, a) == LUA_TSTRING) {
            const char *name = lua_tostring(L, a);
            int32_t m = -1;
            for (int32_t j = 0; j < ss->n_methods; j++)
                if (!strcmp(name, ss->methods[j])) m = j;
            if (m < 0) return luaL_error(L, "speculate: unknown method '%s'", name);
            k->method = m;
        } else {
            kidx = a;
        }
        int64_t kv;
        if (!get_int(L, kidx, 0, 1 << 20, &kv))
            return luaL_error(L, "speculate must return [method,] k with k an integer >= 0, got %s", lua_kind(L, kidx));
        k->k = (int32_t)kv;
        if (kv == 0) k->method = -1;
    }
    lua_settop(L, 1);
    return 0;
}

static int lua_speculate(li_policy *pp, const li_step_state *st, const li_spec_state *ss, li_spec_cand *cands,
                         int32_t n, li_error *err) {
    li_policy_lua *p = (li_policy_lua *)pp;
    if (!(p->core->hooks & LI_POLICY_HOOK_SPECULATE) || n <= 0) return 0;
    spec_ctx x = {.p = p, .st = st, .ss = ss, .c = cands, .n = n};
    return core_call(p->core, spec_thunk, &x, "speculate", err);
}

static void set_name(li_policy_lua *p, const char *path) {
    snprintf(p->base.name, sizeof p->base.name, "%s", path ? path : "policy");
}

static void install(li_policy_lua *p, lua_core *c) {
    core_free(p->core);
    p->core = c;
    p->base.config = c->config;
    p->base.has_schedule = (c->hooks & LI_POLICY_HOOK_SCHEDULE) != 0;
    p->base.has_evict = (c->hooks & LI_POLICY_HOOK_EVICT) != 0;
    p->base.has_speculate = (c->hooks & LI_POLICY_HOOK_SPECULATE) != 0;
    p->n_ids = 0; /* the new state has an empty pool */
}

static int lua_reload(li_policy *pp, const char *path, const char *source, li_error *err) {
    li_policy_lua *p = (li_policy_lua *)pp;
    lua_core *c = core_new(path, source, &p->opts, err);
    if (!c) return err ? err->code : LI_EINVAL; /* the old policy stays */
    install(p, c);
    set_name(p, path);
    return 0;
}

static void lua_free(li_policy *pp) {
    li_policy_lua *p = (li_policy_lua *)pp;
    if (!p) return;
    core_free(p->core);
    free(p->order);
    free(p->ids);
    free(p->cur);
    free(p->gone);
    free(p);
}

static const li_policy_ops lua_ops = {
    .kind = "lua",
    .schedule = lua_schedule,
    .admit = lua_admit,
    .on_finish = lua_on_finish,
    .evict = lua_evict,
    .reload = lua_reload,
    .free = lua_free,
    .speculate = lua_speculate,
};

int li_policy_lua_open(li_policy **out, const char *path, const char *source, const li_policy_lua_opts *opts,
                       li_error *err) {
    *out = NULL;
    li_policy_lua_opts o = {0};
    if (opts) o = *opts;
    lua_core *c = core_new(path, source, &o, err);
    if (!c) return err ? err->code : LI_EINVAL;
    li_policy_lua *p = li_xcalloc(1, sizeof *p);
    p->base.ops = &lua_ops;
    p->opts = o;
    install(p, c);
    set_name(p, path);
    *out = &p->base;
    return 0;
}

unsigned li_policy_lua_hooks(const li_policy *pp) {
    const li_policy_lua *p = (const li_policy_lua *)pp;
    return p->core->hooks;
}

size_t li_policy_lua_mem_used(const li_policy *pp) {
    const li_policy_lua *p = (const li_policy_lua *)pp;
    return p->core->mem_used;
}
