/* forward.c — the Llama-family transformer, written as the math:
 *   x = embed(tokens)
 *   per layer:  x += Wo · attn(rope(Wq·n(x)), rope(Wk·n(x)), Wv·n(x))
 *               x += Wdown · (silu(Wgate·n(x)) * Wup·n(x))
 *   logits = Wout · n(x)   (only for the rows asked for)
 * Every op goes through the backend vtable. */
#include "model/forward.h"
#include "dist/comm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------
 * memory: every array the ops see is carved out of a backend buffer
 * ---------------------------------------------------------------------- */

/* Lays out n arrays of bytes[i] each, aligned, from offset 0; returns the
 * total and writes each start. */
static size_t carve(const size_t *bytes, size_t *off, int n, size_t align) {
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        off[i] = at;
        at += (bytes[i] + align - 1) / align * align;
    }
    return at;
}

int li_forward_init(li_forward *f, const li_model *m, li_backend *be, int64_t cap, li_error *err) {
    memset(f, 0, sizeof *f);
    f->row_host_at = -1;
    if (cap <= 0) return li_error_set(err, LI_EINVAL, "forward: batch capacity must be positive");
    const li_hparams *hp = &m->hp;
    const size_t c = (size_t)cap, fl = sizeof(float);
    const size_t align = LI_MAX(be->ops->alignment, (size_t)64);
    const size_t in_w = m->inproj ? (size_t)m->inproj->in_width : 0, zw = m->inproj ? 2 * (size_t)hp->n_embd : 0;
    const size_t sb[] = {c * hp->n_embd * fl, c * hp->n_embd * fl, c * hp->n_head * hp->head_dim * fl,
                         c * hp->n_head_kv * hp->head_dim * fl, c * hp->n_head_kv * hp->head_dim * fl,
                         c * hp->n_head * hp->head_dim * fl, c * hp->n_ff * fl, c * hp->n_ff * fl,
                         c * hp->n_embd * fl, c * zw * fl, c * in_w * fl};
    size_t so[LI_ARRAY_LEN(sb)];
    int rc = li_buffer_alloc(be, carve(sb, so, LI_ARRAY_LEN(sb), align), &f->scratch, err);
    if (rc) return rc;
    float **views[] = {&f->x, &f->h, &f->q, &f->k, &f->v, &f->att, &f->g, &f->u, &f->sel, &f->z, &f->in};
    for (size_t i = 0; i < LI_ARRAY_LEN(views); i++) *views[i] = (float *)((char *)f->scratch.data + so[i]);
    if (!m->inproj) f->z = f->in = NULL;
    f->sel_dst = li_xmalloc(2 * c * sizeof *f->sel_dst); /* 2 runs per row: an input projection's z */
    f->sel_src = li_xmalloc(2 * c * sizeof *f->sel_src);
    const size_t bb[] = {c * 4, c * 4, c * 4, c * 8};
    size_t bo[LI_ARRAY_LEN(bb)];
    if ((rc = li_buffer_alloc(be, carve(bb, bo, LI_ARRAY_LEN(bb), align), &f->batch, err))) {
        li_buffer_free(be, &f->scratch);
        return rc;
    }
    char *d = f->batch.data;
    f->d_tokens = (int32_t *)(d + bo[0]);
    f->d_pos = (int32_t *)(d + bo[1]);
    f->d_seq = (int32_t *)(d + bo[2]);
    f->d_slot = (int64_t *)(d + bo[3]);
    if (!f->batch.host) f->h_batch = li_xcalloc(1, f->batch.size); /* a device's: a host mirror */
    f->be = be;
    f->cap = cap;
    const char *env = getenv("LUAINFER_GRAPHS");
    f->graphs = be->ops->graph_begin && !(env && !strcmp(env, "0"));
    return 0;
}

static void graphs_drop(li_forward *f) {
    for (int i = 0; i < LI_FW_GRAPHS; i++) {
        if (f->graph[i].g) f->be->ops->graph_free(f->be, f->graph[i].g);
        memset(&f->graph[i], 0, sizeof f->graph[i]);
    }
}

void li_forward_set_graphs(li_forward *f, bool on) {
    if (!on) graphs_drop(f);
    f->graphs = on && f->be->ops->graph_begin;
}

void li_forward_free(li_forward *f) {
    if (f->be) graphs_drop(f);
    free(f->h_batch);
    free(f->g_tokens);
    free(f->g_pos);
    free(f->g_seq);
    free(f->g_rows);
    free(f->g_slot);
    free(f->g_table);
    free(f->ids_host);
    li_buffer *bufs[] = {&f->scratch, &f->batch, &f->table, &f->logits, &f->capture, &f->ids};
    for (size_t i = 0; i < LI_ARRAY_LEN(bufs); i++) li_buffer_free(f->be, bufs[i]);
    free(f->logits_host);
    free(f->row_host);
    free(f->hidden_host);
    free(f->capture_host);
    free(f->sel_dst);
    free(f->sel_src);
    free(f->t_seq);
    free(f->t_root);
    free(f->t_table);
    free(f->t_src);
    free(f->t_dst);
    free(f->t_off_d);
    free(f->t_off_s);
    free(f->t_blocks);
    memset(f, 0, sizeof *f);
}

/* buf holds at least `bytes` (old contents dropped), growing by doubling. */
static int buffer_reserve(li_backend *be, li_buffer *buf, size_t bytes, li_error *err) {
    if (buf->data && buf->size >= bytes) return 0;
    const size_t want = LI_MAX(bytes, 2 * buf->size);
    li_buffer_free(be, buf);
    return li_buffer_alloc(be, want, buf, err);
}

