/* graph/device.c — device kind names and what this build can run (hp/device.h). Here rather
 * than in worker/ because hpctl and hpd use it too and do not link the worker. */
#include "hp/device.h"

#include <string.h>

const char *hp_device_name(hp_device_kind d) {
    switch (d) {
    case HP_DEVICE_CPU:
        return "cpu";
    case HP_DEVICE_CUDA:
        return "cuda";
    }
    return "?";
}

hp_status hp_device_parse(const char *name, hp_device_kind *out, hp_err *err) {
    if (!name || !out) return hp_errf(err, HP_INVALID, "device: NULL argument");
    if (!strcmp(name, "cpu")) {
        *out = HP_DEVICE_CPU;
        return HP_OK;
    }
    if (!strcmp(name, "cuda")) {
        *out = HP_DEVICE_CUDA;
        return HP_OK;
    }
    return hp_errf(err, HP_INVALID, "device '%s' is unknown (expected cpu or cuda)", name);
}

hp_status hp_device_built(hp_device_kind d, hp_err *err) {
    switch (d) {
    case HP_DEVICE_CPU:
        return HP_OK;
    case HP_DEVICE_CUDA:
#ifdef HP_CUDA_BACKEND
        return HP_OK;
#else
        return hp_errf(err, HP_UNSUPPORTED,
                       "device cuda: this hp-worker was built without CUDA (no CUDA backend is "
                       "compiled in; hp never runs a cuda job on the CPU)");
#endif
    }
    return hp_errf(err, HP_INVALID, "device %d is not cpu or cuda", (int)d);
}
