/* eagle_file.h — the EAGLE draft file format (docs/eagle.md), checked in one
 * place for both readers: li_eagle_load (spec/eagle.c, inference) and the
 * trainer (train/eagle.c, evaluating or resuming a draft).
 *
 * GGUF, general.architecture "eagle", eagle.version 1; the draft's shape
 * (eagle.n_embd, eagle.n_vocab: the base's; eagle.n_head, eagle.n_head_kv,
 * eagle.head_dim, eagle.n_ff); the base blocks it reads (eagle.n_features
 * F in [1, LI_EAGLE_MAX_FEATURES], eagle.feature_layer.{i}, ascending);
 * eagle.base.name, eagle.base.vocab_hash (16 lowercase hex digits),
 * eagle.base.n_layer. Tensors (GGUF dims [cols, rows]):
 *   eagle.fc.weight            [F·n_embd, n_embd]
 *   eagle.enorm.weight         [n_embd]     norm of the token's embedding
 *   eagle.hnorm.weight         [n_embd]     norm of the hidden input
 *   eagle.attn_q.weight        [2·n_embd, n_head·head_dim]
 *   eagle.attn_k.weight        [2·n_embd, n_head_kv·head_dim]
 *   eagle.attn_v.weight        [2·n_embd, n_head_kv·head_dim]
 *   eagle.attn_output.weight   [n_head·head_dim, n_embd]
 *   eagle.ffn_norm.weight      [n_embd]
 *   eagle.ffn_gate.weight      [n_embd, n_ff]
 *   eagle.ffn_up.weight        [n_embd, n_ff]
 *   eagle.ffn_down.weight      [n_ff, n_embd]
 *   eagle.output_norm.weight   [n_embd]
 *   eagle.vocab                [n_draft] I32, optional: the draft's vocabulary
 *                              (ids of the base, strictly ascending); absent:
 *                              the base's whole vocabulary
 * Matrices F32, F16 or BF16; norms F32. */
#ifndef LI_SPEC_EAGLE_FILE_H
#define LI_SPEC_EAGLE_FILE_H

#include "model/gguf.h"
#include "types.h"

#define LI_EAGLE_MAX_FEATURES 4

/* The tensors, in file order (li_eagle_tensor_name). */
typedef enum li_eagle_tensor {
    LI_EAGLE_FC = 0, LI_EAGLE_ENORM, LI_EAGLE_HNORM, LI_EAGLE_WQ, LI_EAGLE_WK, LI_EAGLE_WV, LI_EAGLE_WO,
    LI_EAGLE_FFN_NORM, LI_EAGLE_GATE, LI_EAGLE_UP, LI_EAGLE_DOWN, LI_EAGLE_OUTPUT_NORM, LI_EAGLE_N_TENSORS
} li_eagle_tensor;

/* "eagle.fc.weight", ... */
const char *li_eagle_tensor_name(li_eagle_tensor t);

/* What a checked file holds: its fields, and its tensors in the mapping. */
typedef struct li_eagle_file {
    int32_t n_embd, n_vocab, n_head, n_head_kv, head_dim, n_ff;
    int32_t n_features;
    int32_t feature_layer[LI_EAGLE_MAX_FEATURES]; /* ascending blocks of the base */
    char base_name[128];      /* eagle.base.name ("" when absent) */
    uint64_t vocab_hash;      /* eagle.base.vocab_hash */
    int32_t base_n_layer;     /* eagle.base.n_layer */
    const li_gguf_tensor *t[LI_EAGLE_N_TENSORS];
    const int32_t *vocab;     /* (n_draft) into the mapping, or NULL: the whole vocabulary */
    int32_t n_draft;          /* the draft's vocabulary size (n_vocab without eagle.vocab) */
} li_eagle_file;

/* The base the draft must fit (its shape, and li_tokenizer_vocab_hash);
 * name (NULL: unknown) only for messages, and a different name alone is a
 * warning. */
typedef struct li_eagle_base {
    const char *name;
    int64_t n_embd, n_vocab, n_layer, head_dim;
    uint64_t vocab_hash;
} li_eagle_base;

/* Checks the opened file g (named path in messages) against base: one-line
 * errors naming the field and both values. Fills f. base NULL: the file
 * alone (its fields, shapes and vocabulary; `luainfer info`). */
int li_eagle_file_check(const li_gguf *g, const char *path, const li_eagle_base *base, li_eagle_file *f,
                        li_error *err);

#endif
