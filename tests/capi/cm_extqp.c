/* An rdma_cm connection whose QP the application creates and moves itself
 * (tests/test_capi_cm_extqp.py), as rdma-core's test_rdmacm_async_traffic_external_qp:
 * the QP is made with ibv_create_qp on id->pd (the device's PD librdmacm gives every
 * id once it has a device), its number goes in conn_param.qp_num, rdma_init_qp_attr
 * gives the INIT, RTR and RTS attributes; the client gets CONNECT_RESPONSE (no
 * ESTABLISHED) and sends the RTU with rdma_establish; the server gets ESTABLISHED.
 * The client then SENDs "external qp <n>" and the server checks the receive.
 *   cm_extqp server PORT      cm_extqp client PORT
 * Prints "ok" and the completion it checked, or "FAIL <what>" (exit 1). */
#include <rdma/rdma_cma.h>
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_common.h"

#define MSG "external qp 42"

static int expect(struct rdma_event_channel *ch, enum rdma_cm_event_type type,
                  struct rdma_cm_id **id)
{
    struct rdma_cm_event *ev;

    if (rdma_get_cm_event(ch, &ev))
        return -1;
    if (ev->event != type || ev->status) {
        printf("FAIL expected %s, got %s status %d\n", rdma_event_str(type),
               rdma_event_str(ev->event), ev->status);
        rdma_ack_cm_event(ev);
        return -1;
    }
    if (id)
        *id = ev->id;
    return rdma_ack_cm_event(ev);
}

/* INIT, RTR and RTS with the attributes rdma_init_qp_attr gives */
static int move_qp(struct rdma_cm_id *id, struct ibv_qp *qp)
{
    enum ibv_qp_state states[] = { IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS };
    struct ibv_qp_attr qa;
    int mask, i;

    for (i = 0; i < 3; i++) {
        memset(&qa, 0, sizeof(qa));
        qa.qp_state = states[i];
        if (rdma_init_qp_attr(id, &qa, &mask) || qa.qp_state != states[i]
            || !(mask & IBV_QP_STATE) || ibv_modify_qp(qp, &qa, mask)) {
            printf("FAIL moving the QP to state %d (errno %d)\n", states[i], errno);
            return -1;
        }
    }
    return 0;
}

static int poll_one(struct ibv_cq *cq, struct ibv_wc *wc)
{
    int n;

    while ((n = ibv_poll_cq(cq, 1, wc)) == 0)
        ;
    return n == 1 ? 0 : -1;
}

int main(int argc, char **argv)
{
    struct rdma_event_channel *ch = rdma_create_event_channel();
    struct rdma_cm_id *id, *cid;
    struct rdma_conn_param param;
    struct sockaddr_in addr;
    struct ibv_qp_init_attr init;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    struct ibv_mr *mr;
    struct ibv_sge sge;
    struct ibv_wc wc;
    char buf[64];
    int server;

    CHECK(argc == 3, "usage: cm_extqp server|client PORT");
    server = !strcmp(argv[1], "server");
    CHECK(ch, "rdma_create_event_channel");
    CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
    memset(&addr, 0, sizeof(addr));
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)atoi(argv[2]));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (server) {
        CHECK(rdma_bind_addr(id, (struct sockaddr *)&addr) == 0, "rdma_bind_addr");
        CHECK(id->pd && id->pd->context == id->verbs, "a bound id has the device's PD");
        CHECK(rdma_listen(id, 1) == 0, "rdma_listen");
        CHECK(expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST, &cid) == 0, "CONNECT_REQUEST");
        CHECK(cid->pd && cid->pd->context == cid->verbs, "the request's id has a PD");
    } else {
        CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&addr, 2000) == 0,
              "rdma_resolve_addr");
        CHECK(expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED, NULL) == 0, "ADDR_RESOLVED");
        CHECK(id->pd && id->pd->context == id->verbs, "a resolved id has the device's PD");
        CHECK(rdma_resolve_route(id, 2000) == 0, "rdma_resolve_route");
        CHECK(expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, NULL) == 0, "ROUTE_RESOLVED");
        cid = id;
    }
    cq = ibv_create_cq(cid->verbs, 4, NULL, NULL, 0);
    CHECK(cq, "ibv_create_cq");
    memset(&init, 0, sizeof(init));
    init.send_cq = init.recv_cq = cq;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = init.cap.max_recv_wr = 2;
    init.cap.max_send_sge = init.cap.max_recv_sge = 1;
    qp = ibv_create_qp(cid->pd, &init);
    CHECK(qp, "ibv_create_qp on id->pd");
    mr = ibv_reg_mr(cid->pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr, "ibv_reg_mr");
    memset(&param, 0, sizeof(param));
    param.qp_num = qp->qp_num;
    param.responder_resources = param.initiator_depth = 1;
    param.retry_count = param.rnr_retry_count = 7;
    sge.addr = (uintptr_t)buf;
    sge.length = sizeof(buf);
    sge.lkey = mr->lkey;
    if (server) {
        struct ibv_recv_wr rwr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1 }, *bad;

        memset(buf, 0, sizeof(buf));
        CHECK(move_qp(cid, qp) == 0, "the server's QP to RTS");
        CHECK(ibv_post_recv(qp, &rwr, &bad) == 0, "ibv_post_recv");
        CHECK(rdma_accept(cid, &param) == 0, "rdma_accept with conn_param.qp_num");
        CHECK(expect(ch, RDMA_CM_EVENT_ESTABLISHED, NULL) == 0, "ESTABLISHED");
        CHECK(poll_one(cq, &wc) == 0, "the receive's completion");
        CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && wc.wr_id == 7
              && wc.byte_len == sizeof(MSG) && wc.qp_num == qp->qp_num,
              "the receive's completion fields");
        CHECK(!strcmp(buf, MSG), "the data received");
        printf("recv %u %s\n", wc.byte_len, buf);
    } else {
        struct ibv_send_wr swr = { .wr_id = 9, .sg_list = &sge, .num_sge = 1,
                                   .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED },
                           *bad;

        strcpy(buf, MSG);
        sge.length = sizeof(MSG);
        CHECK(rdma_connect(id, &param) == 0, "rdma_connect with conn_param.qp_num");
        CHECK(expect(ch, RDMA_CM_EVENT_CONNECT_RESPONSE, NULL) == 0, "CONNECT_RESPONSE");
        CHECK(move_qp(id, qp) == 0, "the client's QP to RTS");
        CHECK(rdma_establish(id) == 0, "rdma_establish");
        CHECK(ibv_post_send(qp, &swr, &bad) == 0, "ibv_post_send");
        CHECK(poll_one(cq, &wc) == 0, "the send's completion");
        CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND && wc.wr_id == 9,
              "the send's completion fields");
        printf("sent %u\n", (unsigned)sizeof(MSG));
    }
    printf("ok\n");
    return 0;
}
