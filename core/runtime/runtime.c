/* runtime.c — model + backend setup shared by the subcommands, engine
 * objects in Lua and the server. */
#include "runtime/runtime.h"

#include <stdio.h>

int li_runtime_open(li_runtime *rt, const char *model_path, int64_t n_threads, const char *isa, li_error *err) {
    rt->model = NULL;
    rt->be_ready = false;
    if (n_threads < 0 || n_threads > 1024)
        return li_error_set(err, LI_EINVAL, "--threads must be in [0, 1024], got %lld", (long long)n_threads);
    const char *path = li_model_default_path(model_path);
    int rc = li_model_load(&rt->model, path, err);
    if (rc) return rc;
    if ((rc = li_backend_cpu_init(&rt->be, (int)n_threads, isa, err))) {
        li_model_free(rt->model);
        rt->model = NULL;
        return rc;
    }
    rt->be_ready = true;
    if ((rc = li_model_prepare(rt->model, &rt->be, err))) {
        li_runtime_close(rt);
        return rc;
    }
    return 0;
}

void li_runtime_close(li_runtime *rt) {
    if (rt->model && rt->be_ready) li_model_release(rt->model, &rt->be);
    if (rt->be_ready) li_backend_cpu_free(&rt->be);
    li_model_free(rt->model);
    rt->model = NULL;
    rt->be_ready = false;
}

int li_runtime_fail(const li_error *err) {
    fprintf(stderr, "luainfer: error: %s\n", err->msg[0] ? err->msg : "unknown error");
    return 1;
}
