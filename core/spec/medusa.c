/* medusa.c — Medusa heads: loading and checking a heads file, the heads'
 * forward on the target's backend, and the candidate tree (spec/medusa.h). */
#include "spec/medusa.h"
#include "tokenizer/tokenizer.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- loading ----------------------------------------------------------------- */

/* A string value as a NUL-terminated copy (truncated to cap). */
static bool get_str(const li_gguf *g, const char *key, char *out, size_t cap) {
    li_str s;
    if (li_gguf_get_str(g, key, &s, NULL)) return false;
    const size_t n = s.len < cap - 1 ? (size_t)s.len : cap - 1;
    memcpy(out, s.ptr, n);
    out[n] = 0;
    return true;
}

static int get_u32(const li_gguf *g, const char *path, const char *key, uint32_t *v, li_error *err) {
    if (li_gguf_get_u32(g, key, v, NULL))
        return li_error_set(err, LI_EINVAL, "medusa: %s: missing or not a u32: '%s'", path, key);
    return 0;
}

/* 16 lowercase hex digits. */
static bool parse_hash(const char *s, uint64_t *out) {
    if (strlen(s) != 16) return false;
    uint64_t v = 0;
    for (int i = 0; i < 16; i++) {
        const char c = s[i];
        const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return false;
        v = v << 4 | (uint64_t)d;
    }
    *out = v;
    return true;
}

static int check_file(li_medusa *h, const char *path, const li_model *base, li_error *err) {
    const li_gguf *g = &h->gguf;
    char arch[64] = "", hidden[64] = "", hash[64] = "";
    if (!get_str(g, "general.architecture", arch, sizeof arch) || strcmp(arch, "medusa"))
        return li_error_set(err, LI_EINVAL, "medusa: %s: general.architecture is '%s', not 'medusa' (not a heads file)",
                            path, arch);
    uint32_t version, k, n_embd, n_vocab;
    int rc;
    if ((rc = get_u32(g, path, "medusa.version", &version, err))) return rc;
    if (version != 1)
        return li_error_set(err, LI_EUNSUP, "medusa: %s: medusa.version is %u, this build reads version 1", path, version);
    if ((rc = get_u32(g, path, "medusa.n_heads", &k, err)) || (rc = get_u32(g, path, "medusa.n_embd", &n_embd, err)) ||
        (rc = get_u32(g, path, "medusa.n_vocab", &n_vocab, err)))
        return rc;
    if (k < 1 || k > LI_MEDUSA_MAX_HEADS)
        return li_error_set(err, LI_EINVAL, "medusa: %s: medusa.n_heads is %u, must be in [1, %d]", path, k,
                            LI_MEDUSA_MAX_HEADS);
    if (!get_str(g, "medusa.hidden", hidden, sizeof hidden) || strcmp(hidden, "post_norm"))
        return li_error_set(err, LI_EUNSUP, "medusa: %s: medusa.hidden is '%s', only 'post_norm' is supported", path,
                            hidden);
    get_str(g, "medusa.base.name", h->base_name, sizeof h->base_name);
    if (!get_str(g, "medusa.base.vocab_hash", hash, sizeof hash) || !parse_hash(hash, &h->vocab_hash))
        return li_error_set(err, LI_EINVAL, "medusa: %s: medusa.base.vocab_hash '%s' is not 16 lowercase hex digits",
                            path, hash);
    char bname[128] = "";
    if (!get_str(&base->gguf, "general.name", bname, sizeof bname) && base->path) {
        const char *s = strrchr(base->path, '/');
        snprintf(bname, sizeof bname, "%s", s ? s + 1 : base->path);
    }
    const uint64_t want = base->tok ? li_tokenizer_vocab_hash(base->tok) : 0;
    if (h->vocab_hash != want)
        return li_error_set(err, LI_EINVAL,
                            "medusa: heads made for '%s' (vocab hash %016llx), the model is '%s' (%016llx)",
                            h->base_name, (unsigned long long)h->vocab_hash, bname, (unsigned long long)want);
    if ((int64_t)n_embd != base->hp.n_embd || (int64_t)n_vocab != base->hp.n_vocab)
        return li_error_set(err, LI_EINVAL,
                            "medusa: heads made for '%s' (n_embd %u, n_vocab %u), the model is '%s' (n_embd %d, n_vocab %d)",
                            h->base_name, n_embd, n_vocab, bname, base->hp.n_embd, base->hp.n_vocab);
    if (strcmp(h->base_name, bname))
        li_log_warn("medusa: heads made for '%s', the model is '%s' (same vocabulary and shape: used)", h->base_name,
                    bname);
    h->n_heads = (int32_t)k;
    h->n_embd = (int32_t)n_embd;
    h->n_vocab = (int32_t)n_vocab;
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
        li_weight *w = &h->w[i];
        *w = (li_weight){.type = (li_type)t->type, .k = n_embd, .m = n_embd, .data = t->data};
        li_type_row_size(t->type, n_embd, &w->row_bytes);
        snprintf(name, sizeof name, "medusa.%u.bias", i);
        t = li_gguf_find_tensor(g, name);
        if (!t) return li_error_set(err, LI_EINVAL, "medusa: %s: missing tensor '%s'", path, name);
        if (t->type != LI_TYPE_F32 || t->n_dims != 1 || t->ne[0] != n_embd)
            return li_error_set(err, LI_EINVAL, "medusa: %s: tensor '%s' is %s [%lld], want f32 [%u]", path, name,
                                li_type_name(t->type), (long long)t->ne[0], n_embd);
        h->b[i] = t->data;
    }
    return 0;
}

