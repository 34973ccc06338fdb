/* tests/daemon/test_rpc_python.c — the control service seen by an independent client: runs
 * tests/daemon/grpc_client.py (Python grpcio, messages from build/proto/hp.desc) with
 * /usr/bin/python3 against a real hpd on 127.0.0.1 port 0. The script starts and stops the
 * daemon itself; it fails (never skips) when grpcio is missing. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#ifndef HP_SOURCE_DIR
#define HP_SOURCE_DIR "."
#endif
#ifndef HP_BINARY_DIR
#define HP_BINARY_DIR "."
#endif

static const char *dir_env(const char *name, const char *fallback) {
    const char *v = getenv(name);
    return v && *v ? v : fallback;
}

Test(rpc_python, grpcio_client_against_real_hpd, .timeout = 600) {
    const char *src = dir_env("HP_SOURCE_DIR", HP_SOURCE_DIR);
    const char *bin = dir_env("HP_BINARY_DIR", HP_BINARY_DIR);
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "timeout 540 /usr/bin/python3 %s/tests/daemon/grpc_client.py --hpd %s/daemon/hpd "
             "--hpctl %s/client/hpctl --desc %s/proto/hp.desc",
             src, bin, bin, bin);
    int st = system(cmd);
    cr_assert(WIFEXITED(st), "grpc_client.py killed by a signal: %s", cmd);
    cr_assert_eq(WEXITSTATUS(st), 0, "grpc_client.py failed (exit %d): %s", WEXITSTATUS(st), cmd);
}
