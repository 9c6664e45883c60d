/* selfgen.c — a model's own samples (selfgen.h), moved here from
 * core/cli/distill.c so distill and train-medusa share it. */
#include "train/selfgen.h"
#include "engine/session.h"
#include "model/forward.h"
#include "tokenizer/tokenizer.h"
#include "util/progress.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* n tokens sampled from the teacher at temperature 1 (seeded), in segments
 * of up to 256 that each start at BOS: self-distillation data. */
int li_train_self_generate(li_model *m, li_backend *be, int64_t n, uint64_t seed, int32_t **out, li_error *err) {
    const int64_t seg = 256;
    const int32_t V = m->hp.n_vocab, bos = li_tokenizer_bos(m->tok);
    li_session s;
    int rc = li_session_init(&s, m, be, seg, LI_TYPE_F32, 1, err);
    if (rc) return rc;
    int32_t *ids = li_xmalloc((size_t)n * sizeof *ids);
    float *lg = li_xmalloc((size_t)V * sizeof *lg);
    uint64_t rs = seed ? seed * 0x9e3779b97f4a7c15ull : 1;
    li_progress prog;
    li_progress_init(&prog, "self-generate", "tokens/s", n);
    int64_t i = 0, in_seg = 0;
    int32_t cur = bos >= 0 ? bos : 0;
    while (i < n && !rc) {
        if (in_seg == seg - 1) { /* the segment is full: start again at BOS */
            li_session_reset(&s);
            in_seg = 0;
            cur = bos >= 0 ? bos : 0;
        }
        if ((rc = li_session_eval(&s, &cur, 1, false, lg, err))) break;
        in_seg++;
        float mx = lg[0];
        for (int32_t j = 1; j < V; j++) mx = LI_MAX(mx, lg[j]);
        double z = 0;
        for (int32_t j = 0; j < V; j++) z += exp((double)lg[j] - mx);
        rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
        double u = (double)(rs >> 11) * 0x1.0p-53 * z, acc = 0;
        int32_t pick = V - 1;
        for (int32_t j = 0; j < V; j++)
            if ((acc += exp((double)lg[j] - mx)) > u) {
                pick = j;
                break;
            }
        ids[i++] = cur = pick;
        if (i % 16 == 0) li_progress_update(&prog, i, NULL);
    }
    li_progress_finish(&prog);
    free(lg);
    li_session_free(&s);
    if (rc) {
        free(ids);
        return rc;
    }
    *out = ids;
    return 0;
}

/* ==== several streams per forward pass ====================================== */

/* a categorical draw from logits lg (V) with generator *rs */
static int32_t sample(const float *lg, int32_t V, uint64_t *rs) {
    float mx = lg[0];
    for (int32_t j = 1; j < V; j++) mx = LI_MAX(mx, lg[j]);
    double z = 0;
    for (int32_t j = 0; j < V; j++) z += exp((double)lg[j] - mx);
    *rs ^= *rs << 13, *rs ^= *rs >> 7, *rs ^= *rs << 17;
    const double u = (double)(*rs >> 11) * 0x1.0p-53 * z;
    double acc = 0;
    for (int32_t j = 0; j < V; j++)
        if ((acc += exp((double)lg[j] - mx)) > u) return j;
    return V - 1;
}