/* ------------------------------------------------------------------------
 * tree views (forward.h): each displaced tree node gets a row of its own in
 * the uploaded block table; its branch's rows are copied into scratch
 * blocks after every layer's kv_store
 * ---------------------------------------------------------------------- */

static int64_t table_slot(const int32_t *row, int bs, int64_t p) { return (int64_t)row[p / bs] * bs + p % bs; }

static void tree_release(li_forward *f, li_kv_cache *kv) {
    for (int32_t i = 0; i < f->n_tblocks; i++) li_kv_block_unref(kv, f->t_blocks[i]);
    f->n_tblocks = 0;
    f->n_runs = 0;
}

static int32_t tree_block(li_forward *f, li_kv_cache *kv) {
    const int32_t id = li_kv_block_alloc(kv);
    if (id < 0) return -1;
    if (f->n_tblocks == f->tblocks_cap) {
        f->tblocks_cap = f->tblocks_cap ? 2 * f->tblocks_cap : 16;
        f->t_blocks = li_xrealloc(f->t_blocks, (size_t)f->tblocks_cap * sizeof *f->t_blocks);
    }
    f->t_blocks[f->n_tblocks++] = id;
    return id;
}

static void tree_run(li_forward *f, int64_t dst, int64_t src) {
    if (f->n_runs == f->runs_cap) {
        f->runs_cap = f->runs_cap ? 2 * f->runs_cap : 64;
        f->t_src = li_xrealloc(f->t_src, (size_t)f->runs_cap * sizeof *f->t_src);
        f->t_dst = li_xrealloc(f->t_dst, (size_t)f->runs_cap * sizeof *f->t_dst);
        f->t_off_d = li_xrealloc(f->t_off_d, 2 * (size_t)f->runs_cap * sizeof *f->t_off_d);
        f->t_off_s = li_xrealloc(f->t_off_s, 2 * (size_t)f->runs_cap * sizeof *f->t_off_s);
    }
    f->t_dst[f->n_runs] = dst;
    f->t_src[f->n_runs++] = src;
}

/* Checks the parents, builds the view table (b's rows, then one row per
 * displaced node) into f->t_table and each token's row into f->t_seq.
 * *n_rows receives the table's rows (its stride is b->bt_stride: a view
 * of position p needs p / block_size + 1 blocks, as the sequence does). */
static int tree_plan(li_forward *f, li_kv_cache *kv, const li_batch *b, int32_t *n_rows, li_error *err) {
    const int64_t n = b->n, stride = b->bt_stride;
    const int bs = kv->block_size;
    if (!f->t_seq) {
        f->t_seq = li_xmalloc((size_t)f->cap * sizeof *f->t_seq);
        f->t_root = li_xmalloc((size_t)f->cap * sizeof *f->t_root);
    }
    int32_t n_views = 0;
    for (int64_t i = 0; i < n; i++) {
        const int32_t p = b->parent[i];
        if (p < -1 || p >= i)
            return li_error_set(err, LI_EINVAL, "forward: tree parent %d of token %lld is not -1 or an earlier row", p,
                                (long long)i);
        if (p >= 0 && (b->seq[p] != b->seq[i] || b->pos[p] + 1 != b->pos[i]))
            return li_error_set(err, LI_EINVAL,
                                "forward: tree parent %d of token %lld is not of its sequence at the position before", p,
                                (long long)i);
        f->t_root[i] = p < 0 ? b->pos[i] : f->t_root[p];
        const int32_t *row = b->block_table + (size_t)b->seq[i] * (size_t)stride;
        const bool placed = b->slot[i] == table_slot(row, bs, b->pos[i]) && (p < 0 || f->t_seq[p] >= 0);
        f->t_seq[i] = placed ? b->seq[i] : -1;
        n_views += !placed;
    }
    *n_rows = b->n_seqs + n_views;
    const size_t need = (size_t)*n_rows * (size_t)stride;
    if (need > f->t_table_cap) {
        f->t_table_cap = LI_MAX(need, 2 * f->t_table_cap);
        f->t_table = li_xrealloc(f->t_table, f->t_table_cap * sizeof *f->t_table);
    }
    memcpy(f->t_table, b->block_table, (size_t)b->n_seqs * (size_t)stride * sizeof *f->t_table);
    int32_t v = b->n_seqs;
    for (int64_t i = 0; i < n; i++) {
        if (f->t_seq[i] >= 0) continue;
        const int32_t *row = b->block_table + (size_t)b->seq[i] * (size_t)stride;
        int32_t *view = f->t_table + (size_t)v * (size_t)stride;
        memcpy(view, row, (size_t)stride * sizeof *view); /* the prefix's full blocks (and padding) */
        const int64_t root = f->t_root[i], pos = b->pos[i], v0 = root / bs * bs;
        for (int64_t blk = root / bs; blk <= pos / bs; blk++) {
            const int32_t id = tree_block(f, kv);
            if (id < 0) return li_error_set(err, LI_ENOMEM, "forward: no free KV block for a tree view");
            view[blk] = id;
        }
        /* the branch, from the node up to its root, then the prefix's partial block */
        int64_t j = i;
        for (int64_t q = pos; q >= root; q--, j = b->parent[j]) tree_run(f, table_slot(view, bs, q), b->slot[j]);
        for (int64_t q = v0; q < root; q++) tree_run(f, table_slot(view, bs, q), table_slot(row, bs, q));
        f->t_seq[i] = v++;
    }
    return 0;
}

