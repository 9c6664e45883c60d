/* train_internal.h — the ops of train_tmpl.h for both types, declared for
 * train.c and the gradient checks (tests/unit/test_train_grad.c). */
#ifndef LI_TRAIN_INTERNAL_H
#define LI_TRAIN_INTERNAL_H

#include "train/train.h"

/* fn(ctx, j) for j in [0, n) on the thread pool tp (NULL: this thread),
 * jobs taken from an atomic counter (train_par.c). `op` tells apart the
 * ops one fn runs (the pool times each fn and op as its own class) */
typedef void (*li_train_job_fn)(void *ctx, int64_t j);
void li_train_par(void *tp, li_train_job_fn fn, void *ctx, int64_t n, int op);

#define LI_TRAIN_DECLARE(real, S)                                                                                  \
    void li_trop_embed_fwd_##S(const real *E, const int32_t *tok, real *x, int64_t N, int64_t d);                \
    void li_trop_embed_bwd_##S(real *dE, const int32_t *tok, const real *dx, int64_t N, int64_t d);              \
    void li_trop_rmsnorm_fwd_##S(const real *x, const real *w, real *y, real *rstd, int64_t N, int64_t d,        \
                                 real eps);                                                                      \
    void li_trop_rmsnorm_bwd_##S(const real *x, const real *w, const real *rstd, const real *dy, real *dx,       \
                                 real *dw, int64_t N, int64_t d);                                                \
    void li_trop_rope_table_##S(real *cs, int T, int n_rot, real theta);                                         \
    void li_trop_rope_##S(real *x, const real *cs, int64_t N, int T, int H, int hd, int n_rot, int neox,         \
                          int dir);                                                                              \
    void li_trop_attn_fwd_##S(const real *q, const real *k, const real *v, real *P, real *out, int B, int T,     \
                              int H, int Hkv, int hd, void *tp);                                                 \
    void li_trop_attn_bwd_##S(const real *q, const real *k, const real *v, const real *P, const real *dout,      \
                              real *dq, real *dk, real *dv, real *dS, int B, int T, int H, int Hkv, int hd,      \
                              void *tp);                                                                         \
    void li_trop_swiglu_fwd_##S(const real *g, const real *u, real *h, int64_t n);                               \
    void li_trop_swiglu_bwd_##S(const real *g, const real *u, const real *dh, real *dg, real *du, int64_t n);    \
    void li_trop_hadamard_##S(real *x, const float *s, int64_t N, int64_t dim, int64_t block, int dir);         \
    void li_trop_act_quant_##S(real *x, int64_t N, int64_t d, int act);                                       \
    void li_trop_act_quant_par_##S(void *tp, real *x, int64_t N, int64_t d, int act);                          \
    /* the row-parallel forms (ranges of rows on tp; the serial op's bits) */                                    \
    void li_trop_rmsnorm_fwd_par_##S(void *tp, const real *x, const real *w, real *y, real *rstd, int64_t N,     \
                                     int64_t d, real eps);                                                       \
    void li_trop_rmsnorm_bwd_par_##S(void *tp, const real *x, const real *w, const real *rstd, const real *dy,   \
                                     real *dx, real *dw, int64_t N, int64_t d);                                  \
    void li_trop_rope_par_##S(void *tp, real *x, const real *cs, int64_t N, int T, int H, int hd, int n_rot,     \
                              int neox, int dir);                                                                \
    void li_trop_swiglu_par_##S(void *tp, const real *g, const real *u, real *h, const real *dh, real *dg,       \
                                real *du, int64_t N, int64_t ff);                                                \
    void li_trop_hadamard_par_##S(void *tp, real *x, const float *s, int64_t N, int64_t dim, int64_t block,     \
                                  int dir);                                                                      \
    double li_trop_loss_##S(const real *logits, const int32_t *lab, const float *teacher, real *dlogits,         \
                            int64_t N, int64_t V, real alpha, real temp, real gscale, double *kl);               \
    size_t li_train_ws_reals_##S(const li_train_layout *L, int B, int T);                                        \
    double li_train_fb_##S(const li_train_layout *L, const real *P, real *G, const int32_t *tok,                 \
                           const int32_t *lab, const float *teacher, int B, int T, real alpha, real temp,        \
                           real gscale, real *ws, void *tp, double *kl_out, real **logits_out);

