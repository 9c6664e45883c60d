/* policy_proc.c — the engine side of the isolated policy mode.
 *
 * Owns: the `luainfer policy-host` child (pid, socket), the policy's source
 * text, and the per-call deadline. Each schedule/admit call is one msgpack
 * round trip with blocking-free I/O (poll on a non-blocking socket): the
 * engine never waits past the deadline, whatever the host does.
 *
 * Life of a host:
 *   spawn (posix_spawn, socket on fd 3) -> the engine sends `reload` with the
 *   policy source right away -> host answers `hello`, then the reload reply
 *   -> ready. A late reply, an exit, or a protocol error kills the host
 *   (SIGKILL) and starts a new one: at once after the first failure, then
 *   with a doubling back-off (100 ms .. 10 s) while failures repeat; a
 *   successful call resets it. While a new host starts, calls fail fast and
 *   the engine runs its fallback for those steps. */
#define _GNU_SOURCE
#include "policy/policy_proc.h"
#include "policy/policy_wire.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define HOST_FD 3
#define BACKOFF_MIN 0.1
#define BACKOFF_MAX 10.0

enum { IO_OK = 0, IO_TIMEOUT = 1, IO_DEAD = 2, IO_PROTO = 3, IO_DROPPED = 4 };

typedef struct li_policy_proc {
    li_policy base;
    li_policy_proc_opts opts;
    char host_bin[1024];
    char *source;          /* text of the loaded policy: every host loads it */
    unsigned hooks;

    /* the current host */
    pid_t pid;             /* -1: none */
    int fd;
    li_wire_start start;   /* its hello and first load: ready when both came */
    double started;
    int64_t seq;
    bool ever_started;

    /* restarts */
    int fails;             /* consecutive failures */
    double next_start;
    pid_t zombies[16];
    int n_zombies;
    li_policy_proc_stats st;

    /* buffers */
    msgpack_sbuffer sb;
    msgpack_packer pk;
    li_wire_reader rd;     /* bytes from the host, framed and decoded */
    const msgpack_object *msg; /* the last frame read (a map, in rd) */
    char why[320];         /* what the last protocol error was */
} li_policy_proc;

static double now_s(void) { return li_time_now(); }

/* ======================================================================
 * Frames on the non-blocking socket
 * ====================================================================== */

static int remaining_ms(double deadline) {
    double r = (deadline - now_s()) * 1000.0;
    return r <= 0 ? 0 : (int)(r + 0.999);
}

/* Sends the frame in p->sb. droppable: if not a byte can be written now,
 * give up cleanly (IO_DROPPED); a frame once started is always finished. */
