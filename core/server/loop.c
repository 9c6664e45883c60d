/* loop.c — the server's I/O loop: a thin struct over uv_loop_t, work posted
 * from other threads, listeners, connections and write backpressure.
 *
 * Posting (Neovim's habit): another thread appends (fn, data) to a
 * mutex-protected list and calls uv_async_send; the loop thread drains the
 * list in its async callback. uv_async_send coalesces wake-ups, so one
 * callback may run many items: order is kept.
 *
 * Backpressure: every connection counts the bytes it handed to uv_write and
 * that are not yet written (`wbuf`). Over lim.write_buffer it stops reading
 * from the client (no new requests from it), and resumes below half of it.
 * A connection that stays over for lim.slow_client_seconds has its requests
 * cancelled and is closed (li_conn_check_slow, from the server's tick). The
 * engine never waits for a socket: it posts events, the loop queues bytes.
 *
 * Timeouts and room (docs/server.md, "Connections"): the protocol tells the
 * loop what each connection is doing (li_conn_phase); a 100 ms timer closes
 * those past their phase's deadline (a request head not complete
 * header_timeout after its first byte, a body or frame body_timeout after
 * its first, an idle keep-alive past the protocol's idle timeout), each
 * told why first. A new connection at max_connections closes the longest
 * idle one (idle at least evict_idle_seconds) instead of being refused, so
 * a flood of idle or half-sent connections cannot lock new clients out;
 * max_per_ip bounds what one peer address holds open. */
#define _GNU_SOURCE
#include "server/loop.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- posting ------------------------------------------------------------- */

struct li_loop_item {
    li_loop_fn fn;
    void *data;
    li_loop_item *next;
};

static void run_posted(li_loop *l) {
    for (;;) {
        uv_mutex_lock(&l->mu);
        li_loop_item *it = l->head;
        l->head = l->tail = NULL;
        uv_mutex_unlock(&l->mu);
        if (!it) return;
        while (it) {
            li_loop_item *next = it->next;
            it->fn(it->data);
            free(it);
            it = next;
        }
    }
}

static void on_async(uv_async_t *a) { run_posted(a->data); }

void li_loop_run_posted(li_loop *l) { run_posted(l); }

int li_loop_init(li_loop *l, li_error *err) {
    memset(l, 0, sizeof *l);
    int rc = uv_loop_init(&l->uv);
    if (rc) return li_error_set(err, LI_EIO, "serve: uv_loop_init: %s", uv_strerror(rc));
    uv_mutex_init(&l->mu);
    uv_async_init(&l->uv, &l->async, on_async);
    l->async.data = l;
    return 0;
}

void li_loop_post(li_loop *l, li_loop_fn fn, void *data) {
    li_loop_item *it = li_xmalloc(sizeof *it);
    *it = (li_loop_item){fn, data, NULL};
    uv_mutex_lock(&l->mu);
    if (l->tail) l->tail->next = it;
    else l->head = it;
    l->tail = it;
    uv_mutex_unlock(&l->mu);
    uv_async_send(&l->async);
}

static void close_walk(uv_handle_t *h, void *arg) {
    (void)arg;
    if (!uv_is_closing(h)) uv_close(h, NULL);
}

void li_loop_close(li_loop *l) {
    run_posted(l);
    uv_walk(&l->uv, close_walk, NULL);
    uv_run(&l->uv, UV_RUN_DEFAULT);
    run_posted(l);
    uv_loop_close(&l->uv);
    uv_mutex_destroy(&l->mu);
}

/* ---- connections ------------------------------------------------------------ */

typedef struct write_req {
    uv_write_t req;
    li_conn *c;
    size_t n;
    char data[];
} write_req;

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf);

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    (void)h;
    (void)suggested;
    static char slab[64 * 1024]; /* the loop thread is the only reader */
    buf->base = slab;
    buf->len = sizeof slab;
}

static void conn_update_reading(li_conn *c) {
    if (c->closing) return;
    bool want = c->want_read && !c->paused;
    if (want && !c->reading) {
        if (uv_read_start(&c->u.s, on_alloc, on_read) == 0) c->reading = true;
    } else if (!want && c->reading) {
        uv_read_stop(&c->u.s);
        c->reading = false;
    }
}

void li_conn_set_reading(li_conn *c, bool on) {
    c->want_read = on;
    conn_update_reading(c);
}

void li_conn_set_phase(li_conn *c, li_conn_phase p, bool restart) {
    if (p != LI_CONN_IDLE) c->fresh = false;
    if (p == c->phase && !restart) return;
    c->phase = p;
    c->phase_since = li_time_now();
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
    li_conn *c = s->data;
    if (n < 0) {
        li_conn_close(c);
        return;
    }
    if (n > 0 && !c->closing) c->ops->on_data(c, buf->base, (size_t)n);
}

