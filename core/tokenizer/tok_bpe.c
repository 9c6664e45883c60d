/* tok_bpe.c — the vocabulary and merge hash maps, and the two merge loops.
 *
 * Byte-level BPE (GPT-2 family): a word starts as one symbol per byte (the
 * token of that byte's GPT-2 char) and the lowest-ranked adjacent pair is
 * merged until none is left; ties go to the leftmost pair. Symbols carry
 * token ids, and the merge map gives (rank, merged id) per id pair, so the
 * loop never builds strings.
 *
 * SentencePiece BPE (Llama 1/2 family): a fragment starts as one symbol per
 * UTF-8 character, and the adjacent pair whose concatenation is the
 * highest-scoring vocabulary token is merged first (ties: leftmost). What is
 * left over and not in the vocabulary goes out as <0xXX> byte tokens. A
 * tokenizer.json of that family (HF's BPE with byte_fallback) instead maps
 * each character to its token or its byte tokens first and then runs the
 * byte-level loop's ranked merges over those ids.
 *
 * Both use a binary min-heap of candidates keyed by one 64-bit number, and a
 * stale candidate is recognised when popped (its symbols changed since). */
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* ---- id vector ------------------------------------------------------------- */

void li_tok_ids_push(li_tok_ids *ids, int32_t id) {
    if (ids->n == ids->cap) {
        ids->cap = ids->cap ? ids->cap * 2 : 64;
        ids->v = li_xrealloc(ids->v, ids->cap * sizeof *ids->v);
    }
    ids->v[ids->n++] = id;
}

/* ---- string map --------------------------------------------------------------- */

static uint32_t pow2_at_least(uint64_t n) {
    uint32_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

void li_tok_strmap_init(li_tok_strmap *m, const li_tokenizer *t) {
    uint32_t cap = pow2_at_least((uint64_t)t->n_vocab * 2);
    m->slots = li_xcalloc(cap, sizeof *m->slots);
    m->mask = cap - 1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        uint32_t len;
        const char *s = li_tok_text(t, id, &len);
        uint32_t h = (uint32_t)XXH3_64bits(s, len) & m->mask;
        for (;; h = (h + 1) & m->mask) {
            int32_t cur = m->slots[h] - 1;
            if (cur < 0) break;
            uint32_t clen;
            const char *cs = li_tok_text(t, cur, &clen);
            if (clen == len && memcmp(cs, s, len) == 0) break;
        }
        /* A text listed twice maps to its last id, as in llama.cpp and HF. */
        m->slots[h] = id + 1;
    }
}

void li_tok_strmap_free(li_tok_strmap *m) {
    free(m->slots);
    m->slots = NULL;
}

int32_t li_tok_strmap_get(const li_tok_strmap *m, const li_tokenizer *t, const char *s, size_t n) {
    uint32_t h = (uint32_t)XXH3_64bits(s, n) & m->mask;
    for (;; h = (h + 1) & m->mask) {
        int32_t cur = m->slots[h] - 1;
        if (cur < 0) return -1;
        uint32_t clen;
        const char *cs = li_tok_text(t, cur, &clen);
        if (clen == n && memcmp(cs, s, n) == 0) return cur;
    }
}

/* ---- pair map ------------------------------------------------------------------ */

static inline uint32_t pair_hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return (uint32_t)k;
}

void li_tok_pairmap_init(li_tok_pairmap *m, uint32_t n_merges) {
    uint32_t cap = pow2_at_least((uint64_t)n_merges * 2);
    m->slots = li_xmalloc(cap * sizeof *m->slots);
    for (uint32_t i = 0; i < cap; i++) m->slots[i].key = UINT64_MAX;
    m->mask = cap - 1;
}

void li_tok_pairmap_free(li_tok_pairmap *m) {
    free(m->slots);
    m->slots = NULL;
}

