/* train.h — training a Llama-family model in C (docs/training.md).
 *
 * A model to train is a flat array of float32 master parameters carved into
 * tensors (llm.c's habit): the layout (li_train_layout) names each tensor,
 * its shape and its offset, and says which ones train. Gradients live in a
 * second flat array holding only the trainable tensors: a frozen tensor has
 * no gradient buffer and costs no dW work in the backward pass.
 *
 * The forward pass is dense over whole sequences (a batch is B sequences of
 * T tokens, causal, positions 0..T-1; no paged KV), keeps what the backward
 * pass needs, and the backward pass walks it in reverse. Every op is written
 * once over a `real` type (train_tmpl.h) and built for float (training) and
 * double (the gradient checks of tests/unit/test_train_grad.c).
 *
 * Tensor order (li_train_tensor_index): token_embd, output_norm, output,
 * then per layer attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm,
 * ffn_gate, ffn_up, ffn_down, then LoRA adapters (A, B per adapted weight).
 * With a tied head (SmolLM2: no output.weight) `output` aliases token_embd:
 * the same parameters and the same gradient slots, so the gradients of both
 * uses add up. */
#ifndef LI_TRAIN_H
#define LI_TRAIN_H

#include "model/model.h"

#include <signal.h>

struct li_threadpool;

/* ==== layout ============================================================== */

enum {
    LI_TT_TOK_EMBD = 0, LI_TT_OUTPUT_NORM, LI_TT_OUTPUT, LI_TT_N_GLOBAL,
};
/* per layer, in this order */
enum {
    LI_TL_ATTN_NORM = 0, LI_TL_WQ, LI_TL_WK, LI_TL_WV, LI_TL_WO,
    LI_TL_FFN_NORM, LI_TL_GATE, LI_TL_UP, LI_TL_DOWN, LI_TL_N,
};

typedef struct li_train_tensor {
    char name[64];        /* GGUF name: "blk.3.attn_q.weight"; adapters "blk.3.attn_q.lora_a" */
    int64_t rows, cols;   /* (rows, cols) row-major; a norm is (1, n_embd) */
    size_t off;           /* first element in the parameter array */
    int64_t goff;         /* first element in the gradient array, or -1: frozen */
    int32_t lora_a;       /* tensor index of this weight's adapter A (r, cols), or -1 */
    int32_t lora_b;       /* ... and B (rows, r), or -1 */
    int layer;            /* block, or -1 */
    int kind;             /* LI_TT_* (layer -1) or LI_TL_* */
    /* --train scales (scales.c): a scheme matrix's tensor of relative
     * group-scale changes (rows, n_groups), or -1 */
    int32_t qscale;
    /* its dW is computed (the scales' gradients are made of it) but the
     * optimizer never steps it; its slots lie past L.n_grads */
    bool grad_only;
} li_train_tensor;

/* Which parameters train (li_train_select_parse reads "all", "norms",
 * "layers:A-B", "lora:R", "scales", "scales+norms"). */
typedef enum { LI_TRAIN_ALL, LI_TRAIN_NORMS, LI_TRAIN_LAYERS, LI_TRAIN_LORA, LI_TRAIN_SCALES } li_train_what;

typedef struct li_train_select {
    li_train_what what;
    int layer_lo, layer_hi;  /* LAYERS: blocks lo..hi inclusive */
    int lora_rank;           /* LORA: r */
    float lora_alpha;        /* LORA: the update is (alpha / r) · B·A; 0 means alpha = r */
    bool with_norms;         /* SCALES: the RMSNorm weights train too ("scales+norms") */
} li_train_select;

