/* The set-up the libibverbs test programs of tests/capi share (run under `softrdma run`,
 * compiled with -I tests/capi by tests/harness/capi.compile_c): failing, the clock, the
 * device by name, an RC QP and its INIT -> RTR -> RTS, and waiting for a completion. */
#ifndef SOFTRDMA_TESTS_CAPI_COMMON_H
#define SOFTRDMA_TESTS_CAPI_COMMON_H

#include <infiniband/verbs.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FAIL(...) do { fprintf(stderr, "FAIL: " __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)
#define CHECK(cond, ...) do { if (!(cond)) FAIL(__VA_ARGS__); } while (0)

static inline double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* the device called name, opened (FAIL when there is none); *listp gets the device list
 * when listp is not NULL (to free after the context is closed) */
static inline struct ibv_context *open_device(const char *name, struct ibv_device ***listp)
{
    struct ibv_context *ctx = NULL;
    int n = 0, i;
    struct ibv_device **list = ibv_get_device_list(&n);

    for (i = 0; list && i < n; i++)
        if (!strcmp(ibv_get_device_name(list[i]), name))
            ctx = ibv_open_device(list[i]);
    if (!ctx)
        FAIL("no device %s", name);
    if (listp)
        *listp = list;
    return ctx;
}

/* the next completion of cq into *wc, polled for at most timeout_s seconds */
static inline void wait_wc(struct ibv_cq *cq, struct ibv_wc *wc, const char *what,
                           double timeout_s)
{
    double deadline = now() + timeout_s;
    int n;
    while ((n = ibv_poll_cq(cq, 1, wc)) == 0)
        if (now() > deadline)
            FAIL("no completion for %s", what);
    if (n < 0)
        FAIL("ibv_poll_cq failed for %s", what);
}

/* an RC QP, sends completing on send_cq and receives on recv_cq, with depth WRs each
   way, one SGE, inline bytes */
static inline struct ibv_qp *make_rc_qp_cqs(struct ibv_pd *pd, struct ibv_cq *send_cq,
                                            struct ibv_cq *recv_cq, uint32_t depth,
                                            uint32_t inline_data)
{
    struct ibv_qp_init_attr init;
    struct ibv_qp *qp;

    memset(&init, 0, sizeof(init));
    init.send_cq = send_cq;
    init.recv_cq = recv_cq;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = init.cap.max_recv_wr = depth;
    init.cap.max_send_sge = init.cap.max_recv_sge = 1;
    init.cap.max_inline_data = inline_data;
    qp = ibv_create_qp(pd, &init);
    if (!qp)
        FAIL("ibv_create_qp: %s", strerror(errno));
    return qp;
}

/* an RC QP whose sends and receives complete on one CQ */
static inline struct ibv_qp *make_rc_qp(struct ibv_pd *pd, struct ibv_cq *cq, uint32_t depth,
                                        uint32_t inline_data)
{
    return make_rc_qp_cqs(pd, cq, cq, depth, inline_data);
}

/* RESET -> INIT on port 1 with the access flags */
static inline void qp_to_init(struct ibv_qp *qp, unsigned int access)
{
    struct ibv_qp_attr a;

    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = access;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        FAIL("INIT");
}

/* RESET -> INIT -> RTR -> RTS of an RC QP connected to QP dest at gid (MTU 1024, Local ACK
 * Timeout 14, RNR retries for ever, one read/atomic each way) */
static inline void rc_to_rts(struct ibv_qp *qp, unsigned int access, uint32_t dest,
                             const union ibv_gid *gid, uint8_t min_rnr_timer, uint8_t retry_cnt)
{
    struct ibv_qp_attr a;

    qp_to_init(qp, access);
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = dest;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = min_rnr_timer;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = *gid;
    a.ah_attr.grh.hop_limit = 1;
    a.ah_attr.port_num = 1;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN
                      | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        FAIL("RTR");
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = retry_cnt;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT
                      | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
        FAIL("RTS");
}

#endif