void li_tok_pairmap_put(li_tok_pairmap *m, int32_t left, int32_t right, int32_t rank, int32_t result) {
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    for (uint32_t h = pair_hash(key) & m->mask;; h = (h + 1) & m->mask) {
        if (m->slots[h].key == key) return;
        if (m->slots[h].key == UINT64_MAX) {
            m->slots[h] = (li_tok_merge){.key = key, .rank = rank, .result = result};
            return;
        }
    }
}

const li_tok_merge *li_tok_pairmap_get(const li_tok_pairmap *m, int32_t left, int32_t right) {
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    for (uint32_t h = pair_hash(key) & m->mask;; h = (h + 1) & m->mask) {
        if (m->slots[h].key == key) return &m->slots[h];
        if (m->slots[h].key == UINT64_MAX) return NULL;
    }
}

/* ---- symbols and the candidate heap ---------------------------------------------- */

typedef struct li_tok_sym {
    int32_t id;          /* BPE: token id, -1 once merged away */
    uint32_t off, n;     /* SPM: byte span in the work buffer; n = 0 once merged away */
    int32_t prev, next;  /* neighbours, -1 at the ends */
} li_tok_sym;

typedef struct li_tok_cand {
    uint64_t key;        /* smaller pops first */
    int32_t left, right; /* symbol indices */
    int32_t a, b;        /* BPE: the ids the pair was formed from */
    int32_t result;      /* BPE: merged id */
    uint32_t size;       /* SPM: merged byte length */
} li_tok_cand;

void li_tok_work_free(li_tok_work *w) {
    free(w->sym);
    free(w->heap);
    free(w->buf);
    memset(w, 0, sizeof *w);
}

static void work_reserve(li_tok_work *w, size_t n_sym) {
    if (n_sym > w->sym_cap) {
        w->sym_cap = n_sym * 2;
        w->sym = li_xrealloc(w->sym, w->sym_cap * sizeof *w->sym);
    }
    w->heap_n = 0;
}

static void heap_push(li_tok_work *w, li_tok_cand c) {
    if (w->heap_n == w->heap_cap) {
        w->heap_cap = w->heap_cap ? w->heap_cap * 2 : 64;
        w->heap = li_xrealloc(w->heap, w->heap_cap * sizeof *w->heap);
    }
    size_t i = w->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (w->heap[p].key <= c.key) break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = c;
}

static li_tok_cand heap_pop(li_tok_work *w) {
    li_tok_cand top = w->heap[0];
    li_tok_cand last = w->heap[--w->heap_n];
    size_t n = w->heap_n, i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && w->heap[c + 1].key < w->heap[c].key) c++;
        if (last.key <= w->heap[c].key) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n > 0) w->heap[i] = last;
    return top;
}

/* ---- byte-level BPE ------------------------------------------------------------------ */

static void bpe_try_pair(const li_tokenizer *t, li_tok_work *w, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const li_tok_merge *m = li_tok_pairmap_get(&t->merges, w->sym[left].id, w->sym[right].id);
    if (!m) return;
    heap_push(w, (li_tok_cand){.key = (uint64_t)(uint32_t)m->rank << 32 | (uint32_t)left,
                               .left = left, .right = right, .a = w->sym[left].id,
                               .b = w->sym[right].id, .result = m->result});
}

/* The merge loop over ns symbols w->sym[0..ns) holding token ids: the
 * lowest-ranked adjacent pair first, ties to the leftmost; then the ids out. */
static void bpe_merge(const li_tokenizer *t, li_tok_work *w, int32_t ns, li_tok_ids *out) {
    if (ns == 0) return;
    for (int32_t i = 1; i < ns; i++) bpe_try_pair(t, w, i - 1, i);
    while (w->heap_n > 0) {
        li_tok_cand c = heap_pop(w);
        li_tok_sym *l = &w->sym[c.left];
        if (l->id != c.a || l->next != c.right || w->sym[c.right].id != c.b) continue; /* stale */
        li_tok_sym *r = &w->sym[c.right];
        l->id = c.result;
        l->next = r->next;
        if (r->next >= 0) w->sym[r->next].prev = c.left;
        r->id = -1;
        bpe_try_pair(t, w, l->prev, c.left);
        bpe_try_pair(t, w, c.left, l->next);
    }
    for (int32_t i = 0; i >= 0; i = w->sym[i].next) li_tok_ids_push(out, w->sym[i].id);
}