typedef struct li_train_layout {
    li_hparams hp;            /* n_vocab, n_embd, n_layer, heads, n_rot, theta, eps, rope_neox */
    bool tied;                /* output aliases token_embd */
    int n_tensors;            /* LI_TT_N_GLOBAL + LI_TL_N * n_layer + adapters */
    li_train_tensor *t;       /* (n_tensors) */
    size_t n_params;          /* elements of the parameter array */
    size_t n_grads;           /* gradient elements the optimizer steps (trainable tensors only) */
    size_t n_grads_all;       /* the gradient array: n_grads, then the grad_only matrices' (0: n_grads) */
    int n_lora;               /* adapted weights */
    int lora_rank;
    float lora_scale;         /* alpha / r */
    int bwd_stop;             /* the backward pass stops below this block (nothing trains there) */
    li_train_select sel;
    /* a rotated model (luainfer quantize --rotate; li_model.rot_block):
     * down_proj reads H·diag(s)·h, H orthonormal Hadamard in blocks of
     * rot_block, s block l's signs; 0 / NULL: not rotated */
    int32_t rot_block;
    float *down_had;          /* (n_layer, n_ff) signs, block l's first n_ff(l) used; owned */
    /* (n_tensors) the li_act_quant a matrix's input is rounded with before
     * the product, as the engine runs its scheme (W8A8 int8, FP8 e4m3, W4A4
     * int4 rows: li_weight.act), or NULL: all f32. The forward rounds the
     * shared input of q/k/v by q's, of gate/up by gate's; the backward passes
     * the gradient straight through. Owned. */
    uint8_t *act;
} li_train_layout;

/* Index of tensor `kind` of block `layer` (layer -1: the LI_TT_* globals). */
static inline int li_train_tensor_index(int layer, int kind) {
    return layer < 0 ? kind : LI_TT_N_GLOBAL + LI_TL_N * layer + kind;
}

/* Parses "all", "norms", "layers:A-B" (or "layers:A"), "lora:R", "scales",
 * "scales+norms"; a clear LI_EINVAL otherwise. Layer bounds are checked by
 * li_train_layout_init. */
int li_train_select_parse(const char *s, li_train_select *sel, li_error *err);

/* The layout of a model with hyper-parameters hp (tied: no separate output
 * head) training `sel`. hp must satisfy the engine's own constraints
 * (n_head % n_head_kv == 0, n_rot even and <= head_dim). */
int li_train_layout_init(li_train_layout *L, const li_hparams *hp, bool tied, const li_train_select *sel,
                         li_error *err);
void li_train_layout_free(li_train_layout *L);

/* ==== model, gradients ==================================================== */

typedef struct li_train_model {
    li_train_layout L;
    float *params;        /* (L.n_params) float32 master copies; with QAT, what the passes see */
    /* QAT (qat.c; NULL without): params = dequant(quant(master)) per tensor,
     * the optimizer updating master */
    float *master;        /* (L.n_params) */
    uint32_t *qat_type;   /* (L.n_tensors) the type each tensor is rounded through; LI_TYPE_F32: none;
                           * a scheme's code type (scaled): onto src[i]'s grid (li_train_scheme_weight) */
    /* (L.n_tensors) each matrix's weight in the model it was loaded from
     * (li_train_model_init; NULL for norms, adapters and random models). A
     * scheme weight's grid (scales, zero points, permutation) is what --qat
     * rounds that matrix through and what --dtype source writes it on
     * (li_weight_requant_row_ref), so the grid stays the file's. */
    const li_weight **src;
    /* --train scales (scales.c; NULL without): (L.n_tensors) each scheme
     * matrix's weight with its current scales, s0 · (1 + a) per group (its
     * own array; codes, zero points and permutation the source's). params
     * holds its values; a is the matrix's qscale tensor. */
    li_weight *qw;
} li_train_model;

/* Dequantizes every weight of m (any loadable type or scheme) into float32
 * master copies; adapters start as A random (seeded, scale 1/sqrt(cols)),
 * B zero, so the adapted model starts equal to the base. */
int li_train_model_init(li_train_model *tm, const li_model *m, const li_train_select *sel, uint64_t seed,
                        li_error *err);
/* A random model of hyper-parameters hp (tests): weights ~ U(-a, a) with
 * a = 1/sqrt(cols), norms 1 + U(-0.1, 0.1). */
int li_train_model_init_random(li_train_model *tm, const li_hparams *hp, bool tied, const li_train_select *sel,
                               uint64_t seed, li_error *err);
