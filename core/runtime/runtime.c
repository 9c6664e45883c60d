/* runtime.c — model + backend setup shared by the subcommands, engine
 * objects in Lua and the server. */
#include "runtime/runtime.h"
#include "engine/engine.h"
#include "cuda/cuda_backend.h"
#include "spec/eagle.h"
#include "spec/medusa.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int li_runtime_open(li_runtime *rt, const char *model_path, int64_t n_threads, const char *isa, li_error *err) {
    return li_runtime_open_device(rt, model_path, n_threads, isa, NULL, "--device", err);
}

/* "cpu" -> -1, "cuda" -> 0, "cuda:N" -> N; -2 for anything else */
static int device_index(const char *device) {
    if (!device || !strcmp(device, "cpu")) return -1;
    if (!strcmp(device, "cuda")) return 0;
    if (strncmp(device, "cuda:", 5) || !device[5] || strlen(device) > 8) return -2;
    int n = 0;
    for (const char *c = device + 5; *c; c++) {
        if (*c < '0' || *c > '9') return -2;
        n = n * 10 + (*c - '0');
    }
    return n;
}

int li_runtime_open_device(li_runtime *rt, const char *model_path, int64_t n_threads, const char *isa,
                           const char *device, const char *flag, li_error *err) {
    *rt = (li_runtime){0};
    const int dev = device_index(device);
    if (dev == -2) return li_error_set(err, LI_EINVAL, "%s must be cpu, cuda or cuda:N, got '%s'", flag, device);
    if (n_threads < 0 || n_threads > 1024)
        return li_error_set(err, LI_EINVAL, "--threads must be in [0, 1024], got %lld", (long long)n_threads);
    const char *path = li_model_default_path(model_path);
    int rc = li_model_load(&rt->model, path, err);
    if (rc) return rc;
    rc = dev >= 0 ? li_backend_cuda_init(&rt->be, dev, err) : li_backend_cpu_init(&rt->be, (int)n_threads, isa, err);
    if (rc) {
        li_model_free(rt->model);
        rt->model = NULL;
        return rc;
    }
    rt->be_ready = true;
    rt->cuda = dev >= 0;
    if ((rc = li_model_prepare(rt->model, &rt->be, err))) {
        li_runtime_close(rt);
        return rc;
    }
    return 0;
}

int li_runtime_set_q4_act(li_runtime *rt, const char *q4_act, const char *flag, li_error *err) {
    if (q4_act && strcmp(q4_act, "f32")) { /* else the backend's default */
        if (strcmp(q4_act, "int8"))
            return li_error_set(err, LI_EINVAL, "%s must be f32 (A16) or int8 (A8), got '%s'", flag, q4_act);
        if (rt->cuda) return li_error_set(err, LI_EUNSUP, "%s int8 runs on the CPU backend only (not on cuda)", flag);
        if (!strcmp(li_backend_cpu_isa(&rt->be), "ggml"))
            return li_error_set(err, LI_EUNSUP, "%s int8 needs luainfer's own CPU kernels: --isa ggml does not run "
                                "4-bit group weights", flag);
        const int rc = li_backend_cpu_set_q4_act(&rt->be, LI_ACT_INT8, err);
        if (rc) return rc;
    }
    li_model_warm(rt->model, &rt->be); /* the mode's panels now, not in the first request */
    if (rt->draft) li_model_warm(rt->draft, &rt->be);
    return 0;
}

int li_runtime_open_draft(li_runtime *rt, const char *path, li_error *err) {
    if (!rt->model || !rt->be_ready) return li_error_set(err, LI_EINVAL, "draft model: the target is not open");
    if (rt->draft) return li_error_set(err, LI_EINVAL, "draft model: one is open already");
    if (!path || !*path) return li_error_set(err, LI_EINVAL, "draft model: the path is empty");
    li_model *d = NULL;
    int rc = li_model_load(&d, path, err);
    if (rc) {
        /* the loader's message may not name the file: say which model failed */
        if (!err) return rc;
        li_error e = *err;
        return li_error_set(err, rc, "draft model %s: %s", path, e.msg);
    }
    /* checked here too (the engine refuses it as well) so the message names
     * the file before any weights are uploaded */
    if (d->hp.n_vocab != rt->model->hp.n_vocab) {
        li_error_set(err, LI_EINVAL,
                     "draft model %s: its vocabulary has %d tokens, the target's %d: a draft must share the target's "
                     "vocabulary",
                     path, d->hp.n_vocab, rt->model->hp.n_vocab);
        li_model_free(d);
        return LI_EINVAL;
    }
    if ((rc = li_model_prepare(d, &rt->be, err))) {
        li_model_release(d, &rt->be);
        li_model_free(d);
        return rc;
    }
    rt->draft = d;
    return 0;
}

int li_runtime_open_medusa(li_runtime *rt, const char *path, const char *tree, li_error *err) {
    if (!rt->model || !rt->be_ready) return li_error_set(err, LI_EINVAL, "medusa: the model is not open");
    if (rt->medusa) return li_error_set(err, LI_EINVAL, "medusa: heads are open already");
    if (!path || !*path) return li_error_set(err, LI_EINVAL, "medusa: the path is empty");
    if (rt->be.ops->batch_variant)
        return li_error_set(err, LI_EINVAL,
                            "medusa: speculation needs batch-invariant kernels; the '%s' backend is not "
                            "(" LI_BATCH_INVARIANT_HINT ")",
                            rt->be.ops->name);
    /* heads are trained on an unrotated model's hidden states (train-medusa refuses rotated ones) */
    int rc = li_model_refuse_rotated(rt->model, "medusa", err);
    if (rc) return rc;
    li_medusa *h;
    rc = li_medusa_load(&h, path, rt->model, err);
    if (rc) return rc;
    li_medusa_tree t;
    if ((rc = li_medusa_tree_parse(tree, h->n_heads, &t, err))) {
        li_medusa_free(h);
        return rc;
    }
    rt->medusa = h;
    if (tree) {
        const size_t n = strlen(tree) + 1;
        rt->medusa_tree = memcpy(li_xmalloc(n), tree, n);
    }
    return 0;
}

