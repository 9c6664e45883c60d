/* train_mm.c — the matmuls of training, split over the thread pool:
 * y = x·W^T (forward), dX = dY·W and dW = dY^T·X (backward), all three one
 * packed GEMM C (+)= A·B with A and B read through strides (no transposed
 * copies). Blocks of A (MC x KC) and B (KC x NC) are packed into panels of
 * MR rows and NR columns, contiguous along k, and a register-blocked
 * MR x NR micro-kernel (train_mm_avx2.c, train_mm_avx512.c; chosen by
 * CPUID) runs over them. Each element of C is one chain of FMAs in k
 * order, whatever the blocks or the thread count: the result has the same
 * bits on 1 or N threads and with either SIMD kernel. The scalar
 * references stay for the tests and the CPUs without FMA. */
#include "train/train_internal.h"
#include "cpu/threadpool.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* ==== scalar references ==================================================== */

void li_train_mm_nt_ref(const float *x, const float *W, float *y, int64_t n, int64_t m, int64_t k, int64_t j0,
                        int64_t j1) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = j0; j < j1; j++) {
            float s = 0;
            for (int64_t l = 0; l < k; l++) s += x[i * k + l] * W[j * k + l];
            y[i * m + j] = s;
        }
}

void li_train_mm_acc_ref(const float *A, int64_t sa_r, int64_t sa_l, const float *B, float *C, int64_t Lk,
                         int64_t K, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    for (int64_t r = r0; r < r1; r++)
        for (int64_t l = 0; l < Lk; l++) {
            const float a = A[r * sa_r + l * sa_l];
            for (int64_t j = c0; j < c1; j++) C[r * K + j] += a * B[l * K + j];
        }
}

/* ==== dispatch ============================================================= */

static int mm_isa = -1; /* -1: not chosen yet */

static int mm_isa_best(void) {
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return 0;
    return __builtin_cpu_supports("avx512f") ? 2 : 1;
}

int li_train_mm_set_isa(int isa) {
    const int prev = mm_isa < 0 ? mm_isa_best() : mm_isa;
    mm_isa = LI_MAX(0, LI_MIN(isa, mm_isa_best()));
    return prev;
}

static int mm_isa_get(void) {
    if (mm_isa < 0) mm_isa = mm_isa_best();
    return mm_isa;
}

int li_train_isa(void) { return mm_isa_get(); }

/* ==== packed GEMM ========================================================== */

#define KC 256 /* k per pass: an NR-wide B panel (32 KB at NR 32) stays in L1 */
#define MC 256 /* rows of A per block: MC x KC (256 KB) stays in L2; a step of 256 tokens is one block,
                 so the weights (B) are packed once a pass, not once per 128 rows (128: 6% slower) */
#define A_KEEP_FLOATS (2 << 20) /* a thread keeps a row block's packed A over every k pass up to this size */
#define NC_MAX 512

typedef void (*mm_kern)(int64_t kc, const float *Ap, const float *Bp, float *C, int64_t ldc, int load);

typedef struct gemm_job {
    int64_t M, N, K;
    const float *A, *B;
    int64_t sa_r, sa_c, sb_r, sb_c;
    float *C;
    int64_t ldc;
    int acc;            /* 1: C += A·B; 0: C = A·B */
    int mr, nr;
    mm_kern kern;
    int64_t nc, n_mb, n_cb, n_jobs; /* column width; row and column blocks; n_mb x n_cb jobs */
    int keep_a;         /* a thread's packed A of a row block serves all its jobs on that block */
    size_t na;          /* floats of a thread's A panels: (MC + 16) x KC, each k pass's with keep_a */
    atomic_long next;
} gemm_job;

/* Ap[p][l][r] = A(i0 + p·mr + r, l0 + l), rows past M zero: each panel is
 * the mr values a k step broadcasts, in order */