int li_medusa_load(li_medusa **out, const char *path, const li_model *base, li_error *err) {
    *out = NULL;
    li_medusa *h = li_xcalloc(1, sizeof *h);
    int rc = li_gguf_open(&h->gguf, path, err);
    if (rc) {
        free(h);
        return rc;
    }
    if ((rc = check_file(h, path, base, err))) {
        li_medusa_free(h);
        return rc;
    }
    *out = h;
    return 0;
}

void li_medusa_free(li_medusa *h) {
    if (!h) return;
    if (h->be) {
        for (int i = 0; i < h->n_heads; i++)
            if (h->be->ops->weight_release) h->be->ops->weight_release(h->be, &h->w[i]);
        li_buffer_free(h->be, &h->scratch);
        li_buffer_free(h->be, &h->logits);
    }
    free(h->logits_host);
    li_gguf_free(&h->gguf);
    free(h);
}

/* ---- the forward ------------------------------------------------------------------ */

int li_medusa_prepare(li_medusa *h, const li_model *base, li_backend *be, int64_t cap, li_error *err) {
    if (h->be) return li_error_set(err, LI_EINVAL, "medusa: the heads are already prepared");
    if (cap <= 0) return li_error_set(err, LI_EINVAL, "medusa: capacity must be positive");
    for (int i = 0; i < h->n_heads; i++)
        if (be->ops->weight_prepare && be->ops->weight_prepare(be, &h->w[i])) {
            for (int j = 0; j < i; j++)
                if (be->ops->weight_release) be->ops->weight_release(be, &h->w[j]);
            return li_error_set(err, LI_EUNSUP, "medusa: the '%s' backend cannot take head %d's weight", be->ops->name, i);
        }
    h->be = be;
    h->output = &base->output;
    h->cap = cap;
    const size_t E = (size_t)h->n_embd, row = E * sizeof(float);
    const size_t rows = 3 * (size_t)cap + (size_t)h->n_heads;
    int rc = li_buffer_alloc(be, rows * row, &h->scratch, err);
    if (!rc) rc = li_buffer_alloc(be, (size_t)h->n_heads * (size_t)cap * (size_t)h->n_vocab * sizeof(float), &h->logits, err);
    if (rc) return rc;
    h->d_h = h->scratch.data;
    h->d_t = h->d_h + (size_t)cap * E;
    h->d_ones = h->d_t + (size_t)cap * E;
    h->d_bias = h->d_ones + (size_t)cap * E;
    /* SiLU alone is silu_mul by ones: x * 1.0f is exact */
    float *ones = li_xmalloc((size_t)cap * row);
    for (size_t i = 0; i < (size_t)cap * E; i++) ones[i] = 1.0f;
    be->ops->buffer_set(be, &h->scratch, li_buffer_offset(&h->scratch, h->d_ones), ones, (size_t)cap * row);
    free(ones);
    for (int i = 0; i < h->n_heads; i++)
        be->ops->buffer_set(be, &h->scratch, li_buffer_offset(&h->scratch, h->d_bias + (size_t)i * E), h->b[i], row);
    if (!h->logits.host)
        h->logits_host = li_xmalloc((size_t)h->n_heads * (size_t)cap * (size_t)h->n_vocab * sizeof(float));
    return 0;
}

const float *li_medusa_run(li_medusa *h, const float *hidden, int64_t n, int32_t n_heads, li_error *err) {
    li_backend *be = h->be;
    if (!be) {
        li_error_set(err, LI_EINVAL, "medusa: the heads are not prepared");
        return NULL;
    }
    if (n <= 0 || n > h->cap || n_heads <= 0 || n_heads > h->n_heads) {
        li_error_set(err, LI_EINVAL, "medusa: %lld rows x %d heads (capacity %lld x %d)", (long long)n, n_heads,
                     (long long)h->cap, h->n_heads);
        return NULL;
    }
    const int64_t E = h->n_embd, V = h->n_vocab;
    const li_backend_ops *op = be->ops;
    op->buffer_set(be, &h->scratch, li_buffer_offset(&h->scratch, h->d_h), hidden, (size_t)(n * E) * sizeof(float));
    float *lg = h->logits.data;
    for (int32_t k = 0; k < n_heads; k++) {
        /* t = W_k h + b_k; t = SiLU(t); t += h (= h + SiLU(...)); logits = output t */
        op->matmul(be, &h->w[k], h->d_h, h->d_t, n);
        for (int64_t r = 0; r < n; r++) op->add(be, h->d_t + r * E, h->d_bias + (size_t)k * E, E);
        op->silu_mul(be, h->d_t, h->d_ones, n, E);
        op->add(be, h->d_t, h->d_h, n * E);
        op->matmul(be, h->output, h->d_t, lg + (size_t)k * (size_t)(n * V), n);
    }
    const size_t bytes = (size_t)n_heads * (size_t)(n * V) * sizeof(float);
    if (h->logits.host) { /* head k's rows start at k * n * V */
        op->synchronize(be);
        return lg;
    }
    op->buffer_get(be, &h->logits, 0, h->logits_host, bytes);
    return h->logits_host;
}

