/* rotate.h — QuaRot-style rotation of a model (`luainfer quantize --rotate`,
 * docs/quant_rotation.md).
 *
 * A GGUF in, a rotated F32 GGUF out that computes the same function in real
 * arithmetic, with activations that int8 quantizes far better:
 *   - every RMSNorm's gamma folded into the linears it feeds (attn_norm into
 *     q/k/v, ffn_norm into gate/up, output_norm into an untied output head);
 *     the stored gammas become 1, so rmsnorm commutes with any orthogonal Q;
 *   - the residual stream kept as x Q, Q = diag(s) (H_12 ⊗ .. ⊗ H_2^b) / sqrt(n)
 *     a randomized Hadamard matrix of order n_embd = 12^a 2^b: token_embd E Q,
 *     q/k/v/gate/up/head W Q, attn_output/ffn_down Q^T W;
 *   - an online Hadamard before down_proj: the forward applies the backend's
 *     hadamard op (signs s' of the layer, blocks of down_block) to silu(g)*u,
 *     and ffn_down's rows get the same map offline (W diag(s') H_block, the
 *     block-diagonal H symmetric and orthogonal), so down's product is kept.
 * The math is in double; signs come from a splitmix64 stream of `seed` (Q's,
 * then each layer's), stored in the file (LI_ROT_SIGNS_FMT), so the same
 * input and options give the same bytes and the loader needs no RNG. */
#ifndef LI_ROTATE_H
#define LI_ROTATE_H

#include "util/common.h"

#define LI_ROT_DEFAULT_BLOCK 128
#define LI_ROT_DEFAULT_SEED 0

typedef struct li_rot_opts {
    uint64_t seed;
    int64_t down_block; /* a power of two dividing n_ff */
    int64_t threads;    /* the rotation's workers (<= 0: all cores); the file is the same for any */
    bool scratch;       /* out is an intermediate the caller reads and removes: not fsynced */
} li_rot_opts;

/* Writes the rotated F32 model of `in` to `out` (temp + rename). LI_EINVAL /
 * LI_EUNSUP with one line when it cannot apply: an input already rotated, a
 * Hugging Face directory, n_embd not 12^a 2^b, a block that does not divide
 * n_ff. */
int li_rotate_model(const char *in, const char *out, const li_rot_opts *o, li_error *err);

/* ---- the pieces, for the unit tests ---- */

/* Q's factors for order n: a count of H_12 and the power of two left
 * (n = 12^n12 * p2); -1 when n has no such form. */
int li_rot_factor(int64_t n, int *n12, int64_t *p2);
/* v(n) <- (v * s) K / sqrt(n), K = H_12 ⊗ .. ⊗ H_12 ⊗ H_p2 (li_rot_factor's),
 * in place; tmp: n doubles. Row vector times Q. */
void li_rot_apply(double *v, const double *s, int64_t n, double *tmp);
/* v(n) <- (v * s) blockdiag(H_block) / sqrt(block): the hadamard op in double */
void li_rot_block_apply(double *v, const double *s, int64_t n, int64_t block);

#endif
