/* lua_client.c — `luainfer.net`: what a Lua msgpack-RPC client needs and
 * plain Lua lacks — blocking TCP / Unix sockets and msgpack.
 * lua/luainfer/client.lua builds the RPC client on top of it.
 *
 *   local net = require("luainfer.net")
 *   local s = assert(net.connect("127.0.0.1:7700", 5))  -- or "unix:/path"; timeout in seconds
 *   s:send(net.pack(net.array{0, 1, "health", net.map{}}))
 *   local bytes, err = s:recv(65536, 10)                  -- nil, "timeout" | "closed" | message
 *   local msg, next_pos = net.unpack(bytes)               -- next_pos == nil: incomplete
 *   s:close()
 *
 * Packing: nil and net.null → nil; integral numbers → integers; strings →
 * str; a table → array when it is a sequence (1..n, nothing else), else
 * map; net.array(t) / net.map(t) force the choice (an empty table packs as
 * a map unless marked). Unpacking: nil → nil (array holes keep their
 * indices), bin → string, ext → nil. */
#define _GNU_SOURCE
#include "lua/lua_engine.h"
#include "server/lua_client.h"
#include "server/server.h"

#include <errno.h>
#include <lauxlib.h>
#include <lua.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define SOCK_MT "luainfer.net.socket"
#define KIND_FIELD "__msgpack"

typedef struct lsock {
    int fd;
} lsock;

/* ---- sockets -------------------------------------------------------------- */

static int wait_fd(int fd, short events, double timeout) {
    struct pollfd p = {.fd = fd, .events = events};
    int ms = timeout < 0 ? -1 : (int)(timeout * 1000);
    for (;;) {
        int rc = poll(&p, 1, ms);
        if (rc < 0 && errno == EINTR) continue;
        return rc; /* 0: timeout */
    }
}

static int push_err(lua_State *L, const char *msg) {
    lua_pushnil(L);
    lua_pushstring(L, msg);
    return 2;
}

static int l_connect(lua_State *L) {
    const char *addr = luaL_checkstring(L, 1);
    double timeout = luaL_optnumber(L, 2, 10);
    int fd = -1;
    char msg[300];
    if (!strncmp(addr, "unix:", 5)) {
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        if (strlen(addr + 5) >= sizeof sa.sun_path) return push_err(L, "unix socket path too long");
        strcpy(sa.sun_path, addr + 5);
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
            snprintf(msg, sizeof msg, "connect %s: %s", addr, strerror(errno));
            if (fd >= 0) close(fd);
            return push_err(L, msg);
        }
    } else {
        char host[256];
        const char *colon = strrchr(addr, ':');
        if (!colon || colon == addr) return push_err(L, "address must be HOST:PORT or unix:PATH");
        const char *h = addr;
        size_t hl = (size_t)(colon - addr);
        if (h[0] == '[' && hl >= 2 && h[hl - 1] == ']') h++, hl -= 2;
        if (hl >= sizeof host) return push_err(L, "host name too long");
        memcpy(host, h, hl);
        host[hl] = 0;
        struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
        int rc = getaddrinfo(host, colon + 1, &hints, &res);
        if (rc) {
            snprintf(msg, sizeof msg, "resolve %s: %s", addr, gai_strerror(rc));
            return push_err(L, msg);
        }
        snprintf(msg, sizeof msg, "connect %s: no address", addr);
        for (struct addrinfo *a = res; a; a = a->ai_next) {
            fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
            if (fd < 0) continue;
            if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
            if (errno == EINPROGRESS && wait_fd(fd, POLLOUT, timeout) > 0) {
                int e = 0;
                socklen_t el = sizeof e;
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el);
                if (e == 0) break;
                errno = e;
            } else if (errno == EINPROGRESS) {
                errno = ETIMEDOUT;
            }
            snprintf(msg, sizeof msg, "connect %s: %s", addr, strerror(errno));
            close(fd);
            fd = -1;
        }
        freeaddrinfo(res);
        if (fd < 0) return push_err(L, msg);
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    lsock *s = lua_newuserdata(L, sizeof *s);
    s->fd = fd;
    luaL_getmetatable(L, SOCK_MT);
    lua_setmetatable(L, -2);
    return 1;
}

