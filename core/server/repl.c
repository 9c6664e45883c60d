/* repl.c — `luainfer repl [POLICY.lua] [--model M] [--connect HOST:PORT]`:
 * a LuaJIT prompt with a live engine bound as `engine` (or a server
 * connection bound as `server`), line editing and history (libedit), tab
 * completion of globals, the luainfer API and engine/server methods,
 * pretty-printed results and help().
 *
 * An input line is tried as an expression first ("return <line>"), then as
 * a statement; a chunk that ends early ("<eof>") continues on the next
 * line with the ">> " prompt. When stdin is not a terminal, lines are read
 * plainly (no editing), so `luainfer repl < script.lua` works too.
 *
 * Ctrl-C: while a chunk runs, it is interrupted ("interrupted" is raised
 * in it, as lua.c does: the SIGINT handler arms a count hook) and the
 * prompt comes back; a second Ctrl-C before the chunk notices the first
 * (stuck in one long C call) quits. At the prompt, Ctrl-C drops the line
 * and any unfinished multi-line chunk. Ctrl-D (EOF) quits. The REPL's Lua
 * state runs with the JIT off: LuaJIT runs no hooks inside compiled traces,
 * so a compiled `while true do end` could not be interrupted otherwise
 * (jit.on() gives speed back, and takes that guarantee away).
 *
 * The Lua half (pretty printer, help, completion, eval) is the REPL_LUA
 * string below; it needs nothing from C but `__repl_opts`. */
#define _GNU_SOURCE
#include "server/repl.h"
#include "server/lua_client.h"
#include "server/server.h"
#include "runtime/args.h"
#include "runtime/runtime.h"
#include "lua/lua_engine.h"
#include "lua/lua_env.h"

