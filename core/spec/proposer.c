/* proposer.c — the proposers behind spec/proposer.h: n-gram lookup and a
 * model (a draft GGUF, or the target's first layers) drafting k tokens
 * autoregressively, batched over the step's speculating requests. */
#include "spec/proposer.h"
#include "spec/eagle.h"
#include "spec/medusa.h"
#include "spec/ngram.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- methods ------------------------------------------------------------- */

static const char *const method_names[LI_SPEC_N_METHODS] = {"ngram", "draft", "layerskip", "medusa", "eagle"};

const char *li_spec_method_name(int method) {
    return method >= 0 && method < LI_SPEC_N_METHODS ? method_names[method] : "?";
}

int li_spec_method_parse(const char *name, const char *what, li_spec_method *out, li_error *err) {
    for (int i = 0; name && i < LI_SPEC_N_METHODS; i++)
        if (!strcmp(name, method_names[i])) {
            *out = (li_spec_method)i;
            return 0;
        }
    return li_error_set(err, LI_EINVAL, "%s: unknown speculation method '%s' (ngram, draft, layerskip, medusa or eagle)", what,
                        name ? name : "(null)");
}

void li_proposer_free(li_proposer *p) {
    if (p) p->ops->free(p);
}

int32_t li_spec_draft_dist(const float *logits, int32_t n, float t, float *probs) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    if (!probs) return best;
    if (t <= 0) {
        memset(probs, 0, (size_t)n * sizeof *probs);
        probs[best] = 1;
        return best;
    }
    const double mx = logits[best], inv = 1.0 / t;
    double sum = 0;
    for (int32_t i = 0; i < n; i++) sum += exp(((double)logits[i] - mx) * inv);
    for (int32_t i = 0; i < n; i++) probs[i] = (float)(exp(((double)logits[i] - mx) * inv) / sum);
    return best;
}

/* A draw from probs (n) with u in [0, 1): the first id whose cumulative
 * probability exceeds u (in id order; the last nonzero id if rounding
 * leaves u above the total). */
static int32_t draw(const float *probs, int32_t n, double u) {
    double c = 0;
    int32_t last = 0;
    for (int32_t i = 0; i < n; i++) {
        if (probs[i] <= 0) continue;
        last = i;
        c += probs[i];
        if (u < c) return i;
    }
    return last;
}

/* ---- n-gram ------------------------------------------------------------------ */

typedef struct ngram_prop {
    li_proposer base;
    int n_max, n_min;
} ngram_prop;

static int ngram_propose(li_proposer *p, li_spec_seq *seqs, int32_t n, li_error *err) {
    (void)err;
    const ngram_prop *g = (const ngram_prop *)p;
    for (int32_t i = 0; i < n; i++) {
        li_spec_seq *s = &seqs[i];
        s->has_q = false;
        s->n_draft = li_spec_ngram_draft(s->toks, s->n_toks, g->n_max, g->n_min, s->k, s->draft);
    }
    return 0;
}

static void ngram_free(li_proposer *p) { free(p); }

static const li_proposer_ops ngram_ops = {.propose = ngram_propose, .free = ngram_free};

li_proposer *li_proposer_ngram_new(int n_max, int n_min, int32_t n_vocab) {
    ngram_prop *g = li_xcalloc(1, sizeof *g);
    g->base = (li_proposer){.ops = &ngram_ops, .method = LI_SPEC_NGRAM, .n_vocab = n_vocab};
    g->n_max = n_max;
    g->n_min = n_min;
    return &g->base;
}

/* ---- a model drafting autoregressively -------------------------------------------- */