static int send_frame(li_policy_proc *p, double deadline, bool droppable) {
    li_wire_frame_end(&p->sb);
    size_t put = 0, n = p->sb.size;
    while (put < n) {
        ssize_t w = send(p->fd, p->sb.data + put, n - put, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            put += (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (droppable && put == 0) return IO_DROPPED;
            struct pollfd pf = {.fd = p->fd, .events = POLLOUT};
            int ms = remaining_ms(deadline);
            if (ms == 0) return IO_TIMEOUT;
            int r = poll(&pf, 1, ms);
            if (r == 0) return IO_TIMEOUT;
            if (r < 0 && errno != EINTR) return IO_DEAD;
            continue;
        }
        return IO_DEAD;
    }
    return IO_OK;
}

/* Notes why the host broke the protocol (for the log and the caller). */
static int proto_error(li_policy_proc *p, const char *what) {
    snprintf(p->why, sizeof p->why, "%.300s", what);
    return IO_PROTO;
}

/* Reads the next frame into p->msg (valid until the next call). */
static int read_frame(li_policy_proc *p, double deadline) {
    for (;;) {
        li_error e = {0};
        int f = li_wire_reader_next(&p->rd, &p->msg, &e);
        if (f > 0) return IO_OK;
        if (f < 0) return proto_error(p, e.msg);
        size_t room;
        char *dst = li_wire_reader_space(&p->rd, &room);
        ssize_t r = recv(p->fd, dst, room, MSG_DONTWAIT);
        if (r > 0) {
            li_wire_reader_commit(&p->rd, (size_t)r);
            continue;
        }
        if (r == 0) return IO_DEAD;
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return IO_DEAD;
        struct pollfd pf = {.fd = p->fd, .events = POLLIN};
        int ms = remaining_ms(deadline);
        if (ms == 0) return IO_TIMEOUT;
        int pr = poll(&pf, 1, ms);
        if (pr == 0) return IO_TIMEOUT;
        if (pr < 0 && errno != EINTR) return IO_DEAD;
    }
}

/* ======================================================================
 * Host processes: spawn, kill, restart
 * ====================================================================== */

static void reap_zombies(li_policy_proc *p) {
    for (int i = 0; i < p->n_zombies;) {
        pid_t r = waitpid(p->zombies[i], NULL, WNOHANG);
        if (r == p->zombies[i] || (r < 0 && errno == ECHILD)) p->zombies[i] = p->zombies[--p->n_zombies];
        else i++;
    }
}

/* Waits up to ms for pid to exit; describes how in `how`. */
static bool wait_exit(pid_t pid, int ms, char *how, size_t cap) {
    for (int waited = 0;; waited++) {
        int status;
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) {
            if (WIFEXITED(status)) snprintf(how, cap, "exit status %d", WEXITSTATUS(status));
            else if (WIFSIGNALED(status)) snprintf(how, cap, "signal %d", WTERMSIG(status));
            return true;
        }
        if (r < 0) return true; /* not our child any more (SIGCHLD ignored) */
        if (waited >= ms) return false;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

/* Ends the current host (whatever it is doing) and forgets it. */
static void host_kill(li_policy_proc *p, char *how, size_t cap) {
    if (how && cap) how[0] = 0;
    if (p->fd >= 0) close(p->fd);
    p->fd = -1;
    if (p->pid > 0) {
        char tmp[64] = "";
        /* an exit we saw as EOF may still be on its way to zombie state */
        if (!wait_exit(p->pid, 5, tmp, sizeof tmp)) {
            kill(p->pid, SIGKILL);
            if (!wait_exit(p->pid, 50, tmp, sizeof tmp) && p->n_zombies < (int)LI_ARRAY_LEN(p->zombies))
                p->zombies[p->n_zombies++] = p->pid;
        }
        if (how && cap) snprintf(how, cap, "%s", tmp);
    }
    p->pid = -1;
    p->start.hello = p->start.ready = false;
    li_wire_reader_reset(&p->rd);
}

static int64_t pack_reload(li_policy_proc *p, const char *source, const char *name) {
    int64_t seq = ++p->seq;
    li_wire_msg_begin(&p->sb, &p->pk, 4, "reload", seq);
    li_wire_pack_str(&p->pk, "source");
    li_wire_pack_str(&p->pk, source);
    li_wire_pack_str(&p->pk, "name");
    li_wire_pack_str(&p->pk, name);
    return seq;
}

/* Starts a host and queues the load of p->source; does not wait. */
static int host_spawn(li_policy_proc *p, li_error *err) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        return li_error_set(err, LI_EIO, "policy host: socketpair: %s", strerror(errno));
    int cfd = sv[1];
    if (cfd == HOST_FD) { /* dup2 onto itself would keep CLOEXEC */
        int t = fcntl(cfd, F_DUPFD_CLOEXEC, HOST_FD + 1);
        close(cfd);
        cfd = t;
    }
    char fdbuf[16], budget[32], mem[32], seed[32];
    snprintf(fdbuf, sizeof fdbuf, "%d", HOST_FD);
    char *argv[16];
    int a = 0;
    argv[a++] = "luainfer";
    argv[a++] = "policy-host";
    argv[a++] = "--fd";
    argv[a++] = fdbuf;
    const li_policy_lua_opts *lo = &p->opts.lua;
    if (lo->allow_unsafe) argv[a++] = "--unsafe";
    if (lo->jit_off) argv[a++] = "--jit-off";
    if (lo->instr_budget) {
        snprintf(budget, sizeof budget, "%lld", (long long)(lo->instr_budget < 0 ? -1 : lo->instr_budget));
        argv[a++] = "--budget";
        argv[a++] = budget;
    }
    if (lo->mem_limit) {
        snprintf(mem, sizeof mem, "%zu", lo->mem_limit);
        argv[a++] = "--mem-limit";
        argv[a++] = mem;
    }
    if (lo->seed) {
        snprintf(seed, sizeof seed, "%u", lo->seed);
        argv[a++] = "--seed";
        argv[a++] = seed;
    }
    argv[a] = NULL;

    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, cfd, HOST_FD);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, 2, 1); /* the engine's stdout may carry data */
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
    posix_spawn_file_actions_addclosefrom_np(&fa, HOST_FD + 1);
