/* args.c — option parsing for the CLI. */
#include "runtime/args.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static li_opt *find(li_opt *opts, int n, const char *name, size_t len) {
    for (int i = 0; i < n; i++)
        if (strlen(opts[i].name) == len && !strncmp(opts[i].name, name, len)) return &opts[i];
    return NULL;
}

static int set_value(li_opt *o, const char *v, li_error *err) {
    char *end;
    switch (o->kind) {
    case LI_OPT_STR: *(const char **)o->dst = v; return 0;
    case LI_OPT_STR_LIST: {
        li_str_list *l = o->dst;
        l->items = li_xrealloc((void *)l->items, (size_t)(l->n + 1) * sizeof *l->items);
        l->items[l->n++] = v;
        return 0;
    }
    case LI_OPT_INT: {
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (errno || end == v || *end)
            return li_error_set(err, LI_EINVAL, "--%s expects an integer, got '%s'", o->name, v);
        *(int64_t *)o->dst = x;
        return 0;
    }
    case LI_OPT_FLOAT: {
        errno = 0;
        double x = strtod(v, &end);
        if (errno || end == v || *end || !isfinite(x))
            return li_error_set(err, LI_EINVAL, "--%s expects a number, got '%s'", o->name, v);
        *(double *)o->dst = x;
        return 0;
    }
    case LI_OPT_FLAG: break;
    }
    return 0;
}

int li_args_parse(li_opt *opts, int n_opts, int argc, char **argv, const char **positional, int max_pos,
                  int *n_pos, li_error *err) {
    *n_pos = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-' || a[1] == 0 || (a[1] != '-' && !(a[1] == 'h' && a[2] == 0))) {
            if (*n_pos >= max_pos) return li_error_set(err, LI_EINVAL, "unexpected argument '%s'", a);
            positional[(*n_pos)++] = a;
            continue;
        }
        if (!strcmp(a, "-h")) a = "--help";
        if (!strcmp(a, "--")) {
            for (i++; i < argc; i++) {
                if (*n_pos >= max_pos) return li_error_set(err, LI_EINVAL, "unexpected argument '%s'", argv[i]);
                positional[(*n_pos)++] = argv[i];
            }
            break;
        }
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        li_opt *o = find(opts, n_opts, name, len);
        if (!o) return li_error_set(err, LI_EINVAL, "unknown option '--%.*s' (see --help)", (int)len, name);
        if (o->kind == LI_OPT_FLAG) {
            if (eq) return li_error_set(err, LI_EINVAL, "option --%s takes no value", o->name);
            *(bool *)o->dst = true;
            continue;
        }
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v) return li_error_set(err, LI_EINVAL, "option --%s needs a value", o->name);
        int rc = set_value(o, v, err);
        if (rc) return rc;
    }
    return 0;
}

void li_args_usage(const char *cmd, const char *synopsis, const li_opt *opts, int n_opts) {
    printf("usage: luainfer %s %s\n\noptions:\n", cmd, synopsis);
    for (int i = 0; i < n_opts; i++) {
        const char *arg = opts[i].kind == LI_OPT_FLAG ? "" : opts[i].kind == LI_OPT_INT ? " N"
                          : opts[i].kind == LI_OPT_FLOAT ? " X" : " S";
        char left[64];
        snprintf(left, sizeof left, "--%s%s", opts[i].name, arg);
        printf("  %-26s %s\n", left, opts[i].help);
    }
}

int li_parse_bytes(const char *what, const char *s, size_t *out, li_error *err) {
    char *end;
    double v = strtod(s, &end);
    double mul = 1;
    if (*end == 'k' || *end == 'K') mul = 1024, end++;
    else if (*end == 'm' || *end == 'M') mul = 1024.0 * 1024, end++;
    else if (*end == 'g' || *end == 'G') mul = 1024.0 * 1024 * 1024, end++;
    if (*end == 'i' || *end == 'B') end++;
    if (*end == 'B') end++;
    if (end == s || *end || !(v > 0) || v * mul > 1e13)
        return li_error_set(err, LI_EINVAL, "%s expects bytes such as 268435456, 256M or 2G, got '%s'", what, s);
    *out = (size_t)(v * mul);
    return 0;
}
