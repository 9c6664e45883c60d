/* rpc.h — msgpack-RPC framing and dispatch to the methods (api.h), shared
 * by sockets and the fuzz target. */
#ifndef LI_SERVER_RPC_H
#define LI_SERVER_RPC_H

#include "server/api.h"

typedef struct li_rpc_session {
    li_server *srv;
    li_conn *conn;           /* NULL when detached (fuzz): output goes to `out` */
    msgpack_sbuffer *out;
    char *buf;               /* bytes of the frame being received */
    size_t n, cap;
    li_mp_scan scan;
    bool authed, closed;
    int inflight;
    li_srv_req *reqs;        /* requests in flight (generate) */
} li_rpc_session;

void li_rpc_session_init(li_rpc_session *s, li_server *srv, li_conn *conn, msgpack_sbuffer *out);
void li_rpc_session_free(li_rpc_session *s); /* orphans the session's requests */
/* Feeds received bytes: frames are parsed and dispatched; replies go to the
 * connection (or `out`). Returns false once the session must close. */
bool li_rpc_session_feed(li_rpc_session *s, const char *data, size_t n);
/* Pure: feeds bytes into a detached server and returns everything it would
 * have written back (fuzz_rpc). *out malloc'd. */
void li_rpc_process_bytes(const uint8_t *data, size_t n, char **out, size_t *out_n);

/* Sends raw bytes on the session (connection or capture buffer). */
void li_rpc_session_send(li_rpc_session *s, const char *buf, size_t n);

/* What an RPC listener serves (loop.h): ud is the li_server. */
extern const li_protocol li_rpc_protocol;
/* generate over RPC: checks --max-inflight, tracks the request on the
 * session (cancelled when it closes). no_reply: started by a notification. */
li_srv_req *li_rpc_start_generate(li_rpc_session *s, uint32_t msgid, bool no_reply, li_gen_params *g, li_error *err);
/* A request of this session by engine id (any sample) or by msgid (-1: unused). */
li_srv_req *li_rpc_find(li_rpc_session *s, int64_t id, int64_t msgid);

#endif
