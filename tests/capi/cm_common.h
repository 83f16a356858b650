/* The check of the librdmacm test programs of tests/capi (cm_check.c, cm_extqp.c,
 * cm_srq.c; compiled with -I tests/capi by tests/harness/capi.compile_c): a failed
 * condition prints "FAIL <what> (errno N <its text>)" on stdout and returns 1 from the
 * function it is in (main, or a side's function whose result main returns). */
#ifndef SOFTRDMA_TESTS_CAPI_CM_COMMON_H
#define SOFTRDMA_TESTS_CAPI_CM_COMMON_H

#include <errno.h>
#include <stdio.h>
#include <string.h>

#define CHECK(cond, what)                                                    \
    do {                                                                     \
        if (!(cond)) {                                                       \
            printf("FAIL %s (errno %d %s)\n", what, errno, strerror(errno)); \
            return 1;                                                        \
        }                                                                    \
    } while (0)

#endif
