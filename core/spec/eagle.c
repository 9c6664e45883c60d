/* eagle.c — an EAGLE draft loaded as a one-block model with an input
 * projection (spec/eagle.h; the file's check is eagle_file.c). */
#include "spec/eagle.h"
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the base's general.name, else its file's basename ("" when neither) */
static void base_name(const li_model *base, char *out, size_t cap) {
    out[0] = 0;
    if (li_gguf_copy_str(&base->gguf, "general.name", out, cap)) return;
    if (base->path) {
        const char *p = strrchr(base->path, '/');
        snprintf(out, cap, "%s", p ? p + 1 : base->path);
    }
}

static li_weight matrix(const li_gguf_tensor *t, const char *name) {
    li_weight w = {.type = (li_type)t->type, .k = t->ne[0], .m = t->ne[1], .data = t->data, .name = name};
    li_type_row_size(t->type, w.k, &w.row_bytes);
    return w;
}

/* The output rows of the draft vocabulary: the base's rows as they are for
 * a plain GGUF type, else F16 copies of their dequantized values. */
static int build_head(li_eagle *eg, const li_model *base, li_error *err) {
    const li_weight *o = &base->output;
    const int64_t d = base->hp.n_embd, n = eg->f.n_draft;
    const li_type_traits *tt = li_type_get(o->type);
    li_weight *h = &eg->m.output;
    if (o->scheme == LI_SCHEME_PLAIN && tt && tt->to_float && o->row_bytes && o->data) {
        eg->head = li_xmalloc((size_t)n * o->row_bytes);
        for (int64_t i = 0; i < n; i++)
            memcpy((char *)eg->head + (size_t)i * o->row_bytes,
                   (const char *)o->data + (size_t)eg->vocab[i] * o->row_bytes, o->row_bytes);
        *h = (li_weight){.type = o->type, .k = d, .m = n, .row_bytes = o->row_bytes, .data = eg->head,
                         .name = "eagle.output"};
        return 0;
    }
    float *row = li_xmalloc((size_t)d * sizeof *row);
    uint16_t *f16 = li_xmalloc((size_t)n * (size_t)d * sizeof *f16);
    for (int64_t i = 0; i < n; i++) {
        li_weight_dequant_row_ref(o, eg->vocab[i], row);
        for (int64_t j = 0; j < d; j++) f16[i * d + j] = li_fp32_to_fp16(row[j]);
    }
    free(row);
    eg->head = f16;
    *h = (li_weight){.type = LI_TYPE_F16, .k = d, .m = n, .row_bytes = (size_t)d * 2, .data = f16,
                     .name = "eagle.output"};
    (void)err;
    return 0;
}

