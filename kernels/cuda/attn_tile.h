/* attn_tile.h — tiled causal attention over the paged KV for prefills:
 * the phases of a thread block written once, for the device and the host.
 *
 * k_attention reads a token's keys and values once per (token, head): a
 * 512-token prefill reads each key ~256 times a head. Here a block takes a
 * tile of consecutive tokens and one kv head, with every query head of that
 * kv head (AT_ROWS rows of (token, head)); the tile's runs of one sequence
 * (segments) go in turn. A segment's keys and values come through shared
 * memory AT_KEYS positions at a time, shared by all its rows: scores, an
 * online softmax per row, and the weighted values added to accumulators
 * each thread keeps for 4 rows x 8 columns (strided by 8).
 *
 * backend_cuda.cu's k_attn_tile runs these phases with a barrier between
 * them; test_cuda_math runs the very same phases on the CPU, every thread
 * of a phase in turn (what the barriers allow), against the reference op.
 * A row's arithmetic does not depend on the other rows of its tile (a key
 * tile past a row's position leaves its state as it was), so a token's
 * output is the same in any batch. Plain C, as cuda_math.h. */
#ifndef LI_ATTN_TILE_H
#define LI_ATTN_TILE_H

#include "cuda_math.h"

#ifdef __CUDA_ARCH__ /* the device pass: the accumulators stay in registers */
#define LI_AT_UNROLL _Pragma("unroll")
#else
#define LI_AT_UNROLL
#endif

enum {
    AT_THREADS = 128, /* a block's threads: 16 groups of 4 rows x 8 lanes */
    AT_ROWS = 64,     /* (token, head) rows a block holds */
    AT_KEYS = 32,     /* positions a key tile holds: 8 lanes x 4 */
    AT_MAXD = 64,     /* head_dim at most (8 lanes x 8 columns) */
    AT_ACC = 32,      /* a thread's accumulators: 4 rows x 8 columns */
};

typedef struct li_at_args {
    const float *q;                 /* (n_tokens, n_head, D) */
    float *out;                     /* (n_tokens, n_head, D) */
    const int32_t *pos, *seq, *bt;  /* as li_attn_args */
    int64_t bt_stride, n_tokens;
    const void *k, *v;              /* the layer's paged KV, type dt */
    const float *k_scale, *v_scale; /* 8-bit KV: per (slot, kv head) */
    int n_head, n_head_kv, D, bs, dt;
    float scale;
} li_at_args;

/* Rows padded by one word: the rows a warp reads at once (4 apart, or 8
 * consecutive) then fall in different banks. A thread's keys and columns
 * are interleaved with its neighbours' (j = 8 jj + lane group, column
 * 8 cc + lane group) for the same reason. */
typedef struct li_at_shared {
    float q[AT_ROWS][AT_MAXD + 1]; /* the segment's queries; at the end its outputs */
    float k[AT_KEYS][AT_MAXD + 1]; /* the key tile, as f32 codes (scales apart) */
    float v[AT_KEYS][AT_MAXD + 1];
    float p[AT_ROWS][AT_KEYS + 1]; /* scores, then weights (times the value scale) */
    float ksc[AT_KEYS], vsc[AT_KEYS];
    float m[AT_ROWS], l[AT_ROWS], corr[AT_ROWS];
    int32_t rpos[AT_ROWS];     /* each row's position, -1 past the segment */
    int64_t tok0;              /* the segment: its first token, rows, sequence, last position */
    int32_t nrow, seq, maxpos;
} li_at_shared;

/* tokens a tile holds: AT_ROWS rows over the query heads of a kv head */
LI_HD int li_at_tile_tokens(int n_head, int n_head_kv) { return AT_ROWS / (n_head / n_head_kv); }

/* whether the tiled kernel takes these shapes */
LI_HD int li_at_fits(int n_head, int n_head_kv, int head_dim) {
    return n_head_kv > 0 && n_head % n_head_kv == 0 && n_head / n_head_kv <= AT_ROWS && head_dim <= AT_MAXD &&
           head_dim > 0;
}

