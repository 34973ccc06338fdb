/* tests/daemon/test_rpc_python.c — the control service seen by an independent client: runs
 * tests/daemon/grpc_client.py (Python grpcio, messages from build/proto/hp.desc) with
 * /usr/bin/python3 against a real hpd on 127.0.0.1 port 0. The script starts and stops the
 * daemon itself; it fails (never skips) when grpcio is missing. */
#include "tests/util/cli_harness.h"

#include <criterion/criterion.h>

Test(rpc_python, grpcio_client_against_real_hpd, .timeout = 600) {
    const char *bin = hp_th_binary_dir();
    int rc = hp_th_python(540, "tests/daemon/grpc_client.py",
                          "--hpd %s/daemon/hpd --hpctl %s/client/hpctl --desc %s/proto/hp.desc",
                          bin, bin, bin);
    cr_assert_eq(rc, 0, "tests/daemon/grpc_client.py failed (exit %d; its output is above)", rc);
}
