/* tmpguard.c — see tmpguard.h. The handler reads only fixed static
 * buffers and calls only async-signal-safe functions (unlink, signal,
 * raise). */
#define _POSIX_C_SOURCE 200809L /* sigaction */
#include "util/tmpguard.h"

#include <signal.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#define PATH_CAP 4096

static char g_path[LI_TMPGUARD_SLOTS][PATH_CAP];
static volatile sig_atomic_t g_used[LI_TMPGUARD_SLOTS];
static int g_n; /* slots in use */
static bool g_int, g_term; /* which signals this module took */

static void on_signal(int sig) {
    for (int i = 0; i < LI_TMPGUARD_SLOTS; i++)
        if (g_used[i]) unlink(g_path[i]);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Takes sig if nobody else handles it; true when taken. */
static bool take(int sig) {
    struct sigaction old, sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    if (sigaction(sig, NULL, &old) != 0 || old.sa_handler != SIG_DFL || (old.sa_flags & SA_SIGINFO)) return false;
    return sigaction(sig, &sa, NULL) == 0;
}

int li_tmpguard_add(const char *path) {
    const size_t n = strlen(path);
    if (n >= PATH_CAP) return -1;
    for (int i = 0; i < LI_TMPGUARD_SLOTS; i++) {
        if (g_used[i]) continue;
        memcpy(g_path[i], path, n + 1);
        g_used[i] = 1;
        if (g_n++ == 0) {
            g_int = take(SIGINT);
            g_term = take(SIGTERM);
        }
        return i;
    }
    return -1;
}

void li_tmpguard_release(int slot) {
    if (slot < 0 || slot >= LI_TMPGUARD_SLOTS || !g_used[slot]) return;
    g_used[slot] = 0;
    if (--g_n == 0) { /* give the signals back */
        if (g_int) signal(SIGINT, SIG_DFL);
        if (g_term) signal(SIGTERM, SIG_DFL);
        g_int = g_term = false;
    }
}
