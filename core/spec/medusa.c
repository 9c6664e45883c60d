/* medusa.c — Medusa heads: loading a heads file (checked by medusa_file.c),
 * the heads' forward on the target's backend, and the candidate tree
 * (spec/medusa.h). */
#include "spec/medusa.h"
#include "spec/medusa_file.h"
#include "tokenizer/tokenizer.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- loading ----------------------------------------------------------------- */

/* The file's one check (medusa_file.c) against base; the heads' weights
 * and biases then point into the mapping. */
static int check_file(li_medusa *h, const char *path, const li_model *base, li_error *err) {
    char bname[128] = "";
    li_str s;
    if (!li_gguf_get_str(&base->gguf, "general.name", &s, NULL))
        snprintf(bname, sizeof bname, "%.*s", (int)LI_MIN(s.len, (uint64_t)sizeof bname - 1), s.ptr);
    else if (base->path) {
        const char *p = strrchr(base->path, '/');
        snprintf(bname, sizeof bname, "%s", p ? p + 1 : base->path);
    }
    const li_medusa_base want = {.name = bname, .n_embd = base->hp.n_embd, .n_vocab = base->hp.n_vocab,
                                 .vocab_hash = base->tok ? li_tokenizer_vocab_hash(base->tok) : 0};
    li_medusa_file f;
    const int rc = li_medusa_file_check(&h->gguf, path, &want, &f, err);
    if (rc) return rc;
    memcpy(h->base_name, f.base_name, sizeof h->base_name);
    h->vocab_hash = f.vocab_hash;
    h->n_heads = f.n_heads;
    h->n_embd = f.n_embd;
    h->n_vocab = f.n_vocab;
    for (int32_t i = 0; i < f.n_heads; i++) {
        li_weight *w = &h->w[i];
        *w = (li_weight){.type = (li_type)f.w[i]->type, .k = f.n_embd, .m = f.n_embd, .data = f.w[i]->data};
        li_type_row_size(f.w[i]->type, f.n_embd, &w->row_bytes);
        h->b[i] = f.b[i]->data;
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
    /* h (cap rows), every head's t (n_heads x cap: one output matmul reads
     * the n_vocab x n_embd head once for all of them), ones (cap), biases */
    const size_t rows = (2 + (size_t)h->n_heads) * (size_t)cap + (size_t)h->n_heads;
    int rc = li_buffer_alloc(be, rows * row, &h->scratch, err);
    if (!rc) rc = li_buffer_alloc(be, (size_t)h->n_heads * (size_t)cap * (size_t)h->n_vocab * sizeof(float), &h->logits, err);
    if (rc) return rc;
    h->d_h = h->scratch.data;
    h->d_t = h->d_h + (size_t)cap * E;
    h->d_ones = h->d_t + (size_t)h->n_heads * (size_t)cap * E;
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
        /* t = W_k h + b_k; t = SiLU(t); t += h (= h + SiLU(...)) */
        float *t = h->d_t + (size_t)k * (size_t)(n * E);
        op->matmul(be, &h->w[k], h->d_h, t, n);
        for (int64_t r = 0; r < n; r++) op->add(be, t + r * E, h->d_bias + (size_t)k * E, E);
        op->silu_mul(be, t, h->d_ones, n, E);
        op->add(be, t, h->d_h, n * E);
    }
    /* logits = output t, every head's rows in one pass over the output
     * weights (a row's logits do not depend on the batch) */
    op->matmul(be, h->output, h->d_t, lg, (int64_t)n_heads * n);
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
