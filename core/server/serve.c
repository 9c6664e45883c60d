/* serve.c — `luainfer serve [POLICY.lua] [options]`: the model, the engine
 * thread, the listeners, signals and the graceful stop.
 *
 * Start-up order: load the model (slow; nothing listens yet), load the
 * policy, bind every listener (a bad address fails before the engine
 * allocates its KV pool), start the engine thread, run the loop. Each
 * listener prints one line to stdout, e.g.
 *   luainfer: listening on 127.0.0.1:7700 (msgpack-rpc)
 * with the real port when the requested one was 0.
 *
 * Stop (SIGINT, SIGTERM or the `shutdown` method): listeners close, new
 * requests get 503, requests in flight finish for up to --drain-seconds,
 * then the rest are cancelled, connections flushed and closed, exit 0. A
 * second signal skips the wait. A watchdog thread ends the process (exit 1,
 * with a log line) if the stop is not done drain + 5 s after the signal,
 * e.g. with the engine thread stuck. */
#define _GNU_SOURCE
#include "server/serve.h"
#include "server/api.h"
#include "server/http.h"
#include "server/rpc.h"
#include "runtime/args.h"
#include "runtime/policy_open.h"
#include "runtime/runtime.h"

#include <lua.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

/* ---- stopping --------------------------------------------------------------- */

/* Everything in flight is done (or out of time): close up. */
static void stop_now(li_server *srv) {
    if (srv->stopping) return;
    srv->stopping = true;
    if (srv->eng) {
        li_engine_thread *t = srv->eng;
        li_engine_thread_stop(t); /* cancels what is left; its last events are posted */
        srv->eng = NULL;
        li_loop_run_posted(&srv->loop); /* deliver them while the connections still exist */
    }
    for (li_conn *c = srv->net.conns; c; c = c->next) li_conn_close(c);
    srv->stop_deadline = li_time_now() + 2.0; /* time for the last bytes to leave */
}

static void on_tick(uv_timer_t *t) {
    li_server *srv = t->data;
    double now = li_time_now();
    if (srv->stopping) {
        if (srv->net.n_conns > 0 && now < srv->stop_deadline) return;
        for (li_conn *c = srv->net.conns, *next; c; c = next) {
            next = c->next;
            li_conn_force_close(c);
        }
        uv_timer_stop(&srv->tick);
        uv_stop(&srv->loop.uv);
        return;
    }
    /* slow clients: over the write buffer for too long */
    for (li_conn *c = srv->net.conns, *next; c; c = next) {
        next = c->next;
        if (c->paused && !c->closing && now - c->over_since > srv->lim.slow_client_seconds) {
            li_log_warn("serve: closing connection %llu: %zu bytes unread for %.0f s",
                        (unsigned long long)c->serial, c->wbuf, now - c->over_since);
            srv->m.slow_clients_closed++;
            li_conn_force_close(c);
        }
    }
    if (srv->draining && (srv->n_live == 0 || now >= srv->drain_deadline)) {
        if (srv->n_live) fprintf(stderr, "luainfer: drain time is up: cancelling %lld requests\n", (long long)srv->n_live);
        stop_now(srv);
    }
}

/* ---- the stop watchdog ------------------------------------------------------ */

/* A signal must end the process even when the engine thread is stuck (an
 * in-process policy in a compiled loop, a kernel that never returns): the
 * graceful stop joins that thread, so a thread of its own waits out the
 * drain time plus a grace and then _exits with a log line. */
#define WATCHDOG_GRACE 5.0 /* seconds past the drain time: the last bytes, the joins */

static struct {
    uv_mutex_t mu;
    uv_cond_t cv;
    uv_thread_t tid;
    double deadline;
    bool started, done;
} wd;

static void watchdog_main(void *arg) {
    (void)arg;
    uv_mutex_lock(&wd.mu);
    while (!wd.done) {
        double left = wd.deadline - li_time_now();
        if (left <= 0) break;
        uv_cond_timedwait(&wd.cv, &wd.mu, (uint64_t)(left * 1e9) + 1);
    }
    if (!wd.done) {
        fprintf(stderr, "luainfer: the stop did not finish in time (the engine thread is stuck): exiting now\n");
        fflush(stderr);
        _exit(1);
    }
    uv_mutex_unlock(&wd.mu);
}

/* The process ends at the latest `seconds` from now. */
static void watchdog_arm(double seconds) {
    if (!wd.started) {
        uv_mutex_init(&wd.mu);
        uv_cond_init(&wd.cv);
        wd.deadline = li_time_now() + seconds;
        li_thread_signals_begin();
        const int bad = uv_thread_create(&wd.tid, watchdog_main, NULL);
        li_thread_signals_end();
        if (bad != 0) {
            li_log_warn("serve: cannot start the stop watchdog");
            return;
        }
        wd.started = true;
        return;
    }
    uv_mutex_lock(&wd.mu);
    wd.deadline = LI_MIN(wd.deadline, li_time_now() + seconds);
    uv_cond_signal(&wd.cv);
    uv_mutex_unlock(&wd.mu);
}

