/* policy_open.c — policy kinds: their names and their openers, once. */
#include "runtime/policy_open.h"
#include "policy/policy_proc.h"

#include <string.h>

static const char *const kind_names[] = {
    [LI_POLICY_BUILTIN] = "builtin",
    [LI_POLICY_LUA] = "lua",
    [LI_POLICY_PROCESS] = "process",
};

int li_policy_isolation_parse(const char *s, const char *what, li_policy_kind *out, li_error *err) {
    if (s && !strcmp(s, "inprocess")) *out = LI_POLICY_LUA;
    else if (s && !strcmp(s, "process")) *out = LI_POLICY_PROCESS;
    else return li_error_set(err, LI_EINVAL, "%s must be 'inprocess' or 'process', got '%s'", what, s ? s : "");
    return 0;
}

const char *li_policy_kind_name(li_policy_kind k) {
    return (unsigned)k < LI_ARRAY_LEN(kind_names) ? kind_names[k] : "unknown";
}

/* An open policy names its kind in its ops table (policy.h: ops->kind). */
li_policy_kind li_policy_kind_of(const li_policy *p) {
    if (!p || !p->ops->kind) return LI_POLICY_BUILTIN;
    for (size_t k = LI_POLICY_LUA; k < LI_ARRAY_LEN(kind_names); k++)
        if (!strcmp(p->ops->kind, kind_names[k])) return (li_policy_kind)k;
    return LI_POLICY_LUA;
}

int li_policy_open(li_policy **out, const li_policy_open_opts *o, li_error *err) {
    *out = NULL;
    switch (o->kind) {
    case LI_POLICY_LUA: return li_policy_lua_open(out, o->path, o->source, &o->lua, err);
    case LI_POLICY_PROCESS: {
        if (!o->path && !o->source)
            return li_error_set(err, LI_EINVAL, "a process-isolated policy needs a policy file path or its text");
        li_policy_proc_opts po = {.deadline_ms = o->deadline_ms, .lua = o->lua, .source = o->source};
        return li_policy_proc_open(out, o->path, &po, err);
    }
    case LI_POLICY_BUILTIN: break;
    }
    return li_error_set(err, LI_EINVAL, "no policy of kind '%s' can be opened", li_policy_kind_name(o->kind));
}