void li_tok_bpe_word(const li_tokenizer *t, li_tok_work *w, const uint8_t *s, size_t n,
                     li_tok_ids *out) {
    work_reserve(w, n);
    int32_t ns = 0;
    for (size_t i = 0; i < n; i++) {
        /* A byte the vocabulary cannot spell is dropped and its neighbours
         * become adjacent: HF's BPE without an unk token does this.
         * llama.cpp keeps the gap (no merge across it); we follow HF. */
        int32_t id = t->byte_tok[s[i]];
        if (id < 0) continue;
        w->sym[ns] = (li_tok_sym){.id = id, .prev = ns - 1, .next = -1};
        if (ns > 0) w->sym[ns - 1].next = ns;
        ns++;
    }
    bpe_merge(t, w, ns, out);
}

int32_t li_tok_bpe_whole(const li_tokenizer *t, li_tok_work *w, const uint8_t *s, size_t n) {
    /* Each byte's GPT-2 char is at most 2 bytes of UTF-8. */
    if (2 * n > w->buf_cap) {
        w->buf_cap = 2 * n;
        w->buf = li_xrealloc(w->buf, w->buf_cap);
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = li_tok_byte_to_cp(s[i]);
        if (cp < 0x80) {
            w->buf[m++] = (char)cp;
        } else {
            w->buf[m++] = (char)(0xC0 | cp >> 6);
            w->buf[m++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    return li_tok_strmap_get(&t->vocab, t, w->buf, m);
}

/* ---- SentencePiece BPE --------------------------------------------------------------- */

/* Maps a float to a uint32 with the same order. */
static uint32_t float_order(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static void spm_try_pair(const li_tokenizer *t, li_tok_work *w, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    uint32_t size = w->sym[left].n + w->sym[right].n;
    int32_t id = li_tok_strmap_get(&t->vocab, t, w->buf + w->sym[left].off, size);
    if (id < 0) return;
    float score = t->score ? t->score[id] : 0.0f;
    /* Highest score first, then leftmost. */
    uint64_t key = (uint64_t)(~float_order(score)) << 32 | (uint32_t)left;
    heap_push(w, (li_tok_cand){.key = key, .left = left, .right = right, .size = size});
}

static void spm_emit(const li_tokenizer *t, const char *s, uint32_t n, li_tok_ids *out) {
    int32_t id = li_tok_strmap_get(&t->vocab, t, s, n);
    if (id >= 0) {
        li_tok_ids_push(out, id);
        return;
    }
    for (uint32_t i = 0; i < n; i++) {
        int32_t b = t->byte_tok[(uint8_t)s[i]];
        if (b < 0) b = t->unk;
        if (b >= 0) li_tok_ids_push(out, b);
    }
}

/* One character's byte length from its lead byte only (llama.cpp's
 * unicode_len_utf8), so invalid bytes never fail. */
static const uint8_t lead_len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};

/* The fragment escaped into w->buf: an optional leading "▁", then every ' '
 * as U+2581 "▁". Returns its length. */
static size_t spm_escape(li_tok_work *w, const char *s, size_t n, bool prefix_space) {
    size_t need = (n + 1) * 3;
    if (need > w->buf_cap) {
        w->buf_cap = need;
        w->buf = li_xrealloc(w->buf, need);
    }
    size_t m = 0;
    if (prefix_space) {
        memcpy(w->buf, "\xE2\x96\x81", 3);
        m = 3;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(w->buf + m, "\xE2\x96\x81", 3);
            m += 3;
        } else {
            w->buf[m++] = s[i];
        }
    }
    return m;
}

/* HF's BPE with byte_fallback over the escaped fragment: each character is
 * its vocabulary token, else its <0xXX> byte tokens (all of them must
 * exist), else unk (fused with an unk just before it when fuse_unk; dropped
 * without an unk token); then the ranked merges of t->merges. */
static void spm_ranked_word(const li_tokenizer *t, li_tok_work *w, size_t off, size_t m, li_tok_ids *out) {
    work_reserve(w, m - off); /* at most one symbol per byte */
    int32_t ns = 0;
    for (size_t i = off; i < m;) {
        size_t len = lead_len[(uint8_t)w->buf[i] >> 4];
        if (len > m - i) len = m - i;
        int32_t id = li_tok_strmap_get(&t->vocab, t, w->buf + i, len);
        int32_t ids[4], k = 0;
        if (id >= 0) {
            ids[k++] = id;
        } else {
            for (size_t j = 0; j < len && k >= 0; j++) {
                int32_t b = t->byte_tok[(uint8_t)w->buf[i + j]];
                if (b < 0) k = -1;
                else ids[k++] = b;
            }
            if (k < 0) {
                k = 0;
                bool fused = t->fuse_unk && ns > 0 && w->sym[ns - 1].id == t->unk;
                if (t->unk >= 0 && !fused) ids[k++] = t->unk;
            }
        }
        for (int32_t j = 0; j < k; j++) {
            w->sym[ns] = (li_tok_sym){.id = ids[j], .prev = ns - 1, .next = -1};
            if (ns > 0) w->sym[ns - 1].next = ns;
            ns++;
        }
        i += len;
    }
    bpe_merge(t, w, ns, out);
}

/* The escaped fragment w->buf[0..m): one word, or with Metaspace's split a
 * word starting at each "▁" (the delimiter goes with the word after it). */
static void spm_ranked(const li_tokenizer *t, li_tok_work *w, size_t m, li_tok_ids *out) {
    if (!t->spm_split) {
        spm_ranked_word(t, w, 0, m, out);
        return;
    }
    size_t start = 0;
    for (size_t i = 1; i + 3 <= m; i++) {
        if (memcmp(w->buf + i, "\xE2\x96\x81", 3) == 0) {
            spm_ranked_word(t, w, start, i, out);
            start = i;
            i += 2;
        }
    }
    spm_ranked_word(t, w, start, m, out);
}

void li_tok_spm_fragment(const li_tokenizer *t, li_tok_work *w, const char *s, size_t n,
                         bool prefix_space, li_tok_ids *out) {
    size_t m = spm_escape(w, s, n, prefix_space);
    if (m == 0) return;
    if (t->spm_ranked) {
        spm_ranked(t, w, m, out);
        return;
    }
    /* One symbol per character; the highest-scoring pair merges first. */
    work_reserve(w, m);
    int32_t ns = 0;
    for (size_t i = 0; i < m;) {
        size_t len = lead_len[(uint8_t)w->buf[i] >> 4];
        if (len > m - i) len = m - i;
        w->sym[ns] = (li_tok_sym){.off = (uint32_t)i, .n = (uint32_t)len, .prev = ns - 1, .next = -1};
        if (ns > 0) w->sym[ns - 1].next = ns;
        ns++;
        i += len;
    }
    for (int32_t i = 1; i < ns; i++) spm_try_pair(t, w, i - 1, i);
    while (w->heap_n > 0) {
        li_tok_cand c = heap_pop(w);
        li_tok_sym *l = &w->sym[c.left], *r = &w->sym[c.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != c.size) continue; /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) w->sym[r->next].prev = c.left;
        spm_try_pair(t, w, l->prev, c.left);
        spm_try_pair(t, w, c.left, l->next);
    }
    for (int32_t i = 0; i >= 0; i = w->sym[i].next) spm_emit(t, w->buf + w->sym[i].off, w->sym[i].n, out);
}