LI_HD float li_at_kv(int dt, const void *base, int64_t idx) {
    if (dt == LI_TYPE_F32) return ((const float *)base)[idx];
    if (dt == LI_TYPE_F16) return li_cu_fp16_to_f32(((const uint16_t *)base)[idx]);
    if (dt == LI_TYPE_BF16) return li_cu_bf16_to_f32(((const uint16_t *)base)[idx]);
    return li_cu_kv8_value(dt, ((const uint8_t *)base)[idx]);
}

/* thread 0: the segment from token cur: the run of cur's sequence up to end */
LI_HD void li_at_segment(const li_at_args *a, li_at_shared *sh, int64_t cur, int64_t end) {
    const int g = a->n_head / a->n_head_kv;
    const int32_t s = a->seq[cur];
    int64_t e = cur;
    int32_t mp = 0;
    while (e < end && a->seq[e] == s) {
        mp = a->pos[e] > mp ? a->pos[e] : mp;
        e++;
    }
    sh->tok0 = cur;
    sh->nrow = (int32_t)(e - cur) * g;
    sh->seq = s;
    sh->maxpos = mp;
}

/* every thread: the segment's queries; the rows' state; o zeroed */
LI_HD void li_at_load_q(const li_at_args *a, li_at_shared *sh, int t, int kvh, float *o) {
    const int g = a->n_head / a->n_head_kv, D = a->D;
    for (int idx = t; idx < AT_ROWS * AT_MAXD; idx += AT_THREADS) {
        const int r = idx / AT_MAXD, d = idx % AT_MAXD;
        float x = 0.0f;
        if (r < sh->nrow && d < D) x = a->q[((sh->tok0 + r / g) * a->n_head + kvh * g + r % g) * D + d];
        sh->q[r][d] = x;
    }
    if (t < AT_ROWS) {
        sh->m[t] = -INFINITY;
        sh->l[t] = 0.0f;
        sh->rpos[t] = t < sh->nrow ? a->pos[sh->tok0 + t / g] : -1;
    }
    LI_AT_UNROLL
    for (int i = 0; i < AT_ACC; i++) o[i] = 0.0f;
}

/* every thread: positions p0 .. p0 + AT_KEYS - 1 of the segment's keys and
 * values (zeros past its last position) */
LI_HD void li_at_load_kv(const li_at_args *a, li_at_shared *sh, int t, int kvh, int32_t p0) {
    const int D = a->D;
    for (int idx = t; idx < AT_KEYS * AT_MAXD; idx += AT_THREADS) {
        const int j = idx / AT_MAXD, d = idx % AT_MAXD;
        const int32_t p = p0 + j;
        float kx = 0.0f, vx = 0.0f, ks = 1.0f, vs = 1.0f;
        if (p <= sh->maxpos && d < D) {
            const int64_t slot = (int64_t)a->bt[(int64_t)sh->seq * a->bt_stride + p / a->bs] * a->bs + p % a->bs;
            const int64_t e = slot * a->n_head_kv + kvh; /* (slot, kv head) */
            kx = li_at_kv(a->dt, a->k, e * D + d);
            vx = li_at_kv(a->dt, a->v, e * D + d);
            if (a->k_scale) ks = a->k_scale[e], vs = a->v_scale[e];
        }
        sh->k[j][d] = kx;
        sh->v[j][d] = vx;
        if (d == 0) sh->ksc[j] = ks, sh->vsc[j] = vs;
    }
}

/* every thread: the scores of its 4 rows x 4 keys, -inf where masked
 * (each a dot product over d in order; the 16 share one pass over d) */
LI_HD void li_at_scores(const li_at_args *a, li_at_shared *sh, int t, int32_t p0) {
    const int rg = t / 8, cg = t % 8, D = a->D;
    float s[4][4];
    LI_AT_UNROLL
    for (int rr = 0; rr < 4; rr++) {
        LI_AT_UNROLL
        for (int jj = 0; jj < 4; jj++) s[rr][jj] = 0.0f;
    }
    for (int d = 0; d < D; d++) {
        float qv[4], kv[4];
        LI_AT_UNROLL
        for (int i = 0; i < 4; i++) qv[i] = sh->q[rg * 4 + i][d], kv[i] = sh->k[i * 8 + cg][d];
        LI_AT_UNROLL
        for (int rr = 0; rr < 4; rr++) {
            LI_AT_UNROLL
            for (int jj = 0; jj < 4; jj++) s[rr][jj] += qv[rr] * kv[jj];
        }
    }
    LI_AT_UNROLL
    for (int rr = 0; rr < 4; rr++) {
        const int r = rg * 4 + rr;
        LI_AT_UNROLL
        for (int jj = 0; jj < 4; jj++) {
            const int j = jj * 8 + cg;
            const float x = a->k_scale ? s[rr][jj] * sh->ksc[j] * a->scale : s[rr][jj] * a->scale; /* the reference's order */
            sh->p[r][j] = sh->rpos[r] >= 0 && p0 + j <= sh->rpos[r] ? x : -INFINITY;
        }
    }
}