static void pack_a(const gemm_job *g, float *Ap, int64_t i0, int64_t mc, int64_t l0, int64_t kc) {
    const int mr = g->mr;
    for (int64_t p = 0; p < mc; p += mr) {
        float *dst = Ap + p * kc;
        const int rn = (int)LI_MIN((int64_t)mr, mc - p);
        if (g->sa_c == 1) { /* rows contiguous along k: read along k */
            for (int r = 0; r < rn; r++) {
                const float *src = g->A + (i0 + p + r) * g->sa_r + l0;
                for (int64_t l = 0; l < kc; l++) dst[l * mr + r] = src[l];
            }
        } else {
            for (int64_t l = 0; l < kc; l++) {
                const float *src = g->A + (i0 + p) * g->sa_r + (l0 + l) * g->sa_c;
                for (int r = 0; r < rn; r++) dst[l * mr + r] = src[r * g->sa_r];
            }
        }
        if (rn < mr)
            for (int64_t l = 0; l < kc; l++)
                for (int r = rn; r < mr; r++) dst[l * mr + r] = 0;
    }
}

/* Bp[q][l][c] = B(l0 + l, j0 + q·nr + c), columns past N zero */
static void pack_b(const gemm_job *g, float *Bp, int64_t j0, int64_t nc, int64_t l0, int64_t kc) {
    const int nr = g->nr;
    for (int64_t q = 0; q < nc; q += nr) {
        float *dst = Bp + q * kc;
        const int cn = (int)LI_MIN((int64_t)nr, nc - q);
        if (g->sb_c == 1) {
            for (int64_t l = 0; l < kc; l++) {
                const float *src = g->B + (l0 + l) * g->sb_r + j0 + q;
                memcpy(dst + l * nr, src, (size_t)cn * sizeof(float));
                for (int c = cn; c < nr; c++) dst[l * nr + c] = 0;
            }
        } else if (g->sb_r == 1) { /* W^T: columns contiguous along k */
            li_train_mm_pack_bt_avx2(g->B + l0 + (j0 + q) * g->sb_c, g->sb_c, dst, nr, cn, kc);
        } else {
            for (int c = 0; c < cn; c++) {
                const float *src = g->B + (l0) * g->sb_r + (j0 + q + c) * g->sb_c;
                for (int64_t l = 0; l < kc; l++) dst[l * nr + c] = src[l * g->sb_r];
            }
            for (int64_t l = 0; l < kc; l++)
                for (int c = cn; c < nr; c++) dst[l * nr + c] = 0;
        }
    }
}

/* one MC x NC block of C, every k pass. With g->keep_a, Ap holds the row
 * block's A for every pass ((MC + 16) x KC floats each), packed already
 * when a_ready: a step's tokens are one row block that every column block
 * of the weights reads, and a thread packs them once, not once per column
 * block (the same panels either way, so the same bits). */
static void gemm_block(const gemm_job *g, float *Ap, float *Bp, int64_t i0, int64_t j0, bool a_ready) {
    const int mr = g->mr, nr = g->nr;
    const int64_t mc = LI_MIN(MC, g->M - i0), nc = LI_MIN(g->nc, g->N - j0);
    float tile[16 * 64];
    for (int64_t l0 = 0; l0 < g->K; l0 += KC) {
        const int64_t kc = LI_MIN(KC, g->K - l0);
        const int load = g->acc || l0 > 0;
        float *Al = g->keep_a ? Ap + (l0 / KC) * (MC + 16) * KC : Ap; /* this pass's A */
        if (!a_ready) pack_a(g, Al, i0, mc, l0, kc);
        pack_b(g, Bp, j0, nc, l0, kc);
        for (int64_t q = 0; q < nc; q += nr) {
            const int cn = (int)LI_MIN((int64_t)nr, nc - q);
            for (int64_t p = 0; p < mc; p += mr) {
                const int rn = (int)LI_MIN((int64_t)mr, mc - p);
                float *c = g->C + (i0 + p) * g->ldc + j0 + q;
                if (rn == mr && cn == nr) {
                    g->kern(kc, Al + p * kc, Bp + q * kc, c, g->ldc, load);
                    continue;
                }
                /* edge: through a full tile, only the valid part copied */
                if (load)
                    for (int r = 0; r < rn; r++) memcpy(tile + r * nr, c + r * g->ldc, (size_t)cn * sizeof(float));
                g->kern(kc, Al + p * kc, Bp + q * kc, tile, nr, load);
                for (int r = 0; r < rn; r++) memcpy(c + r * g->ldc, tile + r * nr, (size_t)cn * sizeof(float));
            }
        }
    }
}

