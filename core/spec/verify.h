/* verify.h — lossless verification of speculative drafts.
 *
 * Pure functions over probability rows: no engine, no KV, no model. The
 * engine computes the target's distributions with li_sampler_sample_u
 * (sampler.h: the post-processed distribution a draw is made from), the
 * proposer hands the drafted tokens and, when it sampled them, the draft
 * distributions; these functions decide how many drafts survive and which
 * token comes next so that the emitted sequence is distributed exactly as
 * sampling the target alone (Leviathan et al. 2023; Chen et al. 2023).
 *
 * Uniform draws come from a callback so the engine can feed the request's
 * own seeded sampler RNG (li_sampler_uniform): the same seed reproduces the
 * same tokens. Each function documents how many draws it takes. */
#ifndef LI_SPEC_VERIFY_H
#define LI_SPEC_VERIFY_H

#include <stdint.h>

typedef double (*li_spec_uniform_fn)(void *ctx); /* uniform in [0, 1) */

/* Chain: k drafts d[0..k).
 *   p: (k+1, n_vocab) target distributions: row j is the target's at draft
 *      position j (before d[j]); row k is the one after the last draft.
 *   q: (k, n_vocab) draft distributions each d[j] was sampled from, or NULL
 *      when the drafts are deterministic (greedy draft model, n-gram): then q
 *      counts as a point mass on d[j].
 *   scratch: (n_vocab) floats.
 * Accepts d[j] with probability min(1, p_j(d[j]) / q_j(d[j])) in order; at
 * the first rejection draws the next token from norm(max(p_j - q_j, 0)); if
 * all k survive draws it from p_k. Returns the number accepted (0..k) and
 * writes the token to emit after them to *next. A p row that is one-hot
 * (greedy target) makes this exactly greedy verification. Lossless only if
 * each q row is exactly what the proposer drew from (after its own
 * temperature, top-k, ...): a proposer that filters must pass the filtered
 * row, and one that does not draw (argmax, lookup) must pass NULL.
 *
 * Rows are probability distributions (they sum to 1 up to rounding); NaN,
 * negative and infinite entries count as 0, a draft id outside the vocabulary
 * has probability 0 (rejected). If the residual has no mass (only rounding
 * can do that: p one float step short of q at the draft and nowhere above
 * it), the token is drawn from p_j instead. Draws are inverse-CDF
 * in id order and never pick an id of zero probability.
 * Uniforms: exactly one per draft examined plus one for *next, that is
 * min(a + 1, k) + 1 for a return value a (1 when k == 0).
 * Bad arguments (n_vocab < 1, k < 0, a NULL pointer other than q) return -1
 * with *next = -1 and take no uniform. */
int32_t li_spec_verify_chain(const float *p, const float *q, int32_t n_vocab, const int32_t *d, int32_t k,
                             li_spec_uniform_fn uniform, void *uctx, float *scratch, int32_t *next);

/* Target row j (as p's row j below), made when a verifier first needs it:
 * each at most once; a chain asks rows 0, 1, ... in order and none past
 * the first rejection, a tree the root's and then each accepted node's. */
typedef const float *(*li_spec_row_fn)(void *ctx, int32_t j);

/* li_spec_verify_chain with p's rows made on demand by row(rctx, j): the
 * same draws, the same uniforms and the same result, but a chain rejected
 * at draft j makes rows 0..j only (at temperature > 0 each row is a whole
 * distribution, a few times the cost of a row's argmax). A NULL row is
 * a bad argument. */
int32_t li_spec_verify_chain_rows(li_spec_row_fn row, void *rctx, const float *q, int32_t n_vocab, const int32_t *d,
                                  int32_t k, li_spec_uniform_fn uniform, void *uctx, float *scratch, int32_t *next);

/* Tree: n candidate nodes in topological order (a parent before its
 * children). token[i] is node i's token, parent[i] its parent node or -1
 * for a child of the root (the last accepted token). Children of one node
 * are tried in index order.
 *   p: (n+1, n_vocab): row 0 the target's distribution at the root, row i+1
 *      the one after node i.
 *   q: (n+1, n_vocab) the draft distribution each node's children were drawn
 *      from (row 0 for the root's children, row i+1 for node i's), sampled
 *      independently with replacement; or NULL when the children are
 *      deterministic (Medusa top-k, n-gram, greedy draft).
 *   scratch: (2 * n_vocab) floats (n_vocab are used today).
 * Multi-candidate rejection: at each node the children are tried in turn,
 * each against the residual left by the ones rejected before it, so the
 * token that leaves the node is distributed exactly as p (lossless). Writes
 * the accepted path (node indices, root outward) to path (capacity n) and
 * returns its length; *next gets the token to emit after the path.
 *
 * The residual r starts as the node's p row. Sampled children: accept x with
 * min(1, r(x) / q(x)), else r <- norm(max(r - q, 0)). Deterministic children:
 * accept x with r(x), else r(x) <- 0 and renormalise (so a duplicate child is
 * always rejected). When every child is rejected (or there is none), *next is
 * drawn from r. A residual without mass (rounding) falls back to p. A chain
 * is the tree parent[i] = i - 1 and gives the same result with the same
 * uniforms as li_spec_verify_chain. Nodes whose parent is not in [-1, i) are
 * never reached. Rows and bad ids as for the chain.
 * Uniforms: exactly one per child tried plus one for *next.
 * Bad arguments (n_vocab < 1, n < 0, a NULL pointer other than q) return -1
 * with *next = -1 and take no uniform. */
int32_t li_spec_verify_tree(const float *p, const float *q, int32_t n_vocab, const int32_t *token,
                            const int32_t *parent, int32_t n, li_spec_uniform_fn uniform, void *uctx, float *scratch,
                            int32_t *path, int32_t *next);

/* li_spec_verify_tree with p's rows made on demand by row(rctx, j): the
 * same draws and result, but only the rows of the nodes whose children are
 * tried (the root and the accepted path: 1 + the return value of them). A
 * NULL row is a bad argument. */
int32_t li_spec_verify_tree_rows(li_spec_row_fn row, void *rctx, const float *q, int32_t n_vocab,
                                 const int32_t *token, const int32_t *parent, int32_t n, li_spec_uniform_fn uniform,
                                 void *uctx, float *scratch, int32_t *path, int32_t *next);

/* Typical acceptance (Medusa, Cai et al. 2024). NOT LOSSLESS: the emitted
 * tokens are not distributed as the target's samples; it trades exactness
 * for longer accepted runs at temperature > 0. Offer it labelled as such.
 * The tree is given as for li_spec_verify_tree (a chain: parent[i] = i - 1),
 * p (n+1, n_vocab) the same rows. A node is accepted when its parent is
 * (the root always is) and
 *     p_parent(token) > min(epsilon, delta * exp(-H(p_parent)))
 * with H the entropy in nats (Medusa's defaults: epsilon 0.09, delta 0.3).
 * The deepest accepted node wins (the lowest index on ties); its path (root
 * outward) goes to path (capacity n; also used as scratch) and its length is
 * returned. *next is drawn from the row after the path with one uniform, or
 * is that row's argmax (lowest id on ties) when uniform is NULL (no draw).
 * A one-hot p (greedy target) makes this exactly greedy verification.
 * Bad arguments return -1 with *next = -1. */
int32_t li_spec_verify_typical(const float *p, int32_t n_vocab, const int32_t *token, const int32_t *parent,
                               int32_t n, float epsilon, float delta, li_spec_uniform_fn uniform, void *uctx,
                               int32_t *path, int32_t *next);

#endif
