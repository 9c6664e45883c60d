/* session.c — single-sequence evaluation in chunks over the paged cache. */
#include "engine/session.h"

#include <stdlib.h>
#include <string.h>

int li_session_init(li_session *s, li_model *m, li_backend *be, int64_t n_ctx, li_type kv_dtype,
                    int64_t n_batch, li_error *err) {
    memset(s, 0, sizeof *s);
    if (n_ctx <= 0) return li_error_set(err, LI_EINVAL, "context size must be positive");
    if (n_batch <= 0) return li_error_set(err, LI_EINVAL, "batch size must be positive");
    s->model = m;
    s->be = be;
    s->n_ctx = n_ctx;
    s->n_batch = n_batch;
    const int block_size = 16;
    int32_t nblocks = (int32_t)((n_ctx + block_size - 1) / block_size);
    const li_kv_dims dims = li_forward_kv_dims(&m->hp);
    int rc = li_kv_cache_init(&s->kv, be, &dims, kv_dtype, block_size, nblocks, err);
    if (rc) return rc;
    if ((rc = li_forward_init(&s->fw, m, be, n_batch, err))) {
        li_kv_cache_free(&s->kv);
        return rc;
    }
    li_kv_seq_init(&s->seq);
    s->pos = li_xmalloc((size_t)n_batch * sizeof(int32_t));
    s->seq_idx = li_xcalloc((size_t)n_batch, sizeof(int32_t));
    s->rows = li_xmalloc((size_t)n_batch * sizeof(int32_t));
    s->slot = li_xmalloc((size_t)n_batch * sizeof(int64_t));
    return 0;
}

void li_session_free(li_session *s) {
    li_kv_seq_release(&s->kv, &s->seq);
    li_kv_seq_free(&s->seq);
    li_forward_free(&s->fw);
    li_kv_cache_free(&s->kv);
    free(s->pos);
    free(s->seq_idx);
    free(s->rows);
    free(s->slot);
    memset(s, 0, sizeof *s);
}

void li_session_reset(li_session *s) {
    li_kv_seq_release(&s->kv, &s->seq);
    s->n_past = 0;
}

int li_session_eval(li_session *s, const int32_t *tokens, int64_t n, bool all_logits, float *logits,
                    li_error *err) {
    if (n <= 0) return li_error_set(err, LI_EINVAL, "nothing to evaluate");
    if (s->n_past + n > s->n_ctx)
        return li_error_set(err, LI_ERANGE, "context full: %lld cached + %lld new tokens exceed %lld",
                            (long long)s->n_past, (long long)n, (long long)s->n_ctx);
    int rc = li_kv_seq_reserve(&s->kv, &s->seq, s->n_past + n);
    if (rc) return li_error_set(err, LI_ENOMEM, "KV cache exhausted");
    const int32_t n_vocab = s->model->hp.n_vocab;
    for (int64_t done = 0; done < n;) {
        int64_t c = LI_MIN(s->n_batch, n - done);
        for (int64_t i = 0; i < c; i++) {
            int64_t p = s->n_past + i;
            s->pos[i] = (int32_t)p;
            s->slot[i] = li_kv_seq_slot(&s->kv, &s->seq, p);
            s->rows[i] = (int32_t)i;
        }
        bool last = done + c == n;
        li_batch b = {
            .n = c, .tokens = tokens + done, .pos = s->pos, .seq = s->seq_idx, .slot = s->slot,
            .block_table = s->seq.blocks, .n_seqs = 1, .bt_stride = s->seq.n_blocks,
            .logit_rows = all_logits ? s->rows : s->rows + (c - 1),
            .n_logits = all_logits ? c : (last ? 1 : 0),
        };
        float *out = all_logits ? logits + done * n_vocab : logits;
        if ((rc = li_forward_run(&s->fw, s->model, s->be, &s->kv, &b, out, err))) return rc;
        s->n_past += c;
        done += c;
    }
    return 0;
}

int li_session_window(li_session *s, const int32_t *tokens, int64_t n, const char *who, li_batch *b,
                      li_error *err) {
    li_session_reset(s);
    if (n < 1 || n > s->n_batch || n > s->n_ctx)
        return li_error_set(err, LI_EINVAL, "%s: a window of %lld tokens in a session of %lld", who, (long long)n,
                            (long long)LI_MIN(s->n_batch, s->n_ctx));
    if (li_kv_seq_reserve(&s->kv, &s->seq, n)) return li_error_set(err, LI_ENOMEM, "%s: KV cache exhausted", who);
    for (int64_t i = 0; i < n; i++) {
        s->pos[i] = (int32_t)i;
        s->slot[i] = li_kv_seq_slot(&s->kv, &s->seq, i);
        s->rows[i] = (int32_t)i;
    }
    *b = (li_batch){.n = n, .tokens = tokens, .pos = s->pos, .seq = s->seq_idx, .slot = s->slot,
                    .block_table = s->seq.blocks, .n_seqs = 1, .bt_stride = s->seq.n_blocks, .logit_rows = s->rows,
                    .n_logits = n};
    return 0;
}