static void on_write(uv_write_t *w, int status) {
    write_req *wr = (write_req *)w;
    li_conn *c = wr->c;
    c->wbuf -= wr->n;
    free(wr);
    if (status < 0 && !c->closing) {
        li_conn_close(c);
        return;
    }
    if (c->paused && c->wbuf <= c->net->write_buffer / 2) {
        c->paused = false;
        conn_update_reading(c);
    }
}

void li_conn_write(li_conn *c, const void *buf, size_t n) {
    if (c->closing || n == 0) return;
    write_req *wr = li_xmalloc(sizeof *wr + n);
    memcpy(wr->data, buf, n);
    wr->c = c;
    wr->n = n;
    uv_buf_t b = uv_buf_init(wr->data, (unsigned)n);
    int rc = uv_write(&wr->req, &c->u.s, &b, 1, on_write);
    if (rc) {
        free(wr);
        li_conn_close(c);
        return;
    }
    c->wbuf += n;
    if (!c->paused && c->wbuf > c->net->write_buffer) {
        c->paused = true;
        c->over_since = li_time_now();
        conn_update_reading(c);
    }
}

static void on_conn_closed(uv_handle_t *h) {
    li_conn *c = h->data;
    li_net *net = c->net;
    if (c->prev) c->prev->next = c->next;
    else net->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    net->n_conns--;
    if (c->closing) net->n_closing--;
    c->ops->free(c);
}

/* uv_close would drop queued writes: shut the write side down first, so a
 * reply written just before closing (an error, a final SSE event) reaches
 * the client. */
typedef struct shutdown_req {
    uv_shutdown_t req;
    li_conn *c;
} shutdown_req;

static void on_shutdown(uv_shutdown_t *r, int status) {
    (void)status;
    shutdown_req *sr = (shutdown_req *)r;
    /* (cancelled when li_conn_force_close closed the handle first) */
    if (!uv_is_closing(&sr->c->u.h)) uv_close(&sr->c->u.h, on_conn_closed);
    free(sr);
}

void li_conn_close(li_conn *c) {
    if (c->closing) return;
    c->ops->on_close(c);
    c->closing = true;
    c->net->n_closing++;
    if (c->reading) uv_read_stop(&c->u.s);
    c->reading = false;
    shutdown_req *sr = li_xmalloc(sizeof *sr);
    sr->c = c;
    if (c->wbuf == 0 || uv_shutdown(&sr->req, &c->u.s, on_shutdown) != 0) {
        free(sr);
        uv_close(&c->u.h, on_conn_closed);
    }
}

void li_conn_force_close(li_conn *c) {
    if (!c->closing) li_conn_close(c);
    if (!uv_is_closing(&c->u.h)) uv_close(&c->u.h, on_conn_closed);
}

/* ---- timeouts and room ---------------------------------------------------------- */

/* The deadline of c's phase in seconds after phase_since (0: none) and the
 * flag that sets it. */
static double phase_limit(const li_conn *c, const char **flag) {
    const li_net *net = c->net;
    switch (c->phase) {
    case LI_CONN_IDLE:
        if (c->fresh && c->header_first) {
            *flag = "--header-timeout";
            return net->header_timeout;
        }
        *flag = c->idle_flag ? c->idle_flag : "--idle-timeout";
        return c->idle_timeout;
    case LI_CONN_HEADER: *flag = "--header-timeout"; return net->header_timeout;
    case LI_CONN_BODY: *flag = "--body-timeout"; return net->body_timeout;
    case LI_CONN_BUSY: break;
    }
    *flag = "";
    return 0;
}

/* Tells the client why (the protocol decides what to send), then closes. */
static void conn_expire(li_conn *c, int code, const char *why) {
    if (c->proto && c->proto->expire) c->proto->expire(c, code, why);
    li_conn_close(c);
}

static void on_net_timer(uv_timer_t *t) {
    li_net *net = t->data;
    double now = li_time_now();
    for (li_conn *c = net->conns, *next; c; c = next) {
        next = c->next; /* closing only unlinks later, in on_conn_closed */
        if (c->closing) continue;
        const char *flag;
        double lim = phase_limit(c, &flag);
        if (lim <= 0 || now - c->phase_since <= lim) continue;
        char why[160];
        if (c->phase == LI_CONN_IDLE && c->fresh)
            snprintf(why, sizeof why, "no request within %g s of connecting (%s); closing", lim, flag);
        else if (c->phase == LI_CONN_IDLE)
            snprintf(why, sizeof why, "idle for %g s (%s); closing", lim, flag);
        else
            snprintf(why, sizeof why, "request %s not complete %g s after its first byte (%s); closing",
                     c->phase == LI_CONN_HEADER ? "header" : "body", lim, flag);
        net->timeouts_total++;
        conn_expire(c, 408, why);
    }
}

