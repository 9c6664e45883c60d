/* tok_pretok.c — pre-tokenization: cutting raw text into the words BPE runs on.
 *
 * The split rules are regexes in HF tokenizer.json files and llama.cpp; here
 * each one is a hand-written scanner over codepoints, in the shape of
 * llama.cpp's unicode_regex_split_custom_*. A scanner sees one segment
 * [a, b) and treats everything outside it as absent, exactly like a regex run
 * on that substring (lookaheads do not see past the segment end).
 *
 * Character classes: \p{L} and \p{N} are General_Category L* and N* from
 * utf8proc; \s is the Unicode White_Space property (what Oniguruma and
 * llama.cpp use). A byte that is not part of valid UTF-8 becomes a one-byte
 * "character" of no class, which joins [^\s\p{L}\p{N}] runs. */
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ---- UTF-8 ---------------------------------------------------------------- */

int li_tok_utf8_check(const uint8_t *s, size_t n) {
    if (n == 0) return 0;
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    int len;
    uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c == 0xE0) { len = 3; lo = 0xA0; }
    else if (c == 0xED) { len = 3; hi = 0x9F; } /* no surrogates */
    else if (c >= 0xE1 && c <= 0xEF) len = 3;
    else if (c == 0xF0) { len = 4; lo = 0x90; }
    else if (c >= 0xF1 && c <= 0xF3) len = 4;
    else if (c == 0xF4) { len = 4; hi = 0x8F; } /* <= U+10FFFF */
    else return -1;
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n) return 0; /* valid so far, needs more bytes */
        uint8_t l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (s[i] < l || s[i] > h) return -i;
    }
    return len;
}

static uint32_t utf8_decode(const uint8_t *s, int len) {
    switch (len) {
    case 1: return s[0];
    case 2: return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    case 3: return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    default:
        return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
               ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
    }
}

/* ---- GPT-2 byte alphabet ---------------------------------------------------- */

/* Printable Latin-1 bytes stand for themselves; the other 68 bytes map, in
 * order, to U+0100 upward, so every byte has a visible, non-space char:
 * 0x00-0x20 -> U+0100-U+0120, 0x7F-0xA0 -> U+0121-U+0142, 0xAD -> U+0143. */
uint32_t li_tok_byte_to_cp(uint8_t b) {
    if (b <= 0x20) return 0x100 + b;
    if (b >= 0x7F && b <= 0xA0) return 0x121 + (b - 0x7F);
    if (b == 0xAD) return 0x143;
    return b;
}

int li_tok_cp_to_byte(uint32_t cp) {
    if (cp < 0x100) return (cp > 0x20 && cp < 0x7F) || (cp > 0xA0 && cp != 0xAD) ? (int)cp : -1;
    if (cp <= 0x120) return (int)(cp - 0x100);
    if (cp <= 0x142) return (int)(0x7F + cp - 0x121);
    if (cp == 0x143) return 0xAD;
    return -1;
}

/* ---- character classes ------------------------------------------------------- */

enum {
    CL_L = 1,    /* \p{L} */
    CL_N = 2,    /* \p{N} */
    CL_WS = 4,   /* \s */
    CL_ANY = 8,  /* set on every character, so 0 means "outside the segment" */
};

#define CP_NONE 0xFFFFFFFFu /* outside the segment, or an invalid byte */

static bool is_white_space(uint32_t cp) {
    /* Unicode PropList.txt White_Space; stable since Unicode 6.3. */
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

static uint8_t cp_class(uint32_t cp) {
    if (cp < 0x80) {
        if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return CL_ANY | CL_L;
        if (cp >= '0' && cp <= '9') return CL_ANY | CL_N;
        return CL_ANY | (is_white_space(cp) ? CL_WS : 0);
    }
    uint8_t c = CL_ANY;
    if (is_white_space(cp)) c |= CL_WS;
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO:
        c |= CL_L;
        break;
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
        c |= CL_N;
        break;
    default:
        break;
    }
    return c;
}

/* ---- segment view ------------------------------------------------------------- */

typedef struct chars {
    uint32_t *cp;   /* codepoint, CP_NONE for an invalid byte */
    uint32_t *off;  /* byte offset of each char; off[n] = byte length */
    uint8_t *cls;
    size_t n;
} chars;

typedef struct seg {
    const chars *c;
    size_t a, b;      /* the segment [a, b) in chars */
    size_t start;     /* start of the word being built */
    li_tok_word_fn fn;
    void *ctx;
} seg;

static inline uint32_t seg_cp(const seg *s, size_t i) { return i < s->b ? s->c->cp[i] : CP_NONE; }
static inline uint8_t seg_cls(const seg *s, size_t i) { return i < s->b ? s->c->cls[i] : 0; }

static void seg_emit(seg *s, size_t end) {
    if (end > s->start) s->fn(s->ctx, s->c->off[s->start], s->c->off[end]);
    s->start = end;
}

/* ---- GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ ---- */