void li_train_model_free(li_train_model *tm);

typedef struct li_train_grads {
    float *g;             /* (L.n_grads) */
    size_t n;
} li_train_grads;

int li_train_grads_init(li_train_grads *g, const li_train_layout *L);
void li_train_grads_zero(li_train_grads *g);
void li_train_grads_free(li_train_grads *g);

/* ==== forward + backward ================================================== */

typedef struct li_train_loss_opts {
    /* loss = alpha · KL(softmax(t/T) ‖ softmax(s/T)) · T² + (1 − alpha) · CE(labels),
     * averaged over the positions whose label is >= 0; without teacher
     * logits alpha is taken as 0 (plain cross-entropy) */
    float alpha;
    float temperature;
    float grad_scale;     /* gradients are multiplied by this (1 / micro-batches when accumulating); 0 means 1 */
} li_train_loss_opts;

typedef struct li_train_batch {
    int B, T;
    const int32_t *tokens;   /* (B, T) */
    const int32_t *labels;   /* (B, T) the token to predict at each position, -1 = ignore */
    const float *teacher;    /* (B, T, n_vocab) teacher logits, or NULL */
} li_train_batch;

/* Activations of one batch shape, reused across steps. */
typedef struct li_train_ws {
    int B, T;
    float *buf;
    size_t n;
    float *logits;        /* (B, T, n_vocab): the last forward's logits */
} li_train_ws;

int li_train_ws_init(li_train_ws *ws, const li_train_layout *L, int B, int T, li_error *err);
void li_train_ws_free(li_train_ws *ws);

/* Runs the forward pass of batch b and, when g is non-NULL, adds the
 * gradients (times grad_scale) of the loss to g. *loss gets the batch's
 * mean loss (and *kl, when non-NULL, its mean KL term, 0 without teacher).
 * tp (may be NULL) runs the matmuls. Tokens outside the vocabulary and
 * shapes other than ws's are refused. */
int li_train_forward_backward(const li_train_model *tm, li_train_grads *g, const li_train_batch *b,
                              const li_train_loss_opts *o, li_train_ws *ws, struct li_threadpool *tp,
                              double *loss, double *kl, li_error *err);

/* ==== optimizer =========================================================== */

typedef struct li_adamw_opts {
    float lr;             /* e.g. 1e-3 */
    float beta1, beta2;   /* 0.9, 0.999 */
    float eps;            /* 1e-8 */
    float weight_decay;   /* decoupled (AdamW): p -= lr · wd · p; norms and adapters' B decay too */
    float clip;           /* global gradient-norm clip, 0 = none */
    struct li_threadpool *tp; /* runs the update in chunks (may be NULL); results do not depend on it */
} li_adamw_opts;

typedef struct li_adamw {
    float *m, *v;         /* (n_grads) first and second moments */
    size_t n;
    int64_t step;         /* steps taken (bias correction) */
} li_adamw;

int li_adamw_init(li_adamw *a, const li_train_layout *L);
void li_adamw_free(li_adamw *a);
/* The global L2 norm of the gradients; NaN/Inf when any is. */
double li_train_grad_norm(const li_train_grads *g);
/* One AdamW step of tm's trainable tensors (their QAT masters when tm has
 * them) with g (clipped to o->clip first). Returns LI_ERANGE naming the step without touching the
 * parameters when the gradients hold a NaN or Inf. *norm (may be NULL)
 * gets the norm before clipping. */
int li_adamw_step(li_adamw *a, li_train_model *tm, const li_train_grads *g, const li_adamw_opts *o, double *norm,
                  li_error *err);

/* ==== checkpoints ========================================================= */

/* The checkpoint's matrix type. The quantized ones (distill and
 * train-eagle) keep a healed model at its source's size and speed:
 * LI_CKPT_SOURCE writes each matrix in the type the source file has it in
 * (a Q4_1 model with a Q8_0 embedding stays so); a type without a
 * quantizer here, or a row its blocks don't divide, is written F16. */