typedef struct model_prop {
    li_proposer base;
    const li_model *m;
    li_backend *be;
    li_kv_cache *kv;     /* borrowed: the draft's follower storage, or the target's pool */
    li_forward fw;
    int32_t cap;         /* requests per draft step */
    int32_t *tokens, *pos, *seq, *rows; /* (cap) one draft step's batch */
    int64_t *slot;       /* (cap) */
    int32_t *who;        /* (cap) the seq of each batch row */
    int32_t *table;      /* (cap, stride) block tables, grown on demand */
    size_t table_cap;
    li_proposer_observe_fn observe; /* test hook, or NULL */
    void *observe_ud;
    /* an EAGLE draft: its rows read in_hidden (step 0: the seq's feature,
     * then the row's own pre-norm output), its logits the draft vocabulary */
    const int32_t *vocab;  /* (nv_draft) base ids, or NULL: not EAGLE */
    int32_t nv_draft, in_width;
    float *in;             /* (cap, in_width) one step's in_hidden rows */
    float *hid;            /* (cap, n_embd) each seq's last pre-norm output */
    float *dist;           /* (nv_draft) a sampled row's distribution */
} model_prop;

/* Row r of an EAGLE step's in_hidden: seq i's feature (step 0; zeros
 * without one) or its last output. Returns the width. */
static int32_t eagle_input(model_prop *mp, const li_spec_seq *s, int32_t i, int32_t j, int32_t r) {
    const int32_t d = mp->m->hp.n_embd;
    if (j) {
        memcpy(mp->in + (size_t)r * d, mp->hid + (size_t)i * d, (size_t)d * sizeof(float));
        return d;
    }
    float *row = mp->in + (size_t)r * mp->in_width;
    if (s->feature) memcpy(row, s->feature, (size_t)mp->in_width * sizeof(float));
    else memset(row, 0, (size_t)mp->in_width * sizeof(float));
    return mp->in_width;
}

/* An EAGLE row's draft token (a base id) and, sampled, its distribution
 * over the whole vocabulary (zero outside the draft's). */
static int32_t eagle_pick(model_prop *mp, li_spec_seq *s, const float *row, int32_t j, int32_t nv) {
    if (!s->has_q) return mp->vocab[li_spec_draft_dist(row, mp->nv_draft, 0, NULL)];
    li_spec_draft_dist(row, mp->nv_draft, s->temperature, mp->dist);
    float *q = s->q + (size_t)j * nv;
    memset(q, 0, (size_t)nv * sizeof *q);
    for (int32_t i = 0; i < mp->nv_draft; i++) q[mp->vocab[i]] = mp->dist[i];
    return draw(q, nv, s->uniform(s->uctx));
}

