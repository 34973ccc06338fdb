/* tests/worker/cuda_check.h — shared by the cuda backend tests (test code): the backend on
 * device 0, or a clean skip ("no CUDA device: ...", "built without CUDA") where there is none,
 * so every GPU test runs on a device machine and skips everywhere else. */
#ifndef HP_TEST_CUDA_CHECK_H
#define HP_TEST_CUDA_CHECK_H

#include "worker/backend.h"
#ifdef HP_CUDA_BACKEND
#include "worker/cuda/cuda_backend.h"
#endif

#include <criterion/criterion.h>
#include <stdio.h>

/* True when this build has the cuda backend and the machine a device (why: the reason not). */
static inline bool cu_present(char *why, size_t len) {
#ifdef HP_CUDA_BACKEND
    return hp_cuda_device_count(why, len) > 0;
#else
    snprintf(why, len, "this build has no CUDA backend");
    return false;
#endif
}

#define CU_SKIP_WITHOUT_DEVICE()                                                                   \
    do {                                                                                           \
        char cu__why[200] = "";                                                                    \
        if (!cu_present(cu__why, sizeof cu__why)) cr_skip_test("no CUDA device: %s", cu__why);     \
    } while (0)

/* The cuda backend (skips the test without a device). */
static inline hp_backend *cu_backend(void) {
    CU_SKIP_WITHOUT_DEVICE();
    hp_backend *be = NULL;
    hp_err e = {0};
    cr_assert_eq(hp_backend_new(HP_DEVICE_CUDA, NULL, &be, &e), HP_OK, "%s", e.msg);
    return be;
}

#endif
