/* server.c — the server object: its limits, metrics buckets, the Lua
 * states it lends the worker pool, and the start of a graceful stop. */
#define _GNU_SOURCE
#include "server/server.h"

#include <lua.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const double ttft_le[] = {0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 30};
static const double tpot_le[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2.5};
static const double e2e_le[] = {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120};

void li_server_limits_default(li_server_limits *l) {
    *l = (li_server_limits){
        .max_frame = LI_SRV_MAX_FRAME, .max_depth = LI_SRV_MAX_DEPTH, .max_inflight = LI_SRV_MAX_INFLIGHT,
        .max_connections = LI_SRV_MAX_CONNECTIONS, .max_queued = LI_SRV_MAX_QUEUED,
        .write_buffer = LI_SRV_WRITE_BUFFER, .slow_client_seconds = LI_SRV_SLOW_CLIENT_SECONDS,
        .drain_seconds = LI_SRV_DRAIN_SECONDS, .header_timeout = LI_SRV_HEADER_TIMEOUT,
        .body_timeout = LI_SRV_BODY_TIMEOUT, .idle_timeout = LI_SRV_IDLE_TIMEOUT,
        .rpc_idle_timeout = LI_SRV_RPC_IDLE_TIMEOUT, .evict_idle_seconds = LI_SRV_EVICT_IDLE_SECONDS,
        .max_connections_per_ip = LI_SRV_MAX_CONNECTIONS_PER_IP,
    };
}

void li_server_apply_limits(li_server *srv) {
    li_net *net = &srv->net;
    net->write_buffer = srv->lim.write_buffer;
    net->max_connections = srv->lim.max_connections;
    net->header_timeout = srv->lim.header_timeout;
    net->body_timeout = srv->lim.body_timeout;
    net->evict_idle_seconds = srv->lim.evict_idle_seconds;
    net->max_per_ip = srv->lim.max_connections_per_ip;
}

void li_server_init(li_server *srv) {
    memset(srv, 0, sizeof *srv);
    li_server_limits_default(&srv->lim);
    li_hist_init(&srv->m.ttft, ttft_le, (int)LI_ARRAY_LEN(ttft_le));
    li_hist_init(&srv->m.tpot, tpot_le, (int)LI_ARRAY_LEN(tpot_le));
    li_hist_init(&srv->m.e2e, e2e_le, (int)LI_ARRAY_LEN(e2e_le));
    uv_mutex_init(&srv->lua_mu);
    srv->t_start = li_time_now();
    li_engine_config_default(&srv->cfg);
    srv->net.loop = &srv->loop;
    li_server_apply_limits(srv);
}

void li_server_free(li_server *srv) {
    li_hist_free(&srv->m.ttft);
    li_hist_free(&srv->m.tpot);
    li_hist_free(&srv->m.e2e);
    for (int i = 0; i < srv->n_lua_free; i++) lua_close(srv->lua_free[i]);
    free(srv->lua_free);
    uv_mutex_destroy(&srv->lua_mu);
}

/* ---- stopping ------------------------------------------------------------------- */

void li_server_begin_drain(li_server *srv, const char *why) {
    if (!srv->handles_open) return; /* detached (fuzz): nothing to stop */
    if (srv->draining) {
        srv->drain_deadline = li_time_now(); /* asked again: stop waiting */
        return;
    }
    srv->draining = true;
    srv->net.refusing = true;
    srv->drain_deadline = li_time_now() + srv->lim.drain_seconds;
    fprintf(stderr, "luainfer: %s: draining %lld requests in flight (at most %.0f s)\n", why,
            (long long)srv->n_live, srv->lim.drain_seconds);
    li_listeners_close(&srv->net);
}

const char *li_server_default_policy(void) {
    static char path[4096];
    struct stat st;
    if (stat("policies/default.lua", &st) == 0) return "policies/default.lua";
    snprintf(path, sizeof path, "%s/policies/default.lua", LI_SOURCE_DIR);
    if (stat(path, &st) == 0) return path;
    return NULL;
}

/* ---- msgpack helpers ------------------------------------------------------------ */

void li_mp_pack_strn(msgpack_packer *pk, const char *s, size_t n) {
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

void li_mp_pack_str(msgpack_packer *pk, const char *s) { li_mp_pack_strn(pk, s, strlen(s)); }