static lsock *check_sock(lua_State *L) {
    lsock *s = luaL_checkudata(L, 1, SOCK_MT);
    if (s->fd < 0) luaL_error(L, "socket is closed");
    return s;
}

static int l_send(lua_State *L) {
    lsock *s = check_sock(L);
    size_t n;
    const char *p = luaL_checklstring(L, 2, &n);
    double timeout = luaL_optnumber(L, 3, 30);
    size_t off = 0;
    while (off < n) {
        ssize_t k = send(s->fd, p + off, n - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
            off += (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (wait_fd(s->fd, POLLOUT, timeout) <= 0) return push_err(L, "timeout");
            continue;
        }
        return push_err(L, k == 0 ? "closed" : strerror(errno));
    }
    lua_pushboolean(L, 1);
    return 1;
}

/* recv([max], [timeout]) → bytes | nil, "timeout" | "closed" | message */
static int l_recv(lua_State *L) {
    lsock *s = check_sock(L);
    lua_Integer max = luaL_optinteger(L, 2, 65536);
    double timeout = luaL_optnumber(L, 3, -1);
    if (max <= 0 || max > (1 << 26)) return luaL_error(L, "recv: max must be in [1, 2^26]");
    int w = wait_fd(s->fd, POLLIN, timeout);
    if (w == 0) return push_err(L, "timeout");
    if (w < 0) return push_err(L, strerror(errno));
    char stack[65536];
    char *buf = max <= (lua_Integer)sizeof stack ? stack : li_xmalloc((size_t)max);
    ssize_t k;
    do k = recv(s->fd, buf, (size_t)max, MSG_DONTWAIT);
    while (k < 0 && errno == EINTR);
    int ret;
    if (k > 0) {
        lua_pushlstring(L, buf, (size_t)k);
        ret = 1;
    } else if (k == 0) {
        ret = push_err(L, "closed");
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        ret = push_err(L, "timeout");
    } else {
        ret = push_err(L, strerror(errno));
    }
    if (buf != stack) free(buf);
    return ret;
}

static int l_close(lua_State *L) {
    lsock *s = luaL_checkudata(L, 1, SOCK_MT);
    if (s->fd >= 0) close(s->fd);
    s->fd = -1;
    return 0;
}

static int l_fileno(lua_State *L) {
    lua_pushinteger(L, check_sock(L)->fd);
    return 1;
}

/* ---- msgpack ---------------------------------------------------------------------- */

static void *null_key(void) {
    static char k;
    return &k;
}

static const char *table_kind(lua_State *L, int idx) {
    if (!lua_getmetatable(L, idx)) return NULL;
    lua_getfield(L, -1, KIND_FIELD);
    const char *k = lua_tostring(L, -1);
    lua_pop(L, 2); /* the string stays alive: it is interned in the metatable */
    return k;
}

/* pack and unpack raise (luaL_error, or Lua running out of memory) only
 * inside pack_protected / unpack_protected, which l_pack / l_unpack run
 * under lua_pcall: the msgpack buffer or zone is freed before the error is
 * passed on, whatever raised. */
static void pack_value(lua_State *L, msgpack_packer *pk, int idx, int depth) {
    if (depth > 64) luaL_error(L, "net.pack: nesting deeper than 64 (a cycle?)");
    luaL_checkstack(L, 3, "net.pack: nesting too deep");
    idx = idx < 0 ? lua_gettop(L) + idx + 1 : idx;
    switch (lua_type(L, idx)) {
    case LUA_TNIL: msgpack_pack_nil(pk); return;
    case LUA_TBOOLEAN:
        if (lua_toboolean(L, idx)) msgpack_pack_true(pk);
        else msgpack_pack_false(pk);
        return;
    case LUA_TNUMBER: {
        double v = lua_tonumber(L, idx);
        if (v == floor(v) && v >= -9.2e18 && v <= 1.8e19) {
            if (v >= 0) msgpack_pack_uint64(pk, (uint64_t)v);
            else msgpack_pack_int64(pk, (int64_t)v);
        } else {
            msgpack_pack_double(pk, v);
        }
        return;
    }
    case LUA_TSTRING: {
        size_t n;
        const char *s = lua_tolstring(L, idx, &n);
        li_mp_pack_strn(pk, s, n);
        return;
    }
    case LUA_TLIGHTUSERDATA:
        if (lua_touserdata(L, idx) == null_key()) {
            msgpack_pack_nil(pk);
            return;
        }
        break;
    case LUA_TTABLE: {
        const char *kind = table_kind(L, idx);
        size_t len = lua_objlen(L, idx), count = 0;
        lua_pushnil(L);
        while (lua_next(L, idx)) {
            count++;
            lua_pop(L, 1);
        }
        bool array = kind ? !strcmp(kind, "array") : (count > 0 && count == len);
        if (array) {
            msgpack_pack_array(pk, len);
            for (size_t i = 1; i <= len; i++) {
                lua_rawgeti(L, idx, (int)i);
                pack_value(L, pk, -1, depth + 1);
                lua_pop(L, 1);
            }
        } else {
            msgpack_pack_map(pk, count);
            lua_pushnil(L);
            while (lua_next(L, idx)) {
                pack_value(L, pk, -2, depth + 1);
                pack_value(L, pk, -1, depth + 1);
                lua_pop(L, 1);
            }
        }
        return;
    }
    default: break;
    }
    luaL_error(L, "net.pack: cannot pack a %s", luaL_typename(L, idx));
}

typedef struct pack_buf {
    msgpack_sbuffer sb;
    bool failed; /* a write could not grow the buffer */
} pack_buf;

static int pack_write(void *data, const char *buf, size_t len) {
    pack_buf *b = data;
    if (msgpack_sbuffer_write(&b->sb, buf, len) == 0) return 0;
    b->failed = true;
    return -1;
}

/* (value, pack_buf) → the packed bytes; may raise */
static int pack_protected(lua_State *L) {
    pack_buf *b = lua_touserdata(L, 2);
    lua_settop(L, 1);
    msgpack_packer pk;
    msgpack_packer_init(&pk, b, pack_write);
    pack_value(L, &pk, 1, 0);
    if (b->failed) luaL_error(L, "net.pack: out of memory");
    lua_pushlstring(L, b->sb.data ? b->sb.data : "", b->sb.size);
    return 1;
}

static int l_pack(lua_State *L) {
    luaL_checkany(L, 1);
    lua_settop(L, 1);
    pack_buf b = {.failed = false};
    msgpack_sbuffer_init(&b.sb);
    lua_pushvalue(L, lua_upvalueindex(1)); /* pack_protected */
    lua_pushvalue(L, 1);
    lua_pushlightuserdata(L, &b);
    int rc = lua_pcall(L, 2, 1, 0);
    msgpack_sbuffer_destroy(&b.sb);
    if (rc != 0) return lua_error(L); /* the message, as raised */
    return 1;
}

static void push_object(lua_State *L, const msgpack_object *o, int depth) {
    luaL_checkstack(L, 4, "net.unpack: nesting too deep");
    switch (o->type) {
    case MSGPACK_OBJECT_NIL: lua_pushnil(L); return;
    case MSGPACK_OBJECT_BOOLEAN: lua_pushboolean(L, o->via.boolean); return;
    case MSGPACK_OBJECT_POSITIVE_INTEGER: lua_pushnumber(L, (lua_Number)o->via.u64); return;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: lua_pushnumber(L, (lua_Number)o->via.i64); return;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: lua_pushnumber(L, o->via.f64); return;
    case MSGPACK_OBJECT_STR:
    case MSGPACK_OBJECT_BIN: {
        const char *p;
        size_t n;
        li_mp_read_str(o, true, &p, &n); /* never NULL, even for "" */
        lua_pushlstring(L, p, n);
        return;
    }
    case MSGPACK_OBJECT_ARRAY:
        lua_createtable(L, (int)o->via.array.size, 0);
        for (uint32_t i = 0; i < o->via.array.size; i++) {
            push_object(L, &o->via.array.ptr[i], depth + 1);
            lua_rawseti(L, -2, (int)i + 1);
        }
        return;
    case MSGPACK_OBJECT_MAP:
        lua_createtable(L, 0, (int)o->via.map.size);
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            push_object(L, &o->via.map.ptr[i].key, depth + 1);
            if (lua_isnil(L, -1)) {
                lua_pop(L, 1);
                continue;
            }
            push_object(L, &o->via.map.ptr[i].val, depth + 1);
            lua_rawset(L, -3);
        }
        return;
    default: lua_pushnil(L); return;
    }
}