/* The stop finished: the watchdog ends without acting. */
static void watchdog_disarm(void) {
    if (!wd.started) return;
    uv_mutex_lock(&wd.mu);
    wd.done = true;
    uv_cond_signal(&wd.cv);
    uv_mutex_unlock(&wd.mu);
    uv_thread_join(&wd.tid);
    uv_mutex_destroy(&wd.mu);
    uv_cond_destroy(&wd.cv);
    wd.started = false;
}

static void on_signal(uv_signal_t *s, int signum) {
    li_server *srv = s->data;
    /* the first signal allows the drain; a second one only the grace */
    watchdog_arm((srv->draining ? 0 : srv->lim.drain_seconds) + WATCHDOG_GRACE);
    li_server_begin_drain(srv, signum == SIGINT ? "SIGINT" : "SIGTERM");
}

/* ---- options ------------------------------------------------------------------ */


typedef struct serve_opts {
    const char *model, *draft, *kv_dtype, *kv_memory, *isolation, *admin_token, *auth_token, *isa;
    li_str_list listen, http;
    int64_t block_size, max_num_seqs, max_batched_tokens, threads, max_frame, max_inflight, max_connections,
        max_queued, ctx_size, write_buffer, max_depth, spec_tokens, spec_ngram_max, spec_ngram_min,
        spec_disable_batch, spec_layers, eagle_idle_steps;
    int64_t tensor_parallel;
    const char *spec_method;
    double drain_seconds, slow_seconds;
    const char *medusa, *medusa_tree, *eagle;
    bool help, policy_unsafe, no_prefix_cache, spec_calibrate, eagle_lazy;
    double header_timeout, body_timeout, idle_timeout, rpc_idle_timeout, evict_idle;
    int64_t max_per_ip;
    const char *api_key;
    bool no_http, no_rpc;
    const char *q4_act;
    const char *device; /* --device: cpu or cuda */
    const char *step_log; /* --step-log FILE */
} serve_opts;

/* ---- listeners and the banner ------------------------------------------------- */

/* 127.0.0.0/8, ::1, and Unix sockets reach only this machine. */
static bool addr_is_local(const char *addr) {
    return !strncmp(addr, "unix:", 5) || !strncmp(addr, "127.", 4) || !strncmp(addr, "[::1]:", 6);
}

static const li_listener *first_listener(const li_server *srv, const li_protocol *proto) {
    const li_listener *found = NULL;
    for (const li_listener *l = srv->net.listeners; l; l = l->next) /* newest first: keep the last seen */
        if (l->proto == proto) found = l;
    return found;
}

/* A URL base a client on this machine can use for an HTTP listener. */
static void client_url(const char *addr, char *out, size_t cap) {
    const char *port = strrchr(addr, ':');
    if (!strncmp(addr, "0.0.0.0:", 8)) snprintf(out, cap, "http://127.0.0.1%s", port);
    else if (!strncmp(addr, "[::]:", 5)) snprintf(out, cap, "http://[::1]%s", port);
    else snprintf(out, cap, "http://%s", addr);
}

/* This binary's path for a pasted command (the shell may not have it on
 * PATH), single-quoted when it holds anything a shell would split. */
