/* forward.h — the Llama forward pass over one flat batch.
 *
 * A batch is any mix of tokens from any sequences (prefill chunks and single
 * decode tokens alike): each token carries its position, its sequence and the
 * KV slot it writes. Attention reads every earlier position of the token's
 * sequence through that sequence's row of the flat block table, so chunked
 * prefill, decode and speculative verification are the same call.
 *
 * Trees: with li_batch.parent a token may instead see an explicit set of
 * ancestors among its sequence's new tokens (a tree of candidates). A node
 * at depth d (root: d = 0) sits at position P + d, where P is the committed
 * prefix length of its sequence, writes its own KV slot, and attends to the
 * prefix [0, P), its ancestors and itself, in position order. The pass gives
 * every node the bits its branch would get computed alone, causally: the
 * forward builds each displaced node a view (the prefix's full blocks, plus
 * scratch blocks holding copies of the prefix's partial block and of its
 * branch's rows, copied inside the backend after each layer's kv_store), so
 * attention runs the same kernels over the same rows in the same order.
 * Nodes whose whole branch already sits at its positions' slots need no
 * view; without parent the batch is plain causal, at no extra cost.
 *
 * Memory: every array the ops touch lives in buffers of the backend (the
 * scratch activations, the uploaded batch and block table, the logits);
 * the caller's li_batch arrays are host memory, uploaded once per call. */
#ifndef LI_FORWARD_H
#define LI_FORWARD_H

#include "model/model.h"
#include "kv/kv_cache.h"

/* The KV cache dimensions of a model. */
static inline li_kv_dims li_forward_kv_dims(const li_hparams *hp) {
    return (li_kv_dims){.n_layer = hp->n_layer, .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim};
}

/* Which final hidden state a batch returns for its output rows. */
typedef enum li_hidden_kind {
    LI_HIDDEN_NONE = 0,
    LI_HIDDEN_PRE_NORM,  /* the residual stream after the last layer */
    LI_HIDDEN_POST_NORM, /* after the output norm: what the output matrix multiplies */
} li_hidden_kind;

/* Host arrays describing one step. */
typedef struct li_batch {
    int64_t n;                     /* tokens in this batch */
    const int32_t *tokens;         /* (n) */
    const int32_t *pos;            /* (n) position within its sequence */
    const int32_t *seq;            /* (n) row of block_table, in [0, n_seqs) */
    const int64_t *slot;           /* (n) KV slot: block*block_size + offset */
    /* (n_seqs, bt_stride) flat: row s = sequence s's block ids (position p
     * in block row[p / block_size]), written once per step, one upload */
    const int32_t *block_table;
    int32_t n_seqs;
    int64_t bt_stride;
    /* the output descriptor: for the rows logit_rows (batch rows, any
     * order, repeats allowed), logits (n_logits, n_vocab) unless no_logits,
     * and the final hidden state (n_logits, n_embd) when `hidden` asks */
    const int32_t *logit_rows;     /* (n_logits) */
    int64_t n_logits;
    bool no_logits;
    li_hidden_kind hidden;
    /* (n) or NULL (plain causal): tree parent of each token, a batch row
     * before it of the same sequence at position pos - 1, or -1: attaches to
     * the committed prefix [0, pos) of its sequence's block table. Views
     * take scratch blocks from the KV pool for the pass (LI_ENOMEM when
     * none are free). */
    const int32_t *parent;
    /* (n_capture) block indices, ascending, or NULL: the residual stream
     * after each of those blocks, for every row, into the forward's
     * capture rows (n, n_capture * n_embd): row r holds block
     * capture[0]'s x, then capture[1]'s, ... (an EAGLE draft's input,
     * spec/eagle.h) */
    const int32_t *capture;
    int32_t n_capture;
    /* (n, in_width) host rows, for a model with an input projection
     * (li_model.inproj) and only then: in_width is the projection's (rows
     * the target captured) or n_embd (the block's own pre-norm outputs) */
    const float *in_hidden;
    int32_t in_width;
} li_batch;

/* A recorded pass (backend graph ops): the shapes and buffers it was
 * recorded with, which a batch must match to replay it. */