#include <editline/readline.h>
#include <errno.h>
#include <lauxlib.h>
#include <lua.h>
#include <luajit.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char REPL_LUA[] =
    "local opts = __repl_opts\n"
    "__repl_opts = nil\n"
    "local R = {}\n"
    "local luainfer = require('luainfer')\n"
    "_G.luainfer = luainfer\n"
    "-- pretty printer ---------------------------------------------------------\n"
    "local function is_ident(k) return type(k) == 'string' and k:match('^[%a_][%w_]*$') end\n"
    "local function fmt(v, indent, seen, depth)\n"
    "  local t = type(v)\n"
    "  if t == 'string' then return string.format('%q', v):gsub('\\\\\\n', '\\\\n') end\n"
    "  if t == 'number' then\n"
    "    if v == math.floor(v) and math.abs(v) < 1e15 then return string.format('%d', v) end\n"
    "    return string.format('%.6g', v)\n"
    "  end\n"
    "  if t ~= 'table' then return tostring(v) end\n"
    "  if seen[v] then return '<cycle>' end\n"
    "  if depth > 5 then return '{...}' end\n"
    "  seen[v] = true\n"
    "  local n, keys = #v, {}\n"
    "  for k in pairs(v) do\n"
    "    if not (type(k) == 'number' and k >= 1 and k <= n and k == math.floor(k)) then keys[#keys + 1] = k end\n"
    "  end\n"
    "  table.sort(keys, function(a, b)\n"
    "    if type(a) == type(b) and (type(a) == 'string' or type(a) == 'number') then return a < b end\n"
    "    return type(a) < type(b) end)\n"
    "  local simple = #keys == 0\n"
    "  for i = 1, n do if type(v[i]) == 'table' then simple = false end end\n"
    "  if simple and n <= 32 then\n"
    "    local parts = {}\n"
    "    for i = 1, n do parts[i] = fmt(v[i], indent, seen, depth + 1) end\n"
    "    seen[v] = nil\n"
    "    local s = '{' .. table.concat(parts, ', ') .. '}'\n"
    "    if #s <= 100 then return s end\n"
    "  end\n"
    "  local pad = string.rep('  ', indent + 1)\n"
    "  local lines = {}\n"
    "  local shown = math.min(n, 64)\n"
    "  for i = 1, shown do lines[#lines + 1] = pad .. fmt(v[i], indent + 1, seen, depth + 1) end\n"
    "  if n > shown then lines[#lines + 1] = pad .. '... (' .. (n - shown) .. ' more)' end\n"
    "  for _, k in ipairs(keys) do\n"
    "    local ks = is_ident(k) and k or '[' .. fmt(k, indent + 1, seen, depth + 1) .. ']'\n"
    "    lines[#lines + 1] = pad .. ks .. ' = ' .. fmt(v[k], indent + 1, seen, depth + 1)\n"
    "  end\n"
    "  seen[v] = nil\n"
    "  if #lines == 0 then return '{}' end\n"
    "  return '{\\n' .. table.concat(lines, ',\\n') .. '\\n' .. string.rep('  ', indent) .. '}'\n"
    "end\n"
    "function pp(...)\n"
    "  local n = select('#', ...)\n"
    "  local out = {}\n"
    "  for i = 1, n do out[i] = fmt((select(i, ...)), 0, {}, 0) end\n"
    "  print(table.concat(out, '\\t'))\n"
    "end\n"
    "-- the session object --------------------------------------------------------\n"
    "local HELP = {\n"
    "  engine = {\n"
    "    {'engine:info()', 'model, architecture, KV and batch settings, policy'},\n"
    "    {'engine:add{prompt=, max_tokens=, temperature=, ...}', 'queue a request, returns its id'},\n"
    "    {'engine:step()', 'one engine step; true while work remains'},\n"
    "    {'engine:run()', 'step until every request finished'},\n"
    "    {'engine:result(id)', 'text, tokens, finish_reason, ttft, latency (+ logprobs if added with logprobs=k)'},\n"
    "    {'engine:release(id)', 'forget a finished request'},\n"
    "    {'engine:cancel(id)', 'cancel a request (its KV blocks are freed)'},\n"
    "    {'engine:stats()', 'steps, tokens, preemptions, KV blocks, policy errors'},\n"
    "    {'engine:tokenize(text)', 'token ids'},\n"
    "    {'engine:detokenize(ids)', 'text'},\n"
    "    {'engine:set_policy(path)', 'swap the scheduling policy (nil: built-in FCFS)'},\n"
    "    {'engine:reload_policy{path= | source=}', 'hot-reload; the old policy stays on error'},\n"
    "  },\n"
    "  server = {\n"
    "    {'server:generate{prompt=, max_tokens=, on_delta=function(d) ... end}', 'generate (streams with on_delta)'},\n"
    "    {'server:tokenize(text)', 'token ids'},\n"
    "    {'server:detokenize(ids)', 'text'},\n"
    "    {'server:stats()', 'queues, KV usage, preemptions, policy errors, throughput'},\n"
    "    {'server:health()', 'status'},\n"
    "    {'server:models()', 'the served model'},\n"
    "    {'server:methods()', 'every RPC method with its doc'},\n"
    "    {'server:reload_policy{path=, admin_token=}', 'hot-reload the server policy'},\n"
    "    {'server:call(method, params)', 'any RPC method'},\n"
    "  },\n"
    "}\n"
    "function help()\n"
    "  print('luainfer repl: Lua with a live ' .. (engine and 'engine' or 'server connection') .. '.')\n"
    "  print('  generate(prompt, opts)   generate text (greedy, 64 tokens unless opts say otherwise)')\n"
    "  print('  chat(message, opts)      generate with the model\\'s chat template')\n"
    "  print('  pp(...)                  pretty-print values (results are printed this way)')\n"
    "  print('  help()                   this text;  Tab completes names;  Ctrl-C interrupts;  Ctrl-D quits')\n"
    "  for _, h in ipairs(engine and HELP.engine or HELP.server) do print(string.format('  %-48s %s', h[1], h[2])) end\n"
    "  print('  luainfer.chat.format(template, messages, opts), luainfer.generate(engine, prompt, opts)')\n"
    "end\n"
    "local function merged(opts, extra)\n"
    "  local t = { max_tokens = 64, temperature = 0 }\n"
    "  for k, v in pairs(opts or {}) do t[k] = v end\n"
    "  for k, v in pairs(extra or {}) do t[k] = v end\n"
    "  return t\n"
    "end\n"
    "function generate(prompt, opts)\n"
    "  if engine then\n"
    "    local text, r = luainfer.generate(engine, prompt, merged(opts))\n"
    "    return text, r\n"
    "  end\n"
    "  local r, e = server:generate(merged(opts, { prompt = prompt,\n"
    "    on_delta = function(d) io.write(d.text); io.flush() end }))\n"
    "  io.write('\\n')\n"
    "  if not r then error(tostring(e), 0) end\n"
    "  return r\n"
    "end\n"
    "function chat(message, opts)\n"
    "  if engine then\n"
    "    local text = luainfer.chat.format(nil, {{ role = 'user', content = message }}, { add_generation_prompt = true })\n"
    "    return generate(text, opts)\n"
    "  end\n"
    "  local r, e = server:generate(merged(opts, { messages = {{ role = 'user', content = message }},\n"
    "    on_delta = function(d) io.write(d.text); io.flush() end }))\n"
    "  io.write('\\n')\n"
    "  if not r then error(tostring(e), 0) end\n"
    "  return r\n"
    "end\n"
    "-- completion ---------------------------------------------------------------------\n"
    "local KEYWORDS = {'and','break','do','else','elseif','end','false','for','function','if','in','local',\n"
    "  'nil','not','or','repeat','return','then','true','until','while'}\n"
    "local function fields(v, out)\n"
    "  local seen = {}\n"
    "  local function add(t)\n"
    "    if type(t) ~= 'table' or seen[t] then return end\n"
    "    seen[t] = true\n"
    "    for k in pairs(t) do if type(k) == 'string' then out[k] = true end end\n"
    "    local mt = getmetatable(t)\n"
    "    if type(mt) == 'table' and type(mt.__index) == 'table' then add(mt.__index) end\n"
    "  end\n"
    "  if type(v) == 'table' then add(v)\n"
    "  elseif type(v) == 'userdata' or type(v) == 'string' then\n"
    "    local mt = getmetatable(v)\n"
    "    if type(mt) == 'table' and type(mt.__index) == 'table' then add(mt.__index) end\n"
    "  end\n"
    "end\n"
    "function R.complete(word)\n"
    "  local head, sep, tail = word:match('^(.*)([%.:])([%w_]*)$')\n"
    "  local names = {}\n"
    "  if not head then\n"
    "    tail, head, sep = word, '', ''\n"
    "    fields(_G, names)\n"
    "    for _, k in ipairs(KEYWORDS) do names[k] = true end\n"
    "  else\n"
    "    if not head:match('^[%a_][%w_%.]*$') then return {} end\n"
    "    local v = _G\n"
    "    for part in head:gmatch('[^%.]+') do\n"
    "      if type(v) ~= 'table' then return {} end\n"
    "      local ok, nv = pcall(function() return v[part] end)\n"
    "      if not ok then return {} end\n"
    "      v = nv\n"
    "    end\n"
    "    fields(v, names)\n"
    "  end\n"
    "  local out = {}\n"
    "  for k in pairs(names) do\n"
    "    if k:sub(1, #tail) == tail and k:match('^[%a_][%w_]*$') and not (sep == ':' and k:sub(1, 2) == '__') then\n"
    "      out[#out + 1] = head .. sep .. k\n"
    "    end\n"
    "  end\n"
    "  table.sort(out)\n"
    "  return out\n"
    "end\n"
    "-- eval ---------------------------------------------------------------------------------\n"
    "local function report(ok, ...)\n"
    "  if not ok then print((...)); return end\n"
    "  if select('#', ...) > 0 then pp(...) end\n"
    "end\n"
    "local function traceback(e)\n"
    "  if type(e) ~= 'string' then e = tostring(e) end\n"
    "  local out = {}\n"
    "  for l in (debug.traceback(e, 2) .. '\\n'):gmatch('(.-)\\n') do\n"
    "    if l:find('[C]: in function \\'xpcall\\'', 1, true) then break end\n"
    "    if not l:find('[builtin#', 1, true) then out[#out + 1] = l end\n"
    "  end\n"
    "  if #out == 2 then out[2] = nil end -- only the header: no frames worth showing\n"
    "  return table.concat(out, '\\n')\n"
    "end\n"
    "-- returns 'incomplete' when the chunk continues on the next line\n"
    "function R.eval(src)\n"
    "  local f, err1 = loadstring('return ' .. src, '=stdin')\n"
    "  local err\n"
    "  if not f then f, err = loadstring(src, '=stdin') end\n"
    "  if not f then\n"
    "    local function at_end(e) return e:find(\"near '<eof>'$\") ~= nil end\n"
    "    if at_end(err) or at_end(err1) then return 'incomplete' end\n"
    "    print(err)\n"
    "    return 'error'\n"
    "  end\n"
    "  report(xpcall(f, traceback))\n"
    "  return 'ok'\n"
    "end\n"
    "-- the live object ------------------------------------------------------------------------\n"
    "if opts.connect then\n"
    "  local client = require('luainfer.client')\n"
    "  local c, e = client.connect(opts.connect, { auth_token = opts.auth_token })\n"
    "  if not c then error('cannot connect to ' .. opts.connect .. ': ' .. tostring(e), 0) end\n"
    "  server = c\n"
    "  _G.client = client\n"
    "  local h = c:health()\n"
    "  local m = c:models()\n"
    "  print(('connected to %s: %s (%s); help() lists what you can do'):format(opts.connect,\n"
    "    m and m[1] and m[1].id or '?', h and h.status or '?'))\n"
    "else\n"
    "  engine = luainfer.engine{ model = opts.model, policy = opts.policy, threads = opts.threads,\n"
    "    kv_memory = opts.kv_memory, max_num_seqs = opts.max_num_seqs }\n"
    "  local i = engine:info()\n"
    "  print(('luainfer repl: %s (%s, %d layers), policy %s; help() lists what you can do'):format(\n"
    "    i.model:match('[^/]*$'), i.architecture, i.n_layer, i.policy))\n"
    "end\n"
    "return R\n";

