/* tokenizer.h — text <-> token ids, built from a GGUF file's vocabulary
 * (or a Hugging Face tokenizer.json: li_tokenizer_init_hf, tok_json.c).
 *
 * Two model families, chosen by `tokenizer.ggml.model`:
 *   "gpt2"  byte-level BPE (GPT-2 bytes->unicode alphabet, merge ranks),
 *           with a hand-written pre-tokenizer per `tokenizer.ggml.pre`
 *           ("default"/"gpt2", "smollm", "llama-bpe"/"llama3").
 *   "llama" SentencePiece-style BPE (score-ordered merges, "▁" for spaces,
 *           add_space_prefix, <0xXX> byte fallback).
 * Results match Hugging Face `tokenizers` and llama.cpp; where those two
 * disagree the choice is written next to the code that makes it.
 *
 * Special tokens (GGUF token_type CONTROL, USER_DEFINED, UNKNOWN) are matched
 * whole in the input, leftmost-longest, before pre-tokenization.
 *
 * A tokenizer is immutable after init: any number of threads may encode and
 * decode with it at once (each li_detok belongs to one stream). */
#ifndef LI_TOKENIZER_H
#define LI_TOKENIZER_H

#include "../util/common.h"
#include "../model/gguf.h"

/* GGUF `tokenizer.ggml.token_type` values (llama.cpp's numbering). */
typedef enum li_token_type {
    LI_TOKEN_TYPE_UNDEFINED = 0,
    LI_TOKEN_TYPE_NORMAL = 1,
    LI_TOKEN_TYPE_UNKNOWN = 2,
    LI_TOKEN_TYPE_CONTROL = 3,
    LI_TOKEN_TYPE_USER_DEFINED = 4,
    LI_TOKEN_TYPE_UNUSED = 5,
    LI_TOKEN_TYPE_BYTE = 6,
} li_token_type;

typedef struct li_tokenizer li_tokenizer;

/* Builds a tokenizer from g; copies everything it needs, so g may be freed
 * afterwards. Returns 0, or a negative LI_E* code with err filled. */
int li_tokenizer_init(li_tokenizer **out, const li_gguf *g, li_error *err);
void li_tokenizer_free(li_tokenizer *t);

/* What a Hugging Face directory adds to its tokenizer.json (all optional). */
typedef struct li_tokenizer_hf_opts {
    const char *bos_token, *eos_token, *unk_token; /* tokenizer_config.json's texts, or NULL */
    int add_bos;         /* -1: as the post-processor says; 0/1: tokenizer_config.json's add_bos_token */
    int32_t n_vocab_min; /* pad with unused "[PAD<id>]" tokens up to this (the embedding's rows) */
    const int32_t *eog_ids; /* config.json's eos_token_id(s): more end-of-generation ids */
    int n_eog_ids;
} li_tokenizer_hf_opts;

/* Builds a tokenizer from a tokenizer.json's bytes (json, len; `name` names
 * the file in messages): byte-level BPE with the GPT-2, SmolLM (digits) or
 * Llama 3 split, no normalizer; anything else is refused with LI_EUNSUP and
 * the part it does not support. Copies what it needs. (tok_json.c) */
int li_tokenizer_init_hf(li_tokenizer **out, const char *json, size_t len, const char *name,
                         const li_tokenizer_hf_opts *opts, li_error *err);

int32_t li_tokenizer_n_vocab(const li_tokenizer *t);
int32_t li_tokenizer_bos(const li_tokenizer *t); /* -1 if none */
int32_t li_tokenizer_eos(const li_tokenizer *t); /* -1 if none */
bool li_tokenizer_add_bos(const li_tokenizer *t); /* GGUF add_bos_token */
/* End of generation: eos, eot, eom, and the tokens llama.cpp recognises by
 * text (<|im_end|>, <|endoftext|>, <|eot_id|>, <end_of_turn>, ...). */
bool li_tokenizer_is_eog(const li_tokenizer *t, int32_t id);
/* The end-of-generation ids (*ids stays valid while t lives); their count. */
int li_tokenizer_eog_ids(const li_tokenizer *t, const int32_t **ids);
/* Exact lookup of a token's vocabulary text (as stored in the GGUF, so
 * byte-level vocabularies spell a space "Ġ"); -1 if none. */
int32_t li_tokenizer_find(const li_tokenizer *t, const char *text, size_t len);
/* The token's vocabulary text (not NUL-terminated) and its length; NULL for a bad id. */
const char *li_tokenizer_token_text(const li_tokenizer *t, int32_t id, size_t *len);
li_token_type li_tokenizer_token_type(const li_tokenizer *t, int32_t id);
/* A fingerprint of the vocabulary: FNV-1a 64 over the vocabulary size (4
 * bytes, little-endian) and then every token's text followed by one 0 byte,
 * in id order. Files made for a model (Medusa heads) store it to be checked
 * against the model they are loaded with. */
uint64_t li_tokenizer_vocab_hash(const li_tokenizer *t);

/* Encodes text. add_special: prepend BOS (and append EOS) when the model asks
 * for it. parse_special: CONTROL/UNKNOWN token strings in text become their
 * ids (USER_DEFINED ones always do, as in llama.cpp and HF). Writes ids to
 * *out (malloc'd, caller frees; NULL when *n_out is 0) and the count to
 * *n_out. Invalid UTF-8 never fails: each bad byte is a character of its own. */
int li_tokenizer_encode(const li_tokenizer *t, const char *text, size_t len, bool add_special,
                        bool parse_special, int32_t **out, size_t *n_out, li_error *err);

/* Raw bytes of one token (byte-level decoded; "▁" -> " " for SPM; <0xXX> ->
 * that byte). CONTROL/UNKNOWN tokens give their text when `special`, else
 * nothing. Writes up to cap bytes, returns the full byte count (so a
 * too-small cap truncates, snprintf-style), or -1 for a bad id. */
int li_tokenizer_token_to_piece(const li_tokenizer *t, int32_t id, bool special, char *buf,
                                size_t cap);

/* Concatenated pieces of ids, byte-exact (no UTF-8 repair), so
 * decode(encode(text)) == text. For SPM models with add_space_prefix the
 * first non-empty piece loses one leading space, as HF and llama.cpp do.
 * Writes up to cap bytes (no NUL), returns the full byte count or -1 for a
 * bad id. */
long li_tokenizer_decode(const li_tokenizer *t, const int32_t *ids, size_t n, bool special,
                         char *buf, size_t cap);

/* Streaming detokenizer: feed ids one at a time, get back only complete
 * UTF-8 characters. Bytes of a character split across tokens are held until
 * it completes; bytes that can never form a character come out as U+FFFD
 * (one per maximal invalid sequence); at flush a held incomplete character
 * comes out as U+FFFD. */
typedef struct li_detok {
    char pending[8]; /* an incomplete character's leading bytes (at most 3) */
    int n_pending;
} li_detok;

void li_detok_init(li_detok *d);
/* Appends the complete text for `id` to buf (cap bytes). Returns bytes
 * written (>= 0), or -1 for a bad id or when cap is too small (then nothing
 * is written and d is unchanged). */
int li_detok_push(li_detok *d, const li_tokenizer *t, int32_t id, bool special, char *buf,
                  size_t cap);
int li_detok_flush(li_detok *d, char *buf, size_t cap);

#endif