/* ---- the tree ------------------------------------------------------------------------ */

typedef struct path {
    int32_t len, r[LI_MEDUSA_MAX_HEADS];
} path;

static bool path_eq(const path *a, const path *b) {
    return a->len == b->len && !memcmp(a->r, b->r, (size_t)a->len * sizeof *a->r);
}

/* Adds p (and nothing if it is there); false when the set is full. */
static bool add_path(path *set, int32_t *n, const path *p) {
    for (int32_t i = 0; i < *n; i++)
        if (path_eq(&set[i], p)) return true;
    if (*n == LI_MEDUSA_MAX_NODES) return false;
    set[(*n)++] = *p;
    return true;
}

int li_medusa_tree_parse(const char *spec, int32_t n_heads, li_medusa_tree *t, li_error *err) {
    const bool dflt = !spec;
    if (dflt) spec = LI_MEDUSA_TREE_DEFAULT;
    memset(t, 0, sizeof *t);
    path listed[64];
    int32_t nl = 0;
    const char *s = spec;
    while (*s) {
        path p = {0};
        for (;;) {
            while (*s == ' ') s++;
            if (!isdigit((unsigned char)*s))
                return li_error_set(err, LI_EINVAL, "medusa tree '%s': want paths of ranks like '0;1;0,0' at '%.10s'",
                                    spec, s);
            char *end;
            const long v = strtol(s, &end, 10);
            s = end;
            if (v >= LI_MEDUSA_MAX_RANK)
                return li_error_set(err, LI_EINVAL, "medusa tree '%s': rank %ld is outside [0, %d)", spec, v,
                                    LI_MEDUSA_MAX_RANK);
            if (p.len == LI_MEDUSA_MAX_HEADS)
                return li_error_set(err, LI_EINVAL, "medusa tree '%s': a path deeper than %d", spec, LI_MEDUSA_MAX_HEADS);
            p.r[p.len++] = (int32_t)v;
            while (*s == ' ') s++;
            if (*s != ',') break;
            s++;
        }
        if (*s && *s != ';')
            return li_error_set(err, LI_EINVAL, "medusa tree '%s': unexpected '%c' (paths are split by ';')", spec, *s);
        if (*s) s++;
        if (p.len > n_heads) {
            if (dflt) continue;
            return li_error_set(err, LI_EINVAL, "medusa tree '%s': a path of depth %d, the heads file has %d heads", spec,
                                p.len, n_heads);
        }
        if (nl == (int32_t)LI_ARRAY_LEN(listed))
            return li_error_set(err, LI_EINVAL, "medusa tree '%s': more than %d paths", spec, (int)LI_ARRAY_LEN(listed));
        listed[nl++] = p;
    }
    if (!nl) return li_error_set(err, LI_EINVAL, "medusa tree '%s': no path", spec);
    /* the chain to the deepest path, then by depth: each path after its prefixes, as listed */
    int32_t maxd = 0;
    for (int32_t i = 0; i < nl; i++) maxd = LI_MAX(maxd, listed[i].len);
    path set[LI_MEDUSA_MAX_NODES];
    int32_t n = 0;
    bool ok = true;
    for (int32_t d = 1; d <= maxd && ok; d++) ok = add_path(set, &n, &(path){.len = d});
    t->chain = n;
    for (int32_t d = 1; d <= maxd && ok; d++)
        for (int32_t i = 0; i < nl && ok; i++)
            if (listed[i].len >= d) {
                path pre = listed[i];
                pre.len = d;
                ok = add_path(set, &n, &pre);
            }
    if (!ok)
        return li_error_set(err, LI_EINVAL, "medusa tree '%s': more than %d nodes (with every prefix)", spec,
                            LI_MEDUSA_MAX_NODES);
    t->n = n;
    t->max_depth = maxd;
    for (int32_t i = 0; i < n; i++) {
        t->depth[i] = set[i].len;
        t->rank[i] = set[i].r[set[i].len - 1];
        t->parent[i] = -1;
        if (set[i].len > 1) {
            path pre = set[i];
            pre.len--;
            for (int32_t j = 0; j < i; j++)
                if (path_eq(&set[j], &pre)) t->parent[i] = j;
        }
        const int32_t hd = set[i].len - 1;
        t->top[hd] = LI_MAX(t->top[hd], t->rank[i] + 1);
    }
    return 0;
}
