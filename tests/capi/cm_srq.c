/* librdmacm's SRQ and extended-QP calls and rdma_notify (tests/capi/test_capi_cm_srq.py),
 * on synchronous ids (rdma_getaddrinfo, rdma_create_ep with no QP attributes).
 *   server: rdma_create_srq on the request's id (PD NULL: id->pd), rdma_create_qp_ex with
 *     no PD, CQs or SRQ given (librdmacm's defaults: id->pd, CQs made with their
 *     channels, id->srq); two receives through rdma_post_recv (which posts to id->srq);
 *     rdma_notify before the accept (EINVAL on RoCE: no REP sent yet) and after it
 *     (EISCONN on RoCE; iWARP takes any event and returns 0); two receives checked,
 *     data and completion fields; a "done" SEND back to the client (which disconnects only
 *     once it has it: a DREQ before the rdma_notify checks would change their answer);
 *     rdma_destroy_ep frees the QP and the SRQ.
 *   client: rdma_create_qp_ex with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, two SENDs through the
 *     ibv_wr_* API (ibv_qp_to_qp_ex), their completions checked; it waits for "done".
 *   cm_srq server PORT      cm_srq client PORT
 * Prints what it checked and "ok", or "FAIL <what>" (exit 1). */
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_common.h"

#define SLOT 32
#define DONE "done"

/* an RC QP's attributes with one SGE each way and nothing else given */
static void rc_attr(struct ibv_qp_init_attr_ex *qx, uint32_t send_wr, uint32_t recv_wr)
{
    memset(qx, 0, sizeof(*qx));
    qx->qp_type = IBV_QPT_RC;
    qx->cap.max_send_wr = send_wr;
    qx->cap.max_send_sge = 1;
    qx->cap.max_recv_wr = recv_wr;
    qx->cap.max_recv_sge = 1;
}

static int server(struct rdma_addrinfo *res)
{
    struct rdma_cm_id *listen_id, *id;
    struct ibv_srq_init_attr sattr;
    struct ibv_srq_init_attr_ex sx;
    struct ibv_qp_init_attr_ex qx;
    struct ibv_wc wc;
    struct ibv_mr *mr;
    char buf[3 * SLOT], want[SLOT];
    int iwarp, i, ret;

    CHECK(rdma_create_ep(&listen_id, res, NULL, NULL) == 0, "rdma_create_ep (passive)");
    CHECK(rdma_listen(listen_id, 1) == 0, "rdma_listen");
    printf("listening\n");
    fflush(stdout);
    CHECK(rdma_get_request(listen_id, &id) == 0, "rdma_get_request");
    iwarp = id->verbs->device->transport_type == IBV_TRANSPORT_IWARP;

    memset(&sx, 0, sizeof(sx));
    sx.attr.max_wr = 4;
    errno = 0;
    CHECK(rdma_create_srq_ex(id, &sx) == -1 && errno == EINVAL,
          "rdma_create_srq_ex without IBV_SRQ_INIT_ATTR_TYPE is EINVAL");
    memset(&sattr, 0, sizeof(sattr));
    sattr.attr.max_wr = 4;
    sattr.attr.max_sge = 1;
    sattr.srq_context = id;
    CHECK(rdma_create_srq(id, NULL, &sattr) == 0, "rdma_create_srq");
    CHECK(id->srq && id->srq->pd == id->pd && id->srq->srq_context == id
          && sattr.attr.max_wr >= 4, "id->srq on id->pd, its context and size");

    rc_attr(&qx, 2, 4);
    CHECK(rdma_create_qp_ex(id, &qx) == 0, "rdma_create_qp_ex (no PD, CQs or SRQ given)");
    CHECK(id->qp && id->qp->srq == id->srq && qx.srq == id->srq, "the QP takes id->srq");
    CHECK(qx.pd == id->pd && id->qp->pd == id->pd && (qx.comp_mask & IBV_QP_INIT_ATTR_PD),
          "the QP on id->pd");
    CHECK(id->send_cq && id->recv_cq && id->send_cq_channel && id->recv_cq_channel
          && qx.send_cq == id->send_cq && qx.recv_cq == id->recv_cq,
          "librdmacm's CQs and channels");
    errno = 0;
    CHECK(rdma_create_qp_ex(id, &qx) == -1 && errno == EINVAL,
          "a second rdma_create_qp_ex is EINVAL");

    mr = rdma_reg_msgs(id, buf, sizeof(buf));
    CHECK(mr, "rdma_reg_msgs");
    memset(buf, 0, sizeof(buf));
    for (i = 0; i < 2; i++)
        CHECK(rdma_post_recv(id, (void *)(uintptr_t)(40 + i), buf + i * SLOT, SLOT, mr) == 0,
              "rdma_post_recv (to id->srq)");

    errno = 0;
    ret = rdma_notify(id, IBV_EVENT_COMM_EST);
    CHECK(iwarp ? ret == 0 : ret == -1 && errno == EINVAL,
          "rdma_notify before the accept: EINVAL (RoCE), 0 (iWARP)");
    CHECK(rdma_accept(id, NULL) == 0, "rdma_accept");
    errno = 0;
    ret = rdma_notify(id, IBV_EVENT_COMM_EST);
    CHECK(iwarp ? ret == 0 : ret == -1 && errno == EISCONN,
          "rdma_notify once established: EISCONN (RoCE), 0 (iWARP)");
    errno = 0;
    ret = rdma_notify(id, IBV_EVENT_QP_FATAL);
    CHECK(iwarp ? ret == 0 : ret == -1 && errno == EINVAL,
          "rdma_notify of another event: EINVAL (RoCE), 0 (iWARP)");

    for (i = 0; i < 2; i++) {
        CHECK(rdma_get_recv_comp(id, &wc) == 1, "rdma_get_recv_comp");
        snprintf(want, sizeof(want), "srq message %d", i);
        CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV
              && wc.wr_id == (uint64_t)(40 + i) && wc.byte_len == strlen(want) + 1
              && wc.qp_num == id->qp->qp_num, "the receive's completion fields");
        CHECK(!strcmp(buf + i * SLOT, want), "the data received");
        printf("recv %" PRIu64 " %u %s\n", wc.wr_id, wc.byte_len, buf + i * SLOT);
    }
    strcpy(buf + 2 * SLOT, DONE);
    CHECK(rdma_post_send(id, (void *)(uintptr_t)42, buf + 2 * SLOT, sizeof(DONE), mr,
                         IBV_SEND_SIGNALED) == 0, "rdma_post_send (done)");
    CHECK(rdma_get_send_comp(id, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 42,
          "the done SEND's completion");
    rdma_disconnect(id);
    rdma_dereg_mr(mr);
    rdma_destroy_ep(id);
    CHECK(rdma_create_srq(listen_id, NULL, &sattr) == 0 && listen_id->srq,
          "rdma_create_srq on the listening id");
    rdma_destroy_ep(listen_id);
    printf("notify %s\nok\n", iwarp ? "iwarp" : "roce");
    return 0;
}

