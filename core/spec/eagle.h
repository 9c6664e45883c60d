/* eagle.h — an EAGLE draft (docs/eagle.md): one transformer block that
 * drafts from the target's own hidden states.
 *
 * The file (spec/eagle_file.h) is loaded as a one-block li_model with an
 * input projection (li_model_inproj), so the forward pass of
 * core/model/forward.c runs it over its own paged KV (a follower of the
 * target's block pool) like any model: a row at position q reads token x_q
 * and in_hidden, either the target's captured blocks at q - 1 (projected by
 * W_fc) or the block's own pre-norm output at q - 1 (a chain step). Its
 * logits cover the draft vocabulary only: row i of its output matrix is the
 * base's output row vocab[i], so logit i is the base id vocab[i]. */
#ifndef LI_SPEC_EAGLE_H
#define LI_SPEC_EAGLE_H

#include "model/model.h"
#include "spec/eagle_file.h"

/* drafts per step when an EAGLE draft is given and no k is (a chain) */
#define LI_EAGLE_DEFAULT_K 3

typedef struct li_eagle {
    li_gguf gguf;             /* the mapped file: the block's weights point into it */
    li_eagle_file f;          /* its checked fields and tensors */
    /* the block as a model: hp.n_vocab = the draft vocabulary, n_layer 1;
     * tok_embd is the base's (borrowed at prepare), output the base's
     * output rows of the vocabulary (owned: head), output_norm the file's */
    li_model m;
    li_layer layer;
    li_model_inproj inproj;
    int32_t *vocab;           /* (n_draft) base ids, ascending (the identity without eagle.vocab) */
    void *head;               /* the output rows' bytes, owned */
    char base_name[128];      /* eagle.base.name */
    li_backend *be;           /* prepared on, or NULL */
} li_eagle;

/* Loads a draft checked against base by li_eagle_file_check (one-line errors
 * naming the field and both values; a different base name alone is a
 * warning) and builds its output rows from base's output matrix: the same
 * rows bit for bit when that is a plain GGUF type, else F16 copies of the
 * dequantized rows. */
int li_eagle_load(li_eagle **out, const char *path, const li_model *base, li_error *err);
/* The block's weights into be (base must be prepared on be: its embedding
 * is borrowed as it is there). */
int li_eagle_prepare(li_eagle *eg, const li_model *base, li_backend *be, li_error *err);
void li_eagle_free(li_eagle *eg);

#endif