/* Pack buffers kept between calls: a step makes ~600 GEMM calls, and a
 * fresh 0.7 MB buffer each time came back from the kernel as new pages
 * (page faults were ~4% of a step). A thread takes a free slot, grows its
 * buffer if needed and hands it back; the slots are static, so the
 * buffers stay reachable (no leak report) and live until exit. */
#define N_SLOTS 64
static struct pack_slot {
    atomic_int busy;
    float *buf;
    size_t cap; /* floats */
} slots[N_SLOTS];

static float *slot_get(size_t n, int *id) {
    for (int i = 0; i < N_SLOTS; i++)
        if (!atomic_exchange(&slots[i].busy, 1)) {
            if (slots[i].cap < n) {
                li_aligned_free(slots[i].buf);
                slots[i].buf = li_aligned_alloc(n * sizeof(float)); /* stops with a message when out */
                slots[i].cap = n;
            }
            *id = i;
            return slots[i].buf;
        }
    *id = -1; /* more threads than slots: a buffer of its own */
    return li_aligned_alloc(n * sizeof(float));
}

static void slot_put(int id, float *buf) {
    if (id < 0) li_aligned_free(buf);
    else atomic_store(&slots[id].busy, 0);
}

static void gemm_run(void *ctx, int ith, int nth) {
    (void)ith, (void)nth;
    gemm_job *g = ctx;
    float *buf = NULL;
    int id = -1;
    int64_t have = -1; /* the row block whose A the buffer holds (keep_a) */
    for (;;) {
        const long t = atomic_fetch_add(&g->next, 1);
        if (t >= g->n_jobs) break;
        /* 64-byte aligned panels (the kernels' B loads are whole lines): A's, then B's */
        if (!buf) buf = slot_get(g->na + (size_t)((g->nc + 32) * KC), &id);
        /* a row block's jobs in a run, so a thread's next job mostly reads the same A */
        const int64_t ib = t / g->n_cb;
        gemm_block(g, buf, buf + g->na, ib * MC, (t % g->n_cb) * g->nc, g->keep_a && ib == have);
        have = ib;
    }
    if (buf) slot_put(id, buf);
}

/* C(M, N) (+)= A(M, K)·B(K, N); A(i, l) = A[i·sa_r + l·sa_c], B(l, j) = B[l·sb_r + j·sb_c] */
static void gemm(li_threadpool *tp, int isa, int64_t M, int64_t N, int64_t K, const float *A, int64_t sa_r,
                 int64_t sa_c, const float *B, int64_t sb_r, int64_t sb_c, float *C, int64_t ldc, int acc) {
    gemm_job g = {.M = M, .N = N, .K = K, .A = A, .B = B, .sa_r = sa_r, .sa_c = sa_c, .sb_r = sb_r, .sb_c = sb_c,
                  .C = C, .ldc = ldc, .acc = acc};
    if (isa == 2) g.mr = LI_TRAIN_MR512, g.nr = LI_TRAIN_NR512, g.kern = li_train_mm_kern_avx512;
    else g.mr = LI_TRAIN_MR256, g.nr = LI_TRAIN_NR256, g.kern = li_train_mm_kern_avx2;
    const int nth = tp ? li_threadpool_size(tp) : 1;
    g.n_mb = (M + MC - 1) / MC;
    /* column blocks: NC_MAX, or narrower so that every thread gets about
     * four jobs (a skinny C, such as dX of the head, has few rows) */
    const int64_t want = LI_MAX((int64_t)1, 4 * nth / g.n_mb);
    int64_t nc = (N + want - 1) / want;
    nc = LI_MIN(NC_MAX, LI_MAX((int64_t)g.nr, (nc + g.nr - 1) / g.nr * g.nr));
    g.nc = nc;
    g.n_cb = (N + nc - 1) / nc;
    g.n_jobs = g.n_mb * g.n_cb;
    const int64_t passes = (K + KC - 1) / KC;
    g.keep_a = (MC + 16) * KC * passes <= A_KEEP_FLOATS;
    g.na = (size_t)((MC + 16) * KC * (g.keep_a ? passes : 1));
    atomic_init(&g.next, 0);
    if (tp && g.n_jobs > 1) /* timed per multiply-add, skinny products apart */
        li_threadpool_run_shaped(tp, gemm_run, &g, (int)LI_MIN((int64_t)nth, g.n_jobs), M * N * K,
                                 li_threadpool_rows_shape(0, LI_MIN(M, N)));
    else gemm_run(&g, 0, 1);
}

