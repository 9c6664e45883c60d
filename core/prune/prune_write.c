/* prune_write.c — the pruned GGUF (prune.h): every metadata key copied,
 * the counts changed, per-layer arrays kept consistent, tensors sliced and
 * renumbered blk.0 .. blk.(n-1) in the input's order.
 *
 * Slices along rows (q/k/v rows of the kept heads, gate/up rows of the kept
 * channels) copy the kept rows' bytes. Slices along k (o_proj's columns,
 * down_proj's) copy whole blocks when every kept run of columns starts and
 * ends on the type's block boundary (heads of 64 columns in 32-element
 * blocks); otherwise each row is dequantized, gathered and requantized to
 * its own type by the type's reference quantizer (the one `luainfer
 * quantize` uses), or written F16 when the type has none. A refit (--refit,
 * --rank obs) replaces those columns' values: written in plan->refit_type,
 * F16 by default (a second 4-bit rounding gives back part of what the refit
 * gained; Q8_0 costs less of it and reads half the bytes). */
#include "prune/prune.h"
#include "model/gguf_write.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void li_prune_plan_free(li_prune_plan *p) {
    free(p->keep_layer);
    free(p->keep_group);
    free(p->keep_ff);
    free(p->ff_keep_layer);
    for (int32_t l = 0; l < p->n_refit; l++) free(p->refit[l]);
    free(p->refit);
    memset(p, 0, sizeof *p);
}

/* ------------------------------------------------------------------------
 * slicing
 * ---------------------------------------------------------------------- */

/* rows idx[0..n) of a 2-D tensor, bytes copied */
static void *slice_rows(const li_gguf_tensor *t, const int64_t *idx, int64_t n, size_t *nbytes) {
    size_t row;
    li_type_row_size(t->type, t->ne[0], &row);
    uint8_t *d = li_xmalloc(row * (size_t)n);
    for (int64_t i = 0; i < n; i++) memcpy(d + (size_t)i * row, (const uint8_t *)t->data + (size_t)idx[i] * row, row);
    *nbytes = row * (size_t)n;
    return d;
}

/* columns idx[0..n) (ascending) of every row of a 2-D tensor; *type may
 * become F16 (see the file comment) */
static void *slice_cols(const li_gguf_tensor *t, const int64_t *idx, int64_t n, uint32_t *type, size_t *nbytes,
                        li_error *err) {
    const li_type_traits *tr = li_type_get(t->type);
    const int64_t k = t->ne[0], rows = t->ne[1], bs = tr->blck_size;
    size_t in_row;
    li_type_row_size(t->type, k, &in_row);
    bool aligned = n % bs == 0;
    for (int64_t i = 0; i < n && aligned; i += bs) /* every block of bs kept columns is one input block */
        aligned = idx[i] % bs == 0 && idx[i + bs - 1] == idx[i] + bs - 1;
    if (aligned) {
        const size_t out_row = (size_t)(n / bs) * tr->type_size;
        uint8_t *d = li_xmalloc(out_row * (size_t)rows);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t i = 0; i < n; i += bs)
                memcpy(d + (size_t)r * out_row + (size_t)(i / bs) * tr->type_size,
                       (const uint8_t *)t->data + (size_t)r * in_row + (size_t)(idx[i] / bs) * tr->type_size,
                       tr->type_size);
        *type = t->type;
        *nbytes = out_row * (size_t)rows;
        return d;
    }
    if (!tr->to_float) {
        li_error_set(err, LI_EUNSUP, "prune: cannot dequantize a %s tensor to slice its columns", tr->name);
        return NULL;
    }
    uint32_t ot = t->type;
    size_t out_row;
    if (!tr->from_float || !li_type_row_size(ot, n, &out_row)) {
        ot = LI_TYPE_F16;
        li_type_row_size(ot, n, &out_row);
    }
    const li_type_traits *otr = li_type_get(ot);
    float *full = li_xmalloc((size_t)k * sizeof(float)), *kept = li_xmalloc((size_t)n * sizeof(float));
    uint8_t *d = li_xmalloc(out_row * (size_t)rows);
    for (int64_t r = 0; r < rows; r++) {
        tr->to_float((const uint8_t *)t->data + (size_t)r * in_row, full, k);
        for (int64_t i = 0; i < n; i++) kept[i] = full[idx[i]];
        otr->from_float(kept, d + (size_t)r * out_row, n);
    }
    free(full);
    free(kept);
    *type = ot;
    *nbytes = out_row * (size_t)rows;
    return d;
}

