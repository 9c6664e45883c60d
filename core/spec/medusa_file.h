/* medusa_file.h — the Medusa heads file format (docs/medusa.md), checked in
 * one place for both readers: li_medusa_load (spec/medusa.c, inference) and
 * li_train_medusa_load (train/medusa.c, evaluating or resuming heads).
 *
 * GGUF, general.architecture "medusa", medusa.version 1, medusa.n_heads K in
 * [1, LI_MEDUSA_FILE_MAX_HEADS], medusa.n_embd, medusa.n_vocab,
 * medusa.hidden "post_norm", medusa.base.name, medusa.base.vocab_hash (16
 * lowercase hex digits); per head k: medusa.k.weight F32 or F16 [n_embd,
 * n_embd], medusa.k.bias F32 [n_embd]. */
#ifndef LI_SPEC_MEDUSA_FILE_H
#define LI_SPEC_MEDUSA_FILE_H

#include "model/gguf.h"
#include "types.h"

#define LI_MEDUSA_FILE_MAX_HEADS 8

/* What a checked file holds: its fields, and its tensors in the mapping. */
typedef struct li_medusa_file {
    int32_t n_heads, n_embd, n_vocab;
    char base_name[128];      /* medusa.base.name ("" when absent) */
    uint64_t vocab_hash;      /* medusa.base.vocab_hash */
    const li_gguf_tensor *w[LI_MEDUSA_FILE_MAX_HEADS]; /* (n_embd, n_embd) F32 or F16 */
    const li_gguf_tensor *b[LI_MEDUSA_FILE_MAX_HEADS]; /* (n_embd) F32 */
} li_medusa_file;

/* The base the heads must fit: its width, vocabulary and vocabulary hash
 * (li_tokenizer_vocab_hash); name (NULL: unknown) only for messages, and a
 * different name alone is a warning. */
typedef struct li_medusa_base {
    const char *name;
    int64_t n_embd, n_vocab;
    uint64_t vocab_hash;
} li_medusa_base;

/* Checks the opened file g (named path in messages) against base: one-line
 * errors naming the field and both values. Fills f. base NULL: the file
 * alone (its fields and shapes; `luainfer info`). */
int li_medusa_file_check(const li_gguf *g, const char *path, const li_medusa_base *base, li_medusa_file *f,
                         li_error *err);

#endif