/* threads below AT_ROWS: row t's online softmax over the tile's scores */
LI_HD void li_at_softmax(const li_at_args *a, li_at_shared *sh, int t) {
    if (t >= AT_ROWS) return;
    float mx = -INFINITY;
    for (int j = 0; j < AT_KEYS; j++) mx = sh->p[t][j] > mx ? sh->p[t][j] : mx;
    const float m_new = sh->m[t] > mx ? sh->m[t] : mx;
    if (m_new == -INFINITY) { /* no position of this row yet: nothing to add */
        sh->corr[t] = 1.0f;
        for (int j = 0; j < AT_KEYS; j++) sh->p[t][j] = 0.0f;
        return;
    }
    const float corr = expf(sh->m[t] - m_new);
    float sum = 0.0f;
    for (int j = 0; j < AT_KEYS; j++) {
        const float w = expf(sh->p[t][j] - m_new); /* 0 where masked */
        sum += w;
        sh->p[t][j] = a->v_scale ? w * sh->vsc[j] : w;
    }
    sh->l[t] = sh->l[t] * corr + sum;
    sh->m[t] = m_new;
    sh->corr[t] = corr;
}

/* every thread: its 4 rows x 8 columns of accumulator, rescaled, plus the
 * tile's weighted values (each in key order; the 32 share one pass over
 * the keys) */
LI_HD void li_at_pv(li_at_shared *sh, int t, float *o) {
    const int rg = t / 8, cg = t % 8;
    LI_AT_UNROLL
    for (int rr = 0; rr < 4; rr++) {
        const float c = sh->corr[rg * 4 + rr];
        LI_AT_UNROLL
        for (int cc = 0; cc < 8; cc++) o[rr * 8 + cc] *= c;
    }
    for (int j = 0; j < AT_KEYS; j++) {
        float pv[4], vv[8];
        LI_AT_UNROLL
        for (int rr = 0; rr < 4; rr++) pv[rr] = sh->p[rg * 4 + rr][j];
        LI_AT_UNROLL
        for (int cc = 0; cc < 8; cc++) vv[cc] = sh->v[j][cc * 8 + cg];
        LI_AT_UNROLL
        for (int rr = 0; rr < 4; rr++) {
            LI_AT_UNROLL
            for (int cc = 0; cc < 8; cc++) o[rr * 8 + cc] += pv[rr] * vv[cc];
        }
    }
}

/* every thread: its outputs o / l into sh->q (the queries are done with) */
LI_HD void li_at_finish(li_at_shared *sh, int t, const float *o) {
    const int rg = t / 8, cg = t % 8;
    LI_AT_UNROLL
    for (int rr = 0; rr < 4; rr++) {
        const int r = rg * 4 + rr;
        LI_AT_UNROLL
        for (int cc = 0; cc < 8; cc++)
            sh->q[r][cc * 8 + cg] = r < sh->nrow ? o[rr * 8 + cc] / sh->l[r] : 0.0f;
    }
}

/* the flat index of row r, column d of the output */
LI_HD int64_t li_at_out_index(const li_at_args *a, const li_at_shared *sh, int kvh, int r, int d) {
    const int g = a->n_head / a->n_head_kv;
    return ((sh->tok0 + r / g) * a->n_head + kvh * g + r % g) * a->D + d;
}

/* every thread: the segment's outputs to out */
LI_HD void li_at_put(const li_at_args *a, const li_at_shared *sh, int t, int kvh) {
    for (int idx = t; idx < sh->nrow * a->D; idx += AT_THREADS) {
        const int r = idx / a->D, d = idx % a->D;
        a->out[li_at_out_index(a, sh, kvh, r, d)] = sh->q[r][d];
    }
}

#endif
