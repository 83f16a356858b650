/* exit() from a signal handler (tests/capi/test_capi_host_state.py). qperf's server ends
 * that way when its client reports a failure: its SIGURG handler calls die(), which calls
 * exit(1). The signal may come while the main thread is inside a verb, running softrdma's
 * Python, even inside malloc. exit() then runs the process's exit handlers on that thread,
 * and a handler that frees memory waits forever for the malloc lock the interrupted call
 * holds. OpenSSL's libcrypto registers such a handler when it is loaded, and Python loads
 * it with hashlib. qperf hung that way under `softrdma run`.
 *
 * exit_in_handler DEVICE: opens DEVICE, makes a PD, a CQ with a completion channel and an
 * RC QP, and an rdma_cm id bound to 127.0.0.1 (softrdma's verbs and CM modules are then
 * imported). It prints "libcrypto mapped" or "libcrypto not mapped" (from
 * /proc/self/maps). Then it installs a SIGALRM handler that calls exit(3), arms a 20 ms
 * timer and opens and closes DEVICE, with a completion channel and a CQ each time, until
 * the handler ends the process. Exit status 3 is the expected end. A hang is the
 * failure. */
#include "common.h"
#include <rdma/rdma_cma.h>
#include <arpa/inet.h>
#include <signal.h>
#include <sys/time.h>

static void on_alarm(int sig)
{
    (void)sig;
    exit(3);  /* not async-signal-safe, as in the programs that do it */
}

static int libcrypto_mapped(void)
{
    char line[512];
    int found = 0;
    FILE *f = fopen("/proc/self/maps", "r");

    if (!f)
        FAIL("/proc/self/maps: %s", strerror(errno));
    while (fgets(line, sizeof line, f))
        if (strstr(line, "libcrypto"))
            found = 1;
    fclose(f);
    return found;
}

int main(int argc, char **argv)
{
    struct itimerval timer = { .it_value = { 0, 20000 } };
    struct sockaddr_in addr = { .sin_family = AF_INET };
    struct rdma_event_channel *events;
    struct sigaction sa = { .sa_handler = on_alarm };
    struct rdma_cm_id *id;
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *cq;

    if (argc < 2)
        FAIL("usage: exit_in_handler DEVICE");
    ctx = open_device(argv[1], NULL);
    pd = ibv_alloc_pd(ctx);
    CHECK(pd, "ibv_alloc_pd: %s", strerror(errno));
    cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
    CHECK(cq, "ibv_create_cq: %s", strerror(errno));
    make_rc_qp(pd, cq, 16, 0);  /* FAILs when there is none */
    events = rdma_create_event_channel();
    CHECK(events, "rdma_create_event_channel: %s", strerror(errno));
    CHECK(!rdma_create_id(events, &id, NULL, RDMA_PS_TCP), "rdma_create_id: %s",
          strerror(errno));
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    CHECK(!rdma_bind_addr(id, (struct sockaddr *)&addr), "rdma_bind_addr: %s",
          strerror(errno));
    printf("libcrypto %s\n", libcrypto_mapped() ? "mapped" : "not mapped");
    fflush(stdout);

    sigemptyset(&sa.sa_mask);
    CHECK(!sigaction(SIGALRM, &sa, NULL), "sigaction: %s", strerror(errno));
    CHECK(!setitimer(ITIMER_REAL, &timer, NULL), "setitimer: %s", strerror(errno));
    for (;;) {
        struct ibv_context *more = open_device(argv[1], NULL);
        struct ibv_comp_channel *ch = ibv_create_comp_channel(more);
        struct ibv_cq *cq2;

        CHECK(ch, "ibv_create_comp_channel: %s", strerror(errno));
        cq2 = ibv_create_cq(more, 16, NULL, ch, 0);
        CHECK(cq2, "ibv_create_cq: %s", strerror(errno));
        CHECK(!ibv_destroy_cq(cq2), "ibv_destroy_cq");
        CHECK(!ibv_destroy_comp_channel(ch), "ibv_destroy_comp_channel");
        CHECK(!ibv_close_device(more), "ibv_close_device");
    }
}
