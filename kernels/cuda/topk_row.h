/* topk_row.h — a row's k largest values (backend.h's topk): the phases of
 * backend_cuda.cu's k_topk, written once for the device and the host.
 *
 * A block takes a row. A radix select finds the k-th largest key, 8 bits a
 * pass from the top (a shared histogram of the keys that match the prefix
 * so far, then the bin where the count from the top reaches k). Every key
 * above it is kept, and of those equal to it the first in index order:
 * each thread counts its contiguous chunk, thread 0 scans the counts in
 * thread (so index) order, and each thread gathers its chunk. Thread 0
 * sorts the k by value descending, then id. -0 counts as +0; a NaN is
 * skipped and flags the row (ids[0] = -1).
 *
 * The kernel runs these phases with a barrier between them;
 * test_cuda_math runs the very same phases on the CPU, every thread of a
 * phase in turn, against a full sort. Plain C, as cuda_math.h. */
#ifndef LI_TOPK_ROW_H
#define LI_TOPK_ROW_H

#include "cuda_math.h"

enum { TK_THREADS = 256, TK_MAX = 64 }; /* a block's threads; LI_TOPK_MAX */

typedef struct li_tk_shared {
    uint32_t hist[256];
    uint32_t prefix, mask; /* the k-th largest key's bits found so far */
    int rem, nan;          /* of the keys matching prefix, the rank sought; a NaN seen */
    int cg[TK_THREADS], ce[TK_THREADS]; /* each thread's keys above and equal, then their scans */
    float val[TK_MAX];
    int id[TK_MAX];
} li_tk_shared;

/* a float's order as an unsigned key, ascending (-0 as +0) */
LI_HD uint32_t li_tk_key(float f) {
    const uint32_t u = li_cu_u32(f == 0.0f ? 0.0f : f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

LI_HD int li_tk_before(float av, int ai, float bv, int bi) { return av > bv || (av == bv && ai < bi); }

#ifdef __CUDA_ARCH__
#define LI_TK_ADD(p, v) atomicAdd((p), (v))
#else
#define LI_TK_ADD(p, v) (*(p) += (v))
#endif

/* thread 0 */
LI_HD void li_tk_init(li_tk_shared *sh, int k) {
    sh->prefix = 0;
    sh->mask = 0;
    sh->rem = k;
    sh->nan = 0;
}

/* every thread: the histogram cleared */
LI_HD void li_tk_clear(li_tk_shared *sh, int t, int nt) {
    for (int b = t; b < 256; b += nt) sh->hist[b] = 0;
}

/* every thread: its stride's keys that match the prefix, counted by their
 * bits at shift */
LI_HD void li_tk_count(li_tk_shared *sh, const float *row, int64_t dim, int shift, int t, int nt) {
    const uint32_t prefix = sh->prefix, mask = sh->mask;
    for (int64_t j = t; j < dim; j += nt) {
        const float v = row[j];
        if (v != v) {
            sh->nan = 1;
            continue;
        }
        const uint32_t key = li_tk_key(v);
        if ((key & mask) == prefix) LI_TK_ADD(&sh->hist[(key >> shift) & 255u], 1u);
    }
}

/* thread 0: the bin holding the rem-th largest, from the top */
LI_HD void li_tk_pick(li_tk_shared *sh, int shift) {
    uint32_t cum = 0;
    for (int b = 255; b >= 0; b--) {
        if (cum + sh->hist[b] >= (uint32_t)sh->rem) {
            sh->prefix |= (uint32_t)b << shift;
            sh->mask |= 255u << shift;
            sh->rem -= (int)cum;
            return;
        }
        cum += sh->hist[b];
    }
}

/* thread t's contiguous chunk of the row */
LI_HD void li_tk_chunk(int64_t dim, int t, int nt, int64_t *lo, int64_t *hi) {
    const int64_t per = (dim + nt - 1) / nt;
    *lo = t * per;
    *hi = *lo + per < dim ? *lo + per : dim;
    if (*lo > dim) *lo = dim;
}

/* every thread: its chunk's keys above and equal to the k-th largest */
LI_HD void li_tk_tally(li_tk_shared *sh, const float *row, int64_t dim, int t, int nt) {
    int64_t lo, hi;
    li_tk_chunk(dim, t, nt, &lo, &hi);
    int g = 0, e = 0;
    for (int64_t j = lo; j < hi; j++) {
        const float v = row[j];
        if (v != v) continue;
        const uint32_t key = li_tk_key(v);
        g += key > sh->prefix;
        e += key == sh->prefix;
    }
    sh->cg[t] = g;
    sh->ce[t] = e;
}

/* thread 0: exclusive scans of the tallies, in thread (so index) order */
LI_HD void li_tk_scan(li_tk_shared *sh, int nt) {
    int a = 0, b = 0;
    for (int i = 0; i < nt; i++) {
        const int g = sh->cg[i], e = sh->ce[i];
        sh->cg[i] = a;
        sh->ce[i] = b;
        a += g;
        b += e;
    }
}

/* every thread: its chunk's kept values to their places (those above
 * first, then the first rem equal ones) */
LI_HD void li_tk_gather(li_tk_shared *sh, const float *row, int64_t dim, int k, int t, int nt) {
    const uint32_t T = sh->prefix;
    const int take_eq = sh->rem, n_gt = k - take_eq;
    int64_t lo, hi;
    li_tk_chunk(dim, t, nt, &lo, &hi);
    int pg = sh->cg[t], pe = sh->ce[t];
    for (int64_t j = lo; j < hi; j++) {
        const float v = row[j];
        if (v != v) continue;
        const uint32_t key = li_tk_key(v);
        if (key > T) {
            if (pg < k) { /* always, but with a NaN row's broken select */
                sh->val[pg] = v;
                sh->id[pg] = (int)j;
            }
            pg++;
        } else if (key == T) {
            if (pe < take_eq) {
                sh->val[n_gt + pe] = v;
                sh->id[n_gt + pe] = (int)j;
            }
            pe++;
        }
    }
}

/* thread 0: insertion sort of the k, value descending, then id */
LI_HD void li_tk_sort(li_tk_shared *sh, int k) {
    for (int i = 1; i < k; i++) {
        const float v = sh->val[i];
        const int id = sh->id[i];
        int j = i - 1;
        while (j >= 0 && li_tk_before(v, id, sh->val[j], sh->id[j])) {
            sh->val[j + 1] = sh->val[j];
            sh->id[j + 1] = sh->id[j];
            j--;
        }
        sh->val[j + 1] = v;
        sh->id[j + 1] = id;
    }
}

/* every thread: the row's k out (ids[0] = -1 for a row with a NaN) */
LI_HD void li_tk_store(const li_tk_shared *sh, int k, float *vals, int32_t *ids, int t, int nt) {
    for (int i = t; i < k; i += nt) {
        vals[i] = sh->val[i];
        ids[i] = i == 0 && sh->nan ? -1 : sh->id[i];
    }
}

#endif
