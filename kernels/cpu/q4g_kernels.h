/* q4g_kernels.h — 4-bit weights with group scales and zero points (the
 * AWQ, GPTQ and INT4 schemes: u4 codes, li_weight scales / zeros / perm).
 *
 * Internal to kernels/cpu. Two ways to run them:
 *
 *   A16  activations stay f32 (LI_ACT_F32; and LI_ACT_INT4, W4A4, whose
 *        activations are first rounded by li_act_quant_row_ref): each
 *        output is the reference's sum (ops_ref.c), input column by input
 *        column, x[c] * ((q - zero) * scale), in f32 without fused
 *        multiply-adds, so every ISA gives the reference's bits. The SIMD
 *        width comes from the weight rows: one lane per row, 16 rows a panel.
 *   A8   activations quantized to int8 per row on the fly (the CPU backend's
 *        choice, li_backend_cpu_set_q4_act): per (row, group) the exact
 *        integer sum_j xq[j] (q[j] - zero), then in group order
 *        acc = acc + scale * (float)isum, and y = acc * s_x, with xq and s_x
 *        those of li_act_quant_row_ref (LI_ACT_INT8). li_q4g_a8_row_ref is
 *        that definition; the integer sums make every ISA's bits equal.
 *
 * Either way a row's output depends on nothing but its own inputs: batch
 * sizes, tiles and threads never change a bit of it.
 *
 *   ops_q4g.c         packing (weight_prepare), the scalar A8 reference,
 *                     the threaded matmul driver
 *   ops_q4g_avx2.c    A16 panels (AVX2) and A8 rows (AVX2 maddubs)
 *   ops_q4g_avx512.c  A8 rows with AVX-512 VNNI (vpdpbusd)
 *   ops_q4g_amx.c     A8 on AMX tiles (12+ rows, groups of 64k codes)
 *
 * Packed form (w->packed, magic LI_Q4G_MAGIC): li_q4g_pack (at prepare)
 * checks the zero points and keeps gidx; each mode's panels are built
 * from w the first time that mode runs (li_q4g_ready), so a model run one
 * way holds one copy of its codes (then the GGUF's pages are dropped, as
 * repack.c does):
 *   codes   A16 (n_panels, k / 2, 16) byte l of pair c/2 = row 16p + l: its
 *           code of input column c in the low nibble, of c + 1 in the high
 *           (the permutation undone: A16 runs in input order)
 *   sz      A16 (n_panels, n_groups, 32) the 16 rows' scales, then zeros
 *   gidx    (k) the group of input column c (perm: stored position / gs)
 *   a8codes A8 (n_panels, a8_pb) panels of 16 rows in stored order, one
 *           stream each (decode reads nothing else of the weight): per
 *           group g its chunks t of 64 bytes, lane l (4 bytes) of a chunk
 *           holding row 16p + l's elements 8t..8t+3 in the low nibbles,
 *           8t+4..8t+7 in the high ones (one zmm for AVX-512; AVX2 reads
 *           the two 32-byte halves, 8 rows each), then 64 bytes of the 16
 *           rows' zeros as int32, then 64 of their scales. Group g starts
 *           at g * a8_gb (the last one may be shorter); the panels lie in
 *           the forward-order arena (repack.c) like the other packed
 *           weights (built in the first forward pass, so in its order), so
 *           one weight's stream runs into the next one's.
 * A8 permutes the activations into stored order instead. */
#ifndef LI_Q4G_KERNELS_H
#define LI_Q4G_KERNELS_H

#include "cpu/cpu_kernels.h" /* LI_PANEL */

#include <pthread.h>
#include <stdatomic.h>

#define LI_Q4G_MAGIC 0x4c4951344750414bull /* "LIQ4GPAK" */

typedef struct li_q4g_packed {
    uint64_t magic;
    int64_t k, m, gs, ng, n_panels; /* gs: group size (k when per channel), ng = k / gs */
    uint8_t *codes;        /* (n_panels, k / 2, 16) A16, once a16_ready */
    float *sz;             /* (n_panels, ng, 32) A16, once a16_ready */
    int32_t *gidx;         /* (k) */
    uint8_t *a8codes;      /* (n_panels, a8_pb) A8 panels of 16 rows, once a8_ready */
    void *a8chunk;         /* the arena chunk holding a8codes */
    int64_t a8_pb, a8_gb;  /* bytes per A8 panel, per full group in it: (gs / 8) * 64 + 128 */
    bool a8_simd;          /* gs and k multiples of 8: A8 panels can be built, the A8 SIMD kernels apply */
    atomic_bool a16_ready, a8_ready;
    pthread_mutex_t mu;    /* builds the panels once, whichever thread asks first */
    bool warned;           /* an out-of-memory build was logged */
} li_q4g_packed;

/* Panel pp's group g in a8codes: its code chunks, then zeros, then scales */
static inline const uint8_t *li_q4g_a8_group(const li_q4g_packed *p, int64_t pp, int64_t g) {
    return p->a8codes + pp * p->a8_pb + g * p->a8_gb;
}

static inline const li_q4g_packed *li_q4g_packed_of(const li_weight *w) {
    const li_q4g_packed *p = w->packed;
    return p && p->magic == LI_Q4G_MAGIC ? p : NULL;
}