static void net_timer_start(li_net *net) {
    if (net->timer_on) return;
    uv_timer_init(&net->loop->uv, &net->timer);
    net->timer.data = net;
    uv_timer_start(&net->timer, on_net_timer, 100, 100);
    uv_unref((uv_handle_t *)&net->timer); /* the loop's life is the listeners' and the server's */
    net->timer_on = true;
}

/* At max_connections: the open connection idle longest (waiting between
 * requests before one with a request half-sent), idle at least
 * evict_idle_seconds so that clients that just connected are not dropped
 * before they could send. NULL: every connection is busy or new. */
static li_conn *eviction_victim(li_net *net, const li_conn *except) {
    const double now = li_time_now();
    double best = -1;
    bool best_idle = false;
    li_conn *victim = NULL;
    for (li_conn *c = net->conns; c; c = c->next) {
        if (c == except || c->closing || c->phase == LI_CONN_BUSY) continue;
        const double age = now - c->phase_since;
        if (age < net->evict_idle_seconds) continue;
        /* idle before half-sent, then the older: compared apart (age + 1e12
         * kept a quarter of a millisecond of the age, and a flood accepted
         * within that lost its oldest first) */
        const bool idle = c->phase == LI_CONN_IDLE;
        if (idle != best_idle ? idle : age > best) best = age, best_idle = idle, victim = c;
    }
    return victim;
}

static int conns_from(const li_net *net, const char *ip, const li_conn *except) {
    int n = 0;
    for (const li_conn *c = net->conns; c; c = c->next)
        if (c != except && !c->closing && !strcmp(c->ip, ip)) n++;
    return n;
}

static void peer_ip(li_conn *c) {
    struct sockaddr_storage sa;
    int len = sizeof sa;
    c->ip[0] = 0;
    if (uv_tcp_getpeername(&c->u.tcp, (struct sockaddr *)&sa, &len) != 0) return;
    if (sa.ss_family == AF_INET6) uv_ip6_name((struct sockaddr_in6 *)&sa, c->ip, sizeof c->ip);
    else if (sa.ss_family == AF_INET) uv_ip4_name((struct sockaddr_in *)&sa, c->ip, sizeof c->ip);
}

/* ---- listeners ---------------------------------------------------------------- */

static void on_connection(uv_stream_t *server, int status) {
    li_listener *l = server->data;
    li_net *net = l->net;
    if (status < 0) return;
    li_conn *c = l->proto->conn_new(l->ud);
    c->net = net;
    c->proto = l->proto;
    int rc = l->u.h.type == UV_NAMED_PIPE ? uv_pipe_init(&net->loop->uv, &c->u.pipe, 0)
                                          : uv_tcp_init(&net->loop->uv, &c->u.tcp);
    if (rc) {
        c->ops->free(c);
        return;
    }
    c->u.h.data = c;
    c->serial = ++net->next_serial;
    c->next = net->conns;
    if (net->conns) net->conns->prev = c;
    net->conns = c;
    net->n_conns++;
    c->phase = LI_CONN_IDLE;
    c->phase_since = li_time_now();
    c->fresh = true;
    if (uv_accept(server, &c->u.s) != 0) {
        li_conn_close(c);
        return;
    }
    if (l->u.h.type == UV_TCP) {
        uv_tcp_nodelay(&c->u.tcp, 1);
        peer_ip(c);
    }
    net->connections_total++;
    if (net->refusing) {
        net->connections_refused++;
        l->proto->refuse(c, 503, "server is shutting down");
        li_conn_close(c);
        return;
    }
    if (net->max_per_ip > 0 && c->ip[0] && conns_from(net, c->ip, c) >= net->max_per_ip) {
        char why[160];
        snprintf(why, sizeof why, "too many connections from %s (at most %d per address, --max-connections-per-ip)",
                 c->ip, net->max_per_ip);
        net->connections_refused++;
        net->per_ip_refused++;
        l->proto->refuse(c, 429, why);
        li_conn_close(c);
        return;
    }
    if (net->n_conns - net->n_closing > net->max_connections) {
        li_conn *victim = eviction_victim(net, c);
        if (!victim) {
            /* every connection is busy or just opened: tell the client why, then hang up */
            net->connections_refused++;
            l->proto->refuse(c, 503, "too many connections");
            li_conn_close(c);
            return;
        }
        char why[160];
        snprintf(why, sizeof why, "closed to make room for a new connection (--max-connections %d): this one was idle",
                 net->max_connections);
        net->evicted_total++;
        conn_expire(victim, 503, why);
    }
    li_conn_set_reading(c, true);
}