int li_train_self_generate_n(li_model *m, li_backend *be, int64_t n, uint64_t seed, int n_streams, int32_t **out,
                             li_error *err) {
    const int64_t seg = 256, bs = 16, nb = (seg + bs - 1) / bs;
    const int B = n_streams;
    if (B < 1 || B > 256) return li_error_set(err, LI_EINVAL, "self-generate: %d streams, expected 1..256", B);
    if (n < 1) return li_error_set(err, LI_EINVAL, "self-generate: %lld tokens", (long long)n);
    const int32_t V = m->hp.n_vocab, bos0 = li_tokenizer_bos(m->tok), bos = bos0 >= 0 ? bos0 : 0;
    const li_kv_dims dims = li_forward_kv_dims(&m->hp);
    li_kv_cache kv;
    li_forward fw;
    int rc = li_kv_cache_init(&kv, be, &dims, LI_TYPE_F32, (int)bs, (int32_t)(nb * B), err);
    if (rc) return rc;
    if ((rc = li_forward_init(&fw, m, be, B, err))) {
        li_kv_cache_free(&kv);
        return rc;
    }
    li_kv_seq *seqs = li_xcalloc((size_t)B, sizeof *seqs);
    int32_t *table = li_xmalloc((size_t)(B * nb) * sizeof *table), *cur = li_xmalloc((size_t)B * sizeof *cur),
            *pos = li_xmalloc((size_t)B * sizeof *pos), *sq = li_xmalloc((size_t)B * sizeof *sq),
            *rows = li_xmalloc((size_t)B * sizeof *rows);
    int64_t *slot = li_xmalloc((size_t)B * sizeof *slot);
    uint64_t *rs = li_xmalloc((size_t)B * sizeof *rs);
    /* a round: up to seg - 1 tokens of every stream, stream-major */
    int32_t *round = li_xmalloc((size_t)(B * (seg - 1)) * sizeof *round);
    float *lg = li_xmalloc((size_t)B * (size_t)V * sizeof *lg);
    int32_t *ids = li_xmalloc((size_t)n * sizeof *ids);
    for (int j = 0; j < B && !rc; j++) {
        li_kv_seq_init(&seqs[j]);
        if (li_kv_seq_reserve(&kv, &seqs[j], seg)) rc = li_error_set(err, LI_ENOMEM, "self-generate: KV cache exhausted");
        else memcpy(table + j * nb, seqs[j].blocks, (size_t)nb * sizeof *table);
        sq[j] = j;
        rows[j] = j;
        rs[j] = (seed ? seed : 1) * 0x9e3779b97f4a7c15ull + (uint64_t)(j + 1) * 0xbf58476d1ce4e5b9ull;
    }
    li_progress prog;
    li_progress_init(&prog, "self-generate", "tokens/s", n);
    int64_t done = 0;
    while (done < n && !rc) {
        /* a short remainder takes fewer streams, then shorter segments */
        const int64_t left = n - done;
        const int Bn = (int)LI_MIN((int64_t)B, (left + seg - 2) / (seg - 1));
        const int64_t len = LI_MIN(seg - 1, (left + Bn - 1) / Bn);
        for (int j = 0; j < Bn; j++) cur[j] = bos; /* every segment starts at BOS, the cache rewritten from 0 */
        for (int64_t p = 0; p < len && !rc; p++) {
            for (int j = 0; j < Bn; j++) {
                pos[j] = (int32_t)p;
                slot[j] = li_kv_seq_slot(&kv, &seqs[j], p);
            }
            li_batch b = {.n = Bn, .tokens = cur, .pos = pos, .seq = sq, .slot = slot, .block_table = table,
                          .n_seqs = Bn, .bt_stride = nb, .logit_rows = rows, .n_logits = Bn};
            if ((rc = li_forward_run(&fw, m, be, &kv, &b, lg, err))) break;
            for (int j = 0; j < Bn; j++) round[j * len + p] = cur[j] = sample(lg + (size_t)j * V, V, &rs[j]);
            li_progress_update(&prog, LI_MIN(n, done + (p + 1) * Bn), NULL);
        }
        if (rc) break;
        const int64_t take = LI_MIN(left, (int64_t)Bn * len);
        memcpy(ids + done, round, (size_t)take * sizeof *ids);
        done += take;
    }
    li_progress_finish(&prog);
    for (int j = 0; j < B; j++) {
        li_kv_seq_release(&kv, &seqs[j]);
        li_kv_seq_free(&seqs[j]);
    }
    free(seqs);
    free(table);
    free(cur);
    free(pos);
    free(sq);
    free(rows);
    free(slot);
    free(rs);
    free(round);
    free(lg);
    li_forward_free(&fw);
    li_kv_cache_free(&kv);
    if (rc) {
        free(ids);
        return rc;
    }
    *out = ids;
    return 0;
}