/* One activation row for A8 (li_q4g_act_bytes(k) bytes, 64-aligned rows):
 * the int8 codes in stored order (the permutation applied), padded to 4
 * bytes; then per group the sum of its codes (int32); then s_x (f32). */
static inline size_t li_q4g_act_bytes(int64_t k, int64_t ng) {
    return ((((size_t)k + 3) & ~(size_t)3) + (size_t)ng * 4 + 4 + 63) & ~(size_t)63;
}

/* The ISA's kernels. a16: panels [p0, p1) against n f32 rows x (ldx apart),
 * y[r * ldy + i] for the valid rows i of those panels. a8: weight rows
 * [r0, r1) of w->data against n prepared activation rows. */
typedef struct li_q4g_kernels {
    const char *isa;
    void (*a16)(const li_q4g_packed *p, int64_t p0, int64_t p1, const float *x, int64_t ldx, int64_t n, float *y,
                int64_t ldy);
    void (*a8)(const li_weight *w, const li_q4g_packed *p, int64_t r0, int64_t r1, const uint8_t *act,
               size_t act_stride, int64_t n, float *y, int64_t ldy);
    /* li_q4g_act_quantize's bytes, faster (NULL: the reference runs) */
    void (*act)(const li_weight *w, const li_q4g_packed *p, const float *x, uint8_t *dst);
} li_q4g_kernels;

extern const li_q4g_kernels li_q4g_kernels_scalar; /* A16: NULL (ops_ref.c runs it); A8: the reference */
extern const li_q4g_kernels li_q4g_kernels_avx2;
extern const li_q4g_kernels li_q4g_kernels_avx512; /* A16: the AVX2 panels; A8: VNNI */
extern const li_q4g_kernels li_q4g_kernels_amx;    /* A16: the AVX2 panels; A8: AMX tiles (ops_q4g_amx.c) */
/* The AVX-512 A8 kernel (the AMX table hands it calls of few rows). */
void li_q4g_a8_avx512(const li_weight *w, const li_q4g_packed *p, int64_t r0, int64_t r1, const uint8_t *act,
                      size_t act_stride, int64_t n, float *y, int64_t ldy);
/* The AVX2 A16 kernel (the AVX-512 table shares it). */
void li_q4g_a16_avx2(const li_q4g_packed *p, int64_t p0, int64_t p1, const float *x, int64_t ldx, int64_t n,
                     float *y, int64_t ldy);
/* The table for a CPU ISA name ("scalar", "avx2", "avx512", "amx"), or NULL. */
const li_q4g_kernels *li_q4g_kernels_for(const char *isa);

/* true for weights these kernels take: U4 codes of a scheme, k even */
bool li_q4g_supported(const li_weight *w);
/* Builds w->packed (no panels yet): 0, LI_ENOMEM, or LI_EUNSUP for zero
 * points that are not integers 0..15 (codes, as GPTQ and AWQ store them:
 * A8's integer sums need them). li_q4g_pack_free undoes it. */
int li_q4g_pack(li_weight *w);
void li_q4g_pack_free(li_weight *w);
/* true once the panels of mode a8 (else A16) exist, building them if not
 * (thread-safe); false when they cannot be (out of memory, logged once;
 * A8 with k or gs not multiples of 8): the reference runs it then. */
bool li_q4g_ready(const li_weight *w, bool a8);

/* x (k, input order) -> one A8 activation row (the layout above): the
 * reference (li_act_quant_row_ref's scale and rounding), and the AVX2
 * version, which writes the same bytes (the AVX-512 table shares it). */
void li_q4g_act_quantize(const li_weight *w, const li_q4g_packed *p, const float *x, uint8_t *dst);
void li_q4g_act_quantize_avx2(const li_weight *w, const li_q4g_packed *p, const float *x, uint8_t *dst);
/* The A8 definition for weight row `row` and one prepared activation row. */
float li_q4g_a8_row_ref(const li_weight *w, const li_q4g_packed *p, int64_t row, const uint8_t *act);

struct li_threadpool;
/* Scratch the driver keeps between calls (the backend's). */
typedef struct li_q4g_scratch {
    void *buf;
    size_t cap;
} li_q4g_scratch;
void li_q4g_scratch_free(li_q4g_scratch *s);

/* y(n, m) = x(n, k) W^T with `act` LI_ACT_F32 (A16: W's own activation
 * quantization) or LI_ACT_INT8 (A8), then res += y when res is not NULL,
 * over nth threads of tp. */
void li_q4g_matmul(const li_q4g_kernels *kern, struct li_threadpool *tp, int nth, li_q4g_scratch *s,
                   const li_weight *w, li_act_quant act, const float *x, float *y, float *res, int64_t n);

/* Weights that share an input as one A8 job (q/k/v, gate/up): one
 * activation quantization and one dispatch; every output has the bits of
 * li_q4g_matmul. li_q4g_same_job: true when w[0..n_w) can (A8 asked for,
 * every one packed with f32 activations, one k, group size and perm). */
#define LI_Q4G_MAX_PARTS 4
bool li_q4g_same_job(const li_q4g_kernels *kern, li_act_quant act, const li_weight *const *w, int n_w);
void li_q4g_matmul_multi(const li_q4g_kernels *kern, struct li_threadpool *tp, int nth, li_q4g_scratch *s,
                         const li_weight *const *w, int n_w, const float *x, float *const *y, int64_t n);

#endif