int li_runtime_open_eagle(li_runtime *rt, const char *path, li_error *err) {
    if (!rt->model || !rt->be_ready) return li_error_set(err, LI_EINVAL, "eagle: the model is not open");
    if (rt->eagle) return li_error_set(err, LI_EINVAL, "eagle: a draft is open already");
    if (!path || !*path) return li_error_set(err, LI_EINVAL, "eagle: the path is empty");
    if (rt->medusa) return li_error_set(err, LI_EUNSUP, "eagle: an EAGLE draft with Medusa heads is not supported yet");
    if (rt->be.ops->batch_variant)
        return li_error_set(err, LI_EINVAL,
                            "eagle: speculation needs batch-invariant kernels; the '%s' backend is not "
                            "(" LI_BATCH_INVARIANT_HINT ")",
                            rt->be.ops->name);
    /* the draft reads the residual stream in the basis it was trained on */
    int rc = li_model_refuse_rotated(rt->model, "eagle", err);
    if (rc) return rc;
    li_eagle *eg;
    if ((rc = li_eagle_load(&eg, path, rt->model, err))) return rc;
    if ((rc = li_eagle_prepare(eg, rt->model, &rt->be, err))) {
        li_eagle_free(eg);
        return rc;
    }
    rt->eagle = eg;
    return 0;
}

void li_runtime_close(li_runtime *rt) {
    li_eagle_free(rt->eagle); /* its prepared weights go back to the backend first */
    rt->eagle = NULL;
    li_medusa_free(rt->medusa); /* its prepared weights go back to the backend first */
    rt->medusa = NULL;
    free(rt->medusa_tree);
    rt->medusa_tree = NULL;
    if (rt->draft && rt->be_ready) li_model_release(rt->draft, &rt->be);
    li_model_free(rt->draft);
    rt->draft = NULL;
    if (rt->model && rt->be_ready) li_model_release(rt->model, &rt->be);
    if (rt->be_ready && rt->cuda) li_backend_cuda_free(&rt->be);
    else if (rt->be_ready) li_backend_cpu_free(&rt->be);
    li_model_free(rt->model);
    rt->model = NULL;
    rt->be_ready = false;
    rt->cuda = false;
}

int li_runtime_spec_config(li_engine_config *cfg, const li_runtime *rt, const char *method, int64_t k, int64_t layers,
                           const char *flag, li_error *err) {
    const int32_t nl = rt->model->hp.n_layer;
    if (k < 0 || k > LI_SPEC_MAX_TOKENS)
        return li_error_set(err, LI_EINVAL, "%sk must be in [0, %d], got %lld", flag, LI_SPEC_MAX_TOKENS, (long long)k);
    if (layers < 0 || layers >= nl)
        return li_error_set(err, LI_EINVAL, "%slayers must be in [1, %d] (the model has %d layers), got %lld", flag,
                            nl - 1, nl, (long long)layers);
    li_spec_method m = layers > 0      ? LI_SPEC_LAYERSKIP
                       : rt->medusa    ? LI_SPEC_MEDUSA
                       : rt->eagle     ? LI_SPEC_EAGLE
                       : rt->draft     ? LI_SPEC_DRAFT
                                       : LI_SPEC_NGRAM;
    char what[32];
    snprintf(what, sizeof what, "%smethod", flag);
    if (method && li_spec_method_parse(method, what, &m, err)) return LI_EINVAL;
    if (k && m == LI_SPEC_DRAFT && !rt->draft)
        return li_error_set(err, LI_EINVAL, "%smethod 'draft' needs a draft model (--draft-model FILE)", flag);
    if (k && m == LI_SPEC_MEDUSA && !rt->medusa)
        return li_error_set(err, LI_EINVAL, "%smethod 'medusa' needs Medusa heads (--medusa FILE)", flag);
    if (k && m == LI_SPEC_EAGLE && !rt->eagle)
        return li_error_set(err, LI_EINVAL, "%smethod 'eagle' needs an EAGLE draft (--eagle FILE)", flag);
    if (!k && m == LI_SPEC_MEDUSA) k = LI_SPEC_MAX_TOKENS; /* heads given: on, as large as the tree */
    if (!k && m == LI_SPEC_EAGLE) k = LI_EAGLE_DEFAULT_K; /* a draft given: on */
    cfg->medusa = rt->medusa;
    cfg->medusa_tree = rt->medusa_tree;
    cfg->eagle = rt->eagle;
    if (k && m == LI_SPEC_LAYERSKIP && !layers)
        return li_error_set(err, LI_EINVAL, "%smethod 'layerskip' needs %slayers N", flag, flag);
    if (k && rt->be.ops->batch_variant)
        return li_error_set(err, LI_EINVAL,
                            "speculation needs batch-invariant kernels; the '%s' backend is not "
                            "(" LI_BATCH_INVARIANT_HINT ")",
                            rt->be.ops->name);
    cfg->spec_tokens = (int32_t)k;
    cfg->spec_layers = (int32_t)layers;
    cfg->spec_method = m;
    return 0;
}

const char *li_runtime_isa(const li_runtime *rt) { return rt->cuda ? "cuda" : li_backend_cpu_isa(&rt->be); }

int li_runtime_fail(const li_error *err) {
    fprintf(stderr, "luainfer: error: %s\n", err->msg[0] ? err->msg : "unknown error");
    return 1;
}