enum { LI_FW_GRAPHS = 24, LI_FW_GRAPH_MAX_ROWS = 256 };
typedef struct li_fw_graph {
    void *g;               /* the recording, or NULL: seen once (the next sighting records) */
    bool failed;           /* recording failed: this key runs its ops */
    int64_t n, n_logits, bt_stride;
    int32_t n_seqs;
    int hidden;
    bool no_logits;
    const void *kv, *kv_k, *table, *logits; /* the cache, its first K layer, the uploaded table, the logits */
    uint64_t last;         /* the forward's run count at its last use; 0: an unused slot */
} li_fw_graph;

/* Scratch activations for up to `cap` tokens, reused every step; all views
 * into one backend buffer. */
typedef struct li_forward {
    li_backend *be;
    int64_t cap;
    li_buffer scratch;
    float *x;     /* (cap, n_embd) residual stream */
    float *h;     /* (cap, n_embd) normed input */
    float *q;     /* (cap, n_head*head_dim) */
    float *k, *v; /* (cap, n_head_kv*head_dim) */
    float *att;   /* (cap, n_head*head_dim) */
    float *g, *u; /* (cap, n_ff) */
    float *sel;   /* (cap, n_embd) rows selected for logits */
    float *z;     /* (cap, 2 * n_embd) an input projection's q/k/v input, or NULL */
    float *in;    /* (cap, inproj->in_width) the uploaded in_hidden rows, or NULL */
    /* the uploaded batch: views into one backend buffer */
    li_buffer batch;
    int32_t *d_tokens, *d_pos, *d_seq;         /* (cap) */
    int64_t *d_slot;                           /* (cap) */
    char *h_batch; /* a device batch buffer's host mirror (its four arrays go up in one copy); NULL on a host */
    li_buffer table;                           /* the uploaded block table, grown on demand */
    li_buffer logits;                          /* (logits_cap, n_vocab), grown on demand */
    li_buffer ids;                             /* li_forward_argmax's ids, li_forward_topk's values, ids, lse */
    void *ids_host;                            /* li_forward_topk's host copy of them, grown on demand */
    size_t ids_host_cap;
    int64_t logits_cap, n_logits;              /* n_logits: the last run's output rows */
    bool have_logits;                          /* the last run computed logits */
    float *logits_host;                        /* host copy when logits is device memory */
    float *row_host;                           /* (n_vocab) one row of them (li_forward_logits_row) */
    int64_t row_host_at;                       /* the last run's row row_host holds, or -1 */
    float *hidden;                             /* (n_logits, n_embd): f->sel or f->h, or NULL */
    float *hidden_host;                        /* host copy when hidden is device memory */
    li_buffer capture;                         /* (n, n_capture * n_embd) the last run's captured rows */
    int64_t n_captured;                        /* rows of the last run's capture, 0: none asked */
    int32_t capture_width;                     /* n_capture * n_embd of the last run */
    float *capture_host;                       /* host copy when capture is device memory */
    size_t *sel_dst, *sel_src;                 /* (cap) host: byte offsets of the gathered rows */
    /* tree views (host, grown on demand) */
    int32_t *t_seq;                            /* (cap) each token's row of the view table */
    int32_t *t_root;                           /* (cap) position of each token's root */
    int32_t *t_table;                          /* (n_seqs + views, t_stride) */
    size_t t_table_cap;
    int64_t *t_src, *t_dst;                    /* (n_runs) cache slots: view row copies */
    size_t *t_off_d, *t_off_s;                 /* (2 * n_runs) byte offsets of one layer's copies */
    int64_t n_runs, runs_cap;
    int32_t *t_blocks;                         /* scratch blocks taken from the pool for the views */
    int32_t n_tblocks, tblocks_cap;
    /* tensor parallel (docs/parallel.md): this rank's communicator, or NULL
     * for one rank (today's path, untouched). With one, the model is the
     * rank's shard (dist/shard.h) and the partial outputs of wo and w_down
     * are all-reduced before each residual add. */
    struct li_comm *comm;
    double t_comm;                             /* seconds inside those all-reduces, summed over runs */
    /* recorded passes (forward.c): on a backend with graph ops, a plain
     * batch of up to LI_FW_GRAPH_MAX_ROWS rows is padded to a size class
     * and its block table to a power-of-two stride; the second time a
     * shape is seen its ops are recorded, then replayed */
    bool graphs;                               /* on (default where the backend can; LUAINFER_GRAPHS=0 turns off) */
    li_fw_graph graph[LI_FW_GRAPHS];
    uint64_t runs;
    int64_t n_recorded, n_replayed;            /* recordings made, passes replayed */
    int32_t *g_tokens, *g_pos, *g_seq, *g_rows; /* (graph rows) the padded batch, host */
    int64_t *g_slot;
    int32_t *g_table;                          /* the padded block table, host, grown on demand */
    size_t g_table_cap;
} li_forward;

