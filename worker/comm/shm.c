/* worker/comm/shm.c — placeholder until the shared-memory communicator lands. */
#include "hp/comm.h"

hp_status hp_shm_comm_new(const char *name, int rank, int world, double timeout_s, hp_comm **out,
                          hp_err *err) {
    (void)name, (void)rank, (void)world, (void)timeout_s;
    *out = NULL;
    return hp_errf(err, HP_UNSUPPORTED, "the shm communicator has not landed yet");
}