static lua_State *G_L;
static int G_repl_ref = LUA_NOREF;

/* ---- completion ---------------------------------------------------------------- */

static char **G_matches;
static int G_n_matches, G_next_match;

static void free_matches(void) {
    for (int i = G_next_match; i < G_n_matches; i++) free(G_matches[i]);
    free(G_matches);
    G_matches = NULL;
    G_n_matches = G_next_match = 0;
}

static char *match_generator(const char *text, int state) {
    if (state == 0) {
        free_matches();
        lua_State *L = G_L;
        lua_rawgeti(L, LUA_REGISTRYINDEX, G_repl_ref);
        lua_getfield(L, -1, "complete");
        lua_pushstring(L, text);
        if (lua_pcall(L, 1, 1, 0) == 0 && lua_istable(L, -1)) {
            int n = (int)lua_objlen(L, -1);
            G_matches = li_xcalloc((size_t)n + 1, sizeof *G_matches);
            for (int i = 1; i <= n; i++) {
                lua_rawgeti(L, -1, i);
                const char *s = lua_tostring(L, -1);
                if (s) G_matches[G_n_matches++] = strdup(s);
                lua_pop(L, 1);
            }
        }
        lua_settop(L, 0);
    }
    if (G_next_match < G_n_matches) return G_matches[G_next_match++]; /* readline frees it */
    return NULL;
}