#endif
    posix_spawnattr_t at;
    posix_spawnattr_init(&at);
    sigset_t none, dflt;
    sigemptyset(&none);
    sigemptyset(&dflt);
    sigaddset(&dflt, SIGPIPE);
    sigaddset(&dflt, SIGTERM);
    sigaddset(&dflt, SIGCHLD);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setsigdefault(&at, &dflt);
    /* own process group: a Ctrl-C for the engine is not one for the host
     * (it dies with the engine through PDEATHSIG) */
    posix_spawnattr_setpgroup(&at, 0);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
    pid_t pid;
    int rc = posix_spawn(&pid, p->host_bin, &fa, &at, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    close(cfd);
    if (rc != 0) {
        close(sv[0]);
        return li_error_set(err, LI_EIO, "policy host: cannot start %s: %s", p->host_bin, strerror(rc));
    }
    p->pid = pid;
    p->fd = sv[0];
    fcntl(p->fd, F_SETFL, fcntl(p->fd, F_GETFL) | O_NONBLOCK);
    p->start = (li_wire_start){0};
    li_wire_reader_reset(&p->rd);
    p->started = now_s();
    if (p->ever_started) p->st.restarts++;
    p->ever_started = true;
    p->st.pid = pid;
    p->start.load_seq = pack_reload(p, p->source, p->base.name);
    int w = send_frame(p, now_s() + p->opts.start_timeout_ms / 1000.0, false);
    if (w != IO_OK) {
        host_kill(p, NULL, 0);
        return li_error_set(err, LI_EIO, "policy host: cannot send the policy to the new host");
    }
    return 0;
}

/* The host failed (late, dead, or garbled): kill it and schedule a new one. */
static void host_fail(li_policy_proc *p, int kind, const char *what) {
    char how[64];
    int pid = p->pid;
    host_kill(p, how, sizeof how);
    if (kind == IO_TIMEOUT) p->st.timeouts++;
    else p->st.crashes++;
    p->fails++;
    double backoff = p->fails <= 1 ? 0 : BACKOFF_MIN * (double)(1 << LI_MIN(p->fails - 2, 10));
    backoff = LI_MIN(backoff, BACKOFF_MAX);
    p->next_start = now_s() + backoff;
    li_log_warn("policy %s: host %d %s%s%s%s; restarting%s", p->base.name, pid, what, how[0] ? " (" : "", how,
                how[0] ? ")" : "", backoff > 0 ? " after a back-off" : "");
    if (backoff == 0) {
        li_error err = {0};
        if (host_spawn(p, &err)) li_log_warn("policy %s: %s", p->base.name, err.msg);
    }
    p->st.pid = p->pid;
}

/* "timed out after 50 ms", "exited", "broke the protocol (why)" */
static void fail_message(const li_policy_proc *p, int kind, int deadline_ms, char *buf, size_t cap) {
    if (kind == IO_TIMEOUT) snprintf(buf, cap, "timed out after %d ms", deadline_ms);
    else if (kind == IO_PROTO) snprintf(buf, cap, "broke the protocol (%s)", p->why[0] ? p->why : "?");
    else snprintf(buf, cap, "exited");
}

/* What the loaded policy declares: its config and the hooks it defines. */
static void apply_info(li_policy_proc *p, const li_policy_config *cfg, unsigned hooks) {
    p->base.config = *cfg;
    p->hooks = hooks;
    p->base.has_schedule = (p->hooks & LI_POLICY_HOOK_SCHEDULE) != 0;
    p->base.has_evict = (p->hooks & LI_POLICY_HOOK_EVICT) != 0;
    p->base.has_speculate = (p->hooks & LI_POLICY_HOOK_SPECULATE) != 0;
}