/* Layer l's view rows: K and V (one backend copy), and their scales. */
static void tree_copy(li_forward *f, li_kv_cache *kv, int l) {
    li_backend *be = f->be;
    const li_kv_layer *L = &kv->layers[l];
    const size_t slots = (size_t)kv->num_blocks * (size_t)kv->block_size;
    const size_t row = (size_t)((const char *)kv->layers[0].v - (const char *)kv->layers[0].k) / slots;
    const int64_t nr = f->n_runs;
    const size_t k0 = li_buffer_offset(&kv->storage_buf, L->k), v0 = li_buffer_offset(&kv->storage_buf, L->v);
    for (int64_t r = 0; r < nr; r++) {
        f->t_off_d[r] = k0 + (size_t)f->t_dst[r] * row;
        f->t_off_s[r] = k0 + (size_t)f->t_src[r] * row;
        f->t_off_d[nr + r] = v0 + (size_t)f->t_dst[r] * row;
        f->t_off_s[nr + r] = v0 + (size_t)f->t_src[r] * row;
    }
    be->ops->buffer_copy(be, &kv->storage_buf, &kv->storage_buf, f->t_off_d, f->t_off_s, (int)(2 * nr), row);
    if (!L->k_scale) return;
    const size_t srow = (size_t)kv->n_head_kv * sizeof(float);
    const size_t ks = li_buffer_offset(&kv->scales_buf, L->k_scale), vs = li_buffer_offset(&kv->scales_buf, L->v_scale);
    for (int64_t r = 0; r < nr; r++) {
        f->t_off_d[r] = ks + (size_t)f->t_dst[r] * srow;
        f->t_off_s[r] = ks + (size_t)f->t_src[r] * srow;
        f->t_off_d[nr + r] = vs + (size_t)f->t_dst[r] * srow;
        f->t_off_s[nr + r] = vs + (size_t)f->t_src[r] * srow;
    }
    be->ops->buffer_copy(be, &kv->scales_buf, &kv->scales_buf, f->t_off_d, f->t_off_s, (int)(2 * nr), srow);
}

/* ------------------------------------------------------------------------
 * the batch upload
 * ---------------------------------------------------------------------- */

/* Uploads the batch's host arrays (one copy each) and checks what the ops
 * would otherwise index out of bounds with. */
/* n_tokens: the embedding's rows (an EAGLE block's output covers fewer ids
 * than its input takes) */
static int batch_upload(li_forward *f, int64_t n_tokens, li_kv_cache *kv, const li_batch *b, li_error *err) {
    li_backend *be = f->be;
    const int64_t n = b->n;
    if (n <= 0 || n > f->cap)
        return li_error_set(err, LI_EINVAL, "forward: batch of %lld tokens (capacity %lld)", (long long)n,
                            (long long)f->cap);
    if (b->n_seqs <= 0 || b->bt_stride <= 0 || !b->block_table)
        return li_error_set(err, LI_EINVAL, "forward: block table of %d sequences x %lld blocks", b->n_seqs,
                            (long long)b->bt_stride);
    if (b->n_logits < 0 || b->n_logits > n)
        return li_error_set(err, LI_EINVAL, "forward: %lld logit rows for %lld tokens", (long long)b->n_logits,
                            (long long)n);
    const int64_t max_pos = b->bt_stride * kv->block_size;
    for (int64_t i = 0; i < n; i++) {
        if (b->tokens[i] < 0 || b->tokens[i] >= n_tokens)
            return li_error_set(err, LI_EINVAL, "forward: token id %d out of range [0, %lld)", b->tokens[i],
                                (long long)n_tokens);
        if (b->seq[i] < 0 || b->seq[i] >= b->n_seqs || b->pos[i] < 0 || b->pos[i] >= max_pos)
            return li_error_set(err, LI_EINVAL, "forward: token %lld: sequence %d, position %d outside the block table",
                                (long long)i, b->seq[i], b->pos[i]);
    }
    for (int64_t i = 0; i < b->n_logits; i++)
        if (b->logit_rows[i] < 0 || b->logit_rows[i] >= n)
            return li_error_set(err, LI_EINVAL, "forward: logit row %d out of range", b->logit_rows[i]);
    int32_t n_rows = b->n_seqs;
    const int32_t *table = b->block_table, *seq = b->seq;
    int rc;
    if (b->parent) {
        /* views take scratch blocks, and only a pool hands blocks out */
        if (kv->pool)
            return li_error_set(err, LI_EUNSUP, "forward: a tree batch needs a KV pool, not a follower's storage");
        if ((rc = tree_plan(f, kv, b, &n_rows, err))) return rc;
        table = f->t_table;
        seq = f->t_seq;
    }
    const size_t bt_bytes = (size_t)n_rows * (size_t)b->bt_stride * sizeof(int32_t);
    if ((rc = buffer_reserve(be, &f->table, bt_bytes, err))) return rc;
    const li_backend_ops *op = be->ops;
    /* the four arrays at their places: in host memory directly; for a
     * device in its host mirror, then one copy up to the slots' end (each
     * copy is a few microseconds of the host's; the unused tails between
     * the arrays go up too) */
    char *dst = f->batch.host ? (char *)f->batch.data : f->h_batch;
    const size_t n4 = (size_t)n * 4, o_slot = li_buffer_offset(&f->batch, f->d_slot);
    memcpy(dst + li_buffer_offset(&f->batch, f->d_tokens), b->tokens, n4);
    memcpy(dst + li_buffer_offset(&f->batch, f->d_pos), b->pos, n4);
    memcpy(dst + li_buffer_offset(&f->batch, f->d_seq), seq, n4);
    memcpy(dst + o_slot, b->slot, (size_t)n * 8);
    if (!f->batch.host) op->buffer_set(be, &f->batch, 0, f->h_batch, o_slot + (size_t)n * 8);
    op->buffer_set(be, &f->table, 0, table, bt_bytes);
    return 0;
}

/* ------------------------------------------------------------------------
 * the pass
 * ---------------------------------------------------------------------- */

