/* policy_lua.h — a scheduling policy written in Lua, run in-process.
 *
 * Each policy gets its own LuaJIT state (own allocator with a memory limit,
 * own globals, own math.random seed) and a sandbox: the policy file sees an
 * allow-listed environment only, its code is interpreted (never compiled,
 * so the instruction budget and the memory limit's safe point see all of
 * it), and C functions that call back into Lua or backtrack are guarded
 * (see docs/policy-protocol.md, "Sandbox"). Hooks are
 * called under pcall with a traceback; a Lua error becomes an li_error and
 * never propagates. The state and request tables handed to the policy are
 * built once and updated in place every step.
 *
 * Not thread-safe: the engine thread (or whoever owns the policy) makes all
 * calls, including reload. */
#ifndef LI_POLICY_LUA_H
#define LI_POLICY_LUA_H

#include "policy/policy.h"

/* Defaults for li_policy_lua_opts fields left at 0. */
#define LI_POLICY_LUA_DEFAULT_BUDGET (20 * 1000 * 1000) /* VM instructions per hook call */
#define LI_POLICY_LUA_DEFAULT_MEM ((size_t)64 << 20)    /* bytes per policy state */
#define LI_POLICY_LUA_DEFAULT_SEED 0x5eedu
#define LI_POLICY_FILE_MAX ((size_t)16 << 20)           /* bytes of a policy file */

typedef struct li_policy_lua_opts {
    bool allow_unsafe;    /* --policy-unsafe: the full standard library (io, os, require, ffi, jit, debug) */
    int64_t instr_budget; /* VM instructions per hook call; 0 = default, < 0 = unlimited. Exact in
                           * the sandbox (a policy's own code is never JIT-compiled); best effort
                           * with allow_unsafe, whose code LuaJIT compiles and hooks cannot reach */
    size_t mem_limit;     /* bytes the policy's Lua state may hold; 0 = default (64 MiB) */
    uint32_t seed;        /* math.random seed; 0 = default */
    bool jit_off;         /* interpreter only, the engine's own Lua included (the sandbox already
                           * interprets the policy's code; this matters with allow_unsafe) */
} li_policy_lua_opts;

/* Hooks a loaded policy defines (li_policy_lua_hooks). */
enum {
    LI_POLICY_HOOK_SCHEDULE = 1u << 0,
    LI_POLICY_HOOK_ADMIT = 1u << 1,
    LI_POLICY_HOOK_ON_FINISH = 1u << 2,
    LI_POLICY_HOOK_EVICT = 1u << 3,
    LI_POLICY_HOOK_SPECULATE = 1u << 4, /* speculate(req, state): method and k per request */
};

/* Loads a policy from `path` or, when source != NULL, from source text
 * (path then only names it in messages; both NULL is an error). opts may be
 * NULL for the defaults. On failure nothing is left allocated and err holds
 * e.g. "policies/x.lua:12: unexpected symbol near 'end'". */
int li_policy_lua_open(li_policy **out, const char *path, const char *source, const li_policy_lua_opts *opts,
                       li_error *err);

/* LI_POLICY_HOOK_* bits of the policy currently loaded (p must come from
 * li_policy_lua_open). */
unsigned li_policy_lua_hooks(const li_policy *p);

/* Bytes the policy's Lua state holds now. */
size_t li_policy_lua_mem_used(const li_policy *p);

/* Reads a policy file for any mode: a regular file only (a FIFO, device or
 * directory is refused without blocking on it), at most LI_POLICY_FILE_MAX
 * bytes. *out is NUL-terminated (the text may hold NULs: bytecode); free() it. */
int li_policy_read_file(const char *path, char **out, size_t *len, li_error *err);

#endif
