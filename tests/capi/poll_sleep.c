/* poll_sleep DEVICE: how a thread spinning on an empty ibv_poll_cq gives up its CPU.
 *
 * After a post (the process is busy: a completion is awaited) a run of empty polls ends in
 * futex sleeps, which the kernel counts as voluntary context switches of the thread
 * (RUSAGE_THREAD ru_nvcsw); long after the last post or completion the thread spins (and
 * yields, which is no voluntary switch). Prints "busy_nvcsw N" and "idle_nvcsw N".
 */
#define _GNU_SOURCE
#include "common.h"
#include <sys/resource.h>
#include <unistd.h>

#define POLLS 20000

static long nvcsw(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_THREAD, &ru))
        FAIL("getrusage");
    return ru.ru_nvcsw;
}

static long empty_polls(struct ibv_cq *cq)
{
    struct ibv_wc wc;
    long before = nvcsw();
    int i;

    for (i = 0; i < POLLS; i++)
        if (ibv_poll_cq(cq, 1, &wc) != 0)
            FAIL("poll %d found a completion (or failed)", i);
    return nvcsw() - before;
}

int main(int argc, char **argv)
{
    struct ibv_context *ctx;
    struct ibv_recv_wr rwr, *bad;
    struct ibv_sge sge;
    static char buf[256];
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    struct ibv_mr *mr;
    long busy, idle;

    if (argc < 2)
        FAIL("usage: poll_sleep DEVICE");
    ctx = open_device(argv[1], NULL);
    pd = ibv_alloc_pd(ctx);
    cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
    mr = pd ? ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE) : NULL;
    if (!cq || !mr)
        FAIL("pd/cq/mr");
    qp = make_rc_qp(pd, cq, 4, 0);
    qp_to_init(qp, IBV_ACCESS_LOCAL_WRITE);
    /* idle: nothing posted or completed for a while */
    usleep(200000);
    idle = empty_polls(cq);
    /* busy: a receive is posted, its completion awaited */
    sge.addr = (uintptr_t)buf; sge.length = sizeof(buf); sge.lkey = mr->lkey;
    memset(&rwr, 0, sizeof(rwr));
    rwr.sg_list = &sge; rwr.num_sge = 1;
    if (ibv_post_recv(qp, &rwr, &bad))
        FAIL("post_recv");
    busy = empty_polls(cq);
    printf("busy_nvcsw %ld\nidle_nvcsw %ld\n", busy, idle);
    return 0;
}