/* Weights that read the same input in one call when the backend can. */
static void matmul_shared(li_backend *be, const li_weight *const *w, int n_w, const float *x, float *const *y,
                          int64_t n) {
    if (be->ops->matmul_multi) {
        be->ops->matmul_multi(be, w, n_w, x, y, n);
        return;
    }
    for (int i = 0; i < n_w; i++) be->ops->matmul(be, w[i], x, y[i], n);
}

/* y = x · W^T and the residual stream res += y, fused when the backend can. */
static void matmul_residual(li_backend *be, const li_weight *w, const float *x, float *y, float *res, int64_t n) {
    if (be->ops->matmul_add) {
        be->ops->matmul_add(be, w, x, y, res, n);
        return;
    }
    be->ops->matmul(be, w, x, y, n);
    be->ops->add(be, res, y, n * w->m);
}

/* A tensor-parallel rank's row-parallel product (wo, w_down): y holds this
 * rank's partial sum until the all-reduce makes it the whole product, then
 * res += y. */
static int matmul_reduce_residual(li_forward *f, li_backend *be, const li_weight *w, const float *x, float *y,
                                  float *res, int64_t n, li_error *err) {
    be->ops->matmul(be, w, x, y, n);
    be->ops->synchronize(be);
    const double t = li_time_now();
    const int rc = li_comm_all_reduce_sum(f->comm, y, n * w->m, err);
    f->t_comm += li_time_now() - t;
    if (rc) return rc;
    be->ops->add(be, res, y, n * w->m);
    return 0;
}

/* An input projection's rows (li_model_inproj): x = hid (W_fc times the
 * batch's in_hidden rows, or those rows as they are), and block 0's q/k/v
 * input z = [rmsnorm(E[token]; norm_e), rmsnorm(hid; norm_h)], the two
 * halves copied side by side in one backend copy of 2n runs. */
static int inproj_input(li_forward *f, const li_model *m, li_backend *be, const li_batch *b, li_error *err) {
    const li_model_inproj *ip = m->inproj;
    const int64_t n = b->n, d = m->hp.n_embd;
    if (f->comm) return li_error_set(err, LI_EUNSUP, "forward: an input projection on a tensor-parallel rank");
    if (!b->in_hidden || (b->in_width != ip->in_width && b->in_width != d))
        return li_error_set(err, LI_EINVAL, "forward: this block reads in_hidden rows of %d or %lld floats, got %d",
                            ip->in_width, (long long)d, b->in_hidden ? b->in_width : 0);
    const li_backend_ops *op = be->ops;
    const size_t row = (size_t)d * sizeof(float);
    if (b->in_width == ip->in_width && ip->in_width != d) {
        op->buffer_set(be, &f->scratch, li_buffer_offset(&f->scratch, f->in), b->in_hidden,
                       (size_t)n * (size_t)ip->in_width * sizeof(float));
        op->matmul(be, &ip->fc, f->in, f->x, n);
    } else {
        op->buffer_set(be, &f->scratch, li_buffer_offset(&f->scratch, f->x), b->in_hidden, (size_t)n * row);
    }
    op->get_rows(be, &m->tok_embd, f->d_tokens, n, f->h);
    op->rmsnorm(be, f->h, ip->norm_e, f->sel, n, d, m->hp.norm_eps);
    op->rmsnorm(be, f->x, ip->norm_h, f->h, n, d, m->hp.norm_eps);
    const size_t z0 = li_buffer_offset(&f->scratch, f->z), a0 = li_buffer_offset(&f->scratch, f->sel),
                 h0 = li_buffer_offset(&f->scratch, f->h);
    for (int64_t r = 0; r < n; r++) {
        f->sel_dst[2 * r] = z0 + (size_t)(2 * r) * row;
        f->sel_src[2 * r] = a0 + (size_t)r * row;
        f->sel_dst[2 * r + 1] = z0 + (size_t)(2 * r + 1) * row;
        f->sel_src[2 * r + 1] = h0 + (size_t)r * row;
    }
    op->buffer_copy(be, &f->scratch, &f->scratch, f->sel_dst, f->sel_src, (int)(2 * n), row);
    return 0;
}

/* Block capture[i]'s residual stream into column block i of every capture
 * row: one backend copy of n runs. */
static void capture_rows(li_forward *f, li_backend *be, int64_t n, int64_t d, int32_t i) {
    const size_t row = (size_t)d * sizeof(float);
    for (int64_t r = 0; r < n; r++) {
        f->sel_dst[r] = ((size_t)r * (size_t)f->capture_width + (size_t)i * (size_t)d) * sizeof(float);
        f->sel_src[r] = li_buffer_offset(&f->scratch, f->x) + (size_t)r * row;
    }
    be->ops->buffer_copy(be, &f->capture, &f->scratch, f->sel_dst, f->sel_src, (int)n, row);
}

/* What a pass over b leaves for its output rows, sel the rows before the
 * output norm: n_logits, the hidden states (the rows already there: sel
 * before the norm, h after) and whether logits were made. A replayed pass
 * sets the same without issuing its ops. */
static void pass_outputs(li_forward *f, const li_batch *b, float *sel) {
    const bool any = b->n_logits > 0;
    f->n_logits = any ? b->n_logits : 0;
    f->have_logits = any && !b->no_logits;
    f->hidden = !any ? NULL : b->hidden == LI_HIDDEN_PRE_NORM ? sel : b->hidden == LI_HIDDEN_POST_NORM ? f->h : NULL;
}

/* The pass's ops, after the batch's upload: the embedding (or an input
 * projection), every block, and the output rows' norm and logits. Sets
 * f->n_logits, f->hidden and f->have_logits; issues no host transfer and
 * allocates nothing but what a recorded pass finds already there
 * (run_recorded reserves it first). */
