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
 * (greedy target) makes this exactly greedy verification. */
int32_t li_spec_verify_chain(const float *p, const float *q, int32_t n_vocab, const int32_t *d, int32_t k,
                             li_spec_uniform_fn uniform, void *uctx, float *scratch, int32_t *next);

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
 *   scratch: (2 * n_vocab) floats.
 * Multi-candidate rejection: at each node the children are tried in turn,
 * each against the residual left by the ones rejected before it, so the
 * token that leaves the node is distributed exactly as p (lossless). Writes
 * the accepted path (node indices, root outward) to path (capacity n) and
 * returns its length; *next gets the token to emit after the path. */
int32_t li_spec_verify_tree(const float *p, const float *q, int32_t n_vocab, const int32_t *token,
                            const int32_t *parent, int32_t n, li_spec_uniform_fn uniform, void *uctx, float *scratch,
                            int32_t *path, int32_t *next);

#endif
