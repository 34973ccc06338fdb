/* worker/peak_flops.c — the GPU peaks MFU is measured against (hp/metrics.h): a table of bf16
 * dense peaks by device name. CPUs have no such table worth trusting (turbo, AVX-512
 * licences, SMT): their peak is measured, by the cpu backend (worker/cpu/cpu_peak.c).
 */
#include "hp/metrics.h"

#include <math.h>
#include <string.h>

/* ---- GPUs ------------------------------------------------------------------------------------ */

hp_status hp_gpu_peak_flops(const char *name, double *peak, hp_err *err) {
    if (!peak) return hp_errf(err, HP_INVALID, "gpu peak flops: peak is NULL");
    *peak = NAN;
    if (!name) return hp_errf(err, HP_INVALID, "gpu peak flops: device name is NULL");
    /* Substring rules in torchtitan's order (tools/utils.py get_peak_flops), without its
     * fall-back to the A100 figure. */
    if (strstr(name, "A100"))
        *peak = 312e12;
    else if (strstr(name, "H100"))
        *peak = strstr(name, "NVL") ? 835e12 : strstr(name, "PCIe") ? 756e12 : 989e12;
    else if (strstr(name, "H200"))
        *peak = 989e12;
    else if (strstr(name, "B200"))
        *peak = 2.25e15;
    else
        return hp_errf(err, HP_NOT_FOUND, "peak FLOPs of device '%s' are unknown", name);
    return HP_OK;
}