static int issue_pass(li_forward *f, const li_model *m, li_backend *be, li_kv_cache *kv, const li_batch *b,
                      li_error *err) {
    const li_hparams *hp = &m->hp;
    const li_backend_ops *op = be->ops;
    const int64_t n = b->n, d = hp->n_embd;
    int rc = 0;
    f->n_logits = 0;
    f->hidden = NULL;
    f->have_logits = false;
    int32_t ci = 0; /* the next entry of b->capture */

    if (m->inproj) {
        if ((rc = inproj_input(f, m, be, b, err))) return rc;
    } else {
        op->get_rows(be, &m->tok_embd, f->d_tokens, n, f->x);
    }

    li_attn_args aa = {
        .n_tokens = n, .n_head = hp->n_head, .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim,
        .block_size = kv->block_size, .q = f->q, .out = f->att, .pos = f->d_pos, .seq = f->d_seq,
        .block_table = f->table.data, .bt_stride = b->bt_stride, .scale = 1.0f / sqrtf((float)hp->head_dim),
    };
    for (int l = 0; l < hp->n_layer; l++) {
        const li_layer *L = &m->layers[l];
        /* attention block (an input projection's block 0 reads z, made by inproj_input) */
        const float *qkv_in = l == 0 && m->inproj ? f->z : f->h;
        const li_weight *const qkv[] = {&L->wq, &L->wk, &L->wv};
        float *const qkv_out[] = {f->q, f->k, f->v};
        if (qkv_in == f->h && op->norm_matmul) {
            op->norm_matmul(be, f->x, L->attn_norm, hp->norm_eps, f->h, qkv, 3, qkv_out, n, false);
        } else {
            if (qkv_in == f->h) op->rmsnorm(be, f->x, L->attn_norm, f->h, n, d, hp->norm_eps);
            matmul_shared(be, qkv, 3, qkv_in, qkv_out, n);
        }
        if (op->rope_store) {
            op->rope_store(be, f->q, f->k, f->v, f->d_pos, n, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_rot,
                           hp->rope_theta, hp->rope_neox, &kv->layers[l], f->d_slot);
        } else {
            if (op->rope_qk) {
                op->rope_qk(be, f->q, f->k, f->d_pos, n, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_rot,
                            hp->rope_theta, hp->rope_neox);
            } else {
                op->rope(be, f->q, f->d_pos, n, hp->n_head, hp->head_dim, hp->n_rot, hp->rope_theta,
                         hp->rope_neox);
                op->rope(be, f->k, f->d_pos, n, hp->n_head_kv, hp->head_dim, hp->n_rot, hp->rope_theta,
                         hp->rope_neox);
            }
            op->kv_store(be, &kv->layers[l], f->k, f->v, f->d_slot, n, hp->n_head_kv, hp->head_dim);
        }
        if (f->n_runs) tree_copy(f, kv, l);
        aa.kv = &kv->layers[l];
        op->attention(be, &aa);
        if (!f->comm) matmul_residual(be, &L->wo, f->att, f->h, f->x, n);
        else if ((rc = matmul_reduce_residual(f, be, &L->wo, f->att, f->h, f->x, n, err))) return rc;
        /* feed-forward block */
        const int32_t ff = li_hp_n_ff(hp, l); /* g and u are (n, ff), packed */
        const li_weight *const gu[] = {&L->w_gate, &L->w_up};
        float *const gu_out[] = {f->g, f->u};
        if (op->norm_matmul) {
            op->norm_matmul(be, f->x, L->ffn_norm, hp->norm_eps, f->h, gu, 2, gu_out, n, true);
        } else {
            op->rmsnorm(be, f->x, L->ffn_norm, f->h, n, d, hp->norm_eps);
            matmul_shared(be, gu, 2, f->h, gu_out, n);
            op->silu_mul(be, f->g, f->u, n, ff);
        }
        /* rotated: down_proj's weights were made for silu(g)*u in the Hadamard basis */
        if (L->down_had) op->hadamard(be, f->g, L->down_had, n, ff, m->rot_block);
        if (!f->comm) matmul_residual(be, &L->w_down, f->g, f->h, f->x, n);
        else if ((rc = matmul_reduce_residual(f, be, &L->w_down, f->g, f->h, f->x, n, err))) return rc;
        if (ci < b->n_capture && b->capture[ci] == l) capture_rows(f, be, n, d, ci++);
    }
    if (b->n_capture) f->n_captured = n;
    if (b->n_logits <= 0) return 0;
    /* the rows that need logits (the vocab matmul is the largest): the first
     * n_logits rows in order are read where they are; others are gathered,
     * one backend copy of n_logits runs */
    bool prefix = true;
    for (int64_t i = 0; i < b->n_logits && prefix; i++) prefix = b->logit_rows[i] == i;
    float *sel = f->x;
    if (!prefix) {
        for (int64_t i = 0; i < b->n_logits; i++) {
            f->sel_dst[i] = li_buffer_offset(&f->scratch, f->sel) + (size_t)i * d * sizeof(float);
            f->sel_src[i] = li_buffer_offset(&f->scratch, f->x) + (size_t)b->logit_rows[i] * d * sizeof(float);
        }
        op->buffer_copy(be, &f->scratch, &f->scratch, f->sel_dst, f->sel_src, (int)b->n_logits,
                        (size_t)d * sizeof(float));
        sel = f->sel;
    }
    /* the norm inside the head's matmul where the backend fuses them and
     * nobody reads the normalized rows */
    const bool fused = op->norm_matmul && !b->no_logits && b->hidden != LI_HIDDEN_POST_NORM;
    if (!fused && !(b->no_logits && b->hidden != LI_HIDDEN_POST_NORM))
        op->rmsnorm(be, sel, m->output_norm, f->h, b->n_logits, d, hp->norm_eps);
    if (!b->no_logits) {
        const size_t row_bytes = (size_t)hp->n_vocab * sizeof(float);
        if ((rc = buffer_reserve(be, &f->logits, (size_t)b->n_logits * row_bytes, err))) return rc;
        f->logits_cap = (int64_t)(f->logits.size / row_bytes);
        if (fused)
            op->norm_matmul(be, sel, m->output_norm, hp->norm_eps, f->h, (const li_weight *const[]){&m->output}, 1,
                            (float *const[]){f->logits.data}, b->n_logits, false);
        else
            op->matmul(be, &m->output, f->h, f->logits.data, b->n_logits);
    }
    pass_outputs(f, b, sel);
    return 0;
}

