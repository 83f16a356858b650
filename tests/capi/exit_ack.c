/* exit_ack DEVICE: a receiver that exits right after its last completion still ACKs it.
 *
 * The program forks first (before any verb: each process starts its own softrdma). The
 * child posts a receive, tells the parent, busy-polls its CQ until the SEND is there (its
 * own receive step takes it), checks the data and returns from main at once: no
 * ibv_destroy_*, no ibv_close_device. The parent posts that SEND and waits for its
 * completion: IBV_WC_SUCCESS only if the child's ACK left before the child was gone;
 * otherwise its retries are spent (RETRY_EXC_ERR). Prints "send status ..." and "ok".
 */
#include "common.h"
#include <sys/wait.h>
#include <unistd.h>

#define MSG "acked-at-exit"

static void xfer(int fd, void *buf, size_t n, int out)
{
    ssize_t got = out ? write(fd, buf, n) : read(fd, buf, n);
    if (got != (ssize_t)n)
        FAIL("pipe %s: %s", out ? "write" : "read", got < 0 ? strerror(errno) : "short");
}

int main(int argc, char **argv)
{
    int up[2], down[2], child, status;
    struct ibv_context *ctx;
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
    ctx = open_device(argv[1], NULL);
    if (ibv_query_gid(ctx, 1, 0, &gid))
        FAIL("no device %s", argv[1]);
    pd = ibv_alloc_pd(ctx);
    cq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
    mr = pd ? ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE) : NULL;
    if (!cq || !mr)
        FAIL("pd/cq/mr");
    qp = make_rc_qp(pd, cq, 2, 0);
    /* each tells the other its QP number */
    xfer(child ? up[1] : down[1], &qp->qp_num, sizeof(qp->qp_num), 1);
    xfer(child ? down[0] : up[0], &peer, sizeof(peer), 0);

    /* Local ACK Timeout 14: 67 ms, doubled at each retry: about 4 s in all with 6
     * retries (7 retries for ever) */
    rc_to_rts(qp, IBV_ACCESS_LOCAL_WRITE, peer, &gid, 12, 6);
    sge.addr = (uintptr_t)buf;
    sge.lkey = mr->lkey;

    if (child) {
        struct ibv_recv_wr rwr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1 }, *bad;

        sge.length = sizeof(buf);
        if (ibv_post_recv(qp, &rwr, &bad))
            FAIL("ibv_post_recv");
        xfer(up[1], &ready, 1, 1);
        wait_wc(cq, &wc, "the receive", 60.0);
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
        wait_wc(cq, &wc, "the send", 60.0);
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
