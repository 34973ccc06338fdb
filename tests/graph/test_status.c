/* The status table (hp/status.def): every status has a name, a phrase and mappings to the gRPC
 * status, the HTTP status and the exit code, and they are the ones users are told about. */
#include "hp/base.h"

#include <criterion/criterion.h>
#include <string.h>

Test(status, every_status_has_a_name_and_mappings) {
    cr_assert_gt(HP_STATUS_COUNT, 1);
    for (int i = 0; i < HP_STATUS_COUNT; i++) {
        hp_status s = (hp_status)i;
        const char *name = hp_status_name(s);
        cr_expect(name && *name && strcmp(name, "UNKNOWN"), "status %d: no name", i);
        cr_expect(strcmp(hp_status_str(s), "unknown status"), "status %d: no phrase", i);
        int http = hp_status_http(s), code = hp_status_exit(s);
        if (s == HP_OK) {
            cr_expect_eq(http, 200);
            cr_expect_eq(code, 0);
        } else {
            cr_expect(http >= 400 && http <= 599, "%s: HTTP %d", name, http);
            cr_expect(code > 0 && code != 2 && code < 126, "%s: exit %d", name, code);
        }
        for (int j = 0; j < i; j++)
            cr_expect(strcmp(name, hp_status_name((hp_status)j)), "%s twice", name);
    }
}

Test(status, the_mappings_users_see) {
    cr_expect_str_eq(hp_status_name(HP_INVALID), "INVALID");
    cr_expect_str_eq(hp_status_name(HP_UNSUPPORTED), "UNSUPPORTED");
    cr_expect_eq(hp_status_http(HP_NOT_FOUND), 404);
    cr_expect_eq(hp_status_http(HP_INVALID), 400);
    cr_expect_eq(hp_status_http(HP_UNSUPPORTED), 501);
    cr_expect_eq(hp_status_http(HP_STATE), 409);
    cr_expect_eq(hp_status_http(HP_INTERNAL), 500);
}

Test(status, a_value_outside_the_table) {
    hp_status s = (hp_status)HP_STATUS_COUNT;
    cr_expect_str_eq(hp_status_name(s), "UNKNOWN");
    cr_expect_str_eq(hp_status_str(s), "unknown status");
    cr_expect_eq(hp_status_http(s), 500);
    cr_expect_eq(hp_status_exit(s), 1);
    cr_expect_str_eq(hp_status_name((hp_status)-1), "UNKNOWN");
}
