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

/* ---- listeners ------------------------------------------------------------------- */

/* What a listener serves (rpc.c, http.c). */
typedef struct li_protocol {
    const char *name;                            /* in the "listening on" line */
    li_conn *(*conn_new)(void *ud);              /* a connection with its ops, not yet accepted */
    void (*refuse)(li_conn *c, const char *why); /* the bytes telling a refused client why */
} li_protocol;

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