/* (msgpack_object) → its Lua value; may raise */
static int unpack_protected(lua_State *L) {
    push_object(L, lua_touserdata(L, 1), 0);
    return 1;
}

/* unpack(s, [pos]) → value, next_pos | nil, nil (incomplete); malformed raises */
static int l_unpack(lua_State *L) {
    size_t n;
    const char *s = luaL_checklstring(L, 1, &n);
    lua_Integer pos = luaL_optinteger(L, 2, 1);
    if (pos < 1 || (size_t)pos > n + 1) return luaL_error(L, "net.unpack: position out of range");
    size_t off = (size_t)pos - 1, start = off;
    if (off == n) {
        lua_pushnil(L);
        lua_pushnil(L);
        return 2;
    }
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    msgpack_unpack_return rc = msgpack_unpack_next(&u, s, n, &off);
    if (rc == MSGPACK_UNPACK_CONTINUE) {
        msgpack_unpacked_destroy(&u);
        lua_pushnil(L);
        lua_pushnil(L);
        return 2;
    }
    if (rc != MSGPACK_UNPACK_SUCCESS) {
        msgpack_unpacked_destroy(&u);
        return luaL_error(L, "net.unpack: malformed msgpack at byte %d", (int)start + 1);
    }
    lua_pushvalue(L, lua_upvalueindex(1)); /* unpack_protected */
    lua_pushlightuserdata(L, &u.data);
    int prc = lua_pcall(L, 1, 1, 0);
    msgpack_unpacked_destroy(&u);
    if (prc != 0) return lua_error(L);
    lua_pushinteger(L, (lua_Integer)off + 1);
    return 2;
}

