/* request.h — the one parser of a generation request's parameters.
 *
 * Three paths reach it, and all three read the same field table
 * (request.c, `fields[]`; docs/server.md lists it):
 *
 *   msgpack-RPC `generate`  params map                    ─┐
 *   HTTP completions        JSON body → li_request_pack_json ├─▶ li_request_parse ─▶ li_gen_params
 *   Lua engine:add{...}     table → msgpack (lua_engine.c) ─┘
 *
 * so a parameter has one name (and aliases), one type, one default and one
 * range everywhere, and a bad value is refused with the same message. The
 * OpenAI routes start from OpenAI's defaults (a column of the table).
 * Nothing here knows a socket or a Lua state. */
#ifndef LI_REQUEST_H
#define LI_REQUEST_H

#include "engine/engine.h"

#include <msgpack.h>

#define LI_REQ_MAX_PARAMS 256
#define LI_REQ_MAX_STOP 16          /* stop strings */
#define LI_REQ_MAX_STOP_LEN 256     /* bytes of one stop string */
#define LI_REQ_MAX_STOP_TOKEN_IDS 64
#define LI_REQ_MAX_N 64             /* samples of one prompt */
#define LI_REQ_MAX_MESSAGES 4096
#define LI_REQ_MAX_TOKENS (1 << 20) /* max_tokens, min_tokens */
#define LI_REQ_MAX_SLO_MS LI_ENGINE_MAX_SLO_MS /* slo_ttft_ms, slo_tpot_ms: one day */

typedef struct li_chat_msg {
    const char *role;
    const char *content;
} li_chat_msg;

/* The parsed parameters of one request (strings and arrays owned). */
typedef struct li_gen_params {
    char *prompt;           /* text, or NULL */
    size_t prompt_len;
    li_chat_msg *msgs;      /* (n_msgs) chat messages, or NULL */
    int n_msgs;
    int32_t *tokens;        /* (n_tokens) token ids, or NULL */
    size_t n_tokens;
    li_sampling_params sp;
    int64_t max_tokens;     /* -1: up to the context (OpenAI chat) */
    int32_t n;
    char *stop[LI_REQ_MAX_STOP];
    int n_stop;
    bool stream, ignore_eos;
    int32_t logprobs;       /* top alternatives per token (0..20); -1 = off */
    int32_t priority;
    char *tenant, *cache_salt;
    li_logit_bias *logit_bias; /* (sp.n_logit_bias) owned; sp.logit_bias points here */
    int64_t min_tokens;       /* vLLM's: no end-of-generation or stop before this many */
    int32_t *stop_token_ids;  /* (n_stop_token_ids) owned */
    int n_stop_token_ids;
    bool spec_set;            /* 'speculation' given: the request's own method and k (0 = off) */
    li_spec_method spec_method;
    int32_t spec_k;
    double slo_ttft_ms, slo_tpot_ms; /* latency objectives, ms (0 = none) */
} li_gen_params;

/* Which defaults apply and which fields a path takes. */
typedef enum {
    LI_REQ_LUAINFER,        /* msgpack-RPC and engine:add: luainfer's defaults, unknown keys refused */
    LI_REQ_OPENAI,          /* /v1/completions: OpenAI's defaults, unknown keys ignored */
    LI_REQ_OPENAI_CHAT,     /* /v1/chat/completions: same, 'messages' required, max_tokens = the context */
} li_req_profile;

typedef struct li_req_opts {
    li_req_profile profile;
    int32_t n_vocab;        /* > 0: token ids are checked against it */
    bool no_stream;         /* the path cannot stream (engine:add): 'stream = true' is refused */
} li_req_opts;

/* Parses a params map into *g. On failure g is freed and err says why
 * (LI_EINVAL, message "invalid params: ..."). A seed left out is drawn at
 * random here, so the parsed request is fully determined. */
int li_request_parse(const msgpack_object *params, const li_req_opts *o, li_gen_params *g, li_error *err);
void li_gen_params_free(li_gen_params *g);

/* A list of token ids (integers >= 0; not checked against a vocabulary)
 * as *out (owned), or LI_EINVAL naming key. */
int li_request_parse_tokens(const msgpack_object *o, const char *key, int32_t **out, size_t *n_out, li_error *err);

/* The engine's view of g with the prepared prompt (borrowed: g and prompt
 * must outlive li_engine_add). on_event/ud are left NULL. */
void li_gen_params_to_request(const li_gen_params *g, const int32_t *prompt, int64_t n_prompt,
                              li_request_params *p);

/* ---- request_json.c -------------------------------------------------------- */

typedef struct cJSON cJSON;
/* Packs a JSON value as msgpack (integral numbers as integers); false when
 * it nests deeper than max_depth. */
bool li_request_pack_json(msgpack_packer *pk, const cJSON *j, int max_depth);
/* Parses JSON text (jansson: strings keep their length, so "\u0000" stays
 * in them; a key given twice is refused) and packs it as msgpack: 0, or
 * err->code 400 with a one-line message (not JSON, not an object, nesting
 * deeper than max_depth). The HTTP routes read their bodies with this. */
int li_request_pack_json_text(msgpack_packer *pk, const char *text, size_t n, int max_depth, li_error *err);

#endif