static int model_propose(li_proposer *p, li_spec_seq *seqs, int32_t n, li_error *err) {
    model_prop *mp = (model_prop *)p;
    const int32_t nv = p->n_vocab, bs = mp->kv->block_size;
    int32_t kmax = 0, stride = 1;
    for (int32_t i = 0; i < n; i++) {
        seqs[i].n_draft = 0;
        seqs[i].has_q = seqs[i].temperature > 0;
        if (i < mp->cap) kmax = LI_MAX(kmax, seqs[i].k), stride = LI_MAX(stride, seqs[i].n_blocks);
    }
    n = LI_MIN(n, mp->cap); /* the rest draft nothing this step */
    if ((size_t)n * (size_t)stride > mp->table_cap) {
        mp->table_cap = LI_MAX((size_t)n * (size_t)stride, 2 * mp->table_cap);
        mp->table = li_xrealloc(mp->table, mp->table_cap * sizeof *mp->table);
    }
    for (int32_t i = 0; i < n; i++)
        memcpy(mp->table + (size_t)i * stride, seqs[i].blocks, (size_t)seqs[i].n_blocks * sizeof *mp->table);
    /* draft step j: each seq still drafting feeds its newest token (the
     * request's last for j = 0) at position n_toks - 1 + j */
    for (int32_t j = 0; j < kmax; j++) {
        int32_t nb = 0, in_width = 0;
        for (int32_t i = 0; i < n; i++) {
            const li_spec_seq *s = &seqs[i];
            if (s->k <= j || s->n_draft != j) continue;
            const int64_t at = s->n_toks - 1 + j;
            mp->tokens[nb] = j ? s->draft[j - 1] : s->toks[s->n_toks - 1];
            mp->pos[nb] = (int32_t)at;
            mp->seq[nb] = i;
            mp->slot[nb] = (int64_t)s->blocks[at / bs] * bs + at % bs;
            mp->rows[nb] = nb;
            mp->who[nb] = i;
            if (mp->vocab) in_width = eagle_input(mp, s, i, j, nb);
            nb++;
        }
        if (!nb) break;
        li_batch b = {.n = nb, .tokens = mp->tokens, .pos = mp->pos, .seq = mp->seq, .slot = mp->slot,
                      .block_table = mp->table, .n_seqs = n, .bt_stride = stride, .logit_rows = mp->rows,
                      .n_logits = nb, .in_hidden = mp->vocab ? mp->in : NULL, .in_width = in_width,
                      .hidden = mp->vocab ? LI_HIDDEN_PRE_NORM : LI_HIDDEN_NONE};
        int rc = li_forward_run(&mp->fw, mp->m, mp->be, mp->kv, &b, NULL, err);
        const float *lg = rc ? NULL : li_forward_logits(&mp->fw, mp->m);
        const float *hd = lg && mp->vocab ? li_forward_hidden(&mp->fw, mp->m) : NULL;
        if (!lg || (mp->vocab && !hd)) {
            for (int32_t i = 0; i < n; i++) seqs[i].n_draft = 0;
            return rc ? rc : li_error_set(err, LI_EINVAL, "draft: the draft step computed no logits");
        }
        const int32_t nvm = mp->m->hp.n_vocab; /* the draft's logits row (nv_draft for EAGLE) */
        for (int32_t r = 0; r < nb; r++) {
            li_spec_seq *s = &seqs[mp->who[r]];
            const float *row = lg + (size_t)r * nvm;
            if (!j && mp->observe) mp->observe(mp->observe_ud, s->id, mp->pos[r], row);
            if (mp->vocab) {
                const int32_t d = mp->m->hp.n_embd;
                memcpy(mp->hid + (size_t)mp->who[r] * d, hd + (size_t)r * d, (size_t)d * sizeof(float));
                s->draft[j] = eagle_pick(mp, s, row, j, nv);
                s->n_draft = j + 1;
                continue;
            }
            int32_t tok;
            if (s->has_q) {
                float *q = s->q + (size_t)j * nv;
                li_spec_draft_dist(row, nv, s->temperature, q);
                tok = draw(q, nv, s->uniform(s->uctx));
            } else {
                tok = li_spec_draft_dist(row, nv, 0, NULL);
            }
            s->draft[j] = tok;
            s->n_draft = j + 1;
        }
    }
    return 0;
}

static void model_free(li_proposer *p) {
    model_prop *mp = (model_prop *)p;
    li_forward_free(&mp->fw);
    free(mp->tokens);
    free(mp->pos);
    free(mp->seq);
    free(mp->rows);
    free(mp->slot);
    free(mp->who);
    free(mp->table);
    free(mp->in);
    free(mp->hid);
    free(mp->dist);
    free(mp);
}

static const li_proposer_ops model_ops = {.propose = model_propose, .free = model_free};

void li_proposer_model_observe(li_proposer *p, li_proposer_observe_fn fn, void *ud) {
    if (p->ops != &model_ops) return;
    ((model_prop *)p)->observe = fn;
    ((model_prop *)p)->observe_ud = ud;
}

/* A model proposer of m for method over kv, with its forward state and a
 * draft step's batch for cap seqs. */
