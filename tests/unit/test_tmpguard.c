/* test_tmpguard.c — util/tmpguard.h: a registered temporary file is
 * removed when SIGINT or SIGTERM ends the process, and the process still
 * dies by that signal; a released one is left alone; a program's own
 * handler is not replaced. Each case runs in a forked child. */
#define _POSIX_C_SOURCE 200809L
#include "util/tmpguard.h"
#include "test_util.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[] = "/tmp/li_tmpguard_XXXXXX";

static void touch(const char *p) {
    FILE *f = fopen(p, "wb");
    if (f) fclose(f);
}

static bool exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

static void own_handler(int sig) {
    (void)sig;
    _exit(3);
}

enum { REMOVED, RELEASED, OWN_HANDLER, TWO_FILES };

/* The child's status after running case c on files a and b. */
static int child(int c, int sig, const char *a, const char *b) {
    pid_t pid = fork();
    if (pid == 0) {
        touch(a);
        touch(b);
        if (c == OWN_HANDLER) signal(sig, own_handler);
        const int s1 = li_tmpguard_add(a);
        const int s2 = c == TWO_FILES ? li_tmpguard_add(b) : -1;
        if (s1 < 0 || (c == TWO_FILES && s2 < 0)) _exit(9);
        if (c == RELEASED) li_tmpguard_release(s1);
        raise(sig);
        _exit(0); /* not reached when the signal ends the process */
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return st;
}

int main(void) {
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    char a[256], b[256];
    snprintf(a, sizeof a, "%s/a.tmp", dir);
    snprintf(b, sizeof b, "%s/b.tmp", dir);
    const int sigs[2] = {SIGINT, SIGTERM};
    for (int i = 0; i < 2; i++) {
        const int sig = sigs[i];
        int st = child(REMOVED, sig, a, b);
        CHECK(WIFSIGNALED(st) && WTERMSIG(st) == sig && !exists(a) && exists(b),
              "signal %d: the registered file is removed and the process dies by the signal (status %d)", sig, st);
        unlink(b);
        st = child(RELEASED, sig, a, b);
        CHECK(WIFSIGNALED(st) && WTERMSIG(st) == sig && exists(a), "signal %d: a released file stays (status %d)", sig,
              st);
        unlink(a), unlink(b);
        st = child(OWN_HANDLER, sig, a, b);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 3 && exists(a),
              "signal %d: the program's own handler runs, the file stays (status %d)", sig, st);
        unlink(a), unlink(b);
        st = child(TWO_FILES, sig, a, b);
        CHECK(WIFSIGNALED(st) && !exists(a) && !exists(b), "signal %d: both registered files removed", sig);
    }
    /* in this process: slots run out at LI_TMPGUARD_SLOTS, release frees one */
    int s[LI_TMPGUARD_SLOTS];
    for (int i = 0; i < LI_TMPGUARD_SLOTS; i++) s[i] = li_tmpguard_add(a);
    CHECK(s[LI_TMPGUARD_SLOTS - 1] >= 0 && li_tmpguard_add(a) == -1, "slots run out at %d", LI_TMPGUARD_SLOTS);
    li_tmpguard_release(s[0]);
    const int again = li_tmpguard_add(a);
    CHECK(again >= 0, "a released slot is reused");
    li_tmpguard_release(again);
    for (int i = 1; i < LI_TMPGUARD_SLOTS; i++) li_tmpguard_release(s[i]);
    li_tmpguard_release(-1); /* no-op */
    struct sigaction sa;
    sigaction(SIGTERM, NULL, &sa);
    CHECK(sa.sa_handler == SIG_DFL, "the last release gives SIGTERM back");
    char longp[5000];
    memset(longp, 'x', sizeof longp - 1);
    longp[sizeof longp - 1] = 0;
    CHECK(li_tmpguard_add(longp) == -1, "a path too long is refused");
    rmdir(dir);
    return t_summary("test_tmpguard");
}
