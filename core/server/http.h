/* http.h — the OpenAI-compatible HTTP API, Server-Sent Events and the
 * Prometheus metrics, over the same methods and request lifecycle as
 * msgpack-RPC (api.h). */
#ifndef LI_SERVER_HTTP_H
#define LI_SERVER_HTTP_H

#include "server/api.h"

/* What an HTTP listener serves (loop.h): ud is the li_server. */
extern const li_protocol li_http_protocol;
/* Pure: an HTTP byte stream into a detached server; returns the response
 * bytes (fuzz_http). *out malloc'd. */
void li_http_process_bytes(const uint8_t *data, size_t n, char **out, size_t *out_n);
/* Prometheus text (GET /metrics); *out malloc'd. */
void li_http_metrics_text(li_server *srv, char **out, size_t *n);

#endif
