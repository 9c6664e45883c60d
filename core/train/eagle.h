/* eagle.h — training an EAGLE-3-style draft block on a frozen base
 * (docs/eagle.md: the block, its file, its loss).
 *
 * The draft is a li_train_model whose layout holds only its 12 tensors, in
 * li_eagle_tensor order and with its names (spec/eagle_file.h), so AdamW,
 * the gradient norm, clipping and the NaN guard of core/train/ apply
 * unchanged. The base's token embedding E and its output matrix restricted
 * to the draft's vocabulary, E_V, are frozen inputs.
 *
 * One window of L tokens runs J steps of EAGLE-3's training-time test:
 * step 0 is teacher forced (row q: token x_q, hid = W_fc·g_{q-1}, g_{-1} = 0,
 * causal attention over the window's rows); step j = 1..J-1 runs every row
 * q in [1, L - J) once more at position q + j with token x_{q+j} and hid =
 * step j-1's output x'_q, attending to step 0's keys at positions 0..q and
 * to its own chain's keys of steps 1..j. The loss of step j at row q is
 * α·KL(softmax(p/T) ‖ softmax(s/T))·T² + (1 − α)·CE(s, x_{q+j+1}), p the
 * base's logits row q + j restricted to V (renormalized over V), s the
 * draft's; each step's loss is its mean over q in [1, L - J); the window's
 * is Σ_j 0.8^j · loss_j. */
#ifndef LI_TRAIN_EAGLE_H
#define LI_TRAIN_EAGLE_H

#include "spec/eagle_file.h"
#include "train/train.h"

#define LI_TRAIN_EAGLE_MAX_TTT 8  /* steps of the training-time test, J */
#define LI_TRAIN_EAGLE_DECAY 0.8  /* step j's weight is 0.8^j (EAGLE-3) */

typedef struct li_train_eagle {
    li_hparams hp;        /* the base's: n_embd, n_vocab, n_layer, heads, head_dim, n_ff, rope, eps */
    int F;                /* feature blocks, 1..LI_EAGLE_MAX_FEATURES */
    int32_t feat[LI_EAGLE_MAX_FEATURES]; /* ascending blocks of the base */
    int32_t n_draft;      /* |V| */
    int32_t *vocab;       /* (n_draft) ascending base ids, or NULL: the whole vocabulary */
    int32_t *vmap;        /* (n_vocab) base id -> index in V, -1 outside */
    li_train_model tm;    /* LI_EAGLE_N_TENSORS tensors, li_eagle_tensor order; all train */
} li_train_eagle;

/* A draft for a base of hyper-parameters hp reading the F blocks feat[]
 * (ascending, < hp->n_layer), over the vocabulary vocab (n_draft ascending
 * ids; NULL: all of them; copied). Matrices ~ N(0, 0.02) from seed, enorm,
 * hnorm and ffn_norm ones, output_norm a copy of out_norm (the base's; NULL:
 * ones). The block's shape is the base's (n_head, n_head_kv, head_dim, n_ff). */
int li_train_eagle_init(li_train_eagle *e, const li_hparams *hp, int F, const int32_t *feat, const int32_t *vocab,
                        int32_t n_draft, const float *out_norm, uint64_t seed, li_error *err);
void li_train_eagle_free(li_train_eagle *e);
/* Another draft vocabulary for e (as init's vocab, n_draft; copied). No
 * parameter depends on it: the head is the base's rows of V, frozen, so a
 * draft resumed over a new V trains on with its block as it was. */
int li_train_eagle_set_vocab(li_train_eagle *e, const int32_t *vocab, int32_t n_draft, li_error *err);
static inline float *li_train_eagle_param(const li_train_eagle *e, li_eagle_tensor t) {
    return e->tm.params + e->tm.L.t[t].off;
}

/* The draft vocabulary: the n most frequent ids of ids[0..n_ids) (ties to
 * the lower id; ids never seen fill up in id order), ascending, into out (n). */
void li_train_eagle_vocab_select(const int32_t *ids, int64_t n_ids, int32_t n_vocab, int32_t n, int32_t *out);

/* The default feature blocks of a base of n_layer blocks: 2, n_layer / 2,
 * n_layer - 1 (fewer when those coincide); returns F. */