static int mark(lua_State *L, const char *kind) {
    if (lua_isnoneornil(L, 1)) lua_newtable(L);
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_settop(L, 1);
    lua_getfield(L, LUA_REGISTRYINDEX, kind[0] == 'a' ? "luainfer.net.array_mt" : "luainfer.net.map_mt");
    lua_setmetatable(L, 1);
    return 1;
}

static int l_array(lua_State *L) { return mark(L, "array"); }
static int l_map(lua_State *L) { return mark(L, "map"); }

/* The module table (the standard luaopen_ name, so that a binary built with
 * exported symbols can also load it with package.loadlib("", ...)). */
int luaopen_luainfer_net(lua_State *L) {
    if (luaL_newmetatable(L, SOCK_MT)) {
        static const luaL_Reg m[] = {{"send", l_send}, {"recv", l_recv}, {"close", l_close}, {"fileno", l_fileno}, {NULL, NULL}};
        lua_newtable(L);
        luaL_register(L, NULL, m);
        lua_setfield(L, -2, "__index");
        lua_pushcfunction(L, l_close);
        lua_setfield(L, -2, "__gc");
    }
    lua_pop(L, 1);
    for (int i = 0; i < 2; i++) {
        lua_newtable(L);
        lua_pushstring(L, i == 0 ? "array" : "map");
        lua_setfield(L, -2, KIND_FIELD);
        lua_setfield(L, LUA_REGISTRYINDEX, i == 0 ? "luainfer.net.array_mt" : "luainfer.net.map_mt");
    }
    static const luaL_Reg f[] = {{"connect", l_connect}, {"array", l_array}, {"map", l_map}, {NULL, NULL}};
    lua_newtable(L);
    luaL_register(L, NULL, f);
    /* pack / unpack keep their protected halves as upvalues (no closure per call) */
    lua_pushcfunction(L, pack_protected);
    lua_pushcclosure(L, l_pack, 1);
    lua_setfield(L, -2, "pack");
    lua_pushcfunction(L, unpack_protected);
    lua_pushcclosure(L, l_unpack, 1);
    lua_setfield(L, -2, "unpack");
    lua_pushlightuserdata(L, null_key());
    lua_setfield(L, -2, "null");
    return 1;
}

void li_lua_preload_net(lua_State *L) { li_lua_preload(L, "luainfer.net", luaopen_luainfer_net); }
