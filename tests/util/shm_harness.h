/* tests/util/shm_harness.h — forked ranks for the shm communicator's tests
 * (tests/worker/test_comm_shm*.c): a rank is a child process that runs its part and sends one
 * fixed-size record (ok, status, a hash of what must agree across ranks, a timestamp, a
 * message) back through a pipe, then _exits; the test asserts on the records. Also the
 * deterministic inputs, the plain rank-order reference for reductions, and one rank's checked
 * call of each collective against it. Segment names are "t<pid>-<n>", so a test can check
 * that nothing of its own is left in /dev/shm.
 */
#ifndef HP_TEST_SHM_HARNESS_H
#define HP_TEST_SHM_HARNESS_H

#include "hp/comm.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#define HP_SH_MAX_WORLD 4

typedef struct hp_sh_out {
    int32_t ok;     /* the child's checks passed */
    int32_t status; /* hp_status of the call under test */
    uint64_t hash;  /* of outputs every rank must share */
    int64_t t_ns;   /* CLOCK_MONOTONIC of the event under test */
    char msg[1024];
} hp_sh_out;

/* A child's work: fills *out (zeroed before the call). */
typedef void (*hp_sh_fn)(int rank, void *ctx, hp_sh_out *out);
/* One rank's part on a joined communicator: 0 when its checks passed. */
typedef int (*hp_sh_body)(hp_comm *c, int rank, void *ctx, hp_sh_out *o);

/* A group: every rank joins `name` (hp__shm_comm_new_ex), then runs body. */
typedef struct hp_sh_group {
    char name[64];
    int world;
    double timeout_s;
    size_t slot;
    hp_sh_body body;
    void *ctx;
} hp_sh_group;

int64_t hp_sh_now_ns(void);

/* Forks a child running f(rank, ctx); *rfd reads its record. */
pid_t hp_sh_spawn(hp_sh_fn f, int rank, void *ctx, int *rfd);
/* Reads the child's record (a child that died sends none: ok = 0, msg says so) and reaps it. */
void hp_sh_collect(pid_t pid, int fd, hp_sh_out *o);

/* "t<pid>-<n>", n counting up in this process. */
void hp_sh_fresh_name(char *buf, size_t cap);
/* True if /dev/shm/hp-<name> exists. */
int hp_sh_exists(const char *name);
/* Expects nothing of this process's names (hp-t<pid>-*) in /dev/shm. */
void hp_sh_assert_clean(void);

void hp_sh_group_init(hp_sh_group *g, int world, double timeout_s, size_t slot, hp_sh_body body,
                      void *ctx);
/* The child side of a group (for tests that spawn ranks themselves). */
void hp_sh_group_child(int rank, void *ctx, hp_sh_out *o);
/* Spawns g->world ranks, collects outs[0 .. world), expects the segment gone. */
void hp_sh_run_group(hp_sh_group *g, hp_sh_out *outs);

/* ---- deterministic data and the plain reference --------------------------------------------- */

extern const size_t hp_sh_esz[3];      /* element size per hp_comm_dtype */
extern const char *const hp_sh_dtn[3]; /* dtype names */
extern const char *const hp_sh_opn[3]; /* reduce op names */

/* Byte b of rank's all_gather / broadcast / all_to_all input: cheap, and different for every
 * rank and for positions a step (a power of two) apart. */
uint8_t hp_sh_gbyte(int rank, size_t b, uint64_t salt);
/* Element i of rank's reduction input: floats of varied magnitude (so the summation order
 * shows in the bits), i64 within +-2^39. */
void hp_sh_elem(void *out, hp_comm_dtype dt, int rank, uint64_t i, uint64_t salt);
/* The rank-order fold of element i over ranks 0 .. world-1. */
void hp_sh_ref_elem(void *out, hp_comm_dtype dt, hp_reduce_op op, int world, uint64_t i,
                    uint64_t salt);
uint64_t hp_sh_fnv(uint64_t h, const void *p, size_t n);
/* First differing element of got vs want, or -1. */
long hp_sh_first_diff(const void *got, const void *want, size_t n, size_t es);

/* ---- one rank's checked collectives ----------------------------------------------------------
 * Each runs the collective on c as rank `rank` of c->world with the inputs above, compares the
 * result bitwise with the reference, folds it into o->hash, and returns 0, or 1 with o->msg
 * set. */

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            snprintf(o->msg, sizeof o->msg, __VA_ARGS__);                                          \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* CALL(expr, what): expr may use `err`; on failure the rank reports what and the message. */
#define CALL(expr, what)                                                                           \
    do {                                                                                           \
        hp_err e_ = {0};                                                                           \
        hp_err *err = &e_;                                                                         \
        hp_status s_ = (expr);                                                                     \
        CHECK(s_ == HP_OK, "%s: %s", what, e_.msg);                                                \
    } while (0)

int hp_sh_check_all_reduce(hp_comm *c, int rank, size_t n, hp_comm_dtype dt, hp_reduce_op op,
                           int in_place, uint64_t salt, hp_sh_out *o);
int hp_sh_check_reduce_scatter(hp_comm *c, int rank, size_t n, hp_comm_dtype dt, hp_reduce_op op,
                               int in_place, uint64_t salt, hp_sh_out *o);
int hp_sh_check_all_gather(hp_comm *c, int rank, size_t bytes, int in_place, uint64_t salt,
                           hp_sh_out *o);
int hp_sh_check_broadcast(hp_comm *c, int rank, size_t bytes, int root, uint64_t salt,
                          hp_sh_out *o);

#endif