/* ------------------------------------------------------------------------
 * recorded passes
 *
 * Launching a device kernel costs the host microseconds, as long as a small
 * batch's kernels take to run: a decode step's ~700 launches would bound it
 * however fast the kernels are. So on a backend with graph ops a plain batch
 * (no tree, capture, input projection or tensor parallelism; logits for all
 * rows in order, or none) is padded to a size class, its block table to a
 * power-of-two stride, and its pass recorded the second time that shape is
 * seen, then replayed: only the batch's arrays are uploaded each step.
 * Padding rows read token 0 at position 0 of sequence 0 and store no KV
 * (slot -1); their outputs are dropped. Rows are independent in every op,
 * so a padded row changes no other row's bits (a backend whose kernels
 * change with the row count says batch_variant).
 * ---------------------------------------------------------------------- */

static const int64_t graph_sizes[] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, LI_FW_GRAPH_MAX_ROWS};

static bool graph_eligible(const li_forward *f, const li_model *m, const li_batch *b) {
    if (!f->graphs || b->parent || b->n_capture || m->inproj || f->comm || b->in_hidden ||
        b->n > LI_FW_GRAPH_MAX_ROWS)
        return false;
    if (b->n_logits != 0 && b->n_logits != b->n) return false;
    for (int64_t i = 0; i < b->n_logits; i++)
        if (b->logit_rows[i] != i) return false;
    return true;
}

/* Pads b into f's host arrays (*pb: the padded batch). */
static void graph_pad(li_forward *f, const li_batch *b, li_batch *pb) {
    int64_t np = b->n;
    for (size_t i = 0; i < LI_ARRAY_LEN(graph_sizes); i++)
        if (graph_sizes[i] >= b->n) {
            np = graph_sizes[i] <= f->cap ? graph_sizes[i] : b->n;
            break;
        }
    int64_t stride = 4;
    while (stride < b->bt_stride) stride *= 2;
    if (!f->g_tokens) {
        const size_t c = LI_FW_GRAPH_MAX_ROWS;
        f->g_tokens = li_xmalloc(c * sizeof *f->g_tokens);
        f->g_pos = li_xmalloc(c * sizeof *f->g_pos);
        f->g_seq = li_xmalloc(c * sizeof *f->g_seq);
        f->g_rows = li_xmalloc(c * sizeof *f->g_rows);
        f->g_slot = li_xmalloc(c * sizeof *f->g_slot);
        for (size_t i = 0; i < c; i++) f->g_rows[i] = (int32_t)i;
    }
    *pb = *b;
    pb->n = np;
    pb->bt_stride = stride;
    pb->n_logits = b->n_logits ? np : 0;
    pb->logit_rows = f->g_rows;
    if (np > b->n) { /* the batch's arrays and the padding rows after them */
        const size_t n = (size_t)b->n;
        memcpy(f->g_tokens, b->tokens, n * sizeof *f->g_tokens);
        memcpy(f->g_pos, b->pos, n * sizeof *f->g_pos);
        memcpy(f->g_seq, b->seq, n * sizeof *f->g_seq);
        memcpy(f->g_slot, b->slot, n * sizeof *f->g_slot);
        for (int64_t i = b->n; i < np; i++) {
            f->g_tokens[i] = 0;
            f->g_pos[i] = 0;
            f->g_seq[i] = 0;
            f->g_slot[i] = -1; /* stores nothing */
        }
        pb->tokens = f->g_tokens;
        pb->pos = f->g_pos;
        pb->seq = f->g_seq;
        pb->slot = f->g_slot;
    }
    if (stride == b->bt_stride) return; /* the table as it is */
    const size_t cells = (size_t)b->n_seqs * (size_t)stride;
    if (cells > f->g_table_cap) {
        f->g_table_cap = LI_MAX(cells, 2 * f->g_table_cap);
        f->g_table = li_xrealloc(f->g_table, f->g_table_cap * sizeof *f->g_table);
    }
    for (int32_t s = 0; s < b->n_seqs; s++) {
        int32_t *row = f->g_table + (size_t)s * (size_t)stride;
        memcpy(row, b->block_table + (size_t)s * (size_t)b->bt_stride, (size_t)b->bt_stride * sizeof *row);
        memset(row + b->bt_stride, 0, (size_t)(stride - b->bt_stride) * sizeof *row); /* never read */
    }
    pb->block_table = f->g_table;
}

static bool graph_key_eq(const li_fw_graph *e, const li_fw_graph *k) {
    return e->n == k->n && e->n_logits == k->n_logits && e->bt_stride == k->bt_stride && e->n_seqs == k->n_seqs &&
           e->hidden == k->hidden && e->no_logits == k->no_logits && e->kv == k->kv && e->kv_k == k->kv_k &&
           e->table == k->table &&
           e->logits == k->logits;
}

/* Runs the padded batch pb (uploaded): replays its recording, records it
 * (second sighting), or issues its ops (first sighting, failed recording). */