typedef enum {
    LI_CKPT_F32, LI_CKPT_F16, LI_CKPT_Q8_0, LI_CKPT_BF16, LI_CKPT_Q4_0, LI_CKPT_Q4_1, LI_CKPT_SOURCE
} li_ckpt_dtype;

/* "f32", "f16", ... "source" -> *out; -1 for any other name */
int li_ckpt_dtype_parse(const char *name, li_ckpt_dtype *out);
const char *li_ckpt_dtype_name(li_ckpt_dtype d);
/* "F32", "F16", "Q8_0", ...: the type as the "wrote" lines print it */
const char *li_ckpt_dtype_label(li_ckpt_dtype d);

/* The type a matrix named `name` of `cols` columns is written in: dtype's,
 * or (LI_CKPT_SOURCE) src's type for it; F16 where that type has no
 * reference quantizer or its blocks don't divide a row. */
uint32_t li_ckpt_matrix_type(li_ckpt_dtype dtype, const li_gguf *src, const char *name, int64_t cols);
/* Tensor i's weight scheme to keep: with --dtype source, the student's
 * scheme weight (W8A8, FP8, AWQ, GPTQ, INT4) that matrix i was loaded from,
 * written back as codes on its own grid; NULL for plain weights, other
 * dtypes and random models. */
const li_weight *li_train_scheme_weight(const li_train_model *tm, li_ckpt_dtype dtype, int i);

/* Writes tm as a GGUF at path (from the QAT masters when there are): src's metadata copied (its tokenizer, chat
 * template, hyper-parameters), general.file_type set, the matrices in
 * dtype's type (norms always F32), adapters merged into their weights
 * (W + scale · B·A), a tied head left tied. Temporary file + rename. */
int li_train_save(const li_train_model *tm, const li_gguf *src, li_ckpt_dtype dtype, const char *path,
                  li_error *err);

/* ==== quantization-aware training (qat.c) ================================= */

/* Keeps float32 masters of every parameter and rounds each matrix through
 * the type the checkpoint writes it in (li_ckpt_matrix_type), so the
 * passes train the model the file will hold; li_adamw_step then updates
 * the masters (straight-through gradients) and li_train_step re-rounds. Refuses F32 (no
 * rounding) and LoRA (its adapters merge only at save). */
int li_train_qat_init(li_train_model *tm, const li_gguf *src, li_ckpt_dtype dtype, struct li_threadpool *tp,
                      li_error *err);
/* params from master: the rounded matrices, the other tensors copied
 * (trainable_only: only the tensors that train). No-op without QAT. */
void li_train_qat_refresh(li_train_model *tm, bool trainable_only, struct li_threadpool *tp);

/* ==== trained group scales (scales.c) ===================================== */

/* EfficientQAT's end-to-end stage (Chen et al. 2024, "E2E-QP"): every
 * scheme matrix (W8A8, FP8, AWQ, GPTQ, RTN4, W4A4) keeps its codes, zero
 * points and permutation, and its per-group scales train, s = s0 · (1 + a)
 * with a a parameter tensor starting at 0 (relative, so one learning rate
 * suits every matrix). dL/da = s0 · sum over the group of (q - z) · dL/dw.
 * The zero points stay: the packed 4-bit kernels take integer codes. */

/* Appends the qscale tensors of L's scheme matrices (w: (L.n_tensors) the
 * source weights, NULL where none) and gives each of those matrices
 * grad_only slots past n_grads. LI_EINVAL when no matrix has a scheme. */
int li_train_scales_layout(li_train_layout *L, const li_weight *const *w, li_error *err);
/* tm->qw from tm->src, and params from them (li_train_model_init calls it) */
void li_train_scales_init(li_train_model *tm, struct li_threadpool *tp);
/* The current scales from the qscale tensors, and each matrix's values
 * from them (after every optimizer step). */
void li_train_scales_refresh(li_train_model *tm, struct li_threadpool *tp);
/* The qscale tensors' gradients (set, not added) from the matrices' dW in g. */
void li_train_scales_grad(const li_train_model *tm, li_train_grads *g, struct li_threadpool *tp);

/* ==== the training loop =================================================== */

