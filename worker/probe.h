/* worker/probe.h — `hp-worker --probe-profile` (worker/probe.c): this machine's cpu device
 * profile for the cost model, measured and cached (hp/autoshard.h). */
#ifndef HP_WORKER_PROBE_H
#define HP_WORKER_PROBE_H

#include <stdbool.h>

/* Measures with `threads` compute threads (<= 0: the default), caches, prints the figures
 * unless quiet. Returns the exit code: 0, or 1 with the reason on stderr. */
int hp__probe_profile(int threads, bool quiet);

#endif
