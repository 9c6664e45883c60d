/* policy_proc.h — a Lua policy run in an isolated `luainfer policy-host`
 * child process (--policy-isolation process).
 *
 * The engine side speaks msgpack frames over a Unix socket pair to the host,
 * which runs the same policy file through policy_lua.c. Each schedule/admit
 * round trip has a deadline (default 50 ms): a host that is late, crashes or
 * breaks the protocol makes that call fail (the engine uses its fallback for
 * the step), is killed and restarted (immediately the first time, then with
 * a growing back-off while it keeps failing). A host stuck in a compiled
 * `while true do end` therefore costs the engine one deadline, not a hang.
 *
 * Not thread-safe, like every li_policy: one thread makes all calls. */
#ifndef LI_POLICY_PROC_H
#define LI_POLICY_PROC_H

#include "policy/policy_lua.h"

#define LI_POLICY_PROC_DEFAULT_DEADLINE_MS 50
#define LI_POLICY_PROC_DEFAULT_START_MS 5000

typedef struct li_policy_proc_opts {
    int32_t deadline_ms;      /* per schedule/admit round trip; 0 = 50 */
    int32_t start_timeout_ms; /* host start + policy load (open, reload, wait_ready); 0 = 5000 */
    const char *host_bin;     /* the luainfer binary to run; NULL = /proc/self/exe */
    li_policy_lua_opts lua;   /* sandbox options, applied inside the host */
    const char *source;       /* the policy's text instead of reading `path` (which then only names it) */
} li_policy_proc_opts;

/* Starts a host for the policy file at `path` (or opts->source) and waits (start_timeout_ms)
 * until it has loaded it; a file that does not load is an error here, with
 * the host's message ("policies/x.lua:12: ..."). The engine reads the file
 * once: restarts reload the same text even if the file changed since. */
int li_policy_proc_open(li_policy **out, const char *path, const li_policy_proc_opts *opts, li_error *err);

/* Blocks up to timeout_ms until a (re)started host is ready; 0 when ready. */
int li_policy_proc_wait_ready(li_policy *p, int32_t timeout_ms, li_error *err);

typedef struct li_policy_proc_stats {
    int64_t calls;      /* schedule + admit round trips attempted */
    int64_t timeouts;   /* round trips past the deadline */
    int64_t crashes;    /* host exits, protocol errors */
    int64_t restarts;   /* hosts started after the first */
    int64_t dropped;    /* on_finish messages not sent (host busy or down) */
    int pid;            /* current host, -1 if none */
} li_policy_proc_stats;

void li_policy_proc_stats_get(const li_policy *p, li_policy_proc_stats *out);

/* `luainfer policy-host --fd N [--unsafe] [--budget N] [--mem-limit BYTES]
 * [--seed N] [--jit-off] [POLICY.lua]`: the child side (policy_host.c).
 * argv[0] is the first argument after the subcommand name. */
int li_cmd_policy_host(int argc, char **argv);

#endif
