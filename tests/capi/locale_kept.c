/* softrdma's Python in a C program leaves the program's locale alone
 * (tests/capi/test_capi_host_state.py): a program that never called setlocale(3) runs in
 * the "C" locale, and Python's start-up used to call setlocale(LC_CTYPE, "") in it, which
 * gave it the environment's (C.UTF-8, say) once its first verb had run.
 *
 * locale_kept DEVICE: prints each category before and after the first verbs; exits 1 if
 * one changed. */
#include "common.h"
#include <locale.h>

static const int categories[] = { LC_CTYPE, LC_NUMERIC, LC_TIME, LC_COLLATE, LC_MONETARY,
                                   LC_MESSAGES };
#define NCAT (sizeof(categories) / sizeof(categories[0]))

int main(int argc, char **argv)
{
    char before[NCAT][64];
    struct ibv_context *ctx;
    struct ibv_device **list;
    unsigned int i;

    CHECK(argc == 2, "usage: locale_kept DEVICE");
    for (i = 0; i < NCAT; i++)
        snprintf(before[i], sizeof(before[i]), "%s", setlocale(categories[i], NULL));
    ctx = open_device(argv[1], &list);
    CHECK(ctx, "ibv_open_device");
    for (i = 0; i < NCAT; i++) {
        const char *now = setlocale(categories[i], NULL);

        printf("category %d: %s -> %s\n", categories[i], before[i], now);
        CHECK(!strcmp(before[i], now), "locale category %d changed: %s -> %s", categories[i],
              before[i], now);
    }
    CHECK(!ibv_close_device(ctx), "ibv_close_device");
    ibv_free_device_list(list);
    printf("ok\n");
    return 0;
}
