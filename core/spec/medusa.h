/* medusa.h — Medusa heads (Cai et al. 2024): a heads file, its forward on
 * the target's backend, and the candidate tree the heads' top-k expand into.
 *
 * The file format is fixed with `luainfer train-medusa` (docs/speculation.md,
 * "Medusa"): GGUF, general.architecture "medusa", K heads of
 *     h'_t = h_t + SiLU(W_k h_t + b_k),   logits_k = output · h'_t
 * over the base's post-norm hidden state h_t (li_forward LI_HIDDEN_POST_NORM,
 * the vector its output matrix multiplies), with the base's own output
 * matrix. Head k predicts the token at t + k + 2 (the base predicts t + 1).
 *
 * The tree: the root is the token the target just produced (its position t+1
 * is known), a node at depth d + 1 is one of head d's top-k. A tree is a set
 * of paths of ranks, "0;1;0,0;0,1;1,0;0,0,0" (path "1,0" = the second
 * candidate of head 0, then the first of head 1). Nodes are ordered with the
 * top-1 chain ("0", "0,0", ...) first, then by depth, then as listed: any
 * prefix of that order is a tree (parents come first), and the chain's
 * nodes sit at their own positions' KV slots (engine: no copy when it wins). */
#ifndef LI_SPEC_MEDUSA_H
#define LI_SPEC_MEDUSA_H

#include "model/model.h"
#include "spec/medusa_file.h"

#define LI_MEDUSA_MAX_HEADS LI_MEDUSA_FILE_MAX_HEADS
#define LI_MEDUSA_MAX_NODES 16 /* = LI_SPEC_MAX_DRAFT: a tree's nodes are a step's drafts */
#define LI_MEDUSA_MAX_RANK 16  /* candidates per head */

typedef struct li_medusa {
    li_gguf gguf;             /* the mapped file: weights point into it */
    int32_t n_heads, n_embd, n_vocab;
    li_weight w[LI_MEDUSA_MAX_HEADS];      /* (n_embd out, n_embd in) F32 or F16 */
    const float *b[LI_MEDUSA_MAX_HEADS];   /* (n_embd) F32, in the mapping */
    char base_name[128];      /* medusa.base.name */
    uint64_t vocab_hash;      /* medusa.base.vocab_hash */
    /* the forward (li_medusa_prepare): scratch on the backend */
    li_backend *be;           /* NULL until prepared */
    const li_weight *output;  /* the base's (n_vocab, n_embd) output matrix, borrowed */
    int64_t cap;              /* rows per run */
    li_buffer scratch;        /* h, t, ones (cap, n_embd) and bias (n_heads, n_embd) */
    float *d_h, *d_t, *d_ones, *d_bias;
    li_buffer logits;         /* (n_heads, cap, n_vocab) */
    float *logits_host;       /* host copy when logits is device memory */
} li_medusa;

/* Loads a heads file, checked against base by li_medusa_file_check
 * (architecture, version, K in [1, 8], n_embd / n_vocab, the vocabulary
 * hash, tensor shapes and types); one-line errors naming the field and both
 * values. A different base name alone is a warning. */
int li_medusa_load(li_medusa **out, const char *path, const li_model *base, li_error *err);
/* Weights into be and scratch for cap rows; base's output matrix (prepared
 * on be) is shared. */
int li_medusa_prepare(li_medusa *h, const li_model *base, li_backend *be, int64_t cap, li_error *err);
void li_medusa_free(li_medusa *h);
/* Heads 0..n_heads-1 over hidden (n, n_embd) host rows: returns the host
 * logits (n_heads, n, n_vocab), valid until the next run; NULL with err. */
const float *li_medusa_run(li_medusa *h, const float *hidden, int64_t n, int32_t n_heads, li_error *err);

/* ---- the candidate tree ---------------------------------------------------- */

typedef struct li_medusa_tree {
    int32_t n;                                /* nodes */
    int32_t depth[LI_MEDUSA_MAX_NODES];       /* 1.. (head depth - 1 made it) */
    int32_t rank[LI_MEDUSA_MAX_NODES];        /* which of that head's candidates */
    int32_t parent[LI_MEDUSA_MAX_NODES];      /* node index, or -1 for a child of the root */
    int32_t chain;                            /* the top-1 chain: nodes [0, chain) */
    int32_t max_depth;
    int32_t top[LI_MEDUSA_MAX_HEADS];         /* candidates each head must give */
} li_medusa_tree;

/* The default: sparse, 15 nodes over 4 heads (fewer with fewer heads). */
#define LI_MEDUSA_TREE_DEFAULT "0;1;2;3;0,0;0,1;0,2;1,0;1,1;2,0;0,0,0;0,0,1;0,1,0;1,0,0;0,0,0,0"

/* Parses a path list (NULL: the default) for n_heads heads. Every prefix of
 * a path and the top-1 chain to the deepest path are added. Refused (one
 * line): a syntax error, a rank outside [0, 16), a path deeper than n_heads
 * (the default is cut to n_heads instead), more than 16 nodes. */
int li_medusa_tree_parse(const char *spec, int32_t n_heads, li_medusa_tree *t, li_error *err);

#endif