static int run_recorded(li_forward *f, const li_model *m, li_backend *be, li_kv_cache *kv, const li_batch *pb,
                        li_error *err) {
    const li_backend_ops *op = be->ops;
    /* what the pass allocates, allocated before any recording */
    if (pb->n_logits && !pb->no_logits) {
        const size_t row_bytes = (size_t)m->hp.n_vocab * sizeof(float);
        const int rc = buffer_reserve(be, &f->logits, (size_t)pb->n_logits * row_bytes, err);
        if (rc) return rc;
    }
    const li_fw_graph key = {.n = pb->n, .n_logits = pb->n_logits, .bt_stride = pb->bt_stride, .n_seqs = pb->n_seqs,
                             .hidden = (int)pb->hidden, .no_logits = pb->no_logits, .kv = kv,
                             .kv_k = kv->layers[0].k,
                             .table = f->table.data, .logits = f->logits.data};
    f->runs++;
    li_fw_graph *e = NULL, *lru = &f->graph[0];
    for (int i = 0; i < LI_FW_GRAPHS && !e; i++) {
        li_fw_graph *c = &f->graph[i];
        if (c->last && graph_key_eq(c, &key)) e = c;
        else if (lru->last && c->last < lru->last) lru = c; /* an unused slot (last 0) first */
    }
    if (e && e->g && !op->graph_valid(be, e->g)) { /* the backend moved memory it reads: record again */
        op->graph_free(be, e->g);
        e->g = NULL;
    }
    if (!e) { /* first sighting: run the ops, remember the shape */
        if (lru->g) op->graph_free(be, lru->g);
        *lru = key;
        lru->last = f->runs;
        return issue_pass(f, m, be, kv, pb, err);
    }
    e->last = f->runs;
    if (e->failed) return issue_pass(f, m, be, kv, pb, err);
    if (!e->g) {
        void *g = NULL;
        int rc = 0;
        if (op->graph_begin(be) == 0) {
            rc = issue_pass(f, m, be, kv, pb, err);
            g = op->graph_end(be);
        }
        if (!g || rc) {
            if (g) op->graph_free(be, g);
            e->failed = true;
            li_log_warn("forward: a pass of %lld rows could not be recorded; its ops run each time",
                        (long long)pb->n);
            return issue_pass(f, m, be, kv, pb, err);
        }
        e->g = g;
        f->n_recorded++;
    } else {
        pass_outputs(f, pb, f->x); /* as issue_pass set them recording (its rows in order: x) */
        f->n_replayed++;
    }
    op->graph_launch(be, e->g);
    return 0;
}

int li_forward_run(li_forward *f, const li_model *m, li_backend *be, li_kv_cache *kv, const li_batch *b,
                   float *logits, li_error *err) {
    const li_hparams *hp = &m->hp;
    const li_backend_ops *op = be->ops;
    if (be != f->be) return li_error_set(err, LI_EINVAL, "forward: run on another backend than its buffers'");
    if (b->hidden != LI_HIDDEN_NONE && b->hidden != LI_HIDDEN_PRE_NORM && b->hidden != LI_HIDDEN_POST_NORM)
        return li_error_set(err, LI_EINVAL, "forward: unknown hidden state kind %d", (int)b->hidden);
    if (m->rot_block && !op->hadamard)
        return li_error_set(err, LI_EUNSUP, "forward: backend %s has no hadamard op (a rotated model)", op->name);
    f->row_host_at = -1;
    /* captured rows (checked and sized before the upload takes tree blocks) */
    f->n_captured = 0;
    if (b->n_capture) {
        for (int32_t i = 0; i < b->n_capture; i++)
            if (!b->capture || b->capture[i] < 0 || b->capture[i] >= hp->n_layer ||
                (i && b->capture[i] <= b->capture[i - 1]))
                return li_error_set(err, LI_EINVAL, "forward: capture blocks must be ascending in [0, %d)",
                                    hp->n_layer);
        f->capture_width = b->n_capture * (int32_t)hp->n_embd;
        const int crc = buffer_reserve(be, &f->capture, (size_t)b->n * (size_t)f->capture_width * sizeof(float), err);
        if (crc) return crc;
    }
    const int64_t n_ids = m->inproj ? m->tok_embd.m : hp->n_vocab;
    int rc;
    if (graph_eligible(f, m, b)) {
        li_batch pb;
        graph_pad(f, b, &pb);
        if ((rc = batch_upload(f, n_ids, kv, &pb, err)) || (rc = run_recorded(f, m, be, kv, &pb, err))) {
            f->n_logits = 0;
            f->hidden = NULL;
            f->have_logits = false;
            return rc;
        }
        f->n_logits = b->n_logits; /* the padding rows' outputs are dropped */
    } else {
        rc = batch_upload(f, n_ids, kv, b, err);
        if (!rc) rc = issue_pass(f, m, be, kv, b, err);
        tree_release(f, kv);
        if (rc) {
            f->n_captured = 0;
            return rc;
        }
    }
    if (logits && f->have_logits)
        op->buffer_get(be, &f->logits, 0, logits, (size_t)f->n_logits * (size_t)hp->n_vocab * sizeof(float));
    return 0;
}

/* host memory holding (n_logits, width) floats at p of buffer b */
static float *host_view(li_forward *f, const li_buffer *b, float *p, int64_t width, float **mirror) {
    if (b->host) return p;
    const size_t bytes = (size_t)f->n_logits * (size_t)width * sizeof(float);
    *mirror = li_xrealloc(*mirror, bytes ? bytes : 1);
    f->be->ops->buffer_get(f->be, b, li_buffer_offset(b, p), *mirror, bytes);
    return *mirror;
}

float *li_forward_hidden(li_forward *f, const li_model *m) {
    return f->hidden ? host_view(f, &f->scratch, f->hidden, m->hp.n_embd, &f->hidden_host) : NULL;
}

