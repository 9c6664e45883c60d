/* event.h — what the engine tells a request's owner: each generated token
 * (with its text delta) and the finish. Split from engine.h so the output
 * stream (output.h) can build events without including the engine. */
#ifndef LI_ENGINE_EVENT_H
#define LI_ENGINE_EVENT_H

#include "sample/sampler.h"

typedef enum li_event_kind {
    LI_EVENT_TOKEN = 0,  /* one generated token (text may be empty while a character is incomplete) */
    LI_EVENT_FINISH = 1, /* the request ended; finish_reason says why */
} li_event_kind;

typedef struct li_event {
    li_event_kind kind;
    int64_t id;
    int32_t token;           /* TOKEN */
    float logprob;           /* TOKEN: raw logprob of the token */
    const li_token_logprob *top; /* TOKEN: n_logprobs alternatives */
    int32_t n_top;
    const float *logits;     /* TOKEN: the (n_vocab) logits the token came from; valid during the call;
                              * NULL when the token was sampled on the device (engine.h device_sampling) */
    int32_t n_vocab;
    const char *text;        /* TOKEN: new text; FINISH: NULL */
    size_t text_len;
    const char *finish_reason; /* FINISH: "stop", "length", "cancelled", "error" */
} li_event;

typedef void (*li_event_fn)(void *ud, const li_event *ev);

#endif