/* ------------------------------------------------------------------------
 * metadata
 * ---------------------------------------------------------------------- */

static bool key_is(li_str key, const char *arch, const char *suffix) {
    char k[160];
    snprintf(k, sizeof k, "%s.%s", arch, suffix);
    return li_str_eq(key, k);
}

static int write_metadata(const li_model *m, const li_prune_plan *p, const char *rank, li_gguf_writer *w,
                          li_error *err) {
    const li_gguf *g = &m->gguf;
    const li_hparams *hp = &m->hp;
    const char *a = hp->arch;
    const size_t al = strlen(a);
    /* per-block widths: llama.cpp reads them for "deci" (its Llama with
     * per-layer counts), not for "llama", so the file is written as that */
    const char *oa = p->ff_keep_layer ? "deci" : a;
    const int32_t r = hp->n_head / hp->n_head_kv;
    int rc = 0;
    for (uint64_t i = 0; i < g->n_kv && !rc; i++) {
        const li_gguf_kv *kv = &g->kv[i];
        if (kv->key.len >= 15 && !memcmp(kv->key.ptr, "luainfer.prune.", 15)) continue; /* a pruned input's */
        char key[256];
        const bool ours = kv->key.len > al && !memcmp(kv->key.ptr, a, al) && kv->key.ptr[al] == '.';
        if (kv->key.len - (ours ? al : 0) + strlen(oa) >= sizeof key) /* copied whole or not at all */
            return li_error_set(err, LI_EINVAL, "prune: metadata key '%.40s...' is %llu bytes long (at most %zu)",
                                kv->key.ptr, (unsigned long long)kv->key.len, sizeof key - 1 - strlen(oa));
        if (ours) /* ARCH.rest, renamed */
            snprintf(key, sizeof key, "%s%.*s", oa, (int)(kv->key.len - al), kv->key.ptr + al);
        else
            snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.ptr);
        if (li_str_eq(kv->key, "general.architecture")) {
            rc = li_gguf_writer_add_str(w, key, oa, err);
        } else if (key_is(kv->key, a, "block_count")) {
            rc = li_gguf_writer_add_u32(w, key, (uint32_t)p->n_layer_keep, err);
        } else if (key_is(kv->key, a, "attention.head_count")) {
            rc = li_gguf_writer_add_u32(w, key, (uint32_t)(p->n_group_keep * r), err);
        } else if (key_is(kv->key, a, "attention.head_count_kv")) {
            rc = li_gguf_writer_add_u32(w, key, (uint32_t)p->n_group_keep, err);
        } else if (key_is(kv->key, a, "feed_forward_length") && p->ff_keep_layer) {
            /* one width per block: llama.cpp's n_ff_arr form of the key */
            uint32_t *v = li_xmalloc((size_t)hp->n_layer * sizeof *v);
            for (int l = 0; l < hp->n_layer; l++) v[l] = (uint32_t)p->ff_keep_layer[l];
            li_gguf_kv arr = {.key = {key, strlen(key)}, .type = LI_GGUF_ARRAY};
            arr.v.arr.type = LI_GGUF_UINT32;
            arr.v.arr.n = (uint64_t)hp->n_layer;
            arr.v.arr.data = (const uint8_t *)v;
            rc = li_gguf_writer_add_kv(w, &arr, err);
            free(v);
        } else if (key_is(kv->key, a, "feed_forward_length")) {
            rc = li_gguf_writer_add_u32(w, key, (uint32_t)p->n_ff_keep, err);
        } else if (p->what == LI_PRUNE_LAYERS && kv->type == LI_GGUF_ARRAY && kv->v.arr.n == (uint64_t)hp->n_layer &&
                   kv->key.len > al && !memcmp(kv->key.ptr, a, al) && kv->key.ptr[al] == '.' &&
                   li_gguf_vtype_size(kv->v.arr.type)) {
            /* a per-layer array (llama.cpp's per-layer head counts, ...): the kept layers' entries */
            const size_t es = li_gguf_vtype_size(kv->v.arr.type);
            uint8_t *d = li_xmalloc(es * (size_t)p->n_layer_keep);
            for (int32_t j = 0; j < p->n_layer_keep; j++)
                memcpy(d + es * (size_t)j, kv->v.arr.data + es * (size_t)p->keep_layer[j], es);
            li_gguf_kv sub = *kv;
            sub.key = (li_str){key, strlen(key)};
            sub.v.arr.n = (uint64_t)p->n_layer_keep;
            sub.v.arr.data = d;
            rc = li_gguf_writer_add_kv(w, &sub, err);
            free(d);
        } else {
            li_gguf_kv c = *kv;
            c.key = (li_str){key, strlen(key)};
            rc = li_gguf_writer_add_kv(w, &c, err);
        }
    }
    char key[160];
    /* the head size must stay when head_count changes (it defaults to n_embd / head_count) */
    snprintf(key, sizeof key, "%s.attention.head_count_kv", oa);
    if (!rc && !li_gguf_writer_has_kv(w, key)) rc = li_gguf_writer_add_u32(w, key, (uint32_t)p->n_group_keep, err);
    snprintf(key, sizeof key, "%s.attention.key_length", oa);
    if (!rc && !li_gguf_writer_has_kv(w, key)) rc = li_gguf_writer_add_u32(w, key, (uint32_t)hp->head_dim, err);
    snprintf(key, sizeof key, "%s.attention.value_length", oa);
    if (!rc && !li_gguf_writer_has_kv(w, key)) rc = li_gguf_writer_add_u32(w, key, (uint32_t)hp->head_dim, err);
    if (!rc) rc = li_gguf_writer_add_str(w, "luainfer.prune.what", li_prune_what_name(p->what), err);
    if (!rc) rc = li_gguf_writer_add_str(w, "luainfer.prune.rank", rank, err);
    if (!rc) rc = li_gguf_writer_add_u32(w, "luainfer.prune.source_block_count", (uint32_t)hp->n_layer, err);
    if (!rc && p->refit) rc = li_gguf_writer_add_str(w, "luainfer.prune.refit", "least-squares", err);
    return rc;
}

