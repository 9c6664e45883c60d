/* session.h — one sequence evaluated against a private paged KV cache.
 * Used by the single-stream CLI commands (generate, perplexity); the
 * continuous-batching engine drives li_forward_run directly. */
#ifndef LI_SESSION_H
#define LI_SESSION_H

#include "model/forward.h"

typedef struct li_session {
    li_model *model;
    li_backend *be;
    li_kv_cache kv;
    li_kv_seq seq;
    li_forward fw;
    int64_t n_ctx;     /* max positions */
    int64_t n_batch;   /* max tokens per forward call */
    int64_t n_past;    /* positions already in the cache */
    /* per-call scratch (n_batch) */
    int32_t *pos, *seq_idx, *rows;
    int64_t *slot;
} li_session;

int li_session_init(li_session *s, li_model *m, li_backend *be, int64_t n_ctx, li_type kv_dtype,
                    int64_t n_batch, li_error *err);
void li_session_free(li_session *s);
/* Forgets the cached positions (blocks return to the pool). */
void li_session_reset(li_session *s);
/* Appends n tokens after n_past, in chunks of n_batch. logits receives
 * (n, n_vocab) when all_logits, else (1, n_vocab) for the last token. */
int li_session_eval(li_session *s, const int32_t *tokens, int64_t n, bool all_logits, float *logits,
                    li_error *err);

/* Forgets the cached positions and lays out one window of n tokens from
 * position 0, every row asking for logits: *b is ready to run on s (the
 * caller sets what else it wants: hidden, capture, no_logits). `who`
 * prefixes the one-line errors (a window longer than the session, no KV). */
int li_session_window(li_session *s, const int32_t *tokens, int64_t n, const char *who, li_batch *b,
                      li_error *err);

#endif
