/* runner.c — model + backend + forward state + KV storage. */
#include "engine/runner.h"

#include <string.h>

size_t li_runner_kv_bytes_per_token(const li_model *m, li_type kv_dtype) {
    const li_kv_dims dims = li_forward_kv_dims(&m->hp);
    return li_kv_bytes_per_token(&dims, kv_dtype);
}

int li_runner_init(li_runner *r, li_model *m, li_backend *be, li_kv_cache *pool, li_type kv_dtype,
                   int block_size, int32_t num_blocks, int64_t cap, li_error *err) {
    memset(r, 0, sizeof *r);
    const li_kv_dims dims = li_forward_kv_dims(&m->hp);
    int rc = pool ? li_kv_cache_init_follower(&r->kv, pool, be, &dims, err)
                  : li_kv_cache_init(&r->kv, be, &dims, kv_dtype, block_size, num_blocks, err);
    if (rc) return rc;
    if ((rc = li_forward_init(&r->fw, m, be, cap, err))) {
        li_kv_cache_free(&r->kv);
        return rc;
    }
    r->model = m;
    r->be = be;
    return 0;
}

void li_runner_free(li_runner *r) {
    if (!r->model) return;
    li_forward_free(&r->fw);
    li_kv_cache_free(&r->kv);
    memset(r, 0, sizeof *r);
}

int li_runner_run(li_runner *r, const li_batch *b, li_error *err) {
    r->logits = NULL;
    int rc = li_forward_run(&r->fw, r->model, r->be, &r->kv, b, NULL, err);
    if (!rc && r->fw.logits.host) r->logits = li_forward_logits(&r->fw, r->model);
    return rc;
}

float *li_runner_logits(li_runner *r) {
    if (!r->logits) r->logits = li_forward_logits(&r->fw, r->model);
    return r->logits;
}

const float *li_runner_logits_row(li_runner *r, int64_t row) {
    return r->logits ? r->logits + (size_t)row * (size_t)r->model->hp.n_vocab
                     : li_forward_logits_row(&r->fw, r->model, row);
}
