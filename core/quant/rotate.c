/* rotate.c — the rotated F32 model (rotate.h). Owns: the Hadamard
 * constructions (Paley's H_12, Sylvester's by the fast transform), the sign
 * stream, and which weight gets which side of Q. */
#define _GNU_SOURCE
#include "quant/rotate.h"
#include "quant/quant4_internal.h"
#include "model/gguf_write.h"
#include "model/model.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------
 * the matrices
 * ---------------------------------------------------------------------- */

/* Paley's construction I for q = 11 (q = 3 mod 4): H = I + S, S the skew
 * Jacobsthal matrix bordered by ones; a +-1 matrix with H H^T = 12 I. */
static double paley12[12][12];

static void paley12_init(void) {
    if (paley12[0][0] != 0) return;
    int chi[11] = {0};
    for (int a = 1; a < 11; a++) chi[a] = -1;
    for (int a = 1; a < 11; a++) chi[(a * a) % 11] = 1;
    for (int i = 0; i < 12; i++)
        for (int j = 0; j < 12; j++) {
            double v;
            if (i == 0) v = j == 0 ? 0 : 1;
            else if (j == 0) v = -1;
            else v = chi[((j - 1) - (i - 1) + 11) % 11];
            paley12[i][j] = v + (i == j);
        }
}

int li_rot_factor(int64_t n, int *n12, int64_t *p2) {
    int a = 0;
    if (n <= 0) return -1;
    while (n % 12 == 0) n /= 12, a++;
    if (n & (n - 1)) return -1;
    *n12 = a;
    *p2 = n;
    return 0;
}

/* Sylvester's H_len (len a power of two) on len elements `stride` apart */
static void fwht_strided(double *v, int64_t len, int64_t stride) {
    for (int64_t h = 1; h < len; h *= 2)
        for (int64_t i = 0; i < len; i += 2 * h)
            for (int64_t j = i; j < i + h; j++) {
                const double a = v[j * stride], c = v[(j + h) * stride];
                v[j * stride] = a + c;
                v[(j + h) * stride] = a - c;
            }
}

LI_HOT_CLONES void li_rot_apply(double *v, const double *s, int64_t n, double *tmp) {
    int n12;
    int64_t p2;
    if (li_rot_factor(n, &n12, &p2)) abort(); /* the callers checked n */
    paley12_init();
    for (int64_t j = 0; j < n; j++) v[j] *= s[j];
    /* index (i_1, .., i_n12, r): the H_12 factors outermost, the power of two innermost */
    int64_t inner = n / 12; /* the stride of the factor being applied */
    for (int f = 0; f < n12; f++, inner /= 12) {
        const int64_t outer = n / (inner * 12);
        /* row vector times H_12 for each of the inner indices: element
         * (b, in) sums its 12 terms a = 0, 1, .. in order from 0, the bits of
         * one dot product at a time */
        for (int64_t o = 0; o < outer; o++) {
            double *base = v + o * 12 * inner;
            int64_t in = 0;
            /* four inner indices at a time, the twelve outputs in registers (the factor's 144
             * products and sums per element, not 144 passes over a scratch row) */
            for (; in + 4 <= inner; in += 4) {
                li_dv4 acc[12];
#pragma GCC unroll 12
                for (int b = 0; b < 12; b++) acc[b] = (li_dv4){0, 0, 0, 0};
                for (int a = 0; a < 12; a++) {
                    li_dv4 x;
                    LI_DV4_LD(x, base + a * inner + in);
#pragma GCC unroll 12 /* the twelve accumulators stay in registers */
                    for (int b = 0; b < 12; b++) acc[b] += x * paley12[a][b];
                }
#pragma GCC unroll 12
                for (int b = 0; b < 12; b++) LI_DV4_ST(tmp + b * inner + in, acc[b]);
            }
            for (; in < inner; in++)
                for (int b = 0; b < 12; b++) {
                    double t = 0;
                    for (int a = 0; a < 12; a++) t += base[a * inner + in] * paley12[a][b];
                    tmp[b * inner + in] = t;
                }
            memcpy(base, tmp, (size_t)(12 * inner) * sizeof *tmp);
        }
    }
    if (p2 > 1)
        for (int64_t o = 0; o < n / p2; o++) fwht_strided(v + o * p2, p2, 1);
    const double scale = 1.0 / sqrt((double)n);
    for (int64_t j = 0; j < n; j++) v[j] *= scale;
}