/* Takes in a frame that is not the reply being waited for (a hello, the
 * reply to the pending load, or a stale reply); false when the host cannot
 * be used (p->start.error says why). A (re)started host's config and hooks
 * come from its load reply. */
static bool take_async(li_policy_proc *p, const msgpack_object *m) {
    bool was_ready = p->start.ready;
    if (!li_wire_take_async(&p->start, m)) return false;
    if (p->start.ready && !was_ready) apply_info(p, &p->start.config, p->start.hooks);
    return true;
}

/* Makes sure a ready host exists, waiting at most until deadline. */
static int ensure_ready(li_policy_proc *p, double deadline, li_error *err) {
    reap_zombies(p);
    if (p->pid <= 0) {
        double wait = p->next_start - now_s();
        if (wait > 0)
            return li_error_set(err, LI_EIO, "policy host restarting (back-off, %d ms left)", (int)(wait * 1000));
        if (host_spawn(p, err)) {
            p->fails++;
            p->next_start = now_s() + LI_MIN(BACKOFF_MIN * (double)(1 << LI_MIN(p->fails, 10)), BACKOFF_MAX);
            return err->code;
        }
    }
    while (!p->start.ready) {
        double start_deadline = p->started + p->opts.start_timeout_ms / 1000.0;
        int r = read_frame(p, LI_MIN(deadline, start_deadline));
        if (r == IO_TIMEOUT) {
            if (now_s() < start_deadline) return li_error_set(err, LI_EIO, "policy host still starting");
            host_fail(p, IO_TIMEOUT, "did not start in time");
            return li_error_set(err, LI_EIO, "policy host did not start within %d ms", p->opts.start_timeout_ms);
        }
        if (r != IO_OK) {
            char m[400], what[440];
            fail_message(p, r, 0, m, sizeof m);
            snprintf(what, sizeof what, "%s while starting", m);
            host_fail(p, r, what);
            return li_error_set(err, LI_EIO, "policy host %s", what);
        }
        if (!take_async(p, p->msg)) {
            char why[512];
            snprintf(why, sizeof why, "%s", p->start.error);
            host_fail(p, IO_PROTO, "could not load the policy");
            snprintf(p->start.error, sizeof p->start.error, "%s", why);
            return li_error_set(err, LI_EINVAL, "policy host: %s", why);
        }
    }
    return 0;
}

/* Sends p->sb and waits for the reply to seq; on failure the host is
 * replaced and err says what happened. */
static int round_trip(li_policy_proc *p, int64_t seq, double deadline, int deadline_ms, li_error *err) {
    int r = send_frame(p, deadline, false);
    while (r == IO_OK) {
        r = read_frame(p, deadline);
        if (r != IO_OK) break;
        const msgpack_object *m = p->msg;
        int64_t s;
        if (li_wire_int(li_wire_get(m, "seq"), &s) && s == seq) return 0;
        if (!take_async(p, m)) r = proto_error(p, p->start.error);
    }
    char what[400];
    fail_message(p, r, deadline_ms, what, sizeof what);
    host_fail(p, r, what);
    return li_error_set(err, LI_EIO, "policy host %s (killed; a new one is starting)", what);
}

/* A reply that breaks the protocol: the host is replaced; err says why. */
static int reply_broken(li_policy_proc *p, const char *what, li_error *err) {
    char why[400];
    snprintf(why, sizeof why, "sent %s: %.300s", what, err->msg);
    host_fail(p, IO_PROTO, why);
    return li_error_set(err, LI_EIO, "policy host %s (killed; a new one is starting)", why);
}

/* A reply of type "error" becomes err (a policy error: the host stays);
 * anything but `want` is a protocol error. */
static int check_reply(li_policy_proc *p, const char *want, li_error *err) {
    int rc = li_wire_check_reply(p->msg, want, err);
    if (rc == LI_EIO) return reply_broken(p, "an unexpected reply", err);
    return rc;
}

/* A call's start: counted, a ready host, and the request map's first two
 * fields {type, seq} packed (n_fields counts every field of the map). */
