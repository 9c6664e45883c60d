/* medusa_file.c — the one check of a Medusa heads file (spec/medusa_file.h). */
#include "spec/medusa_file.h"

#include "spec/draft_base.h"

#include <stdio.h>
#include <string.h>

static int get_u32(const li_gguf *g, const char *path, const char *key, uint32_t *v, li_error *err) {
    if (li_gguf_get_u32(g, key, v, NULL))
        return li_error_set(err, LI_EINVAL, "medusa: %s: missing or not a u32: '%s'", path, key);
    return 0;
}

int li_medusa_file_check(const li_gguf *g, const char *path, const li_medusa_base *base, li_medusa_file *f,
                         li_error *err) {
    *f = (li_medusa_file){0};
    char arch[64] = "", hidden[64] = "";
    if (!li_gguf_copy_str(g, "general.architecture", arch, sizeof arch) || strcmp(arch, "medusa"))
        return li_error_set(err, LI_EINVAL,
                            "medusa: %s: general.architecture is '%s', expected 'medusa' (not a heads file)", path, arch);
    uint32_t version, k, n_embd, n_vocab;
    int rc;
    if ((rc = get_u32(g, path, "medusa.version", &version, err))) return rc;
    if (version != 1)
        return li_error_set(err, LI_EUNSUP, "medusa: %s: medusa.version is %u, this build reads version 1", path, version);
    if ((rc = get_u32(g, path, "medusa.n_heads", &k, err)) || (rc = get_u32(g, path, "medusa.n_embd", &n_embd, err)) ||
        (rc = get_u32(g, path, "medusa.n_vocab", &n_vocab, err)))
        return rc;
    if (k < 1 || k > LI_MEDUSA_FILE_MAX_HEADS)
        return li_error_set(err, LI_EINVAL, "medusa: %s: medusa.n_heads is %u, must be in [1, %d]", path, k,
                            LI_MEDUSA_FILE_MAX_HEADS);
    if (!li_gguf_copy_str(g, "medusa.hidden", hidden, sizeof hidden) || strcmp(hidden, "post_norm"))
        return li_error_set(err, LI_EUNSUP, "medusa: %s: medusa.hidden is '%s', only 'post_norm' is supported", path,
                            hidden);
    /* base NULL: the file alone (luainfer info) */
    const li_draft_model_ref mref = {base ? base->name : NULL, base ? base->vocab_hash : 0};
    char who[160]; /* " 'name'" of the base, when known */
    if ((rc = li_draft_base_read(g, path, "medusa", "heads", base ? &mref : NULL, f->base_name, sizeof f->base_name,
                                 &f->vocab_hash, who, sizeof who, err)))
        return rc;
    if (base) {
        if ((int64_t)n_embd != base->n_embd || (int64_t)n_vocab != base->n_vocab)
            return li_error_set(err, LI_EINVAL,
                                "medusa: heads made for '%s' (n_embd %u, n_vocab %u), the model%s has n_embd %lld, n_vocab %lld",
                                f->base_name, n_embd, n_vocab, who, (long long)base->n_embd,
                                (long long)base->n_vocab);
        li_draft_base_warn_name("medusa", "heads", f->base_name, &mref);
    }
    f->n_heads = (int32_t)k;
    f->n_embd = (int32_t)n_embd;
    f->n_vocab = (int32_t)n_vocab;
    for (uint32_t i = 0; i < k; i++) {
        char name[64];
        snprintf(name, sizeof name, "medusa.%u.weight", i);
        const li_gguf_tensor *t = li_gguf_find_tensor(g, name);
        if (!t) return li_error_set(err, LI_EINVAL, "medusa: %s: missing tensor '%s'", path, name);
        if (t->type != LI_TYPE_F32 && t->type != LI_TYPE_F16)
            return li_error_set(err, LI_EUNSUP, "medusa: %s: tensor '%s' has type %s, want f32 or f16", path, name,
                                li_type_name(t->type));
        if (t->n_dims != 2 || t->ne[0] != n_embd || t->ne[1] != n_embd)
            return li_error_set(err, LI_EINVAL, "medusa: %s: tensor '%s' has shape [%lld, %lld], want [%u, %u]", path,
                                name, (long long)t->ne[0], (long long)(t->n_dims > 1 ? t->ne[1] : 1), n_embd, n_embd);
        f->w[i] = t;
        snprintf(name, sizeof name, "medusa.%u.bias", i);
        t = li_gguf_find_tensor(g, name);
        if (!t) return li_error_set(err, LI_EINVAL, "medusa: %s: missing tensor '%s'", path, name);
        if (t->type != LI_TYPE_F32 || t->n_dims != 1 || t->ne[0] != n_embd)
            return li_error_set(err, LI_EINVAL, "medusa: %s: tensor '%s' is %s [%lld], want f32 [%u]", path, name,
                                li_type_name(t->type), (long long)t->ne[0], n_embd);
        f->b[i] = t;
    }
    return 0;
}