int li_train_eagle_default_features(int n_layer, int32_t *feat);

/* ==== one window ========================================================== */

/* What a window needs of the base (frozen). */
typedef struct li_train_eagle_window {
    int L;
    const int32_t *tok;   /* (L) the window's tokens */
    const float *emb;     /* (L, n_embd) the base's token embeddings E[tok[i]] */
    const float *feat;    /* (L, F·n_embd) the base's residual streams after the feature blocks */
    const float *base;    /* (L, n_vocab) the base's logits, or NULL with base_v */
    const float *base_v;  /* (L, n_draft) the base's logits over V already (base_window with EV), or NULL */
} li_train_eagle_window;

typedef struct li_train_eagle_opts {
    int J;                /* steps of the training-time test, 1..LI_TRAIN_EAGLE_MAX_TTT */
    float alpha, temperature;
    float grad_scale;     /* gradients times this (1 / windows per step); 0 means 1 */
} li_train_eagle_opts;

/* Per step j of one window (or a sum over windows: li_train_eagle_stats_add). */
typedef struct li_train_eagle_stats {
    int J;
    int64_t rows;                         /* rows per step (L - J - 1 per window) */
    double loss;                          /* Σ_j 0.8^j loss_j */
    double loss_j[LI_TRAIN_EAGLE_MAX_TTT]; /* mean over rows */
    double kl_j[LI_TRAIN_EAGLE_MAX_TTT];  /* mean KL at the temperature, without α or T² */
    int64_t agree_j[LI_TRAIN_EAGLE_MAX_TTT]; /* rows where argmax s == argmax p (over V) */
} li_train_eagle_stats;

/* Adds b into a as a mean over rows (a->rows += b->rows). */
void li_train_eagle_stats_add(li_train_eagle_stats *a, const li_train_eagle_stats *b);

/* Scratch for windows of L tokens and J steps. */
typedef struct li_train_eagle_ws {
    int L, J;
    float *buf;
    size_t n;             /* floats in buf */
    float *teacher;       /* (L, n_draft) the base's logits over V (when V is not everything) */
    float *emb;           /* (L, n_embd) */
    int32_t *labv;        /* (L) each token's index in V, -1 outside */
    int32_t *argmax;      /* (J, L - J - 1) the draft's top-1 (index in V) per step and row */
} li_train_eagle_ws;

int li_train_eagle_ws_init(li_train_eagle_ws *ws, const li_train_eagle *e, int L, int J, li_error *err);
void li_train_eagle_ws_free(li_train_eagle_ws *ws);

/* The forward pass of window w and, when g is non-NULL, its backward: the
 * gradients of the window's loss times o->grad_scale added to g. EV
 * (n_draft, n_embd): the base's output rows of V in float32. *st gets the
 * window's losses and agreement; ws->argmax the draft's top-1 per row. */
int li_train_eagle_forward_backward(const li_train_eagle *e, li_train_grads *g, const float *EV,
                                    const li_train_eagle_window *w, const li_train_eagle_opts *o,
                                    li_train_eagle_ws *ws, struct li_threadpool *tp, li_train_eagle_stats *st,
                                    li_error *err);

/* ==== the base, frozen ==================================================== */

/* One window of n tokens through the engine from position 0 (s: a session
 * with n_ctx and n_batch >= n, reset here): every row's logits and the
 * residual stream after blocks feat[0..F) (n, F·n_embd). EV NULL: the
 * engine's logits over the whole vocabulary (n, n_vocab). EV (n_ev, n_embd),
 * the output rows of the draft's vocabulary: the engine stops at the output
 * norm and the logits over V (n, n_ev) are its post-norm hidden states ·
 * EV^T in float32 on tp (a sixth of the head's work at |V| 8192 of 49152). */
struct li_session;
int li_train_eagle_base_window(struct li_session *s, const int32_t *tok, int64_t n, const int32_t *feat, int F,
                               const float *EV, int32_t n_ev, struct li_threadpool *tp, float *logits,
                               float *captured, li_error *err);
/* The base's output rows of vocab (n_draft of them; NULL: all) in float32,
 * (n_draft, n_embd); li_aligned_free it. NULL when out of memory. */