static int call_begin(li_policy_proc *p, const char *type, uint32_t n_fields, int64_t *seq, double *deadline,
                      li_error *err) {
    *deadline = now_s() + p->opts.deadline_ms / 1000.0;
    p->st.calls++;
    if (ensure_ready(p, *deadline, err)) return err->code;
    *seq = ++p->seq;
    li_wire_msg_begin(&p->sb, &p->pk, n_fields, type, *seq);
    return 0;
}

/* Sends the packed call and leaves its reply, of type `want`, in p->msg. */
static int call_end(li_policy_proc *p, int64_t seq, double deadline, const char *want, li_error *err) {
    if (round_trip(p, seq, deadline, p->opts.deadline_ms, err)) return err->code;
    return check_reply(p, want, err);
}

/* ======================================================================
 * The li_policy vtable
 * ====================================================================== */

static int proc_schedule(li_policy *pp, const li_step_state *st, li_plan *plan, li_error *err) {
    li_policy_proc *p = (li_policy_proc *)pp;
    int64_t seq;
    double deadline;
    if (call_begin(p, "schedule", 3, &seq, &deadline, err)) return err->code;
    li_wire_pack_str(&p->pk, "state");
    li_wire_pack_state(&p->pk, st);
    if (call_end(p, seq, deadline, "plan", err)) return err->code;
    if (li_wire_unpack_plan(li_wire_get(p->msg, "plan"), plan, err)) {
        li_plan_clear(plan); /* never half a plan */
        return reply_broken(p, "a malformed plan", err);
    }
    p->fails = 0;
    return 0;
}

static int proc_admit(li_policy *pp, const li_req_view *req, const li_step_state *st, bool *accept, char *reason,
                      size_t reason_cap, li_error *err) {
    li_policy_proc *p = (li_policy_proc *)pp;
    *accept = true;
    if (reason && reason_cap) reason[0] = 0;
    if (!(p->hooks & LI_POLICY_HOOK_ADMIT)) return 0;
    int64_t seq;
    double deadline;
    if (call_begin(p, "admit", 4, &seq, &deadline, err)) return err->code;
    li_wire_pack_str(&p->pk, "req");
    li_wire_pack_req(&p->pk, req);
    li_wire_pack_str(&p->pk, "state");
    if (st) li_wire_pack_state(&p->pk, st);
    else msgpack_pack_nil(&p->pk);
    if (call_end(p, seq, deadline, "admit", err)) return err->code;
    if (li_wire_decode_admit(p->msg, accept, reason, reason_cap, err))
        return reply_broken(p, "a malformed admit reply", err); /* *accept stays true */
    p->fails = 0;
    return 0;
}

/* Eviction order: candidates go as [block, last_access, hits, depth] rows,
 * the host answers {order = [block, ...]}; the engine checks every id. */
static int proc_evict(li_policy *pp, const li_evict_candidate *cands, int32_t n_cands, int32_t need, int32_t *order,
                      int32_t *n_order, li_error *err) {
    li_policy_proc *p = (li_policy_proc *)pp;
    *n_order = 0;
    if (!(p->hooks & LI_POLICY_HOOK_EVICT)) return 0;
    int64_t seq;
    double deadline;
    if (call_begin(p, "evict", 4, &seq, &deadline, err)) return err->code;
    li_wire_pack_str(&p->pk, "need");
    msgpack_pack_int32(&p->pk, need);
    li_wire_pack_str(&p->pk, "cands");
    msgpack_pack_array(&p->pk, (size_t)n_cands);
    for (int32_t i = 0; i < n_cands; i++) {
        msgpack_pack_array(&p->pk, 4);
        msgpack_pack_int32(&p->pk, cands[i].block);
        msgpack_pack_double(&p->pk, cands[i].last_access);
        msgpack_pack_uint32(&p->pk, cands[i].hits);
        msgpack_pack_int32(&p->pk, cands[i].depth);
    }
    if (call_end(p, seq, deadline, "order", err)) return err->code;
    if (li_wire_decode_order(p->msg, n_cands, order, n_order, err))
        return reply_broken(p, "a malformed evict reply", err);
    p->fails = 0;
    return 0;
}

/* Speculation: the state and the candidates go out, one [method, k] per
 * candidate comes back, checked whole before any is taken (a bad reply
 * leaves the wants, and replaces the host). */
