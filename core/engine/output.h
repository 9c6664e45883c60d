/* output.h — a request's output stream: detokenization, stop strings, the
 * accumulated text and its token/finish events.
 *
 * The engine samples; this turns each sampled token into text, finds a stop
 * string in it, holds back bytes that may still grow into one (and the
 * tail of an incomplete UTF-8 character), and tells the request's callback.
 * It never ends a request itself: li_output_token says a stop string
 * matched, and the engine finishes the request. */
#ifndef LI_ENGINE_OUTPUT_H
#define LI_ENGINE_OUTPUT_H

#include "engine/event.h"
#include "tokenizer/tokenizer.h"

typedef struct li_output {
    li_detok dt;
    char *text;           /* (text_cap) generated text, NUL-terminated; NULL until the first byte */
    size_t text_len, text_cap;
    size_t emitted;       /* bytes of text already sent in events */
    char **stop;          /* (n_stop) stop strings, owned */
    int n_stop;
} li_output;

/* Copies the stop strings (each 1..256 bytes, checked by the caller). */
void li_output_init(li_output *o, const char *const *stop, int n_stop);
void li_output_free(li_output *o);

/* Appends tok's text. With check_stop (min_tokens reached), a stop string in
 * the new text cuts the text before it and the call returns true: the
 * request ends with "stop". Calls fn (when set) with a TOKEN event built
 * from ev (kind, id, token, logprob, top, logits filled by the caller) and
 * the text that is safe to send. */
bool li_output_token(li_output *o, const li_tokenizer *tk, bool check_stop, li_event *ev, li_event_fn fn, void *ud);
/* Sends what was held back (a partial stop string that never completed, an
 * incomplete character) as a last TOKEN event with token -1. */
void li_output_flush(li_output *o, int64_t id, int32_t n_vocab, li_event_fn fn, void *ud);
/* The FINISH event. */
void li_output_finish(int64_t id, const char *reason, li_event_fn fn, void *ud);

#endif