/* be must outlive f. */
int li_forward_init(li_forward *f, const li_model *m, li_backend *be, int64_t cap, li_error *err);
void li_forward_free(li_forward *f);
/* Runs the batch (b->n <= cap) on f's backend (be must be the one given to
 * li_forward_init). The (n_logits, n_vocab) logits stay in f->logits, read
 * by li_forward_logits; when `logits` is not NULL they are also copied
 * there. */
int li_forward_run(li_forward *f, const li_model *m, li_backend *be, li_kv_cache *kv, const li_batch *b,
                   float *logits, li_error *err);
/* The last run's greedy ids, one per logit row, into out (n_logits),
 * computed where the logits are (backend.h's argmax): only n_logits ids
 * are copied back. LI_EUNSUP when the logits are host memory or the
 * backend has no argmax op (the caller reads li_forward_logits), LI_EINVAL
 * when the last run computed no logits. */
int li_forward_argmax(li_forward *f, const li_model *m, int32_t *out, li_error *err);
/* What li_forward_topk fetches of the last run's logits, each computed
 * where they are: only these come back (one transfer). */
typedef struct li_logit_fetch {
    int k;                   /* the largest logits a row, 1..LI_TOPK_MAX */
    float *vals;             /* (n_logits, k) out: sorted by value descending then id ascending */
    int32_t *ids;            /* (n_logits, k) out */
    float *lse;              /* (n_logits) out, or NULL: each row's log-sum-exp (backend.h's lse) */
    const float *lse_scale;  /* (n_logits), or NULL: each row's scale for lse_t */
    float *lse_t;            /* (n_logits) out with lse_scale: the log-sum-exp at that scale */
    const int64_t *gidx;     /* (n_gather) flat indices (row * n_vocab + id) */
    int64_t n_gather;
    float *gout;             /* (n_gather) out: the logits there */
} li_logit_fetch;
/* Errors as li_forward_argmax's (LI_EUNSUP also without an lse or gather
 * op when asked). */
int li_forward_topk(li_forward *f, const li_model *m, const li_logit_fetch *q, li_error *err);
/* Whether li_forward_topk can gather (the backend has the op) */
bool li_forward_can_gather(const li_forward *f);
/* Recorded passes on or off (a backend without graph ops: always off).
 * Off frees the recordings. */
void li_forward_set_graphs(li_forward *f, bool on);
/* The last run's (n_logits, n_vocab) logits in host memory: the backend
 * buffer itself when it is host memory, else a copy fetched from it. NULL
 * when the run computed none. */
float *li_forward_logits(li_forward *f, const li_model *m);
/* Row `row` (< n_logits) of them alone: the backend buffer's when it is
 * host memory, else a one-row copy (valid until the next call for another
 * row or the next run). For a step sampled on the device whose candidates
 * could not decide a row. NULL when the run computed none. */
const float *li_forward_logits_row(li_forward *f, const li_model *m, int64_t row);
/* The last run's (n_logits, n_embd) hidden states (the kind its batch
 * asked for), in host memory as li_forward_logits; NULL when none were
 * asked. Valid until the next run. */
float *li_forward_hidden(li_forward *f, const li_model *m);
/* The last run's captured residual rows (n, n_capture * n_embd) in host
 * memory (li_batch.capture), NULL when none were asked. Valid until the
 * next run. */
float *li_forward_captured(li_forward *f);

#endif