static int proc_speculate(li_policy *pp, const li_step_state *st, const li_spec_state *ss, li_spec_cand *cands,
                          int32_t n, li_error *err) {
    li_policy_proc *p = (li_policy_proc *)pp;
    if (!(p->hooks & LI_POLICY_HOOK_SPECULATE) || n <= 0) return 0;
    int64_t seq;
    double deadline;
    if (call_begin(p, "speculate", 5, &seq, &deadline, err)) return err->code;
    li_wire_pack_str(&p->pk, "state");
    li_wire_pack_state(&p->pk, st);
    li_wire_pack_spec(&p->pk, ss, cands, n);
    if (call_end(p, seq, deadline, "speculate", err)) return err->code;
    if (li_wire_decode_choices(p->msg, cands, n, LI_MIN(ss->n_methods, LI_WIRE_MAX_METHODS), err))
        return reply_broken(p, "a malformed speculate reply", err);
    p->fails = 0;
    return 0;
}

static void proc_on_finish(li_policy *pp, const li_req_view *req, const char *finish_reason) {
    li_policy_proc *p = (li_policy_proc *)pp;
    if (!(p->hooks & LI_POLICY_HOOK_ON_FINISH)) return;
    if (p->pid <= 0 || !p->start.ready) {
        p->st.dropped++;
        return;
    }
    li_wire_msg_begin(&p->sb, &p->pk, 3, "on_finish", -1);
    li_wire_pack_str(&p->pk, "req");
    li_wire_pack_req(&p->pk, req);
    li_wire_pack_str(&p->pk, "finish_reason");
    li_wire_pack_str(&p->pk, finish_reason ? finish_reason : "");
    /* fire and forget: never waits for the host unless a frame is half sent */
    int r = send_frame(p, now_s() + p->opts.deadline_ms / 1000.0, true);
    if (r == IO_DROPPED) p->st.dropped++;
    else if (r != IO_OK) {
        char what[400];
        fail_message(p, r, p->opts.deadline_ms, what, sizeof what);
        host_fail(p, r, what);
    }
}

/* The policy file's text (the host reads it again; this copy is for the
 * engine's checks and errors): li_read_file with policy_lua's limit. */
static int read_file(const char *path, char **out, li_error *err) {
    size_t len;
    if (li_policy_read_file(path, out, &len, err)) return err->code;
    if (memchr(*out, 0, len)) {
        free(*out);
        *out = NULL;
        return li_error_set(err, LI_EINVAL, "policy file %s is not text", path);
    }
    return 0;
}

static int proc_reload(li_policy *pp, const char *path, const char *source, li_error *err) {
    li_policy_proc *p = (li_policy_proc *)pp;
    char *text = NULL;
    if (source) {
        size_t n = strlen(source);
        text = li_xmalloc(n + 1);
        memcpy(text, source, n + 1);
    } else if (!path) {
        return li_error_set(err, LI_EINVAL, "policy reload: neither a path nor source text given");
    } else if (read_file(path, &text, err)) {
        return err->code;
    }
    const char *name = path ? path : "policy";
    double deadline = now_s() + p->opts.start_timeout_ms / 1000.0;
    /* Replacing a broken policy must always be possible: no back-off for a
     * reload, and a host that is not ready (down, starting, or failing) is
     * replaced by a fresh one before the new text is sent. */
    reap_zombies(p);
    if (p->pid > 0 && !p->start.ready) host_kill(p, NULL, 0);
    p->next_start = 0;
    int rc = ensure_ready(p, deadline, err);
    if (rc == 0) {
        int64_t seq = pack_reload(p, text, name);
        rc = round_trip(p, seq, deadline, p->opts.start_timeout_ms, err);
        if (rc == 0 && (rc = check_reply(p, "reload", err)) == 0) {
            li_policy_config cfg;
            unsigned hooks;
            rc = li_wire_decode_reload(p->msg, &cfg, &hooks, err);
            if (rc == 0) {
                apply_info(p, &cfg, hooks);
                free(p->source);
                p->source = text;
                text = NULL;
                snprintf(p->base.name, sizeof p->base.name, "%s", name);
            } else if (rc == LI_EIO) {
                rc = reply_broken(p, "a malformed reload reply", err);
            }
        }
    }
    free(text);
    return rc; /* on failure the host keeps the old policy (or restarts with it) */
}

