/* poll_sleep DEVICE: how a thread spinning on an empty ibv_poll_cq gives up its CPU.
 *
 * After a post (the process is busy: a completion is awaited) a run of empty polls ends in
 * futex sleeps, which the kernel counts as voluntary context switches of the thread
 * (RUSAGE_THREAD ru_nvcsw); long after the last post or completion the thread spins (and
 * yields, which is no voluntary switch). Prints "busy_nvcsw N" and "idle_nvcsw N".
 */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define FAIL(...) do { fprintf(stderr, "FAIL: " __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)
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
    struct ibv_device **list;
    struct ibv_context *ctx = NULL;
    struct ibv_qp_init_attr init;
    struct ibv_qp_attr a;
    struct ibv_recv_wr rwr, *bad;
    struct ibv_sge sge;
    static char buf[256];
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    struct ibv_mr *mr;
    long busy, idle;
    int n, i;

    if (argc < 2)
        FAIL("usage: poll_sleep DEVICE");
    list = ibv_get_device_list(&n);
    for (i = 0; list && i < n; i++)
        if (!strcmp(ibv_get_device_name(list[i]), argv[1]))
            ctx = ibv_open_device(list[i]);
    if (!ctx)
        FAIL("no device %s", argv[1]);
    pd = ibv_alloc_pd(ctx);
    cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
    mr = pd ? ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE) : NULL;
    if (!cq || !mr)
        FAIL("pd/cq/mr");
    memset(&init, 0, sizeof(init));
    init.send_cq = init.recv_cq = cq;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = init.cap.max_recv_wr = 4;
    init.cap.max_send_sge = init.cap.max_recv_sge = 1;
    qp = ibv_create_qp(pd, &init);
    if (!qp)
        FAIL("ibv_create_qp");
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        FAIL("INIT");
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