/* One optimizer step over n_micro micro-batches mb[]: the gradients zeroed,
 * each micro-batch's added times 1/n_micro (so the step sees their mean:
 * gradient accumulation), then AdamW. A NaN/Inf loss or gradient returns
 * LI_ERANGE naming the step (opt->step + 1) with the parameters untouched.
 * *loss, *kl: the micro-batches' mean. */
int li_train_step(li_train_model *tm, li_train_grads *g, li_adamw *opt, const li_train_batch *mb, int n_micro,
                  const li_train_loss_opts *lo, const li_adamw_opts *ao, li_train_ws *ws, struct li_threadpool *tp,
                  double *loss, double *kl, double *gnorm, li_error *err);

/* The learning rate by step, as transformers' get_{constant,cosine,linear}
 * _schedule_with_warmup (step s runs at their lambda(s - 1), since their
 * scheduler steps after the optimizer): rising linearly from 0 over
 * `warmup` steps, then held, or decayed to 0 at the last step by a half
 * cosine or a line. */
typedef enum { LI_LR_CONSTANT, LI_LR_COSINE, LI_LR_LINEAR } li_lr_kind;
typedef struct li_lr_schedule {
    li_lr_kind kind;
    int warmup;                  /* steps, >= 0 */
} li_lr_schedule;

/* the rate of step `step` (1-based) of `total` for base rate lr */
double li_train_lr_at(const li_lr_schedule *s, double lr, int step, int total);
/* "constant", "cosine", "linear" -> *kind; -1 for any other name */
int li_lr_kind_parse(const char *name, li_lr_kind *kind);

/* A run of steps with checkpoints (loop.c). */
typedef struct li_train_run_opts {
    int steps;
    int n_micro;                 /* micro-batches per step (>= 1) */
    /* the batch of step s (1-based), micro-batch j: fills b (its arrays
     * stay the callee's until the next call) */
    int (*next_batch)(void *ctx, int step, int micro, li_train_batch *b, li_error *err);
    /* after each good step (may be NULL), with the rate it ran at */
    void (*on_step)(void *ctx, int step, double loss, double kl, double gnorm, double lr);
    void *ctx;
    li_train_loss_opts loss;
    li_adamw_opts adamw;         /* adamw.lr: the base rate of sched */
    li_lr_schedule sched;        /* {0}: constant, no warmup */
    struct li_threadpool *tp;
    /* checkpoints: every ckpt_every steps (0: only at the end) and when
     * *stop becomes nonzero (a SIGINT handler's flag), to out */
    const char *out;             /* NULL: none */
    const li_gguf *src;
    li_ckpt_dtype dtype;
    int ckpt_every;
    volatile sig_atomic_t *stop;
} li_train_run_opts;

/* Runs o->steps steps. NaN/Inf stops the run (LI_ERANGE naming the step)
 * leaving the last checkpoint written as it was; *stop set writes a
 * checkpoint and returns 0 with *steps_done short. */
int li_train_run(li_train_model *tm, const li_train_run_opts *o, int *steps_done, li_error *err);

/* ==== matmul kernels (train_mm.c; exposed for the tests) ================== */

/* y(n, m) = x(n, k) · W(m, k)^T */
void li_train_mm_nt(struct li_threadpool *tp, const float *x, const float *W, float *y, int64_t n, int64_t m,
                    int64_t k);
/* C(R, K) += sum_l A(r, l) · B(l, K), A's element (r, l) at A[r * sa_r + l * sa_l]:
 * dX = dY·W (A = dY, sa_r = m, sa_l = 1) and dW = dY^T·X (sa_r = 1, sa_l = m) */
void li_train_mm_acc(struct li_threadpool *tp, const float *A, int64_t sa_r, int64_t sa_l, const float *B,
                     float *C, int64_t R, int64_t Lk, int64_t K);
/* Which kernels: 0 scalar, 1 AVX2+FMA, 2 AVX-512 (clamped to what the CPU
 * has); returns the previous. Tests compare them; the default is the best. */
int li_train_mm_set_isa(int isa);

#endif