void li_rot_block_apply(double *v, const double *s, int64_t n, int64_t block) {
    const double scale = 1.0 / sqrt((double)block);
    for (int64_t j = 0; j < n; j++) v[j] *= s[j];
    for (int64_t b0 = 0; b0 < n; b0 += block) fwht_strided(v + b0, block, 1);
    for (int64_t j = 0; j < n; j++) v[j] *= scale;
}

/* splitmix64: a fixed stream, so the signs (and the file) depend on the seed only */
static uint64_t splitmix(uint64_t *st) {
    uint64_t z = (*st += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void draw_signs(uint64_t *st, double *s, int64_t n) {
    for (int64_t j = 0; j < n; j++) s[j] = splitmix(st) >> 63 ? -1.0 : 1.0;
}

/* ------------------------------------------------------------------------
 * the weights
 * ---------------------------------------------------------------------- */

typedef struct rot_ctx {
    li_model *m;
    li_gguf_writer w;
    double *s_q;      /* (n_embd) Q's signs */
    int64_t threads;  /* the rotation's workers */
} rot_ctx;

static double *load_w(const li_weight *w) {
    const size_t n = (size_t)w->m * (size_t)w->k;
    double *d = li_xmalloc(n * sizeof(double));
    float *row = li_xmalloc((size_t)w->k * sizeof(float));
    for (int64_t r = 0; r < w->m; r++) {
        li_weight_dequant_row_ref(w, r, row);
        for (int64_t j = 0; j < w->k; j++) d[r * w->k + j] = row[j];
    }
    free(row);
    return d;
}

static int put_f32(rot_ctx *c, const char *name, const double *d, int64_t ne0, int64_t ne1, li_error *err) {
    const size_t n = (size_t)ne0 * (size_t)ne1;
    float *f = li_xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) f[i] = (float)d[i];
    const int64_t ne[2] = {ne0, ne1};
    return li_gguf_writer_add_tensor(&c->w, name, LI_TYPE_F32, ne1 > 1 ? 2 : 1, ne, f, n * sizeof(float), err);
}

static int put_ones(rot_ctx *c, const char *name, int64_t n, li_error *err) {
    float *f = li_xmalloc((size_t)n * sizeof(float));
    for (int64_t j = 0; j < n; j++) f[j] = 1.0f;
    return li_gguf_writer_add_tensor(&c->w, name, LI_TYPE_F32, 1, (const int64_t[]){n}, f, (size_t)n * sizeof(float),
                                     err);
}

/* Vectors of a tensor rotated on --threads workers, 32 at a time from a
 * shared counter: rows (reader: row r at d + r n, after diag(g)) or columns
 * (writer: column r at d + r, n of them k apart, gathered and put back).
 * Each vector's arithmetic is its own, so the bits are one thread's. */
typedef struct rot_vecs {
    double *d;
    int64_t count, n, k; /* count vectors of n elements; k: the writer's row length */
    bool columns;
    const float *g;      /* reader: the norm folded in, or NULL */
    const double *s;     /* Q's signs (n) */
    _Atomic int64_t next;
} rot_vecs;

static void *rot_vecs_worker(void *arg) {
    rot_vecs *j = arg;
    double *tmp = li_xmalloc((size_t)j->n * sizeof *tmp), *col = li_xmalloc((size_t)j->n * sizeof *col);
    for (;;) {
        const int64_t r0 = atomic_fetch_add(&j->next, 32);
        if (r0 >= j->count) break;
        for (int64_t r = r0; r < LI_MIN(r0 + 32, j->count); r++) {
            if (!j->columns) {
                double *row = j->d + r * j->n;
                if (j->g)
                    for (int64_t e = 0; e < j->n; e++) row[e] *= j->g[e];
                li_rot_apply(row, j->s, j->n, tmp);
                continue;
            }
            for (int64_t e = 0; e < j->n; e++) col[e] = j->d[e * j->k + r];
            li_rot_apply(col, j->s, j->n, tmp);
            for (int64_t e = 0; e < j->n; e++) j->d[e * j->k + r] = col[e];
        }
    }
    free(tmp);
    free(col);
    return NULL;
}

static void rot_vecs_run(rot_ctx *c, rot_vecs *j) {
    atomic_init(&j->next, 0);
    li_run_workers(rot_vecs_worker, j, LI_MAX((int64_t)1, LI_MIN(c->threads, (j->count + 31) / 32)));
}

/* W diag(g) Q, row by row (g NULL: no norm folded): a weight reading the residual stream */
static int put_reader(rot_ctx *c, const char *name, const li_weight *w, const float *g, li_error *err) {
    double *d = load_w(w);
    rot_vecs j = {.d = d, .count = w->m, .n = w->k, .g = g, .s = c->s_q};
    rot_vecs_run(c, &j);
    const int rc = put_f32(c, name, d, w->k, w->m, err);
    free(d);
    return rc;
}

/* Q^T W, column by column (Q^T u = (u^T Q)^T): a weight writing the residual
 * stream; down_s (n_ff signs) also maps its rows for the online Hadamard */
static int put_writer(rot_ctx *c, const char *name, const li_weight *w, const double *down_s, li_error *err) {
    double *d = load_w(w);
    rot_vecs j = {.d = d, .count = w->k, .n = w->m, .k = w->k, .columns = true, .s = c->s_q};
    rot_vecs_run(c, &j);
    if (down_s)
        for (int64_t r = 0; r < w->m; r++) li_rot_block_apply(d + r * w->k, down_s, w->k, c->m->rot_block);
    const int rc = put_f32(c, name, d, w->k, w->m, err);
    free(d);
    return rc;
}

static int put_copy(rot_ctx *c, const li_gguf_tensor *t, const char *name, li_error *err) {
    const li_type_traits *tr = li_type_get(t->type);
    const int64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    if (!tr || !tr->to_float || t->n_dims > 2)
        return li_error_set(err, LI_EUNSUP, "quantize: --rotate: cannot read tensor '%s' (%s)", name,
                            li_type_name(t->type));
    float *f = li_xmalloc((size_t)n * sizeof(float));
    tr->to_float(t->data, f, n);
    return li_gguf_writer_add_tensor(&c->w, name, LI_TYPE_F32, t->n_dims, t->ne, f, (size_t)n * sizeof(float), err);
}

static bool has_suffix(const char *s, const char *suf) {
    const size_t n = strlen(s), k = strlen(suf);
    return n > k && !strcmp(s + n - k, suf);
}

/* ------------------------------------------------------------------------
 * the run
 * ---------------------------------------------------------------------- */

int li_rotate_model(const char *in, const char *out, const li_rot_opts *o, li_error *err) {
    rot_ctx c = {0};
    int rc = li_model_load(&c.m, in, err);
    if (rc) return rc;
    li_model *m = c.m;
    const li_hparams *hp = &m->hp;
    int n12;
    int64_t p2;
    li_gguf_writer_init(&c.w);
    c.w.scratch = o->scratch;
    if (m->rot_block) {
        rc = li_error_set(err, LI_EINVAL, "quantize: --rotate: %s is already rotated (%s)", in, LI_ROT_KEY_METHOD);
        goto done;
    }
    if (m->hf) {
        rc = li_error_set(err, LI_EUNSUP, "quantize: --rotate reads GGUF files, not a Hugging Face directory");
        goto done;
    }
    if (li_rot_factor(hp->n_embd, &n12, &p2)) {
        rc = li_error_set(err, LI_EUNSUP, "quantize: --rotate: n_embd %d is not 12^a * 2^b (no Hadamard matrix of "
                          "that order is built here)", hp->n_embd);
        goto done;
    }
    const int64_t b = o->down_block;
    if (hp->n_ff_layer) {
        rc = li_error_set(err, LI_EUNSUP, "quantize: --rotate: the blocks' FFN widths differ (a non-uniformly pruned "
                                          "model); not supported");
        goto done;
    }
    if (b <= 0 || (b & (b - 1)) || hp->n_ff % b) {
        rc = li_error_set(err, LI_EINVAL, "quantize: --rotate-block %lld is not a power of two dividing n_ff %d",
                          (long long)b, hp->n_ff);
        goto done;
    }
    m->rot_block = (int32_t)b; /* put_writer's block */
    const int64_t d = hp->n_embd, ff = hp->n_ff;
    c.s_q = li_xmalloc((size_t)d * sizeof(double));
    c.threads = li_threads_or_cpus(o->threads);
    double *s_down = li_xmalloc((size_t)hp->n_layer * (size_t)ff * sizeof(double));
    uint64_t st = o->seed;
    draw_signs(&st, c.s_q, d);
    for (int l = 0; l < hp->n_layer; l++) draw_signs(&st, s_down + (size_t)l * (size_t)ff, ff);

    /* metadata: the input's, but for what describes the old file's types */
    const li_gguf *g = &m->gguf;
    for (uint64_t i = 0; i < g->n_kv && !rc; i++) {
        const li_gguf_kv *kv = &g->kv[i];
        if (li_str_eq(kv->key, "general.file_type") ||
            (kv->key.len >= 15 && !memcmp(kv->key.ptr, "luainfer.quant.", 15)))
            continue;
        rc = li_gguf_writer_add_kv(&c.w, kv, err);
    }
    if (!rc) rc = li_gguf_writer_add_u32(&c.w, "general.file_type", 0, err); /* all F32 */
    if (!rc) rc = li_gguf_writer_add_str(&c.w, LI_ROT_KEY_METHOD, LI_ROT_METHOD, err);
    if (!rc) rc = li_gguf_writer_add_u32(&c.w, LI_ROT_KEY_VERSION, LI_ROT_VERSION, err);
    if (!rc) rc = li_gguf_writer_add_u32(&c.w, LI_ROT_KEY_BLOCK, (uint32_t)b, err);
    if (!rc) rc = li_gguf_writer_add_u32(&c.w, LI_ROT_KEY_SEED, (uint32_t)o->seed, err);

    /* tensors in the input's order; the untied head and the signs after */
    const bool tied = m->output.data == m->tok_embd.data;
    for (uint64_t i = 0; i < g->n_tensors && !rc; i++) {
        const li_gguf_tensor *t = &g->tensors[i];
        char name[160];
        snprintf(name, sizeof name, "%.*s", (int)LI_MIN(t->name.len, 159), t->name.ptr);
        if (has_suffix(name, ".scale") || has_suffix(name, ".zero") || has_suffix(name, ".perm")) continue;
        int l = -1, nch = 0;
        char site[64] = "";
        if (sscanf(name, "blk.%d.%63[a-z_].weight%n", &l, site, &nch) == 2 && (size_t)nch == strlen(name) && l >= 0 &&
            l < hp->n_layer) {
            const li_layer *L = &m->layers[l];
            if (!strcmp(site, "attn_norm") || !strcmp(site, "ffn_norm")) rc = put_ones(&c, name, d, err);
            else if (!strcmp(site, "attn_q")) rc = put_reader(&c, name, &L->wq, L->attn_norm, err);
            else if (!strcmp(site, "attn_k")) rc = put_reader(&c, name, &L->wk, L->attn_norm, err);
            else if (!strcmp(site, "attn_v")) rc = put_reader(&c, name, &L->wv, L->attn_norm, err);
            else if (!strcmp(site, "ffn_gate")) rc = put_reader(&c, name, &L->w_gate, L->ffn_norm, err);
            else if (!strcmp(site, "ffn_up")) rc = put_reader(&c, name, &L->w_up, L->ffn_norm, err);
            else if (!strcmp(site, "attn_output")) rc = put_writer(&c, name, &L->wo, NULL, err);
            else if (!strcmp(site, "ffn_down"))
                rc = put_writer(&c, name, &L->w_down, s_down + (size_t)l * (size_t)ff, err);
            else rc = li_error_set(err, LI_EUNSUP, "quantize: --rotate: no rule for tensor '%s'", name);
            continue;
        }
        if (!strcmp(name, "token_embd.weight")) rc = put_reader(&c, name, &m->tok_embd, NULL, err);
        else if (!strcmp(name, "output.weight")) rc = put_reader(&c, name, &m->output, m->output_norm, err);
        else if (!strcmp(name, "output_norm.weight")) rc = put_ones(&c, name, d, err);
        else if (!strncmp(name, "blk.", 4) && (strstr(name, "bias") || strstr(name, "attn_") || strstr(name, "ffn_")))
            rc = li_error_set(err, LI_EUNSUP, "quantize: --rotate: no rule for tensor '%s'", name);
        else rc = put_copy(&c, t, name, err); /* rope tables and the like: not on the residual stream */
    }
    /* the head, untied: (E diag(g_out)) Q, where the embedding is E Q */
    if (!rc && tied) rc = put_reader(&c, "output.weight", &m->tok_embd, m->output_norm, err);
    for (int l = 0; l < hp->n_layer && !rc; l++) {
        char name[64];
        snprintf(name, sizeof name, LI_ROT_SIGNS_FMT, l);
        rc = put_f32(&c, name, s_down + (size_t)l * (size_t)ff, ff, 1, err);
    }
    if (!rc) rc = li_gguf_writer_write(&c.w, out, err);
    free(s_down);
done:
    free(c.s_q);
    li_gguf_writer_free(&c.w);
    li_model_free(m);
    return rc;
}
