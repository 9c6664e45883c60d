/* tmpguard.h — temporary output files that SIGINT or SIGTERM removes.
 *
 * A writer that builds its output under a temporary name and renames it
 * registers the name for as long as the file exists: if the process is
 * ended by SIGINT or SIGTERM meanwhile, the handler unlinks every
 * registered name and ends the process as the signal would. Only signals
 * whose disposition is the default are taken: a program with its own
 * handler (distill's checkpoint on Ctrl-C, the server's event loop) keeps
 * it. Not thread-safe: register and release from one thread. */
#ifndef LI_TMPGUARD_H
#define LI_TMPGUARD_H

#define LI_TMPGUARD_SLOTS 4

/* A slot (>= 0) for path, or -1 when every slot is taken or the path is too
 * long (then the file is simply not removed on a signal). */
int li_tmpguard_add(const char *path);
/* Forgets the slot (renamed or removed by the caller); -1 is a no-op. */
void li_tmpguard_release(int slot);

#endif