static void split_gpt2(seg *s) {
    size_t pos = s->a;
    s->start = pos;
    while (pos < s->b) {
        uint32_t cp = seg_cp(s, pos);
        uint8_t cl = seg_cls(s, pos);
        if (cp == '\'' && pos + 1 < s->b) {
            uint32_t c1 = seg_cp(s, pos + 1);
            if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
                seg_emit(s, pos += 2);
                continue;
            }
            if (pos + 2 < s->b) {
                uint32_t c2 = seg_cp(s, pos + 2);
                if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
                    seg_emit(s, pos += 3);
                    continue;
                }
            }
        }
        uint8_t cl2 = cp == ' ' ? seg_cls(s, pos + 1) : cl;
        if (cl2 & CL_L) {
            pos += cp == ' ';
            while (seg_cls(s, pos) & CL_L) pos++;
            seg_emit(s, pos);
            continue;
        }
        if (cl2 & CL_N) {
            pos += cp == ' ';
            while (seg_cls(s, pos) & CL_N) pos++;
            seg_emit(s, pos);
            continue;
        }
        if (cl2 && !(cl2 & (CL_WS | CL_L | CL_N))) {
            pos += cp == ' ';
            for (uint8_t c; (c = seg_cls(s, pos)) && !(c & (CL_WS | CL_L | CL_N));) pos++;
            seg_emit(s, pos);
            continue;
        }
        size_t nws = 0;
        while (seg_cls(s, pos + nws) & CL_WS) nws++;
        if (nws > 1 && pos + nws < s->b) { /* \s+(?!\S): leave the last one for the word */
            seg_emit(s, pos += nws - 1);
            continue;
        }
        if (nws > 0) {
            seg_emit(s, pos += nws);
            continue;
        }
        seg_emit(s, ++pos);
    }
}

/* ---- Llama 3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *               ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ ----------------- */

static uint32_t lower(uint32_t cp) {
    return cp == CP_NONE ? cp : (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
}

static void split_llama3(seg *s) {
    size_t pos = s->a;
    s->start = pos;
    while (pos < s->b) {
        uint32_t cp = seg_cp(s, pos);
        uint8_t cl = seg_cls(s, pos);
        if (cp == '\'' && pos + 1 < s->b) {
            uint32_t c1 = lower(seg_cp(s, pos + 1));
            if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
                seg_emit(s, pos += 2);
                continue;
            }
            if (pos + 2 < s->b) {
                uint32_t c2 = lower(seg_cp(s, pos + 2));
                if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
                    seg_emit(s, pos += 3);
                    continue;
                }
            }
        }
        if (!(cp == '\r' || cp == '\n' || (cl & CL_N))) {
            if ((cl & CL_L) || (seg_cls(s, pos + 1) & CL_L)) {
                pos++;
                while (seg_cls(s, pos) & CL_L) pos++;
                seg_emit(s, pos);
                continue;
            }
        }
        if (cl & CL_N) {
            size_t ini = pos;
            while ((seg_cls(s, pos) & CL_N) && pos - ini < 3) pos++;
            seg_emit(s, pos);
            continue;
        }
        uint8_t cl2 = cp == ' ' ? seg_cls(s, pos + 1) : cl;
        if (cl2 && !(cl2 & (CL_WS | CL_L | CL_N))) {
            pos += cp == ' ';
            for (uint8_t c; (c = seg_cls(s, pos)) && !(c & (CL_WS | CL_L | CL_N));) pos++;
            for (uint32_t c; (c = seg_cp(s, pos)) == '\r' || c == '\n';) pos++;
            seg_emit(s, pos);
            continue;
        }
        size_t nws = 0, last_rn = 0;
        while (seg_cls(s, pos + nws) & CL_WS) {
            uint32_t c = seg_cp(s, pos + nws);
            if (c == '\r' || c == '\n') last_rn = pos + nws + 1;
            nws++;
        }
        if (last_rn > 0) { /* \s*[\r\n]+ */
            seg_emit(s, pos = last_rn);
            continue;
        }
        if (nws > 1 && pos + nws < s->b) {
            seg_emit(s, pos += nws - 1);
            continue;
        }
        if (nws > 0) {
            seg_emit(s, pos += nws);
            continue;
        }
        seg_emit(s, ++pos);
    }
}

/* ---- driver ----------------------------------------------------------------------- */

static void chars_init(chars *c, const char *text, size_t n) {
    c->cp = li_xmalloc((n + 1) * sizeof *c->cp);
    c->off = li_xmalloc((n + 1) * sizeof *c->off);
    c->cls = li_xmalloc(n + 1);
    const uint8_t *s = (const uint8_t *)text;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        int len = li_tok_utf8_check(s + i, n - i);
        c->off[k] = (uint32_t)i;
        if (len > 0) {
            c->cp[k] = utf8_decode(s + i, len);
            c->cls[k] = cp_class(c->cp[k]);
            i += (size_t)len;
        } else {
            c->cp[k] = CP_NONE;
            c->cls[k] = CL_ANY;
            i++;
        }
        k++;
    }
    c->off[k] = (uint32_t)n;
    c->n = k;
}

static void chars_free(chars *c) {
    free(c->cp);
    free(c->off);
    free(c->cls);
}

void li_tok_pretokenize(int pre, const char *text, size_t n, li_tok_word_fn fn, void *ctx) {
    if (n == 0) return;
    chars c;
    chars_init(&c, text, n);
    seg s = {.c = &c, .a = 0, .b = c.n, .fn = fn, .ctx = ctx};
    switch (pre) {
    case LI_TOK_PRE_SMOLLM:
        /* "\p{N}" first: every digit is a word of its own, and the GPT-2
         * rule then runs on each stretch between digits separately. */
        for (size_t i = 0, a = 0; i <= c.n; i++) {
            if (i < c.n && !(c.cls[i] & CL_N)) continue;
            if (i > a) {
                s.a = a;
                s.b = i;
                split_gpt2(&s);
            }
            if (i < c.n) fn(ctx, c.off[i], c.off[i + 1]);
            a = i + 1;
        }
        break;
    case LI_TOK_PRE_LLAMA3:
        split_llama3(&s);
        break;
    default:
        split_gpt2(&s);
        break;
    }
    chars_free(&c);
}