static int model_prop_new(model_prop **out, li_spec_method method, const li_model *m, int32_t n_vocab,
                          li_backend *be, li_kv_cache *kv, int32_t cap, li_error *err) {
    model_prop *mp = li_xcalloc(1, sizeof *mp);
    const int rc = li_forward_init(&mp->fw, m, be, cap, err);
    if (rc) {
        free(mp);
        return rc;
    }
    mp->base = (li_proposer){.ops = &model_ops, .method = method, .n_vocab = n_vocab};
    mp->m = m;
    mp->be = be;
    mp->kv = kv;
    mp->cap = cap;
    const size_t c = (size_t)cap;
    mp->tokens = li_xmalloc(c * sizeof *mp->tokens);
    mp->pos = li_xmalloc(c * sizeof *mp->pos);
    mp->seq = li_xmalloc(c * sizeof *mp->seq);
    mp->rows = li_xmalloc(c * sizeof *mp->rows);
    mp->slot = li_xmalloc(c * sizeof *mp->slot);
    mp->who = li_xmalloc(c * sizeof *mp->who);
    *out = mp;
    return 0;
}

int li_proposer_model_new(li_proposer **out, li_spec_method method, const li_model *m, li_backend *be,
                          li_kv_cache *kv, int32_t cap, li_error *err) {
    *out = NULL;
    if (method != LI_SPEC_DRAFT && method != LI_SPEC_LAYERSKIP)
        return li_error_set(err, LI_EINVAL, "proposer: method %s is not a model", li_spec_method_name(method));
    if (cap <= 0) return li_error_set(err, LI_EINVAL, "proposer: capacity must be positive, got %d", cap);
    if (kv->n_layer < m->hp.n_layer || kv->n_head_kv != m->hp.n_head_kv || kv->head_dim != m->hp.head_dim)
        return li_error_set(err, LI_EINVAL, "proposer: the KV storage (%d layers) does not fit the model (%d layers)",
                            kv->n_layer, m->hp.n_layer);
    model_prop *mp;
    const int rc = model_prop_new(&mp, method, m, m->hp.n_vocab, be, kv, cap, err);
    if (rc) return rc;
    *out = &mp->base;
    return 0;
}

int li_proposer_eagle_new(li_proposer **out, li_eagle *eg, li_backend *be, li_kv_cache *kv, int32_t cap,
                          li_error *err) {
    *out = NULL;
    if (!eg->be) return li_error_set(err, LI_EINVAL, "proposer: the EAGLE draft is not prepared");
    if (cap <= 0) return li_error_set(err, LI_EINVAL, "proposer: capacity must be positive, got %d", cap);
    if (kv->n_layer < 1 || kv->n_head_kv != eg->m.hp.n_head_kv || kv->head_dim != eg->m.hp.head_dim)
        return li_error_set(err, LI_EINVAL, "proposer: the KV storage does not fit the EAGLE draft");
    /* the proposer's n_vocab is the target's: the size of q */
    model_prop *mp;
    const int rc = model_prop_new(&mp, LI_SPEC_EAGLE, &eg->m, eg->f.n_vocab, be, kv, cap, err);
    if (rc) return rc;
    mp->vocab = eg->vocab;
    mp->nv_draft = eg->f.n_draft;
    mp->in_width = eg->inproj.in_width;
    const size_t c = (size_t)cap, d = (size_t)eg->m.hp.n_embd;
    mp->in = li_xmalloc(c * LI_MAX((size_t)mp->in_width, d) * sizeof *mp->in);
    mp->hid = li_xmalloc(c * d * sizeof *mp->hid);
    mp->dist = li_xmalloc((size_t)mp->nv_draft * sizeof *mp->dist);
    *out = &mp->base;
    return 0;
}

int li_spec_layer_view(li_model *view, const li_model *m, int32_t n_layer, li_error *err) {
    if (n_layer < 1 || n_layer >= m->hp.n_layer)
        return li_error_set(err, LI_EINVAL, "layerskip: spec_layers must be in [1, %d] (the model has %d layers), got %d",
                            m->hp.n_layer - 1, m->hp.n_layer, n_layer);
    *view = *m; /* shares the mapping, weights and tokenizer: never freed through the view */
    view->hp.n_layer = n_layer;
    return 0;
}

/* ---- Medusa heads: a candidate tree of their top-k -------------------------------- */