static int client(struct rdma_addrinfo *res)
{
    struct ibv_qp_init_attr_ex qx;
    struct rdma_cm_id *id;
    struct ibv_qp_ex *qpx;
    struct ibv_wc wc;
    struct ibv_mr *mr;
    char buf[3 * SLOT];
    int i;

    CHECK(rdma_create_ep(&id, res, NULL, NULL) == 0, "rdma_create_ep (active)");
    rc_attr(&qx, 4, 1);
    qx.comp_mask = IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    qx.send_ops_flags = IBV_QP_EX_WITH_SEND;
    CHECK(rdma_create_qp_ex(id, &qx) == 0, "rdma_create_qp_ex with send_ops_flags");
    qpx = ibv_qp_to_qp_ex(id->qp);
    CHECK(qpx, "ibv_qp_to_qp_ex on the rdma_cm QP");
    mr = rdma_reg_msgs(id, buf, sizeof(buf));
    CHECK(mr, "rdma_reg_msgs");
    CHECK(rdma_post_recv(id, (void *)(uintptr_t)80, buf + 2 * SLOT, SLOT, mr) == 0,
          "rdma_post_recv (for done)");
    CHECK(rdma_connect(id, NULL) == 0, "rdma_connect");
    for (i = 0; i < 2; i++) {
        char *m = buf + i * SLOT;
        snprintf(m, SLOT, "srq message %d", i);
        ibv_wr_start(qpx);
        qpx->wr_id = 70 + i;
        qpx->wr_flags = IBV_SEND_SIGNALED;
        ibv_wr_send(qpx);
        ibv_wr_set_sge(qpx, mr->lkey, (uintptr_t)m, (uint32_t)strlen(m) + 1);
        CHECK(ibv_wr_complete(qpx) == 0, "ibv_wr_complete");
        CHECK(rdma_get_send_comp(id, &wc) == 1, "rdma_get_send_comp");
        CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND
              && wc.wr_id == (uint64_t)(70 + i) && wc.qp_num == id->qp->qp_num,
              "the send's completion fields");
        printf("sent %" PRIu64 " %s\n", wc.wr_id, m);
    }
    CHECK(rdma_get_recv_comp(id, &wc) == 1, "rdma_get_recv_comp (done)");
    CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 80 && wc.byte_len == sizeof(DONE)
          && !strcmp(buf + 2 * SLOT, DONE), "the server's done message");
    printf("recv %s\n", buf + 2 * SLOT);
    rdma_disconnect(id);
    rdma_dereg_mr(mr);
    rdma_destroy_ep(id);
    printf("ok\n");
    return 0;
}

int main(int argc, char **argv)
{
    struct rdma_addrinfo hints, *res;
    int is_server, ret;

    CHECK(argc == 3, "usage: cm_srq server|client PORT");
    is_server = !strcmp(argv[1], "server");
    memset(&hints, 0, sizeof(hints));
    hints.ai_port_space = RDMA_PS_TCP;
    if (is_server)
        hints.ai_flags = RAI_PASSIVE;
    ret = rdma_getaddrinfo("127.0.0.1", argv[2], &hints, &res);
    CHECK(ret == 0, "rdma_getaddrinfo");
    ret = is_server ? server(res) : client(res);
    rdma_freeaddrinfo(res);
    return ret;
}
