/* tok_internal.h — what the tokenizer's .c files share; not a public API.
 *
 *   tokenizer.c   loading from GGUF, special tokens, encode/decode driver
 *   tok_json.c    loading from a Hugging Face tokenizer.json
 *   tok_pretok.c  UTF-8 decoding, Unicode classes, pre-tokenizer scanners
 *   tok_bpe.c     vocabulary / merge hash maps, byte-level and SPM merging */
#ifndef LI_TOK_INTERNAL_H
#define LI_TOK_INTERNAL_H

#include "tokenizer.h"

/* ---- vocabulary map: byte string -> id (open addressing) ---------------- */

typedef struct li_tok_strmap {
    int32_t *slots;  /* id + 1, 0 = empty; capacity is a power of two */
    uint32_t mask;
} li_tok_strmap;

/* ---- merge map: (left id, right id) -> (rank, merged id) ---------------- */

typedef struct li_tok_merge {
    uint64_t key;    /* left << 32 | right; UINT64_MAX = empty */
    int32_t rank;
    int32_t result;
} li_tok_merge;

typedef struct li_tok_pairmap {
    li_tok_merge *slots;
    uint32_t mask;
} li_tok_pairmap;

enum { LI_TOK_MODEL_BPE, LI_TOK_MODEL_SPM };
/* When an SPM fragment (text between special tokens) gets a leading "▁". */
enum {
    LI_TOK_PREFIX_LLAMACPP = 0, /* GGUF: add_space_prefix, on the first fragment and after each special */
    LI_TOK_PREFIX_EVERY,        /* tokenizer.json normalizer Prepend("▁"): every fragment */
    LI_TOK_PREFIX_META_FIRST,   /* Metaspace "first": the fragment at offset 0, unless it starts with a space */
    LI_TOK_PREFIX_META_ALWAYS,  /* Metaspace "always": every fragment not starting with a space */
    LI_TOK_PREFIX_NEVER,        /* Metaspace "never" */
};
enum { LI_TOK_PRE_GPT2, LI_TOK_PRE_SMOLLM, LI_TOK_PRE_LLAMA3 };

#define LI_TOK_MAX_EOG 16

struct li_tokenizer {
    int model;             /* LI_TOK_MODEL_* */
    int pre;               /* LI_TOK_PRE_* (BPE only) */
    bool ignore_merges;    /* BPE: a word that is a whole token is taken as is */
    bool spm_ranked;       /* SPM from a tokenizer.json: pairs merge by merge rank (t->merges), as
                            * HF's BPE with byte_fallback does, not by the merged token's score */
    bool fuse_unk;         /* spm_ranked: consecutive unknown characters give one unk */
    bool spm_split;        /* spm_ranked: Metaspace split: words start at each "▁", merges stay inside */
    int spm_prefix;        /* SPM: LI_TOK_PREFIX_* */
    int32_t n_vocab;

    char *text;            /* every token's GGUF text, back to back */
    uint32_t *text_off;    /* (n_vocab + 1) offsets into text */
    char *piece;           /* every token's decoded bytes, back to back */
    uint32_t *piece_off;   /* (n_vocab + 1) offsets into piece */
    uint8_t *type;         /* (n_vocab) li_token_type */
    float *score;          /* (n_vocab) SPM merge scores; NULL for BPE */

    li_tok_strmap vocab;
    li_tok_pairmap merges; /* BPE, and SPM when spm_ranked */
    int32_t byte_tok[256]; /* BPE: token of the byte's GPT-2 char; SPM: <0xXX>; -1 if none */

    int32_t *special;      /* ids matched whole in text, longest text first */
    int32_t n_special;
    uint8_t special_first[256]; /* 1 if some special token starts with this byte */

    int32_t bos, eos, unk, eot, eom;
    bool add_bos, add_eos, add_space_prefix;
    int32_t eog[LI_TOK_MAX_EOG];
    int n_eog;
};

static inline const char *li_tok_text(const li_tokenizer *t, int32_t id, uint32_t *len) {
    *len = t->text_off[id + 1] - t->text_off[id];
    return t->text + t->text_off[id];
}

/* Derived tables once vocabulary, types, merges and ids are filled (both
 * loaders): byte tokens, decoded pieces, the special-token list, the
 * end-of-generation ids. */
void li_tok_finish(li_tokenizer *t);

/* ---- growable id vector -------------------------------------------------- */

typedef struct li_tok_ids {
    int32_t *v;
    size_t n, cap;
} li_tok_ids;

void li_tok_ids_push(li_tok_ids *ids, int32_t id);

/* ---- maps (tok_bpe.c) ----------------------------------------------------- */

void li_tok_strmap_init(li_tok_strmap *m, const li_tokenizer *t);
void li_tok_strmap_free(li_tok_strmap *m);
int32_t li_tok_strmap_get(const li_tok_strmap *m, const li_tokenizer *t, const char *s, size_t n);

void li_tok_pairmap_init(li_tok_pairmap *m, uint32_t n_merges);
void li_tok_pairmap_free(li_tok_pairmap *m);
/* Keeps the first (lowest-rank) entry for a pair, as llama.cpp does. */
void li_tok_pairmap_put(li_tok_pairmap *m, int32_t left, int32_t right, int32_t rank, int32_t result);
const li_tok_merge *li_tok_pairmap_get(const li_tok_pairmap *m, int32_t left, int32_t right);

/* ---- merging (tok_bpe.c) -------------------------------------------------- */

/* Scratch space reused across words of one encode call. */
typedef struct li_tok_work {
    struct li_tok_sym *sym;
    size_t sym_cap;
    struct li_tok_cand *heap;
    size_t heap_n, heap_cap;
    char *buf;             /* SPM: escaped fragment text */
    size_t buf_cap;
} li_tok_work;

void li_tok_work_free(li_tok_work *w);
/* Byte-level BPE of one pre-tokenized word (raw bytes). */
void li_tok_bpe_word(const li_tokenizer *t, li_tok_work *w, const uint8_t *s, size_t n,
                     li_tok_ids *out);
/* The token whose byte-level spelling is the whole word, or -1. */
int32_t li_tok_bpe_whole(const li_tokenizer *t, li_tok_work *w, const uint8_t *s, size_t n);
/* SentencePiece BPE of one raw-text fragment; `prefix_space` prepends " ".
 * Merges by score (GGUF, llama.cpp's rule), or by rank when t->spm_ranked
 * (tokenizer.json, HF's rule: a character outside the vocabulary becomes
 * its <0xXX> byte tokens before merging, else unk). */
void li_tok_spm_fragment(const li_tokenizer *t, li_tok_work *w, const char *s, size_t n,
                         bool prefix_space, li_tok_ids *out);

/* ---- pre-tokenizer (tok_pretok.c) ----------------------------------------- */

/* Called once per word with its byte range in the fragment. */
typedef void (*li_tok_word_fn)(void *ctx, size_t start, size_t end);

/* Splits a raw-text fragment into words the way `pre` says. */
void li_tok_pretokenize(int pre, const char *s, size_t n, li_tok_word_fn fn, void *ctx);

/* Length of the valid UTF-8 character at s (1..4), 0 when s[0..n) is a valid
 * but incomplete start, or -k when the first k bytes (k >= 1) are a maximal
 * invalid subpart (Unicode 3.9, "U+FFFD substitution of maximal subparts"). */
int li_tok_utf8_check(const uint8_t *s, size_t n);

/* GPT-2's byte -> codepoint table, and the inverse (-1 when not a byte char). */
uint32_t li_tok_byte_to_cp(uint8_t b);
int li_tok_cp_to_byte(uint32_t cp);

#endif
