/* shard.c — tensor-parallel shards of a model (shard.h). Owns: a view's
 * layer array and its row-parallel weights' copied columns. */
#include "dist/shard.h"

#include <stdlib.h>
#include <string.h>

/* [0, n) over size ranks, the remainder on the first ranks */
static void split(int64_t n, int rank, int size, int64_t *start, int64_t *len) {
    const int64_t base = n / size, rem = n % size;
    *start = rank * base + LI_MIN((int64_t)rank, rem);
    *len = base + (rank < rem);
}

static int64_t block_of(li_type t) {
    const li_type_traits *tr = li_type_get(t);
    return tr && tr->blck_size > 0 ? tr->blck_size : 1;
}

int li_shard_plan(const li_model *m, int rank, int size, li_shard *out, li_error *err) {
    const li_hparams *hp = &m->hp;
    memset(out, 0, sizeof *out);
    if (size < 1) return li_error_set(err, LI_EINVAL, "tensor parallel: %d ranks (want at least 1)", size);
    if (size > hp->n_head_kv)
        return li_error_set(err, LI_EINVAL,
                            "tensor parallel: %d ranks for a model with %d KV heads (each rank needs at least one)",
                            size, hp->n_head_kv);
    if (rank < 0 || rank >= size) return li_error_set(err, LI_EINVAL, "tensor parallel: rank %d of %d", rank, size);
    if (m->quant_scheme != LI_SCHEME_PLAIN)
        return li_error_set(err, LI_EUNSUP, "tensor parallel: weight scheme %s is not supported yet (GGUF block types only)",
                            li_scheme_name(m->quant_scheme));
    int64_t s, n;
    split(hp->n_head_kv, rank, size, &s, &n);
    const int32_t group = hp->n_head / hp->n_head_kv;
    out->rank = rank;
    out->size = size;
    out->head_kv0 = (int32_t)s;
    out->n_head_kv = (int32_t)n;
    out->head0 = out->head_kv0 * group;
    out->n_head = out->n_head_kv * group;
    if (hp->n_ff_layer)
        return li_error_set(err, LI_EUNSUP, "tensor parallel: the blocks' FFN widths differ (a non-uniformly pruned "
                                            "model); not supported yet");
    /* n_ff in whole blocks of every layer's w_down (its k-slice) */
    int64_t unit = 1;
    for (int l = 0; l < hp->n_layer; l++) unit = LI_MAX(unit, block_of(m->layers[l].w_down.type));
    /* a rotated model's online Hadamard is block-diagonal: a rank's slice holds whole blocks */
    unit = LI_MAX(unit, (int64_t)m->rot_block);
    if (hp->n_ff % unit || hp->n_ff / unit < size)
        return li_error_set(err, LI_EUNSUP, "tensor parallel: n_ff %d does not split into %d slices of whole %lld-element blocks",
                            hp->n_ff, size, (long long)unit);
    split(hp->n_ff / unit, rank, size, &s, &n);
    out->ff0 = s * unit;
    out->n_ff = n * unit;
    /* wo's k-slice: the rank's query heads, in whole blocks */
    for (int l = 0; l < hp->n_layer; l++) {
        const int64_t b = block_of(m->layers[l].wo.type), c0 = (int64_t)out->head0 * hp->head_dim,
                      c1 = c0 + (int64_t)out->n_head * hp->head_dim;
        if (c0 % b || c1 % b)
            return li_error_set(err, LI_EUNSUP,
                                "tensor parallel: blk.%d.attn_output (%s, blocks of %lld) cannot be cut at head %d "
                                "(column %lld)",
                                l, li_type_name(m->layers[l].wo.type), (long long)b, c0 % b ? out->head0 : out->head0 + out->n_head,
                                (long long)(c0 % b ? c0 : c1));
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * slicing one weight
 * ---------------------------------------------------------------------- */

/* A plain weight with its packed layout dropped: the rank's backend makes its own. */
static li_weight unpacked(const li_weight *w) {
    li_weight v = *w;
    v.packed = NULL;
    return v;
}

/* rows [r0, r0 + n) of w: a view of its rows */
static li_weight rows_of(const li_weight *w, int64_t r0, int64_t n) {
    li_weight v = unpacked(w);
    v.data = (const char *)w->data + (size_t)r0 * w->row_bytes;
    v.m = n;
    return v;
}

/* columns [c0, c0 + n) of every row of w, copied into *owned (whole blocks:
 * li_shard_plan checked) */
static li_weight cols_of(const li_weight *w, int64_t c0, int64_t n, void **owned) {
    li_weight v = unpacked(w);
    const int64_t b = block_of(w->type);
    const size_t blk_bytes = li_type_get(w->type)->type_size;
    const size_t off = (size_t)(c0 / b) * blk_bytes, rb = (size_t)(n / b) * blk_bytes;
    char *dst = li_aligned_alloc(rb * (size_t)w->m);
    for (int64_t r = 0; r < w->m; r++) memcpy(dst + (size_t)r * rb, (const char *)w->data + (size_t)r * w->row_bytes + off, rb);
    v.data = dst;
    v.k = n;
    v.row_bytes = rb;
    *owned = dst;
    return v;
}

int li_shard_model_init(li_model *view, const li_model *m, int rank, int size, li_error *err) {
    memset(view, 0, sizeof *view);
    li_shard s;
    int rc = li_shard_plan(m, rank, size, &s, err);
    if (rc) return rc;
    *view = *m; /* shares the mapping, tokenizer and replicated weights: never freed through the view */
    view->tok_embd = unpacked(&m->tok_embd);
    view->output = m->output.data == m->tok_embd.data ? view->tok_embd : unpacked(&m->output);
    view->owned = NULL; /* m's f32 norm copies stay m's */
    view->n_owned = 0;
    view->hf = NULL;
    li_hparams *hp = &view->hp;
    hp->n_head = s.n_head;
    hp->n_head_kv = s.n_head_kv;
    hp->n_ff = (int32_t)s.n_ff;
    const int64_t hd = m->hp.head_dim;
    const int nl = m->hp.n_layer;
    view->layers = li_xcalloc((size_t)nl, sizeof *view->layers);
    view->shard_copies = li_xcalloc(2 * (size_t)nl, sizeof *view->shard_copies);
    view->n_shard_copies = 0;
    void **own = view->shard_copies;
    for (int l = 0; l < nl; l++) {
        const li_layer *F = &m->layers[l];
        li_layer *L = &view->layers[l];
        L->attn_norm = F->attn_norm;
        L->ffn_norm = F->ffn_norm;
        L->wq = rows_of(&F->wq, s.head0 * hd, s.n_head * hd);
        L->wk = rows_of(&F->wk, s.head_kv0 * hd, s.n_head_kv * hd);
        L->wv = rows_of(&F->wv, s.head_kv0 * hd, s.n_head_kv * hd);
        L->w_gate = rows_of(&F->w_gate, s.ff0, s.n_ff);
        L->w_up = rows_of(&F->w_up, s.ff0, s.n_ff);
        L->wo = cols_of(&F->wo, s.head0 * hd, s.n_head * hd, &own[view->n_shard_copies++]);
        L->w_down = cols_of(&F->w_down, s.ff0, s.n_ff, &own[view->n_shard_copies++]);
        L->down_had = F->down_had ? F->down_had + s.ff0 : NULL; /* the slice's signs: its blocks are its own */
    }
    return 0;
}

void li_shard_model_free(li_model *view) {
    for (int i = 0; i < view->n_shard_copies; i++) li_aligned_free(view->shard_copies[i]);
    free(view->shard_copies);
    free(view->layers);
    memset(view, 0, sizeof *view);
}
