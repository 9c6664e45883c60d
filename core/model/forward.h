/* forward.h — the Llama forward pass over one flat batch.
 *
 * A batch is any mix of tokens from any sequences (prefill chunks and single
 * decode tokens alike): each token carries its position, its sequence and the
 * KV slot it writes. Attention reads every earlier position of the token's
 * sequence through that sequence's block table, so chunked prefill, decode
 * and (later) speculative verification are the same call. */
#ifndef LI_FORWARD_H
#define LI_FORWARD_H

#include "model/model.h"
#include "kv/kv_cache.h"

typedef struct li_batch {
    int64_t n;                     /* tokens in this batch */
    const int32_t *tokens;         /* (n) */
    const int32_t *pos;            /* (n) position within its sequence */
    const int32_t *seq;            /* (n) index into block_tables */
    const int64_t *slot;           /* (n) KV slot: block*block_size + offset */
    int32_t *const *block_tables;  /* per sequence */
    const int32_t *logit_rows;     /* (n_logits) batch rows whose logits are wanted */
    int64_t n_logits;
} li_batch;

/* Scratch activations for up to `cap` tokens, reused every step. */
typedef struct li_forward {
    int64_t cap;
    float *x;     /* (cap, n_embd) residual stream */
    float *h;     /* (cap, n_embd) normed input */
    float *q;     /* (cap, n_head*head_dim) */
    float *k, *v; /* (cap, n_head_kv*head_dim) */
    float *att;   /* (cap, n_head*head_dim) */
    float *g, *u; /* (cap, n_ff) */
    float *sel;   /* (cap, n_embd) rows selected for logits */
} li_forward;

int li_forward_init(li_forward *f, const li_model *m, int64_t cap, li_error *err);
void li_forward_free(li_forward *f);
/* Runs the batch (b->n <= cap); writes (n_logits, n_vocab) logits. */
int li_forward_run(li_forward *f, const li_model *m, li_backend *be, li_kv_cache *kv, const li_batch *b,
                   float *logits, li_error *err);

#endif
