/* output.c — detokenization, stop strings and events for one request. */
#define _GNU_SOURCE /* memmem */
#include "engine/output.h"

#include <stdlib.h>
#include <string.h>

void li_output_init(li_output *o, const char *const *stop, int n_stop) {
    memset(o, 0, sizeof *o);
    li_detok_init(&o->dt);
    o->n_stop = n_stop;
    if (n_stop) {
        o->stop = li_xmalloc((size_t)n_stop * sizeof *o->stop);
        for (int k = 0; k < n_stop; k++) o->stop[k] = strdup(stop[k]);
    }
}

void li_output_free(li_output *o) {
    for (int i = 0; i < o->n_stop; i++) free(o->stop[i]);
    free(o->stop);
    free(o->text);
    memset(o, 0, sizeof *o);
}

static void text_append(li_output *o, const char *s, size_t n) {
    if (o->text_len + n + 1 > o->text_cap) {
        o->text_cap = LI_MAX(o->text_cap * 2, o->text_len + n + 64);
        o->text = li_xrealloc(o->text, o->text_cap);
    }
    memcpy(o->text + o->text_len, s, n);
    o->text_len += n;
    o->text[o->text_len] = 0;
}

/* ---- stop strings ------------------------------------------------------------- */

/* The earliest stop string that ends at or after byte `from` (only text
 * added since then can complete one). */
static bool find_stop(const li_output *o, size_t from, size_t *at) {
    bool hit = false;
    for (int i = 0; i < o->n_stop; i++) {
        size_t sl = strlen(o->stop[i]);
        size_t start = from >= sl ? from - sl + 1 : 0;
        if (o->text_len < sl) continue;
        const char *p = memmem(o->text + start, o->text_len - start, o->stop[i], sl);
        if (p && (!hit || (size_t)(p - o->text) < *at)) {
            *at = (size_t)(p - o->text);
            hit = true;
        }
    }
    return hit;
}

/* Bytes at the end of the text that might still grow into a stop string. */
static size_t stop_holdback(const li_output *o) {
    size_t hold = 0;
    for (int i = 0; i < o->n_stop; i++) {
        size_t sl = strlen(o->stop[i]);
        for (size_t k = LI_MIN(sl - 1, o->text_len); k > hold; k--)
            if (!memcmp(o->text + o->text_len - k, o->stop[i], k)) {
                hold = k;
                break;
            }
    }
    return hold;
}

/* ---- events ----------------------------------------------------------------- */

bool li_output_token(li_output *o, const li_tokenizer *tk, bool check_stop, li_event *ev, li_event_fn fn, void *ud) {
    char piece[256];
    size_t before = o->text_len;
    int nb = li_detok_push(&o->dt, tk, ev->token, false, piece, sizeof piece);
    if (nb > 0) text_append(o, piece, (size_t)nb);
    size_t at = 0;
    bool stopped = o->n_stop && check_stop && find_stop(o, before, &at);
    if (stopped) {
        o->text_len = at;
        o->text[at] = 0;
    }
    size_t safe = stopped ? o->text_len : o->text_len - stop_holdback(o);
    /* never split a UTF-8 character between two events */
    while (safe > o->emitted && safe < o->text_len && (o->text[safe] & 0xC0) == 0x80) safe--;
    if (safe < o->emitted) safe = o->emitted;
    if (fn) {
        ev->text = o->text ? o->text + o->emitted : "";
        ev->text_len = safe - o->emitted;
        fn(ud, ev);
    }
    o->emitted = safe;
    return stopped;
}

void li_output_flush(li_output *o, int64_t id, int32_t n_vocab, li_event_fn fn, void *ud) {
    char piece[16];
    int nb = li_detok_flush(&o->dt, piece, sizeof piece);
    if (nb > 0) text_append(o, piece, (size_t)nb);
    if (fn && o->text_len > o->emitted) {
        li_event ev = {.kind = LI_EVENT_TOKEN, .id = id, .token = -1, .text = o->text + o->emitted,
                       .text_len = o->text_len - o->emitted, .n_vocab = n_vocab};
        fn(ud, &ev);
    }
    o->emitted = o->text_len;
}

void li_output_finish(int64_t id, const char *reason, li_event_fn fn, void *ud) {
    if (!fn) return;
    li_event ev = {.kind = LI_EVENT_FINISH, .id = id, .finish_reason = reason};
    fn(ud, &ev);
}
