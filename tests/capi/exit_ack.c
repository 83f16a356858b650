/* exit_ack DEVICE: a receiver that exits right after its last completion still ACKs it.
 *
 * The program forks first (before any verb: each process starts its own softrdma). The
 * child posts a receive, tells the parent, busy-polls its CQ until the SEND is there (its
 * own receive step takes it), checks the data and returns from main at once: no
 * ibv_destroy_*, no ibv_close_device. The parent posts that SEND and waits for its
 * completion: IBV_WC_SUCCESS only if the child's ACK left before the child was gone;
 * otherwise its retries are spent (RETRY_EXC_ERR). Prints "send status ..." and "ok".
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define FAIL(...) do { fprintf(stderr, "FAIL: " __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)
#define MSG "acked-at-exit"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void xfer(int fd, void *buf, size_t n, int out)
{
    ssize_t got = out ? write(fd, buf, n) : read(fd, buf, n);
    if (got != (ssize_t)n)
        FAIL("pipe %s: %s", out ? "write" : "read", got < 0 ? strerror(errno) : "short");
}

static void wait_wc(struct ibv_cq *cq, struct ibv_wc *wc, const char *what)
{
    double deadline = now() + 60.0;
    int n;
    while ((n = ibv_poll_cq(cq, 1, wc)) == 0)
        if (now() > deadline)
            FAIL("no completion for %s", what);
    if (n < 0)
        FAIL("ibv_poll_cq failed for %s", what);
}

int main(int argc, char **argv)
{
    int up[2], down[2], n, i, child, status;
    struct ibv_device **list;
    struct ibv_context *ctx = NULL;
    struct ibv_qp_init_attr init;
    struct ibv_qp_attr a;
    struct ibv_sge sge;
    struct ibv_wc wc;
    union ibv_gid gid;
    uint32_t peer;
    static char buf[256];
    char ready = 'R';
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    struct ibv_mr *mr;
    pid_t pid;

    if (argc < 2)
        FAIL("usage: exit_ack DEVICE");
    if (pipe(up) || pipe(down))
        FAIL("pipe");
    pid = fork();
    if (pid < 0)
        FAIL("fork");
    child = pid == 0;
    list = ibv_get_device_list(&n);
    for (i = 0; list && i < n; i++)
        if (!strcmp(ibv_get_device_name(list[i]), argv[1]))
            ctx = ibv_open_device(list[i]);
    if (!ctx || ibv_query_gid(ctx, 1, 0, &gid))
        FAIL("no device %s", argv[1]);
    pd = ibv_alloc_pd(ctx);
    cq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
    mr = pd ? ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE) : NULL;
    if (!cq || !mr)
        FAIL("pd/cq/mr");
    memset(&init, 0, sizeof(init));
    init.send_cq = init.recv_cq = cq;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = init.cap.max_recv_wr = 2;
    init.cap.max_send_sge = init.cap.max_recv_sge = 1;
    qp = ibv_create_qp(pd, &init);
    if (!qp)
        FAIL("ibv_create_qp: %s", strerror(errno));
    /* each tells the other its QP number */
    xfer(child ? up[1] : down[1], &qp->qp_num, sizeof(qp->qp_num), 1);
    xfer(child ? down[0] : up[0], &peer, sizeof(peer), 0);

    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        FAIL("INIT");
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = peer;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = gid;
    a.ah_attr.grh.hop_limit = 1;
    a.ah_attr.port_num = 1;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN
                      | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        FAIL("RTR");
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;  /* 67 ms, doubled at each retry: about 4 s in all */
    a.retry_cnt = 6;  /* (7 retries for ever) */
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT
                      | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
        FAIL("RTS");
    sge.addr = (uintptr_t)buf;
    sge.lkey = mr->lkey;

    if (child) {
        struct ibv_recv_wr rwr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1 }, *bad;

        sge.length = sizeof(buf);
        if (ibv_post_recv(qp, &rwr, &bad))
            FAIL("ibv_post_recv");
        xfer(up[1], &ready, 1, 1);
        wait_wc(cq, &wc, "the receive");
        if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV || wc.wr_id != 7
            || wc.byte_len != sizeof(MSG) || strcmp(buf, MSG))
            FAIL("receive: status %d opcode %d byte_len %u data '%.20s'", wc.status,
                 wc.opcode, wc.byte_len, buf);
        return 0;  /* at once: nothing destroyed, nothing closed */
    } else {
        struct ibv_send_wr swr = { .wr_id = 9, .sg_list = &sge, .num_sge = 1,
                                   .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED },
                           *bad;

        strcpy(buf, MSG);
        sge.length = sizeof(MSG);
        xfer(up[0], &ready, 1, 0);
        if (ibv_post_send(qp, &swr, &bad))
            FAIL("ibv_post_send");
        wait_wc(cq, &wc, "the send");
        printf("send status %s\n", ibv_wc_status_str(wc.status));
        if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status))
            FAIL("the receiver: status %#x", status);
        if (wc.status != IBV_WC_SUCCESS || wc.wr_id != 9 || wc.opcode != IBV_WC_SEND)
            FAIL("send: status %d (%s) opcode %d", wc.status, ibv_wc_status_str(wc.status),
                 wc.opcode);
    }
    printf("ok\n");
    return 0;
}
