/* medusa.h — training Medusa-1 heads on a frozen base (docs/medusa.md).
 *
 * Head k (k = 0..K-1, "Medusa head k+1") maps the base's post-norm hidden
 * state h_t (the vector the output matrix multiplies at position t, whose
 * base logits predict token t+1) to z = h_t + SiLU(W_k·h_t + b_k), and its
 * logits are E·z with the base's own output matrix E (frozen, shared): head
 * k predicts token t+k+2. W = 0, b = 0 gives z = h exactly: the base's own
 * next-token logits.
 *
 * The loss of head k at position t is the seed's, against the base's
 * distribution one place further (its logits row t+k+1, which predicts
 * token t+k+2) and the token t+k+2 itself:
 *   α·KL(softmax(p/T) ‖ softmax(s/T))·T² + (1 − α)·CE(s, tok[t+k+2]),
 * averaged over the positions of the window that have that token; the
 * step's loss is the mean over heads. The heads are a li_train_model whose
 * layout holds only them (medusa.{k}.weight (n_embd, n_embd), medusa.{k}.bias
 * (1, n_embd)), so AdamW, the gradient norm and the NaN guard of core/train/
 * apply unchanged. The file format: docs/medusa.md. */
#ifndef LI_TRAIN_MEDUSA_H
#define LI_TRAIN_MEDUSA_H

#include "spec/medusa_file.h"
#include "train/train.h"

#define LI_TRAIN_MEDUSA_MAX_HEADS LI_MEDUSA_FILE_MAX_HEADS /* the file format's limit */

typedef struct li_train_medusa {
    int K;                /* heads, 1..LI_TRAIN_MEDUSA_MAX_HEADS */
    int64_t d, V;         /* the base's n_embd and n_vocab */
    li_train_model tm;    /* 2K tensors: head k's W (d, d) at t[2k], b (1, d) at t[2k+1]; all train */
} li_train_medusa;

/* K zero heads for a base of width d and vocabulary V. */
int li_train_medusa_init(li_train_medusa *h, int K, int64_t d, int64_t V, li_error *err);
void li_train_medusa_free(li_train_medusa *h);
static inline float *li_train_medusa_w(const li_train_medusa *h, int k) { return h->tm.params + h->tm.L.t[2 * k].off; }
static inline float *li_train_medusa_b(const li_train_medusa *h, int k) { return h->tm.params + h->tm.L.t[2 * k + 1].off; }

/* Scratch for windows of up to N positions. */
typedef struct li_train_medusa_ws {
    int N;
    float *buf;
    float *A, *Z, *dZ;    /* (N, d) pre-activation W·h + b, z, dL/dz then dL/d(pre-activation) */
    float *logits;        /* (N, V) the last head's logits */
    float *dlogits;       /* (N, V) */
    int32_t *lab;         /* (N) the last head's labels, -1: no target in the window */
} li_train_medusa_ws;

int li_train_medusa_ws_init(li_train_medusa_ws *ws, const li_train_medusa *h, int N, li_error *err);
void li_train_medusa_ws_free(li_train_medusa_ws *ws);

/* One window of N positions: H (N, d) the base's post-norm hidden states,
 * E (V, d) its output matrix in float32, base (N, V) its logits, tok (N) the
 * window's tokens (tok[t+1] is what base row t predicts). Adds the
 * gradients of the mean-over-heads loss, times o->grad_scale (0: 1), to g
 * when g is non-NULL. loss_k, kl_k (K, may be NULL): each head's mean loss
 * and mean KL (no α, no T²); *loss the mean over heads. Windows too short
 * for a head (N < k + 3) give that head no positions (its loss 0). */
int li_train_medusa_forward_backward(const li_train_medusa *h, li_train_grads *g, const float *E, const float *H,
                               const float *base, const int32_t *tok, int N, const li_train_loss_opts *o,
                               li_train_medusa_ws *ws, struct li_threadpool *tp, double *loss, double *loss_k,
                               double *kl_k, li_error *err);

/* Head k's logits (N, V) over the hidden states H (N, d), in ws->logits. */
void li_train_medusa_head_logits(const li_train_medusa *h, int k, const float *E, const float *H, int N, li_train_medusa_ws *ws,
                           struct li_threadpool *tp);

/* The base's side, frozen. One window of n tokens through the engine from
 * position 0 (s: a session with n_ctx and n_batch >= n, reset here):
 * every row's logits (n, V) and post-norm hidden state (n, d), the vector
 * the output matrix multiplies (LI_HIDDEN_POST_NORM). */
struct li_session;
int li_train_medusa_base_window(struct li_session *s, const int32_t *tok, int64_t n, float *logits, float *hidden,
                          li_error *err);
/* The base's output matrix (V, d) dequantized to float32 (tied: the
 * embedding); li_aligned_free it. NULL when out of memory. */
float *li_train_medusa_output_f32(const li_model *m);

/* What the heads file records of its base (medusa.base.*, docs/medusa.md). */
typedef struct li_train_medusa_meta {
    const char *base_name;    /* the base's general.name, or its file's basename */
    uint64_t vocab_hash;      /* li_tokenizer_vocab_hash of the base */
    int64_t steps, tokens;    /* medusa.train.*: informational */
    float alpha, temperature;
    const char *data;         /* "FILE" or "self-generate" (may be NULL) */
} li_train_medusa_meta;

/* Writes the heads as the GGUF of docs/medusa.md (W as F32 or F16, biases
 * F32); temporary file + rename. */
int li_train_medusa_save(const li_train_medusa *h, const li_train_medusa_meta *meta, li_ckpt_dtype dtype, const char *path,
                   li_error *err);

/* Reads a heads file written by li_train_medusa_save into h (initialized here),
 * checked against a base of width d, vocabulary V and vocab_hash by the
 * inference loader's own check (li_medusa_file_check): one line naming the
 * field and both values on a mismatch. */
int li_train_medusa_load(li_train_medusa *h, const char *path, int64_t d, int64_t V, uint64_t vocab_hash, li_error *err);

/* ==== internal: the ops over `real` (medusa_tmpl.h), for the gradient checks ==== */

/* P: the heads' parameters (K, d·d + d), head k's W then b; G alike (NULL:
 * forward only). ws_real: li_train_medusa_ws_reals(d, V, N) reals; lab: N int32. */
#define LI_TRAIN_MEDUSA_DECLARE(real, S)                                                                                \
    void li_train_medusa_head_fwd_##S(const real *H, const real *W, const real *b, const real *E, real *A, real *Z,   \
                                real *logits, int64_t N, int64_t d, int64_t V, void *tp);                        \
    void li_train_medusa_head_bwd_##S(const real *H, const real *A, const real *E, const real *dlogits, real *dZ,     \
                                real *dW, real *db, int64_t N, int64_t d, int64_t V, void *tp);                  \
    double li_train_medusa_fb_##S(const real *P, real *G, int K, const real *E, const real *H, const float *base,     \
                            const int32_t *tok, int64_t N, int64_t d, int64_t V, real alpha, real temp,          \
                            real gscale, real *ws, int32_t *lab, void *tp, double *loss_k, double *kl_k);
LI_TRAIN_MEDUSA_DECLARE(float, f32)
LI_TRAIN_MEDUSA_DECLARE(double, f64)
size_t li_train_medusa_ws_reals(int64_t d, int64_t V, int64_t N);

#endif