static char **complete(const char *text, int start, int end) {
    (void)start, (void)end;
    rl_attempted_completion_over = 1; /* no filename completion */
    return rl_completion_matches(text, match_generator);
}

/* ---- Ctrl-C ------------------------------------------------------------------------------ */

static volatile sig_atomic_t G_sigint;  /* a Ctrl-C nobody has acted on yet */
static volatile sig_atomic_t G_running; /* a chunk is being evaluated (G_L is in use) */
static bool G_line_cancelled;           /* the line just read was cut short by Ctrl-C */

/* Runs in the chunk, at the next call, return or instruction after a Ctrl-C:
 * one shot, as in lua.c (a pcall in the chunk may catch it). */
static void interrupt_hook(lua_State *L, lua_Debug *ar) {
    (void)ar;
    lua_sethook(L, NULL, 0, 0);
    G_sigint = 0;
    luaL_error(L, "interrupted");
}

/* Only async-signal-safe work: flags, and lua_sethook, which LuaJIT's
 * lj_dispatch.c marks as callable asynchronously, e.g. from a signal
 * handler (lua.c and luajit.c arm their Ctrl-C hook the same way). */
static void on_sigint(int sig) {
    if (G_running) {
        if (G_sigint) { /* the first one was not noticed: stuck in C, quit */
            signal(sig, SIG_DFL);
            raise(sig);
            return;
        }
        lua_sethook(G_L, interrupt_hook, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
    }
    G_sigint = 1;
}

/* libedit's character source: read() without SA_RESTART returns EINTR on
 * Ctrl-C; the line is then ended ("\n") and marked cancelled. */
static int getc_interruptible(FILE *f) {
    for (;;) {
        if (G_sigint) {
            G_sigint = 0;
            G_line_cancelled = true;
            return '\n';
        }
        unsigned char c;
        ssize_t n = read(fileno(f), &c, 1);
        if (n == 1) return c;
        if (n < 0 && errno == EINTR) continue;
        return EOF;
    }
}

/* ---- the loop ------------------------------------------------------------------------- */

static char *read_plain(const char *prompt, bool echo_prompt) {
    if (echo_prompt) {
        fputs(prompt, stdout);
        fflush(stdout);
    }
    size_t cap = 0;
    char *line = NULL;
    ssize_t n;
    while ((n = getline(&line, &cap, stdin)) < 0 && ferror(stdin) && errno == EINTR) {
        clearerr(stdin); /* Ctrl-C (what getline had read of the line is gone) */
        if (G_sigint) {
            G_sigint = 0;
            G_line_cancelled = true;
            n = 0;
            break;
        }
    }
    if (n < 0) {
        free(line);
        return NULL;
    }
    if (!line) line = li_xcalloc(1, 1);
    if (n > 0 && line[n - 1] == '\n') line[n - 1] = 0;
    if (G_line_cancelled) line[0] = 0;
    return line;
}

static const char *history_path(void) {
    static char path[4096];
    const char *env = getenv("LUAINFER_HISTORY");
    if (env) return *env ? env : NULL;
    const char *home = getenv("HOME");
    if (!home || !*home) return NULL;
    snprintf(path, sizeof path, "%s/.luainfer_history", home);
    return path;
}

int li_cmd_repl(int argc, char **argv) {
    const char *model = NULL, *connect = NULL, *auth = NULL, *kv_memory = NULL;
    int64_t threads = 0, max_num_seqs = 0;
    bool help = false;
    li_opt opts[] = {
        {"model", LI_OPT_STR, &model, "GGUF model (default: $LUAINFER_MODEL or the bundled SmolLM2)"},
        {"connect", LI_OPT_STR, &connect, "bind `server` to a luainfer server (HOST:PORT or unix:PATH) instead"},
        {"api-key", LI_OPT_STR, &auth, "the key of a server started with --api-key (default: $LUAINFER_API_KEY)"},
        {"auth-token", LI_OPT_STR, &auth, "the older name of --api-key"},
        {"threads", LI_OPT_INT, &threads, "compute threads (default: all cores)"},
        {"max-num-seqs", LI_OPT_INT, &max_num_seqs, "requests per engine step (default 64)"},
        {"kv-memory", LI_OPT_STR, &kv_memory, "KV cache budget in bytes (default 256 MiB)"},
        {"help", LI_OPT_FLAG, &help, "show this help"},
    };
    const int n_opts = (int)LI_ARRAY_LEN(opts);
    li_error err = {0};
    const char *pos[1] = {NULL};
    int n_pos;
    if (li_args_parse(opts, n_opts, argc, argv, pos, 1, &n_pos, &err)) return li_runtime_fail(&err);
    if (help) {
        li_args_usage("repl", "[POLICY.lua] [options]", opts, n_opts);
        printf("\nA LuaJIT prompt with a live engine bound as `engine` (or `server` with --connect).\n"
               "The policy defaults to policies/default.lua, as for serve.\n"
               "Type help() inside. History: $LUAINFER_HISTORY, else ~/.luainfer_history.\n");
        return 0;
    }
    if (!auth) { /* as serve's --api-key: the same variable on both sides */
        const char *env = getenv("LUAINFER_API_KEY");
        if (env && *env) auth = env;
    }
    lua_State *L = li_lua_new(&err);
    if (!L) return li_runtime_fail(&err);
    li_lua_preload_core(L);
    li_lua_preload_net(L);
    lua_createtable(L, 0, 8);
    if (model) lua_pushstring(L, model), lua_setfield(L, -2, "model");
    const char *policy = pos[0] ? pos[0] : li_server_default_policy();
    if (policy) lua_pushstring(L, policy), lua_setfield(L, -2, "policy");
    if (connect) lua_pushstring(L, connect), lua_setfield(L, -2, "connect");
    if (auth) lua_pushstring(L, auth), lua_setfield(L, -2, "auth_token");
    if (threads > 0) lua_pushnumber(L, (lua_Number)threads), lua_setfield(L, -2, "threads");
    if (max_num_seqs > 0) lua_pushnumber(L, (lua_Number)max_num_seqs), lua_setfield(L, -2, "max_num_seqs");
    if (kv_memory) {
        size_t bytes;
        if (li_parse_bytes("--kv-memory", kv_memory, &bytes, &err)) {
            lua_close(L);
            return li_runtime_fail(&err);
        }
        lua_pushnumber(L, (lua_Number)bytes);
        lua_setfield(L, -2, "kv_memory");
    }
    lua_setglobal(L, "__repl_opts");
    if (luaL_loadbuffer(L, REPL_LUA, sizeof REPL_LUA - 1, "=repl") != 0 || li_lua_pcall(L, 0, 1, &err) != 0) {
        if (!err.msg[0]) li_error_set(&err, LI_EINVAL, "%s", lua_tostring(L, -1));
        lua_close(L);
        return li_runtime_fail(&err);
    }
    G_repl_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    G_L = L;

    /* See the top of the file: hooks do not run in compiled traces. */
    luaJIT_setmode(L, 0, LUAJIT_MODE_ENGINE | LUAJIT_MODE_OFF);
    struct sigaction sa = {.sa_handler = on_sigint}, old_sa; /* no SA_RESTART: reads return EINTR */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_sa);

    bool tty = isatty(STDIN_FILENO);
    const char *hist = history_path();
    if (tty) {
        rl_readline_name = "luainfer";
        rl_getc_function = getc_interruptible;
        rl_attempted_completion_function = complete;
        rl_completer_word_break_characters = (char *)" \t\n\"'`<>=;,+-*/%^~#()[]{}|&";
        rl_completion_append_character = '\0';
        using_history();
        if (hist) read_history(hist);
    }
    char *chunk = NULL;
    size_t chunk_len = 0;
    for (;;) {
        const char *prompt = chunk ? ">> " : "> ";
        G_sigint = 0; /* a Ctrl-C that came after the last chunk ended */
        G_line_cancelled = false;
        char *line = tty ? readline(prompt) : read_plain(prompt, false);
        if (!line) break;
        if (G_line_cancelled) { /* Ctrl-C at the prompt: drop the line and any unfinished chunk */
            free(line);
            free(chunk);
            chunk = NULL;
            chunk_len = 0;
            continue;
        }
        if (tty && *line) add_history(line);
        size_t n = strlen(line);
        chunk = li_xrealloc(chunk, chunk_len + n + 2);
        if (chunk_len) chunk[chunk_len++] = '\n';
        memcpy(chunk + chunk_len, line, n + 1);
        chunk_len += n;
        free(line);
        if (chunk_len == 0 || strspn(chunk, " \t") == chunk_len) {
            free(chunk);
            chunk = NULL;
            chunk_len = 0;
            continue;
        }
        lua_rawgeti(L, LUA_REGISTRYINDEX, G_repl_ref);
        lua_getfield(L, -1, "eval");
        lua_pushlstring(L, chunk, chunk_len);
        const char *status = "error";
        G_sigint = 0;
        G_running = 1;
        int rc = lua_pcall(L, 1, 1, 0);
        G_running = 0;
        lua_sethook(L, NULL, 0, 0); /* a Ctrl-C at the very end may have armed it */
        G_sigint = 0;
        if (rc == 0) status = lua_tostring(L, -1);
        else printf("%s\n", lua_tostring(L, -1));
        bool more = status && !strcmp(status, "incomplete");
        lua_settop(L, 0);
        fflush(stdout);
        if (!more) {
            free(chunk);
            chunk = NULL;
            chunk_len = 0;
        }
    }
    free(chunk);
    sigaction(SIGINT, &old_sa, NULL);
    if (tty) {
        printf("\n");
        if (hist) write_history(hist);
    }
    free_matches();
    luaL_unref(L, LUA_REGISTRYINDEX, G_repl_ref);
    lua_close(L);
    G_L = NULL;
    return 0;
}