static int parse_hostport(const char *spec, char *host, size_t host_cap, int *port, li_error *err) {
    const char *colon;
    if (spec[0] == '[') {
        const char *end = strchr(spec, ']');
        if (!end || end[1] != ':') return li_error_set(err, LI_EINVAL, "serve: bad address '%s' (want [V6]:PORT)", spec);
        snprintf(host, host_cap, "%.*s", (int)(end - spec - 1), spec + 1);
        colon = end + 1;
    } else if ((colon = strrchr(spec, ':'))) {
        snprintf(host, host_cap, "%.*s", (int)(colon - spec), spec);
    } else {
        snprintf(host, host_cap, "%s", "127.0.0.1");
        colon = spec - 1; /* the whole spec is the port */
    }
    if (!host[0] || !strcmp(host, "localhost")) snprintf(host, host_cap, "%s", "127.0.0.1");
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (end == colon + 1 || *end || p < 0 || p > 65535)
        return li_error_set(err, LI_EINVAL, "serve: bad port in '%s' (want HOST:PORT, port 0-65535)", spec);
    *port = (int)p;
    return 0;
}

int li_listener_open(li_net *net, const char *spec, const li_protocol *proto, void *ud, li_error *err) {
    li_listener *l = li_xcalloc(1, sizeof *l);
    l->net = net;
    l->proto = proto;
    l->ud = ud;
    int rc;
    if (!strncmp(spec, "unix:", 5)) {
        const char *path = spec + 5;
        if (!*path || strlen(path) > 100) {
            free(l);
            return li_error_set(err, LI_EINVAL, "serve: bad unix socket path in '%s'", spec);
        }
        struct stat st;
        if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode)) unlink(path); /* stale socket from a crash */
        uv_pipe_init(&net->loop->uv, &l->u.pipe, 0);
        l->u.h.data = l;
        if ((rc = uv_pipe_bind(&l->u.pipe, path)) != 0) {
            uv_close(&l->u.h, (uv_close_cb)free);
            return li_error_set(err, LI_EIO, "serve: cannot bind %s: %s", spec, uv_strerror(rc));
        }
        l->unix_path = strdup(path);
        snprintf(l->addr, sizeof l->addr, "unix:%s", path);
    } else {
        char host[256];
        int port = 0;
        if ((rc = parse_hostport(spec, host, sizeof host, &port, err))) {
            free(l);
            return rc;
        }
        struct sockaddr_storage sa;
        if (uv_ip4_addr(host, port, (struct sockaddr_in *)&sa) != 0 &&
            uv_ip6_addr(host, port, (struct sockaddr_in6 *)&sa) != 0) {
            free(l);
            return li_error_set(err, LI_EINVAL, "serve: '%s' is not a numeric IPv4/IPv6 address", host);
        }
        uv_tcp_init(&net->loop->uv, &l->u.tcp);
        l->u.h.data = l;
        if ((rc = uv_tcp_bind(&l->u.tcp, (struct sockaddr *)&sa, 0)) != 0) {
            uv_close(&l->u.h, (uv_close_cb)free);
            return li_error_set(err, LI_EIO, "serve: cannot bind %s: %s", spec, uv_strerror(rc));
        }
        struct sockaddr_storage got;
        int len = sizeof got;
        uv_tcp_getsockname(&l->u.tcp, (struct sockaddr *)&got, &len);
        char ip[64] = "?";
        int real_port = port;
        if (got.ss_family == AF_INET6) {
            uv_ip6_name((struct sockaddr_in6 *)&got, ip, sizeof ip);
            real_port = ntohs(((struct sockaddr_in6 *)&got)->sin6_port);
            snprintf(l->addr, sizeof l->addr, "[%s]:%d", ip, real_port);
        } else {
            uv_ip4_name((struct sockaddr_in *)&got, ip, sizeof ip);
            real_port = ntohs(((struct sockaddr_in *)&got)->sin_port);
            snprintf(l->addr, sizeof l->addr, "%s:%d", ip, real_port);
        }
    }
    if ((rc = uv_listen(&l->u.s, 511, on_connection)) != 0) {
        if (l->unix_path) unlink(l->unix_path);
        free(l->unix_path);
        uv_close(&l->u.h, (uv_close_cb)free);
        return li_error_set(err, LI_EIO, "serve: cannot listen on %s: %s", spec, uv_strerror(rc));
    }
    l->next = net->listeners;
    net->listeners = l;
    net_timer_start(net);
    printf("luainfer: listening on %s (%s)\n", l->addr, proto->name);
    fflush(stdout);
    return 0;
}

static void on_listener_closed(uv_handle_t *h) {
    li_listener *l = h->data;
    if (l->unix_path) unlink(l->unix_path);
    free(l->unix_path);
    free(l);
}

void li_listeners_close(li_net *net) {
    for (li_listener *l = net->listeners, *next; l; l = next) {
        next = l->next;
        uv_close(&l->u.h, on_listener_closed);
    }
    net->listeners = NULL;
}