LI_TRAIN_DECLARE(float, f32)
LI_TRAIN_DECLARE(double, f64)

/* the double instantiations' matmuls (train_f64.c; eagle_f64.c and
 * medusa_f64.c use them too): y(n, m) = x(n, k) W(m, k)^T, and
 * C(R, K) += A(R, Lk) B(Lk, K), A's elements sa_r, sa_l apart; plain
 * loops, one thread */
void li_train_mm_nt_f64(const double *x, const double *W, double *y, int64_t n, int64_t m, int64_t k);
void li_train_mm_acc_f64(const double *A, int64_t sa_r, int64_t sa_l, const double *B, double *C, int64_t R,
                         int64_t Lk, int64_t K);

/* scalar reference matmuls of train_mm.c:
 * mm_nt: the output columns [j0, j1); mm_acc: the block rows [r0, r1) x columns [c0, c1) of C */
void li_train_mm_nt_ref(const float *x, const float *W, float *y, int64_t n, int64_t m, int64_t k, int64_t j0,
                        int64_t j1);
void li_train_mm_acc_ref(const float *A, int64_t sa_r, int64_t sa_l, const float *B, float *C, int64_t Lk,
                         int64_t K, int64_t r0, int64_t r1, int64_t c0, int64_t c1);

/* The packed GEMM's micro-kernels (train_mm_avx2.c, train_mm_avx512.c):
 * C(MR, NR) = [C +] Ap·Bp over kc steps, Ap kc x MR and Bp kc x NR packed
 * (k outer; Bp 32-byte aligned for AVX2, 64 for AVX-512), C rows ldc apart;
 * load = 0 starts from zero. */
#define LI_TRAIN_MR256 6
#define LI_TRAIN_NR256 16
#define LI_TRAIN_MR512 8
#define LI_TRAIN_NR512 32
void li_train_mm_kern_avx2(int64_t kc, const float *Ap, const float *Bp, float *C, int64_t ldc, int load);
/* dst(kc, nr)[l][c] = W[c·ldw + l] (c < cn; zero up to nr): W^T packed */
void li_train_mm_pack_bt_avx2(const float *W, int64_t ldw, float *dst, int nr, int cn, int64_t kc);
void li_train_mm_kern_avx512(int64_t kc, const float *Ap, const float *Bp, float *C, int64_t ldc, int load);

/* The training kernels' ISA (li_train_mm_set_isa): 0 scalar, 1 AVX2, 2 AVX-512 */
int li_train_isa(void);

/* AdamW's constants for one step, and its AVX-512 and AVX2 updates of n
 * elements (optim_avx512.c, optim_avx2.c; the scalar loop is optim_tmpl.h's
 * li_adamw_update_scalar) */
typedef struct li_adamw_coef {
    float clip, b1, b2, lr, wd, step_size, inv_bc2, eps;
} li_adamw_coef;
void li_adamw_update_avx512(float *p, const float *g, float *m, float *v, size_t n, const li_adamw_coef *c);
void li_adamw_update_avx2(float *p, const float *g, float *m, float *v, size_t n, const li_adamw_coef *c);

/* --qat's round trip of a row through Q4_1 (n a multiple of 32): y = the
 * reference quantizer's codes dequantized, bit for bit (qat_avx2.c) */
void li_train_qat_q4_1_row_avx2(const float *x, float *y, int64_t n);
/* ... and through Q8_0 (n a multiple of 32), as li_quantize_row_q8_0_ref
 * then Q8_0's to_float */
void li_train_qat_q8_0_row_avx2(const float *x, float *y, int64_t n);

#endif