float *li_train_eagle_output_f32(const li_model *m, const int32_t *vocab, int32_t n_draft);
/* The embedding rows E[tok[i]] (n, n_embd), dequantized. */
void li_train_eagle_embed(const li_model *m, const int32_t *tok, int64_t n, float *out);

/* ==== the file ============================================================ */

/* What the file records of its base and its training (docs/eagle.md). */
typedef struct li_train_eagle_meta {
    const char *base_name;    /* the base's general.name, or its file's basename */
    uint64_t vocab_hash;      /* li_tokenizer_vocab_hash of the base */
    int64_t steps, tokens;    /* eagle.train.*: informational */
    float alpha, temperature, lr;
    int ttt;
    const char *data;         /* "FILE" or "self-generate" (may be NULL) */
} li_train_eagle_meta;

/* Writes the draft as the GGUF of docs/eagle.md (matrices F32 or F16, norms
 * F32, eagle.vocab I32 when V is not the whole vocabulary); temporary file +
 * rename. */
int li_train_eagle_save(const li_train_eagle *e, const li_train_eagle_meta *meta, li_ckpt_dtype dtype,
                        const char *path, li_error *err);

/* Reads a draft file into e (initialized here) through li_eagle_file_check
 * against base (its shape and vocabulary hash): one line naming the field
 * and both values on a mismatch. The block's shape must be the base's. */
int li_train_eagle_load(li_train_eagle *e, const char *path, const li_hparams *hp, const li_eagle_base *base,
                        li_error *err);

/* ==== internal: the passes over `real` (eagle_tmpl.h), for the checks ==== */

/* The shapes one pass needs. */
typedef struct li_train_eagle_dims {
    int64_t d, ff, Vd;        /* n_embd, n_ff, |V| */
    int F, H, Hkv, hd;        /* features, heads, kv heads, head_dim */
    int n_rot, neox;
    double theta, eps;
    int L, J;
} li_train_eagle_dims;

/* P: the parameters at the layout's offsets off[LI_EAGLE_N_TENSORS]; G the
 * gradients alike (NULL: forward only). emb (L, d), feat (L, F·d), EV (Vd, d);
 * teacher (L, Vd) the base's logits over V; labv (L) each token's index in V
 * or -1. ws: li_train_eagle_ws_reals(D) reals; argmax (J, L - J - 1) or NULL.
 *
 * The prefix + chain attention (a chain step's attention): R rows, row r's
 * query q (R, H, hd) sees keys k0 rows 0..r + p0 (at most n0 rows), then the
 * chain keys i = 0..nc-1 of its own row, kc + i·cstride + r·Hkv·hd (v alike);
 * P (H, R, W) keeps the softmax rows (prefix in columns 0..r + p0, the chain
 * right after, zero beyond); out (R, H, hd). The backward writes dq and ADDS
 * into dk0, dv0, dkc, dvc; dS: H·R·W reals of scratch. */
#define LI_TRAIN_EAGLE_DECLARE(real, S)                                                                              \
    size_t li_train_eagle_ws_reals_##S(const li_train_eagle_dims *D);                                                \
    double li_train_eagle_fb_##S(const li_train_eagle_dims *D, const size_t *off, const real *P, real *G,           \
                                 const real *emb, const real *feat, const float *teacher, const int32_t *labv,     \
                                 const real *EV, real alpha, real temp, real gscale, real *ws, void *tp,          \
                                 li_train_eagle_stats *st, int32_t *argmax);                                      \
    void li_trop_chain_attn_fwd_##S(const real *q, const real *k0, const real *v0, const real *kc, const real *vc,  \
                                    int64_t cstride, real *P, real *out, int R, int n0, int p0, int nc, int W,     \
                                    int H, int Hkv, int hd, void *tp);                                             \
    void li_trop_chain_attn_bwd_##S(const real *q, const real *k0, const real *v0, const real *kc, const real *vc,  \
                                    int64_t cstride, const real *P, const real *dout, real *dq, real *dk0,         \
                                    real *dv0, real *dkc, real *dvc, real *dS, int R, int n0, int p0, int nc,      \
                                    int W, int H, int Hkv, int hd, void *tp);
LI_TRAIN_EAGLE_DECLARE(float, f32)
LI_TRAIN_EAGLE_DECLARE(double, f64)

#endif