/* ------------------------------------------------------------------------
 * tensors
 * ---------------------------------------------------------------------- */

/* "blk.N.REST": N and REST, or -1 */
static int parse_blk(li_str name, char *rest, size_t cap) {
    char buf[160];
    snprintf(buf, sizeof buf, "%.*s", (int)LI_MIN(name.len, 159), name.ptr);
    int l, n = 0;
    if (sscanf(buf, "blk.%d.%n", &l, &n) != 1 || n == 0 || l < 0) return -1;
    snprintf(rest, cap, "%s", buf + n);
    return l;
}

/* The tensors of a Llama block: a block with others (biases, ...) cannot be
 * sliced without knowing their shapes' meaning. */
static bool known_block_tensor(const char *rest) {
    static const char *names[] = {"attn_norm.weight", "attn_q.weight",   "attn_k.weight",  "attn_v.weight",
                                  "attn_output.weight", "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight",
                                  "ffn_down.weight"};
    for (size_t i = 0; i < LI_ARRAY_LEN(names); i++)
        if (!strcmp(rest, names[i])) return true;
    return false;
}

/* The kept rows (heads: head_dim rows per head) or channels of layer l. */
static int64_t keep_index(const li_model *m, const li_prune_plan *p, int l, int which, int64_t *idx) {
    const li_hparams *hp = &m->hp;
    const int32_t r = hp->n_head / hp->n_head_kv, hd = hp->head_dim;
    int64_t n = 0;
    if (which == 2) { /* ffn channels */
        const int64_t nk = p->ff_keep_layer ? p->ff_keep_layer[l] : p->n_ff_keep,
                      stride = p->ff_keep_layer ? hp->n_ff : p->n_ff_keep;
        for (int64_t j = 0; j < nk; j++) idx[n++] = p->keep_ff[(size_t)l * stride + j];
        return n;
    }
    for (int32_t j = 0; j < p->n_group_keep; j++) {
        const int32_t grp = p->keep_group[(size_t)l * p->n_group_keep + j];
        const int32_t h0 = which == 0 ? grp * r : grp, nh = which == 0 ? r : 1; /* 0: query heads, 1: the kv head */
        for (int32_t h = h0; h < h0 + nh; h++)
            for (int32_t e = 0; e < hd; e++) idx[n++] = (int64_t)h * hd + e;
    }
    return n;
}