/* ==== scalar drivers ======================================================= */

#define NT_TILE 8    /* W rows per job: 8 x k floats stay in L1 */
#define ACC_RT 64    /* C rows per job */
#define ACC_CT 64    /* C columns per job */

typedef struct mm_job {
    const float *x, *W, *A, *B;
    float *y, *C;
    int64_t n, m, k, sa_r, sa_l, R, Lk, K, n_ct;
    int64_t n_jobs;
    atomic_long next;
} mm_job;

static void nt_run(void *ctx, int ith, int nth) {
    (void)ith, (void)nth;
    mm_job *j = ctx;
    for (;;) {
        const long t = atomic_fetch_add(&j->next, 1);
        if (t >= j->n_jobs) break;
        const int64_t j0 = t * NT_TILE, j1 = LI_MIN(j->m, j0 + NT_TILE);
        li_train_mm_nt_ref(j->x, j->W, j->y, j->n, j->m, j->k, j0, j1);
    }
}

static void acc_run(void *ctx, int ith, int nth) {
    (void)ith, (void)nth;
    mm_job *j = ctx;
    for (;;) {
        const long t = atomic_fetch_add(&j->next, 1);
        if (t >= j->n_jobs) break;
        const int64_t r0 = (t / j->n_ct) * ACC_RT, c0 = (t % j->n_ct) * ACC_CT;
        const int64_t r1 = LI_MIN(j->R, r0 + ACC_RT), c1 = LI_MIN(j->K, c0 + ACC_CT);
        li_train_mm_acc_ref(j->A, j->sa_r, j->sa_l, j->B, j->C, j->Lk, j->K, r0, r1, c0, c1);
    }
}

static void mm_launch(li_threadpool *tp, li_threadpool_fn fn, mm_job *j) {
    if (tp && j->n_jobs > 1)
        li_threadpool_run_sized(tp, fn, j, (int)LI_MIN((int64_t)li_threadpool_size(tp), j->n_jobs), j->n_jobs);
    else fn(j, 0, 1);
}

/* ==== the two entry points ================================================= */

void li_train_mm_nt(li_threadpool *tp, const float *x, const float *W, float *y, int64_t n, int64_t m,
                    int64_t k) {
    if (n <= 0 || m <= 0) return;
    const int isa = mm_isa_get();
    if (isa && k > 0) {
        /* B(l, j) = W(j, l) */
        gemm(tp, isa, n, m, k, x, k, 1, W, 1, k, y, m, 0);
        return;
    }
    mm_job j = {.x = x, .W = W, .y = y, .n = n, .m = m, .k = k, .n_jobs = (m + NT_TILE - 1) / NT_TILE};
    atomic_init(&j.next, 0);
    mm_launch(tp, nt_run, &j);
}

void li_train_mm_acc(li_threadpool *tp, const float *A, int64_t sa_r, int64_t sa_l, const float *B, float *C,
                     int64_t R, int64_t Lk, int64_t K) {
    if (R <= 0 || K <= 0 || Lk <= 0) return;
    const int isa = mm_isa_get();
    if (isa) {
        gemm(tp, isa, R, K, Lk, A, sa_r, sa_l, B, K, 1, C, K, 1);
        return;
    }
    const int64_t n_ct = (K + ACC_CT - 1) / ACC_CT;
    mm_job j = {.A = A, .B = B, .C = C, .sa_r = sa_r, .sa_l = sa_l, .R = R, .Lk = Lk, .K = K, .n_ct = n_ct,
                .n_jobs = ((R + ACC_RT - 1) / ACC_RT) * n_ct};
    atomic_init(&j.next, 0);
    mm_launch(tp, acc_run, &j);
}
