/* policy_open.h — the kinds of scheduling policy and the one place that
 * opens a policy of a kind (serve, the REPL's and scripts' engines, the
 * server's engine thread). */
#ifndef LI_POLICY_OPEN_H
#define LI_POLICY_OPEN_H

#include "policy/policy_lua.h"

typedef enum {
    LI_POLICY_BUILTIN,  /* no policy: the engine's C fallback FCFS */
    LI_POLICY_LUA,      /* a Lua policy in the engine's process */
    LI_POLICY_PROCESS,  /* a Lua policy in a `luainfer policy-host` child */
} li_policy_kind;

/* The isolation spelling of --policy-isolation / policy_isolation:
 * "inprocess" (LI_POLICY_LUA) or "process"; `what` names the option. */
int li_policy_isolation_parse(const char *s, const char *what, li_policy_kind *out, li_error *err);
/* "builtin", "lua", "process" (what stats report). */
const char *li_policy_kind_name(li_policy_kind k);
/* The kind of an open policy (NULL: builtin). */
li_policy_kind li_policy_kind_of(const li_policy *p);

typedef struct li_policy_open_opts {
    li_policy_kind kind;     /* LI_POLICY_LUA or LI_POLICY_PROCESS */
    const char *path;        /* the policy file (a process policy needs one) */
    const char *source;      /* or its text (then path, if set, only names it) */
    int32_t deadline_ms;     /* process: per round trip; 0 = its default */
    li_policy_lua_opts lua;  /* sandbox options */
} li_policy_open_opts;

int li_policy_open(li_policy **out, const li_policy_open_opts *o, li_error *err);

#endif