int li_prune_write(const li_model *m, const li_prune_plan *p, const char *rank, const char *path, li_error *err) {
    const li_gguf *g = &m->gguf;
    const li_hparams *hp = &m->hp;
    int32_t *new_id = li_xmalloc((size_t)hp->n_layer * sizeof *new_id);
    for (int l = 0; l < hp->n_layer; l++) new_id[l] = -1;
    for (int32_t j = 0; j < p->n_layer_keep; j++) new_id[p->keep_layer[j]] = j;
    int64_t *idx = li_xmalloc((size_t)LI_MAX((int64_t)hp->n_head * hp->head_dim, hp->n_ff) * sizeof *idx);
    li_gguf_writer w;
    li_gguf_writer_init(&w);
    int rc = write_metadata(m, p, rank, &w, err);
    for (uint64_t i = 0; i < g->n_tensors && !rc; i++) {
        const li_gguf_tensor *t = &g->tensors[i];
        char rest[160], name[200];
        const int l = parse_blk(t->name, rest, sizeof rest);
        snprintf(name, sizeof name, "%.*s", (int)LI_MIN(t->name.len, 199), t->name.ptr);
        if (l >= hp->n_layer) {
            rc = li_error_set(err, LI_EINVAL, "prune: tensor '%s' names a block past block_count %d", name, hp->n_layer);
            break;
        }
        if (l >= 0 && new_id[l] < 0) continue; /* a removed block */
        if (l >= 0) snprintf(name, sizeof name, "blk.%d.%s", new_id[l], rest);
        int64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
        uint32_t type = t->type;
        void *data = NULL;
        size_t nbytes = 0;
        /* 0: query rows, 1: kv rows, 2: ffn channels; rows (m) or columns (k) */
        int which = -1;
        bool cols = false;
        if (l >= 0 && p->what == LI_PRUNE_HEADS) {
            if (!strcmp(rest, "attn_q.weight")) which = 0;
            else if (!strcmp(rest, "attn_k.weight") || !strcmp(rest, "attn_v.weight")) which = 1;
            else if (!strcmp(rest, "attn_output.weight")) which = 0, cols = true;
        } else if (l >= 0 && p->what == LI_PRUNE_FFN) {
            if (!strcmp(rest, "ffn_gate.weight") || !strcmp(rest, "ffn_up.weight")) which = 2;
            else if (!strcmp(rest, "ffn_down.weight")) which = 2, cols = true;
        }
        if (l >= 0 && p->what != LI_PRUNE_LAYERS && !known_block_tensor(rest)) {
            rc = li_error_set(err, LI_EUNSUP, "prune: tensor '%s' is not a Llama block tensor this pruner can slice",
                              name);
            break;
        }
        if (which >= 0) {
            if (t->n_dims != 2 || !li_type_get(t->type)) {
                rc = li_error_set(err, LI_EINVAL, "prune: tensor '%s' is not a 2-D GGUF weight", name);
                break;
            }
            const int64_t n = keep_index(m, p, l, which, idx);
            if (cols && p->refit && l < p->n_refit && p->refit[l]) {
                const uint32_t rt = p->refit_type ? p->refit_type : LI_TYPE_F16;
                const li_type_traits *otr = li_type_get(rt);
                size_t row;
                if (!otr || !otr->from_float || !li_type_row_size(rt, n, &row)) {
                    rc = li_error_set(err, LI_EINVAL, "prune: '%s' keeps %lld columns, which %s cannot hold in a row",
                                      name, (long long)n, li_type_name(rt));
                    break;
                }
                const int64_t k = t->ne[0];
                float *kept = li_xmalloc((size_t)n * sizeof(float));
                data = li_xmalloc(row * (size_t)t->ne[1]);
                for (int64_t r = 0; r < t->ne[1]; r++) {
                    for (int64_t i = 0; i < n; i++) kept[i] = p->refit[l][r * k + idx[i]];
                    otr->from_float(kept, (uint8_t *)data + (size_t)r * row, n);
                }
                free(kept);
                type = rt;
                nbytes = row * (size_t)t->ne[1];
                ne[0] = n;
            } else if (cols) {
                if (!(data = slice_cols(t, idx, n, &type, &nbytes, err))) {
                    rc = err->code;
                    break;
                }
                ne[0] = n;
            } else {
                data = slice_rows(t, idx, n, &nbytes);
                ne[1] = n;
            }
        } else {
            data = li_xmalloc(t->nbytes ? t->nbytes : 1);
            memcpy(data, t->data, t->nbytes);
            nbytes = t->nbytes;
        }
        rc = li_gguf_writer_add_tensor(&w, name, type, t->n_dims, ne, data, nbytes, err);
    }
    if (!rc) rc = li_gguf_writer_write(&w, path, err);
    li_gguf_writer_free(&w);
    free(idx);
    free(new_id);
    return rc;
}