int li_eagle_load(li_eagle **out, const char *path, const li_model *base, li_error *err) {
    *out = NULL;
    if (!base->tok)
        return li_error_set(err, LI_EINVAL, "eagle: the base model has no tokenizer to check the draft against");
    li_eagle *eg = li_xcalloc(1, sizeof *eg);
    int rc = li_gguf_open(&eg->gguf, path, err);
    if (rc) {
        free(eg);
        return rc;
    }
    char bname[128];
    base_name(base, bname, sizeof bname);
    const li_eagle_base want = {.name = bname, .n_embd = base->hp.n_embd, .n_vocab = base->hp.n_vocab,
                                .n_layer = base->hp.n_layer, .head_dim = base->hp.head_dim,
                                .vocab_hash = base->tok ? li_tokenizer_vocab_hash(base->tok) : 0};
    li_eagle_file *f = &eg->f;
    if ((rc = li_eagle_file_check(&eg->gguf, path, &want, f, err))) {
        li_eagle_free(eg);
        return rc;
    }
    memcpy(eg->base_name, f->base_name, sizeof eg->base_name);
    eg->vocab = li_xmalloc((size_t)f->n_draft * sizeof *eg->vocab);
    for (int32_t i = 0; i < f->n_draft; i++) eg->vocab[i] = f->vocab ? f->vocab[i] : i;
    /* the block as a model: the base's rope and eps, the file's shape */
    li_model *m = &eg->m;
    m->hp = base->hp;
    m->hp.n_vocab = f->n_draft;
    m->hp.n_layer = 1;
    m->hp.n_head = f->n_head;
    m->hp.n_head_kv = f->n_head_kv;
    m->hp.head_dim = f->head_dim;
    m->hp.n_ff = f->n_ff;
    m->hp.n_ff_layer = NULL; /* the draft block's own width, not the base's per-layer ones */
    if (m->hp.n_rot > f->head_dim) m->hp.n_rot = f->head_dim;
    const li_gguf_tensor *const *t = f->t;
    eg->layer = (li_layer){.wq = matrix(t[LI_EAGLE_WQ], "eagle.attn_q"),
                           .wk = matrix(t[LI_EAGLE_WK], "eagle.attn_k"),
                           .wv = matrix(t[LI_EAGLE_WV], "eagle.attn_v"),
                           .wo = matrix(t[LI_EAGLE_WO], "eagle.attn_output"),
                           .ffn_norm = t[LI_EAGLE_FFN_NORM]->data,
                           .w_gate = matrix(t[LI_EAGLE_GATE], "eagle.ffn_gate"),
                           .w_up = matrix(t[LI_EAGLE_UP], "eagle.ffn_up"),
                           .w_down = matrix(t[LI_EAGLE_DOWN], "eagle.ffn_down")};
    eg->inproj = (li_model_inproj){.fc = matrix(t[LI_EAGLE_FC], "eagle.fc"),
                                   .in_width = f->n_features * f->n_embd,
                                   .norm_e = t[LI_EAGLE_ENORM]->data,
                                   .norm_h = t[LI_EAGLE_HNORM]->data};
    m->layers = &eg->layer;
    m->inproj = &eg->inproj;
    m->output_norm = t[LI_EAGLE_OUTPUT_NORM]->data;
    m->quant_scheme = LI_SCHEME_PLAIN;
    if ((rc = build_head(eg, base, err))) {
        li_eagle_free(eg);
        return rc;
    }
    *out = eg;
    return 0;
}

/* the weights the draft owns (the embedding is the base's) */
#define EAGLE_N_OWNED 9
static li_weight *owned(li_eagle *eg, int i) {
    li_layer *L = &eg->layer;
    li_weight *const w[EAGLE_N_OWNED] = {&eg->inproj.fc, &L->wq, &L->wk, &L->wv, &L->wo,
                                         &L->w_gate, &L->w_up, &L->w_down, &eg->m.output};
    return w[i];
}

int li_eagle_prepare(li_eagle *eg, const li_model *base, li_backend *be, li_error *err) {
    if (eg->be) return li_error_set(err, LI_EINVAL, "eagle: the draft is already prepared");
    for (int i = 0; i < EAGLE_N_OWNED; i++) {
        li_weight *w = owned(eg, i);
        if (be->ops->weight_prepare && be->ops->weight_prepare(be, w)) {
            for (int j = 0; j < i; j++)
                if (be->ops->weight_release) be->ops->weight_release(be, owned(eg, j));
            return li_error_set(err, LI_EUNSUP, "eagle: the '%s' backend cannot take the draft's %s weights (%s)",
                                be->ops->name, w->name, li_type_name(w->type));
        }
    }
    eg->m.tok_embd = base->tok_embd;
    eg->be = be;
    return 0;
}

void li_eagle_free(li_eagle *eg) {
    if (!eg) return;
    if (eg->be && eg->be->ops->weight_release)
        for (int i = 0; i < EAGLE_N_OWNED; i++) eg->be->ops->weight_release(eg->be, owned(eg, i));
    free(eg->head);
    free(eg->vocab);
    li_gguf_free(&eg->gguf);
    free(eg);
}