static const char *self_command(char *buf, size_t cap) {
    char path[1024];
    const ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
    if (n <= 0) return "luainfer";
    path[n] = 0;
    const bool plain = strspn(path, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._+-") == (size_t)n;
    if (plain || strchr(path, '\'')) snprintf(buf, cap, "%s", path);
    else snprintf(buf, cap, "'%s'", path);
    return buf;
}

/* Where to listen and the ready-to-paste examples (stderr). With a key the
 * examples read it from $LUAINFER_API_KEY (the key itself is never printed),
 * so they say when that is not the server's key yet. */
static void print_banner(const li_server *srv) {
    const li_listener *h = first_listener(srv, &li_http_protocol), *r = first_listener(srv, &li_rpc_protocol);
    const char *key = srv->auth_token ? "$LUAINFER_API_KEY" : "none";
    const char *env_key = getenv("LUAINFER_API_KEY");
    if (srv->auth_token && (!env_key || strcmp(env_key, srv->auth_token)))
        fprintf(stderr, "luainfer: the examples below read the key from $LUAINFER_API_KEY: export it first\n");
    if (h && strncmp(h->addr, "unix:", 5)) {
        char url[340];
        client_url(h->addr, url, sizeof url);
        fprintf(stderr, "luainfer: OpenAI API on %s/v1, for example:\n", url);
        fprintf(stderr, "  curl %s/v1/completions -H 'Content-Type: application/json'%s \\\n"
                        "    -d '{\"prompt\": \"The capital of France is\", \"max_tokens\": 16}'\n",
                url, srv->auth_token ? " -H \"Authorization: Bearer $LUAINFER_API_KEY\"" : "");
        fprintf(stderr, "  python3 -c 'from openai import OpenAI; c = OpenAI(base_url=\"%s/v1\", api_key=\"%s\"); "
                        "print(c.chat.completions.create(model=\"%s\", max_tokens=16, "
                        "messages=[{\"role\": \"user\", \"content\": \"Hi!\"}]).choices[0].message.content)'\n",
                url, srv->auth_token ? "'\"$LUAINFER_API_KEY\"'" : key, srv->model_name);
    } else if (h) {
        fprintf(stderr, "luainfer: OpenAI API on %s: curl --unix-socket %s http://localhost/v1/models%s\n", h->addr,
                h->addr + 5, srv->auth_token ? " -H \"Authorization: Bearer $LUAINFER_API_KEY\"" : "");
    }
    if (r) {
        char url[340], self[1100];
        client_url(r->addr, url, sizeof url); /* "http://HOST:PORT": the part after "//" */
        const char *a = strncmp(r->addr, "unix:", 5) ? url + 7 : r->addr;
        /* the client by its full path when the source tree is there (pasted from any directory) */
        const char *client = LI_SOURCE_DIR "/examples/python_client.py";
        if (access(client, R_OK) || strspn(client, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._+-") !=
                                        strlen(client))
            client = "examples/python_client.py";
        /* both clients send auth {token = $LUAINFER_API_KEY} first when it is set */
        fprintf(stderr, "luainfer: msgpack-RPC on %s, for example:\n"
                        "  python3 %s --addr %s \"Once upon a time\"\n"
                        "  %s repl --connect %s\n",
                r->addr, client, a, self_command(self, sizeof self), a);
    }
    for (const li_listener *l = srv->net.listeners; l; l = l->next)
        if (!addr_is_local(l->addr) && !srv->auth_token)
            fprintf(stderr,
                    "luainfer: warning: %s (%s) is reachable from other machines and there is no --api-key: "
                    "anyone who can connect may use this server\n",
                    l->addr, l->proto->name);
}

static int check_range(const char *name, int64_t v, int64_t lo, int64_t hi, li_error *err) {
    if (v < lo || v > hi)
        return li_error_set(err, LI_EINVAL, "--%s must be in [%lld, %lld], got %lld", name, (long long)lo, (long long)hi,
                            (long long)v);
    return 0;
}

/* an integer option not given: any number given, -1 too, is range-checked */
#define UNSET INT64_MIN

int li_cmd_serve(int argc, char **argv) {
    serve_opts o = {
        .isolation = "process", .isa = "auto", .block_size = UNSET, .max_num_seqs = UNSET,
        .max_batched_tokens = UNSET, .spec_ngram_max = UNSET, .spec_ngram_min = UNSET, .spec_disable_batch = UNSET,
        .eagle_idle_steps = UNSET, .tensor_parallel = 1,
        .max_frame = LI_SRV_MAX_FRAME, .max_inflight = LI_SRV_MAX_INFLIGHT, .max_connections = LI_SRV_MAX_CONNECTIONS,
        .max_queued = LI_SRV_MAX_QUEUED,
        .max_depth = LI_SRV_MAX_DEPTH, .write_buffer = LI_SRV_WRITE_BUFFER, .drain_seconds = LI_SRV_DRAIN_SECONDS,
        .slow_seconds = LI_SRV_SLOW_CLIENT_SECONDS,
        .header_timeout = LI_SRV_HEADER_TIMEOUT, .body_timeout = LI_SRV_BODY_TIMEOUT,
        .idle_timeout = LI_SRV_IDLE_TIMEOUT, .rpc_idle_timeout = LI_SRV_RPC_IDLE_TIMEOUT,
        .evict_idle = LI_SRV_EVICT_IDLE_SECONDS, .max_per_ip = LI_SRV_MAX_CONNECTIONS_PER_IP,
    };
    li_opt opts[] = {
        {"model", LI_OPT_STR, &o.model, "GGUF model (default: $LUAINFER_MODEL or the bundled SmolLM2)"},
        {"draft-model", LI_OPT_STR, &o.draft, "draft GGUF with the target's vocabulary, run next to it over the same KV blocks; drafts with --spec-k (default: none)"},
        {"draft", LI_OPT_STR, &o.draft, "the same as --draft-model"},
        {"medusa", LI_OPT_STR, &o.medusa, "Medusa heads made for the model (luainfer train-medusa): drafts a tree of their top-k, verified in one pass (default: none)"},
        {"medusa-tree", LI_OPT_STR, &o.medusa_tree, "the Medusa tree: paths of candidate ranks, e.g. '0;1;0,0;1,0;0,0,0' (default: a sparse 15-node tree)"},
        {"eagle", LI_OPT_STR, &o.eagle, "an EAGLE draft made for the model (luainfer train-eagle): drafts a chain from the model's own hidden states (default: none)"},
        {"eagle-idle-steps", LI_OPT_INT, &o.eagle_idle_steps, "with --eagle: a request that has not drafted with it for this many steps (or positions past its prompt) stops computing its draft KV (zeroed instead); 0 = never (default 16)"},
        {"eagle-lazy", LI_OPT_FLAG, &o.eagle_lazy, "with --eagle: a request's draft KV of its prompt is computed when it first drafts with EAGLE (up to 512 positions), not at prefill; prefix-cached blocks computed before then hold zeros in the draft's KV (docs/speculation.md, \"Idle requests\"; default off)"},
        {"spec-calibrate", LI_OPT_FLAG, &o.spec_calibrate, "when a policy with a speculate hook is set, first time forward passes of 1-64 rows (about 0.3 s), so it prices its first drafts on measured costs, not guesses (default off)"},
        {"spec-method", LI_OPT_STR, &o.spec_method, "speculation proposer: ngram, draft, layerskip, medusa or eagle (default: layerskip with --spec-layers, medusa with heads, eagle with an EAGLE draft, draft with a draft model, else ngram)"},
        {"spec-k", LI_OPT_INT, &o.spec_tokens, "the same as --spec-tokens"},
        {"spec-layers", LI_OPT_INT, &o.spec_layers, "layerskip: draft with the model's first N blocks and its head (default 0 = no layerskip)"},
        {"tensor-parallel", LI_OPT_INT, &o.tensor_parallel, "split the model over N ranks (threads; docs/parallel.md), at most its KV heads (default 1)"},
        {"listen", LI_OPT_STR_LIST, &o.listen, "msgpack-RPC on HOST:PORT or unix:PATH (repeatable; default 127.0.0.1:7700)"},
        {"http", LI_OPT_STR_LIST, &o.http, "OpenAI-compatible HTTP on HOST:PORT or unix:PATH (repeatable; default 127.0.0.1:8000, off when only --listen is given)"},
        {"no-http", LI_OPT_FLAG, &o.no_http, "no HTTP listener"},
        {"no-rpc", LI_OPT_FLAG, &o.no_rpc, "no msgpack-RPC listener"},
        {"api-key", LI_OPT_STR, &o.api_key, "clients must present it: HTTP 'Authorization: Bearer KEY' (not /health, /metrics), RPC auth {token = KEY} (default: $LUAINFER_API_KEY)"},
        {"kv-dtype", LI_OPT_STR, &o.kv_dtype, "KV cache dtype: f16, bf16, f32, fp8, int8 (default: the policy's, else f16)"},
        {"kv-memory", LI_OPT_STR, &o.kv_memory, "KV cache budget in bytes, e.g. 256M (default 256M)"},
        {"block-size", LI_OPT_INT, &o.block_size, "tokens per KV block (default: the policy's, else 16)"},
        {"max-num-seqs", LI_OPT_INT, &o.max_num_seqs, "requests per step (default: the policy's, else 64)"},
        {"max-batched-tokens", LI_OPT_INT, &o.max_batched_tokens, "tokens per step (default: the policy's, else 512)"},
        {"ctx-size", LI_OPT_INT, &o.ctx_size, "positions per request (default: the model's, at most 8192)"},
        {"threads", LI_OPT_INT, &o.threads, "compute threads (default: all cores)"},
        {"q4-act", LI_OPT_STR, &o.q4_act, "4-bit group weights (awq, gptq, rtn4): f32 activations (A16, the reference bits) or int8 (A8, quantized per row on the fly) (default f32)"},
        {"isa", LI_OPT_STR, &o.isa, "CPU kernels: auto, scalar, avx2, avx512, amx (AVX-512 with AMX tiles for quantized matmul), or ggml (llama.cpp's x86 arithmetic, bit for bit; slower) (default auto)"},
        {"device", LI_OPT_STR, &o.device, "compute device: cpu, or cuda / cuda:N (the CUDA backend, docs/cuda.md) (default cpu)"},
        {"policy-isolation", LI_OPT_STR, &o.isolation,
         "process (default: a policy-host child with a 50 ms deadline) or inprocess (trusted policies; see docs/policy-protocol.md)"},
        {"policy-unsafe", LI_OPT_FLAG, &o.policy_unsafe, "give the policy the full Lua standard library"},
        {"admin-token", LI_OPT_STR, &o.admin_token, "token for policy.reload and shutdown (default: those are refused)"},
        {"auth-token", LI_OPT_STR, &o.auth_token, "the older name of --api-key"},
        {"max-frame-bytes", LI_OPT_INT, &o.max_frame, "largest msgpack frame / HTTP body (default 1048576)"},
        {"max-inflight", LI_OPT_INT, &o.max_inflight, "requests in flight per connection (default 64)"},
        {"max-connections", LI_OPT_INT, &o.max_connections, "open connections (default 256)"},
        {"max-queued", LI_OPT_INT, &o.max_queued, "requests (samples) waiting + running, server-wide (default 4096)"},
        {"max-depth", LI_OPT_INT, &o.max_depth, "nesting of msgpack arrays/maps in a frame (default 32, at most 32)"},
        {"no-prefix-cache", LI_OPT_FLAG, &o.no_prefix_cache, "turn prefix caching off (default on)"},
        {"spec-tokens", LI_OPT_INT, &o.spec_tokens, "speculation: draft tokens per decode step, 0..16 (default 0 = off)"},
        {"spec-ngram-max", LI_OPT_INT, &o.spec_ngram_max, "longest n-gram matched for drafts (default 4)"},
        {"spec-ngram-min", LI_OPT_INT, &o.spec_ngram_min, "shortest n-gram matched for drafts (default 2)"},
        {"spec-disable-batch", LI_OPT_INT, &o.spec_disable_batch, "no drafts while more requests than this run, 0 = never (default 4)"},
        {"write-buffer", LI_OPT_INT, &o.write_buffer, "unsent bytes per connection before reads stop (default 8 MiB)"},
        {"slow-client-seconds", LI_OPT_FLOAT, &o.slow_seconds, "over the write buffer this long: close (default 30)"},
        {"drain-seconds", LI_OPT_FLOAT, &o.drain_seconds, "on SIGTERM, wait this long for requests (default 30)"},
        {"header-timeout", LI_OPT_FLOAT, &o.header_timeout, "s for an HTTP request head from its first byte, and for the first request (default 10; 0 = off)"},
        {"body-timeout", LI_OPT_FLOAT, &o.body_timeout, "s for an HTTP body or a msgpack frame from its first byte (default 30; 0 = off)"},
        {"idle-timeout", LI_OPT_FLOAT, &o.idle_timeout, "s an HTTP keep-alive connection may wait between requests (default 60; 0 = off)"},
        {"rpc-idle-timeout", LI_OPT_FLOAT, &o.rpc_idle_timeout, "s a msgpack-RPC connection may wait between calls (default 0 = no limit)"},
        {"max-connections-per-ip", LI_OPT_INT, &o.max_per_ip, "open TCP connections per client address (default 0 = no limit)"},
        {"idle-evict-seconds", LI_OPT_FLOAT, &o.evict_idle, "at --max-connections, a new client closes the longest idle connection idle this long (default 2)"},
        {"step-log", LI_OPT_STR, &o.step_log, "append one JSON line per engine step that computed something to FILE: prefill_tokens, decode_rows, context, step_s, iter_s (the whole engine-thread iteration), forward_s, policy_s; fit with bench/bench_step_cost.lua --fit-log (default: off)"},
        {"help", LI_OPT_FLAG, &o.help, "show this help"},
    };
    const int n_opts = (int)LI_ARRAY_LEN(opts);
    li_error err = {0};
    const char *pos[1] = {NULL};
    int n_pos, rc;
    if ((rc = li_args_parse(opts, n_opts, argc, argv, pos, 1, &n_pos, &err))) return li_runtime_fail(&err);
    if (o.help) {
        li_args_usage("serve", "[POLICY.lua] [options]", opts, n_opts);
        printf("\nWith no options: the default model, policies/default.lua, msgpack-RPC on 127.0.0.1:7700 and\n"
               "OpenAI HTTP on 127.0.0.1:8000. --listen and --http replace those addresses (--listen alone: no HTTP).\n"
               "Port 0 picks a free port; each listener prints 'luainfer: listening on ADDR (PROTOCOL)'.\n");
        return 0;
    }
    int status = 1;
    li_server srv;
    li_server_init(&srv);
    li_runtime rt = {0};
    bool rt_open = false, loop_open = false;
    li_policy *policy = NULL;
    FILE *step_log = NULL;
    if ((rc = check_range("max-frame-bytes", o.max_frame, 64, (int64_t)1 << 30, &err)) ||
        (rc = check_range("max-inflight", o.max_inflight, 1, 1 << 20, &err)) ||
        (rc = check_range("max-connections", o.max_connections, 1, 1 << 20, &err)) ||
        (rc = check_range("max-queued", o.max_queued, 1, 1 << 30, &err)) ||
        (rc = check_range("max-depth", o.max_depth, 2, LI_SRV_MAX_DEPTH, &err)) ||
        (rc = check_range("write-buffer", o.write_buffer, 4096, (int64_t)1 << 40, &err)) ||
        (rc = check_range("max-connections-per-ip", o.max_per_ip, 0, 1 << 20, &err)))
        goto done;
    {
        const struct { const char *name; double v; } secs[] = {
            {"header-timeout", o.header_timeout}, {"body-timeout", o.body_timeout}, {"idle-timeout", o.idle_timeout},
            {"rpc-idle-timeout", o.rpc_idle_timeout}, {"idle-evict-seconds", o.evict_idle}};
        for (size_t i = 0; i < LI_ARRAY_LEN(secs); i++)
            if (!(secs[i].v >= 0 && secs[i].v <= 86400)) {
                li_error_set(&err, LI_EINVAL, "--%s must be in [0, 86400] seconds, got %g", secs[i].name, secs[i].v);
                goto done;
            }
    }
    if (!(o.drain_seconds >= 0 && o.drain_seconds <= 86400) || !(o.slow_seconds > 0 && o.slow_seconds <= 86400)) {
        li_error_set(&err, LI_EINVAL, "--drain-seconds must be in [0, 86400] and --slow-client-seconds in (0, 86400]");
        goto done;
    }
    li_policy_kind kind;
    if ((rc = li_policy_isolation_parse(o.isolation, "--policy-isolation", &kind, &err))) goto done;
    srv.lim.max_frame = (size_t)o.max_frame;
    srv.lim.max_inflight = (int)o.max_inflight;
    srv.lim.max_connections = (int)o.max_connections;
    srv.lim.max_queued = o.max_queued;
    srv.lim.max_depth = (int)o.max_depth;
    srv.lim.write_buffer = (size_t)o.write_buffer;
    srv.net.write_buffer = srv.lim.write_buffer;
    srv.net.max_connections = srv.lim.max_connections;
    srv.lim.slow_client_seconds = o.slow_seconds;
    srv.lim.drain_seconds = o.drain_seconds;
    srv.lim.header_timeout = o.header_timeout;
    srv.lim.body_timeout = o.body_timeout;
    srv.lim.idle_timeout = o.idle_timeout;
    srv.lim.rpc_idle_timeout = o.rpc_idle_timeout;
    srv.lim.evict_idle_seconds = o.evict_idle;
    srv.lim.max_connections_per_ip = (int)o.max_per_ip;
    li_server_apply_limits(&srv);
    /* an empty key on the command line is a mistake (--api-key "$KEY" with
     * KEY unset), not a wish to serve without one: vLLM takes "" as no key,
     * which would serve the port unguarded while the command says otherwise */
    {
        const char *empty = o.api_key && !*o.api_key         ? "--api-key"
                            : o.auth_token && !*o.auth_token ? "--auth-token"
                            : o.admin_token && !*o.admin_token ? "--admin-token"
                                                               : NULL;
        if (empty) {
            li_error_set(&err, LI_EINVAL, "%s is empty: give the key, or leave the option out (%s)", empty,
                         strcmp(empty, "--admin-token") ? "then $LUAINFER_API_KEY is the key, or none"
                                                        : "then policy.reload and shutdown are refused");
            goto done;
        }
    }
    srv.admin_token = o.admin_token;
    {
        /* --api-key, its older name --auth-token, then the environment (as vLLM's VLLM_API_KEY) */
        const char *env_key = getenv("LUAINFER_API_KEY");
        const char *key = o.api_key ? o.api_key : o.auth_token ? o.auth_token : env_key;
        if (o.api_key && o.auth_token && strcmp(o.api_key, o.auth_token)) {
            li_error_set(&err, LI_EINVAL, "--api-key and --auth-token are one key: give one of them");
            goto done;
        }
        srv.auth_token = key && *key ? key : NULL;
    }
    if ((o.no_http && o.http.n) || (o.no_rpc && o.listen.n)) {
        li_error_set(&err, LI_EINVAL, "%s", o.no_http && o.http.n ? "--no-http and --http contradict each other"
                                                                   : "--no-rpc and --listen contradict each other");
        goto done;
    }

    /* before the slow model load: a bad path fails at once */
    if (o.step_log && (rc = li_engine_thread_log_open(&step_log, o.step_log, &err))) goto done;

    /* the policy first: its config table may set engine defaults */
    const char *policy_path = pos[0] ? pos[0] : li_server_default_policy();
    if (policy_path) {
        li_policy_open_opts po = {.kind = kind, .path = policy_path, .lua = {.allow_unsafe = o.policy_unsafe}};
        if ((rc = li_policy_open(&policy, &po, &err))) goto done;
    } else {
        fprintf(stderr, "luainfer: no policies/default.lua found: using the built-in FCFS\n");
    }

    if ((rc = li_runtime_open_device(&rt, o.model, o.threads, o.isa, o.device, "--device", &err))) goto done;
    rt_open = true;
    if ((rc = li_runtime_set_q4_act(&rt, o.q4_act, "--q4-act", &err))) goto done;
    if (o.draft && (rc = li_runtime_open_draft(&rt, o.draft, &err))) goto done;
    if (o.medusa && (rc = li_runtime_open_medusa(&rt, o.medusa, o.medusa_tree, &err))) goto done;
    if (o.eagle && (rc = li_runtime_open_eagle(&rt, o.eagle, &err))) goto done;
    if (!o.medusa && o.medusa_tree) {
        rc = li_error_set(&err, LI_EINVAL, "--medusa-tree needs --medusa FILE");
        goto done;
    }
    srv.model = rt.model;
    {
        const char *base = strrchr(rt.model->path ? rt.model->path : "", '/');
        snprintf(srv.model_name, sizeof srv.model_name, "%s", base ? base + 1 : rt.model->path ? rt.model->path : "model");
        char *dot = strstr(srv.model_name, ".gguf");
        if (dot) *dot = 0;
    }

    /* engine config: flags > the policy's config table > defaults */
    li_engine_config *cfg = &srv.cfg;
    const li_policy_config *pc = policy ? &policy->config : NULL;
    cfg->block_size = (int32_t)(o.block_size > 0 ? o.block_size : pc && pc->block_size ? pc->block_size : cfg->block_size);
    cfg->max_num_seqs = (int32_t)(o.max_num_seqs > 0 ? o.max_num_seqs : pc && pc->max_num_seqs ? pc->max_num_seqs : cfg->max_num_seqs);
    cfg->max_batched_tokens = (int32_t)(o.max_batched_tokens > 0 ? o.max_batched_tokens
                                        : pc && pc->max_batched_tokens ? pc->max_batched_tokens
                                                                       : cfg->max_batched_tokens);
    const char *dt = o.kv_dtype ? o.kv_dtype : pc && pc->kv_dtype[0] ? pc->kv_dtype : "f16";
    if ((rc = li_kv_dtype_parse(dt, &cfg->kv_dtype, &err))) goto done;
    if (o.kv_memory && (rc = li_parse_bytes("--kv-memory", o.kv_memory, &cfg->kv_memory, &err))) goto done;
    if (o.no_prefix_cache) cfg->prefix_caching = false;
    if ((rc = check_range("spec-tokens", o.spec_tokens, 0, LI_SPEC_MAX_TOKENS, &err)) ||
        (o.spec_ngram_max != UNSET && (rc = check_range("spec-ngram-max", o.spec_ngram_max, 1, 64, &err))) ||
        (o.spec_ngram_min != UNSET && (rc = check_range("spec-ngram-min", o.spec_ngram_min, 1, 64, &err))) ||
        (o.spec_disable_batch != UNSET && (rc = check_range("spec-disable-batch", o.spec_disable_batch, 0, 1 << 20, &err))) ||
        (o.eagle_idle_steps != UNSET && (rc = check_range("eagle-idle-steps", o.eagle_idle_steps, 0, 1 << 20, &err))))
        goto done;
    if ((rc = li_runtime_spec_config(cfg, &rt, o.spec_method, o.spec_tokens, o.spec_layers, "--spec-", &err)))
        goto done;
    if (o.spec_ngram_max != UNSET) cfg->spec_ngram_max = (int32_t)o.spec_ngram_max;
    if (o.spec_ngram_min != UNSET) cfg->spec_ngram_min = (int32_t)o.spec_ngram_min;
    if (o.spec_disable_batch != UNSET) cfg->spec_disable_batch = (int32_t)o.spec_disable_batch;
    if (o.eagle_idle_steps != UNSET) cfg->eagle_idle_steps = (int32_t)o.eagle_idle_steps;
    if (o.spec_calibrate) cfg->spec_calibrate = true;
    if (o.eagle_lazy) cfg->eagle_lazy = true;
    if ((o.block_size != UNSET && (rc = check_range("block-size", o.block_size, 1, 1024, &err))) ||
        (o.max_num_seqs != UNSET && (rc = check_range("max-num-seqs", o.max_num_seqs, 1, 4096, &err))) ||
        (o.max_batched_tokens != UNSET && (rc = check_range("max-batched-tokens", o.max_batched_tokens, 1, 65536, &err))) ||
        (rc = check_range("ctx-size", o.ctx_size, 0, 1 << 20, &err)) ||
        (rc = check_range("tensor-parallel", o.tensor_parallel, 1, 64, &err)))
        goto done;
    cfg->tensor_parallel = (int32_t)o.tensor_parallel;
    cfg->max_model_len = o.ctx_size > 0 ? o.ctx_size : LI_MIN(rt.model->hp.n_ctx_train, 8192);
    if (cfg->max_model_len > rt.model->hp.n_ctx_train) cfg->max_model_len = rt.model->hp.n_ctx_train;

    if ((rc = li_loop_init(&srv.loop, &err))) goto done;
    loop_open = true;
    signal(SIGPIPE, SIG_IGN);
    /* defaults: msgpack-RPC on 7700 and HTTP on 8000, both loopback. --listen
     * alone (no --http) serves RPC only, as before HTTP was on by default. */
    if (o.listen.n == 0 && !o.no_rpc) {
        char def[32];
        snprintf(def, sizeof def, "127.0.0.1:%d", LI_SRV_DEFAULT_PORT);
        if ((rc = li_listener_open(&srv.net, def, &li_rpc_protocol, &srv, &err))) goto done;
    }
    for (int i = 0; i < o.listen.n; i++)
        if ((rc = li_listener_open(&srv.net, o.listen.items[i], &li_rpc_protocol, &srv, &err))) goto done;
    if (o.http.n == 0 && !o.no_http && o.listen.n == 0) {
        /* the default HTTP port may be taken (another dev server): say so, serve the rest */
        char def[32];
        snprintf(def, sizeof def, "127.0.0.1:%d", LI_SRV_DEFAULT_HTTP_PORT);
        li_error herr = {0};
        if (li_listener_open(&srv.net, def, &li_http_protocol, &srv, &herr)) {
            if (o.no_rpc) {
                err = herr;
                rc = herr.code;
                goto done;
            }
            fprintf(stderr, "luainfer: warning: no HTTP: %s (--http ADDR picks another, --no-http skips it)\n",
                    herr.msg);
        }
    }
    for (int i = 0; i < o.http.n; i++)
        if ((rc = li_listener_open(&srv.net, o.http.items[i], &li_http_protocol, &srv, &err))) goto done;
    if (!srv.net.listeners) {
        li_error_set(&err, LI_EINVAL, "--no-rpc and --no-http leave nothing to listen on");
        goto done;
    }

    li_engine_thread_opts eo = {
        .model = rt.model, .draft = rt.draft, .be = &rt.be, .cfg = *cfg, .policy = policy, .on_events = li_api_on_events,
        .reload = {.kind = kind, .lua = {.allow_unsafe = o.policy_unsafe}}, .step_log = step_log};
    li_engine_thread *eng;
    rc = li_engine_thread_start(&eng, &srv, &eo, &err);
    policy = NULL; /* the engine thread owns them (and freed them on failure) */
    step_log = NULL;
    if (rc) goto done;
    {
        li_engine_snapshot snap;
        li_engine_thread_snapshot(eng, &snap);
        fprintf(stderr,
                "luainfer: serving %s with %s (KV %d blocks x %d tokens %s, max_num_seqs %d, max_batched_tokens %d, "
                "context %lld)\n",
                srv.model_name, snap.policy, snap.st.kv_total_blocks, snap.st.block_size, li_kv_dtype_name(cfg->kv_dtype),
                cfg->max_num_seqs, cfg->max_batched_tokens, (long long)cfg->max_model_len);
        if (rt.draft)
            fprintf(stderr, "luainfer: draft model %s (KV %zu bytes; the target's %zu)\n", o.draft, snap.st.kv_draft_bytes,
                    snap.st.kv_bytes);
        li_hist_free(&snap.step_time);
        print_banner(&srv);
    }
    uv_timer_init(&srv.loop.uv, &srv.tick);
    srv.tick.data = &srv;
    uv_timer_start(&srv.tick, on_tick, 100, 100);
    uv_signal_init(&srv.loop.uv, &srv.sig_int);
    uv_signal_init(&srv.loop.uv, &srv.sig_term);
    srv.sig_int.data = srv.sig_term.data = &srv;
    uv_signal_start(&srv.sig_int, on_signal, SIGINT);
    uv_signal_start(&srv.sig_term, on_signal, SIGTERM);
    srv.handles_open = true;
    srv.t_start = li_time_now();

    uv_run(&srv.loop.uv, UV_RUN_DEFAULT);

    if (srv.eng) { /* the loop ended some other way: still stop cleanly */
        li_engine_thread_stop(srv.eng);
        srv.eng = NULL;
    }
    watchdog_disarm();
    fprintf(stderr, "luainfer: stopped\n");
    status = 0;
done:
    if (status) li_runtime_fail(&err);
    if (srv.eng) {
        li_engine_thread_stop(srv.eng);
        srv.eng = NULL;
    }
    if (loop_open) {
        li_listeners_close(&srv.net);
        for (li_conn *c = srv.net.conns; c; c = c->next) li_conn_force_close(c);
        li_loop_close(&srv.loop);
    }
    if (policy) policy->ops->free(policy);
    if (step_log) fclose(step_log);
    if (rt_open) li_runtime_close(&rt);
    li_server_free(&srv);
    free((void *)o.listen.items);
    free((void *)o.http.items);
    return status;
}