float *li_forward_captured(li_forward *f) {
    if (!f->n_captured) return NULL;
    if (f->capture.host) return f->capture.data;
    const size_t bytes = (size_t)f->n_captured * (size_t)f->capture_width * sizeof(float);
    f->capture_host = li_xrealloc(f->capture_host, bytes);
    f->be->ops->buffer_get(f->be, &f->capture, 0, f->capture_host, bytes);
    return f->capture_host;
}

int li_forward_argmax(li_forward *f, const li_model *m, int32_t *out, li_error *err) {
    li_backend *be = f->be;
    if (!be->ops->argmax || f->logits.host)
        return li_error_set(err, LI_EUNSUP, "forward: backend %s samples on the host", be->ops->name);
    if (!f->have_logits) return li_error_set(err, LI_EINVAL, "forward: the last run computed no logits");
    const size_t bytes = (size_t)f->n_logits * sizeof(int32_t);
    const int rc = buffer_reserve(be, &f->ids, bytes, err);
    if (rc) return rc;
    be->ops->argmax(be, f->logits.data, f->n_logits, m->hp.n_vocab, f->ids.data);
    be->ops->buffer_get(be, &f->ids, 0, out, bytes);
    return 0;
}

bool li_forward_can_gather(const li_forward *f) { return f->be->ops->gather != NULL; }

int li_forward_topk(li_forward *f, const li_model *m, const li_logit_fetch *q, li_error *err) {
    li_backend *be = f->be;
    const bool want_lse = q->lse || q->lse_scale;
    const int64_t ng = LI_MAX(q->n_gather, 0), nl = f->n_logits;
    if (!be->ops->topk || f->logits.host || (want_lse && !be->ops->lse) || (ng > 0 && !be->ops->gather))
        return li_error_set(err, LI_EUNSUP, "forward: backend %s samples on the host", be->ops->name);
    if (!f->have_logits) return li_error_set(err, LI_EINVAL, "forward: the last run computed no logits");
    const int k = q->k;
    if (k < 1 || k > LI_TOPK_MAX || k > m->hp.n_vocab)
        return li_error_set(err, LI_EINVAL, "forward: top-%d of %d logits (at most %d)", k, m->hp.n_vocab, LI_TOPK_MAX);
    const int64_t cells = nl * m->hp.n_vocab;
    for (int64_t i = 0; i < ng; i++)
        if (q->gidx[i] < 0 || q->gidx[i] >= cells)
            return li_error_set(err, LI_EINVAL, "forward: gather index %lld outside %lld logits", (long long)q->gidx[i],
                                (long long)cells);
    /* what comes back lies end to end (one transfer, a wait each): values,
     * ids, lse, lse at scale, the gathered logits; then what goes up: the
     * scales and the indices */
    const size_t half = (size_t)nl * (size_t)k * 4, lb = (size_t)nl * 4;
    const size_t at_l = 2 * half, at_t = at_l + (q->lse ? lb : 0), at_g = at_t + (q->lse_scale ? lb : 0);
    const size_t back = at_g + (size_t)ng * 4, at_s = back, at_i = (at_s + (q->lse_scale ? lb : 0) + 7) & ~(size_t)7;
    const int rc = buffer_reserve(be, &f->ids, at_i + (size_t)ng * 8, err);
    if (rc) return rc;
    char *d = f->ids.data;
    be->ops->topk(be, f->logits.data, nl, m->hp.n_vocab, k, (float *)d, (int32_t *)(d + half));
    if (q->lse) be->ops->lse(be, f->logits.data, nl, m->hp.n_vocab, NULL, (float *)(d + at_l));
    if (q->lse_scale) {
        be->ops->buffer_set(be, &f->ids, at_s, q->lse_scale, lb);
        be->ops->lse(be, f->logits.data, nl, m->hp.n_vocab, (const float *)(d + at_s), (float *)(d + at_t));
    }
    if (ng) {
        be->ops->buffer_set(be, &f->ids, at_i, q->gidx, (size_t)ng * 8);
        be->ops->gather(be, f->logits.data, (const int64_t *)(d + at_i), ng, (float *)(d + at_g));
    }
    if (back > f->ids_host_cap) {
        f->ids_host_cap = LI_MAX(back, 2 * f->ids_host_cap);
        f->ids_host = li_xrealloc(f->ids_host, f->ids_host_cap);
    }
    be->ops->buffer_get(be, &f->ids, 0, f->ids_host, back);
    const char *h = f->ids_host;
    memcpy(q->vals, h, half);
    memcpy(q->ids, h + half, half);
    if (q->lse) memcpy(q->lse, h + at_l, lb);
    if (q->lse_scale) memcpy(q->lse_t, h + at_t, lb);
    if (ng) memcpy(q->gout, h + at_g, (size_t)ng * 4);
    return 0;
}

float *li_forward_logits(li_forward *f, const li_model *m) {
    return f->have_logits ? host_view(f, &f->logits, f->logits.data, m->hp.n_vocab, &f->logits_host) : NULL;
}

const float *li_forward_logits_row(li_forward *f, const li_model *m, int64_t row) {
    if (!f->have_logits || row < 0 || row >= f->n_logits) return NULL;
    const size_t nv = (size_t)m->hp.n_vocab;
    if (f->logits.host) return (const float *)f->logits.data + (size_t)row * nv;
    if (f->row_host_at != row) {
        if (!f->row_host) f->row_host = li_xmalloc(nv * sizeof(float));
        const size_t at = li_buffer_offset(&f->logits, f->logits.data) + (size_t)row * nv * sizeof(float);
        f->be->ops->buffer_get(f->be, &f->logits, at, f->row_host, nv * sizeof(float));
        f->row_host_at = row;
    }
    return f->row_host;
}
