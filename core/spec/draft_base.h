/* draft_base.h — what a draft file (an EAGLE draft, Medusa heads) says of
 * the base model it was made for: `<kind>.base.name` and
 * `<kind>.base.vocab_hash` (16 lowercase hex digits), and the check of
 * them against the model it is loaded with. Shapes stay with each file's
 * own check. */
#ifndef LI_SPEC_DRAFT_BASE_H
#define LI_SPEC_DRAFT_BASE_H

#include "model/gguf.h"
#include "util/common.h"

#include <stdint.h>

/* The model a draft file is checked against: name NULL when unknown (only
 * for messages: a different name alone is a warning). */
typedef struct li_draft_model_ref {
    const char *name;
    uint64_t vocab_hash;
} li_draft_model_ref;

/* Reads the base's name (into name, "" when absent) and vocabulary hash of
 * the file g (path in messages; kind "eagle" or "medusa"); with model (NULL:
 * the file alone), refuses another vocabulary, the draft named by what
 * ("draft", "heads"). who gets " 'name'" of the model, or "" when unknown,
 * for the caller's own messages. */
int li_draft_base_read(const li_gguf *g, const char *path, const char *kind, const char *what,
                       const li_draft_model_ref *model, char *name, size_t name_cap, uint64_t *hash, char *who,
                       size_t who_cap, li_error *err);

/* After the caller's shape checks passed: a warning when the file names
 * another model than model's (same vocabulary and shape: it is used). */
void li_draft_base_warn_name(const char *kind, const char *what, const char *name, const li_draft_model_ref *model);

#endif