static void proc_free(li_policy *pp) {
    li_policy_proc *p = (li_policy_proc *)pp;
    if (!p) return;
    if (p->fd >= 0) {
        /* the host exits on EOF; don't wait for it */
        close(p->fd);
        p->fd = -1;
    }
    if (p->pid > 0) {
        kill(p->pid, SIGKILL);
        waitpid(p->pid, NULL, 0);
    }
    for (int i = 0; i < p->n_zombies; i++) waitpid(p->zombies[i], NULL, 0);
    li_wire_reader_free(&p->rd);
    msgpack_sbuffer_destroy(&p->sb);
    free(p->source);
    free(p);
}

static const li_policy_ops proc_ops = {
    .kind = "process",
    .schedule = proc_schedule,
    .admit = proc_admit,
    .evict = proc_evict,
    .on_finish = proc_on_finish,
    .reload = proc_reload,
    .free = proc_free,
    .speculate = proc_speculate,
};

int li_policy_proc_open(li_policy **out, const char *path, const li_policy_proc_opts *opts, li_error *err) {
    *out = NULL;
    if (!path && !(opts && opts->source)) return li_error_set(err, LI_EINVAL, "policy: no path given");
    char *text;
    if (opts && opts->source) {
        size_t n = strlen(opts->source);
        text = li_xmalloc(n + 1);
        memcpy(text, opts->source, n + 1);
        if (!path) path = "policy";
    } else if (read_file(path, &text, err)) {
        return err->code;
    }
    li_policy_proc *p = li_xcalloc(1, sizeof *p);
    p->base.ops = &proc_ops;
    snprintf(p->base.name, sizeof p->base.name, "%s", path);
    if (opts) p->opts = *opts;
    if (p->opts.deadline_ms <= 0) p->opts.deadline_ms = LI_POLICY_PROC_DEFAULT_DEADLINE_MS;
    if (p->opts.start_timeout_ms <= 0) p->opts.start_timeout_ms = LI_POLICY_PROC_DEFAULT_START_MS;
    snprintf(p->host_bin, sizeof p->host_bin, "%s", p->opts.host_bin ? p->opts.host_bin : "/proc/self/exe");
    p->opts.host_bin = NULL; /* not owned; p->host_bin is the copy */
    p->opts.source = NULL;   /* p->source is the copy */
    p->source = text;
    p->pid = -1;
    p->fd = -1;
    p->st.pid = -1;
    msgpack_sbuffer_init(&p->sb);
    msgpack_packer_init(&p->pk, &p->sb, msgpack_sbuffer_write);
    li_wire_reader_init(&p->rd);
    int rc = host_spawn(p, err);
    if (rc == 0) {
        double deadline = now_s() + p->opts.start_timeout_ms / 1000.0;
        while (!p->start.ready) {
            int r = read_frame(p, deadline);
            if (r != IO_OK) {
                char m[400];
                fail_message(p, r, p->opts.start_timeout_ms, m, sizeof m);
                rc = li_error_set(err, LI_EIO, "policy host (%s policy-host) %s while starting", p->host_bin, m);
                break;
            }
            if (!take_async(p, p->msg)) {
                rc = li_error_set(err, LI_EINVAL, "%s", p->start.error);
                break;
            }
        }
    }
    if (rc) {
        proc_free(&p->base);
        return rc;
    }
    *out = &p->base;
    return 0;
}

int li_policy_proc_wait_ready(li_policy *pp, int32_t timeout_ms, li_error *err) {
    li_policy_proc *p = (li_policy_proc *)pp;
    double deadline = now_s() + timeout_ms / 1000.0;
    for (;;) {
        if (ensure_ready(p, deadline, err) == 0) return 0;
        if (now_s() >= deadline) return err->code ? err->code : LI_EIO;
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
}

void li_policy_proc_stats_get(const li_policy *pp, li_policy_proc_stats *out) {
    const li_policy_proc *p = (const li_policy_proc *)pp;
    *out = p->st;
    out->pid = p->pid;
}
