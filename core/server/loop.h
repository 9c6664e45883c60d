/* loop.h — the server's I/O loop: a thin struct over uv_loop_t that other
 * threads post work to, listeners, connections and write backpressure. It
 * knows no protocol: a listener is given one (li_protocol), which makes
 * the connection objects and says why a refused one is closed. */
#ifndef LI_SERVER_LOOP_H
#define LI_SERVER_LOOP_H

#include "util/common.h"

#include <uv.h>

/* ---- the loop ---------------------------------------------------------------- */

typedef void (*li_loop_fn)(void *data);
typedef struct li_loop_item li_loop_item;

typedef struct li_loop {
    uv_loop_t uv;
    uv_async_t async;       /* wakes the loop to run posted items */
    uv_mutex_t mu;          /* guards head/tail */
    li_loop_item *head, *tail;
} li_loop;

int li_loop_init(li_loop *l, li_error *err);
/* Runs fn(data) on the loop thread, soon. Safe from any thread. */
void li_loop_post(li_loop *l, li_loop_fn fn, void *data);
/* Runs what is posted now (the loop thread only). */
void li_loop_run_posted(li_loop *l);
/* Closes every handle, runs what is still posted, frees the loop. */
void li_loop_close(li_loop *l);

/* ---- connections --------------------------------------------------------------- */

typedef struct li_conn li_conn;
typedef struct li_listener li_listener;
typedef struct li_protocol li_protocol;

/* What a connection is doing, for its timeouts (loop.c's timer) and for
 * choosing whom to close when the server is full. The protocol sets it. */
typedef enum {
    LI_CONN_IDLE,    /* waiting for a request, nothing partial: --idle-timeout (before the first: see header_first) */
    LI_CONN_HEADER,  /* part of an HTTP request head received: --header-timeout from its first byte */
    LI_CONN_BODY,    /* part of a body (HTTP) or frame (RPC) received: --body-timeout from its first byte */
    LI_CONN_BUSY,    /* a request is being served: no read timeout (the write side has --slow-client-seconds) */
} li_conn_phase;

typedef struct li_conn_ops {
    void (*on_data)(li_conn *c, const char *buf, size_t n);
    void (*on_close)(li_conn *c); /* before the handle closes: drop requests */
    void (*free)(li_conn *c);     /* after it closed */
} li_conn_ops;

/* The open connections and listeners of one loop, and their limits. */
typedef struct li_net {
    li_loop *loop;
    li_conn *conns;
    int n_conns;
    uint64_t next_serial;
    li_listener *listeners;
    size_t write_buffer;     /* unsent bytes per connection before it stops reading */
    int max_connections;
    bool refusing;           /* draining: new connections are told why and closed */
    uint64_t connections_total, connections_refused;
    /* connection hardening (docs/server.md, "Connections"); 0 = off */
    double header_timeout;   /* s: a request head complete after its first byte */
    double body_timeout;     /* s: a body / RPC frame complete after its first byte */
    double evict_idle_seconds; /* at max_connections, a new client closes the longest idle one idle this long */
    int max_per_ip;          /* open TCP connections per peer address */
    int n_closing;           /* of n_conns, closing: not counted against the limits */
    uv_timer_t timer;        /* the timeouts, started with the first listener */
    bool timer_on;
    uint64_t timeouts_total, evicted_total, per_ip_refused;
} li_net;

/* A TCP or Unix-socket stream handle, seen as whichever libuv type a call wants. */
typedef union li_uv_stream {
    uv_handle_t h;
    uv_stream_t s;
    uv_tcp_t tcp;
    uv_pipe_t pipe;
} li_uv_stream;

struct li_conn {
    li_uv_stream u;
    const li_conn_ops *ops;
    li_net *net;
    uint64_t serial;        /* unique per connection, for logs */
    size_t wbuf;            /* bytes handed to uv_write and not yet written */
    bool reading, paused, closing;
    bool want_read;         /* reading unless a protocol pause (HTTP: one request at a time) */
    double over_since;      /* when wbuf went over the limit (paused) */
    li_conn *prev, *next;   /* net->conns */
    /* timeouts: set by conn_new (idle_timeout, header_first) and li_conn_set_phase */
    const li_protocol *proto;
    li_conn_phase phase;
    double phase_since;     /* li_time_now() when the phase began */
    double idle_timeout;    /* s between requests, 0 = none */
    const char *idle_flag;  /* the flag named when it expires, e.g. "--idle-timeout" */
    bool header_first;      /* before the first request the header timeout applies (HTTP) */
    bool fresh;             /* no request begun yet */
    char ip[64];            /* the peer's address (TCP); "" for Unix sockets */
};

/* Writes a copy of buf; never blocks. Past the write buffer the connection
 * stops reading (backpressure); a connection over it too long is closed by
 * the server's tick. */
void li_conn_write(li_conn *c, const void *buf, size_t n);
/* Closes after queued writes; requests of the connection are cancelled. */
void li_conn_close(li_conn *c);
/* Closes now, dropping unsent bytes (shutdown of a client that does not read). */
void li_conn_force_close(li_conn *c);
/* Protocol-level read pause (independent of backpressure). */
void li_conn_set_reading(li_conn *c, bool on);
/* The protocol says what the connection is doing (its timeouts follow).
 * The phase's clock restarts when the phase changes, or always with restart. */
void li_conn_set_phase(li_conn *c, li_conn_phase p, bool restart);

/* ---- listeners ------------------------------------------------------------------- */

/* What a listener serves (rpc.c, http.c). */
struct li_protocol {
    const char *name;                            /* in the "listening on" line */
    li_conn *(*conn_new)(void *ud);              /* a connection with its ops, not yet accepted */
    /* the bytes telling a refused new client why (code: 503 full or draining, 429 per-address limit) */
    void (*refuse)(li_conn *c, int code, const char *why);
    /* the same for an open connection closed by a timeout (408) or to make room (503); the
     * protocol may send nothing (HTTP between requests: a keep-alive close is silent) */
    void (*expire)(li_conn *c, int code, const char *why);
};

struct li_listener {
    li_uv_stream u;
    li_net *net;
    const li_protocol *proto;
    void *ud;               /* passed to proto->conn_new */
    char addr[300];         /* printed form: "127.0.0.1:7700", "unix:/path" */
    char *unix_path;        /* unlinked at close */
    li_listener *next;
};

/* Binds "HOST:PORT", "[V6]:PORT", ":PORT", "PORT" or "unix:PATH"; port 0
 * picks a free port and l->addr has the real one. */
int li_listener_open(li_net *net, const char *spec, const li_protocol *proto, void *ud, li_error *err);
void li_listeners_close(li_net *net);

#endif