typedef struct medusa_prop {
    li_proposer base;
    li_medusa *h;
    li_medusa_tree tree;
    int32_t cap;
    float *hid;          /* (cap, n_embd) the seqs' hidden rows */
    int32_t *who;        /* (cap) seq of each row */
} medusa_prop;

/* The top n ids of row (v), best first, ties to the lowest id. */
static void top_n(const float *row, int32_t v, int32_t n, int32_t *out) {
    int32_t k = 0;
    for (int32_t i = 0; i < v; i++) {
        if (k == n && !(row[i] > row[out[k - 1]])) continue;
        int32_t j = k < n ? k++ : n - 1;
        while (j > 0 && row[i] > row[out[j - 1]]) out[j] = out[j - 1], j--;
        out[j] = i;
    }
}

static int medusa_propose(li_proposer *p, li_spec_seq *seqs, int32_t n, li_error *err) {
    medusa_prop *mp = (medusa_prop *)p;
    const li_medusa_tree *t = &mp->tree;
    const int32_t E = mp->h->n_embd, V = p->n_vocab;
    int32_t rows = 0, heads = 0;
    for (int32_t i = 0; i < n; i++) {
        li_spec_seq *s = &seqs[i];
        s->n_draft = 0;
        s->has_q = false;
        if (!s->hidden || !s->parent || s->k <= 0 || rows == mp->cap) continue;
        memcpy(mp->hid + (size_t)rows * E, s->hidden, (size_t)E * sizeof(float));
        mp->who[rows++] = i;
        /* only the heads the seq's nodes come from (a cut tree needs fewer) */
        for (int32_t j = 0; j < LI_MIN(s->k, t->n); j++) heads = LI_MAX(heads, t->depth[j]);
    }
    if (!rows) return 0;
    const float *lg = li_medusa_run(mp->h, mp->hid, rows, heads, err);
    if (!lg) return err ? err->code : LI_EINVAL;
    int32_t cand[LI_MEDUSA_MAX_HEADS][LI_MEDUSA_MAX_RANK];
    for (int32_t r = 0; r < rows; r++) {
        li_spec_seq *s = &seqs[mp->who[r]];
        const int32_t nodes = LI_MIN(s->k, t->n);
        for (int32_t d = 0; d < heads; d++)
            if (t->top[d]) top_n(lg + ((size_t)d * (size_t)rows + (size_t)r) * (size_t)V, V, t->top[d], cand[d]);
        for (int32_t i = 0; i < nodes; i++) {
            s->draft[i] = cand[t->depth[i] - 1][t->rank[i]];
            s->parent[i] = t->parent[i];
        }
        s->n_draft = nodes;
    }
    return 0;
}

static void medusa_free(li_proposer *p) {
    medusa_prop *mp = (medusa_prop *)p;
    free(mp->hid);
    free(mp->who);
    free(mp);
}

static const li_proposer_ops medusa_ops = {.propose = medusa_propose, .free = medusa_free};

int li_proposer_medusa_new(li_proposer **out, li_medusa *h, const li_medusa_tree *tree, int32_t cap, li_error *err) {
    *out = NULL;
    if (cap <= 0 || !h->be || h->cap < cap)
        return li_error_set(err, LI_EINVAL, "proposer: Medusa heads prepared for %lld rows, %d wanted",
                            (long long)h->cap, cap);
    if (tree->n < 1 || tree->max_depth > h->n_heads)
        return li_error_set(err, LI_EINVAL, "proposer: a Medusa tree of depth %d over %d heads", tree->max_depth,
                            h->n_heads);
    medusa_prop *mp = li_xcalloc(1, sizeof *mp);
    mp->base = (li_proposer){.ops = &medusa_ops, .method = LI_SPEC_MEDUSA, .n_vocab = h->n_vocab};
    mp->h = h;
    mp->tree = *tree;
    mp->cap = cap;
    mp->hid = li_xmalloc((size_t)cap * (size_t)h->n_embd * sizeof(float));
    mp->who = li_xmalloc((size_t)cap * sizeof *mp->who);
    *out = &mp->base;
    return 0;
}
