/* A libibverbs program for tests/test_capi_verbs.py, run under `softrdma run`:
 * the verbs the stock tools do not cover, each checked on its data and completion fields.
 *
 *   verbs_check DEVICE     prints "ok: ..." per check, exits 0 when all pass (FAIL: and
 *                          exit 1 at the first that does not).
 *
 * Checks: the async event fd (non-blocking, poll) with an SRQ limit event; UD with the
 * 40-byte GRH in front of the data; unsignaled sends (sq_sig_all 0 and 1); inline data
 * gathered from unregistered buffers; ibv_create_cq_ex polling; ibv_resize_cq;
 * ibv_rereg_mr; device memory; ibv_query_device_ex, ODP and ibv_advise_mr; a thread
 * blocked in ibv_get_cq_event while another busy-polls and posts; XRC; error completions
 * of a message too long for its receive buffer; verbs not served (EOPNOTSUPP); the
 * receive queue's rules with its C ring (EINVAL in RESET, ENOMEM when full, posting order,
 * flushes in ERR), and the SRQ's with its own (ENOMEM, resize, order, the limit event);
 * thread and parent domains (the allocators' rings, traffic, EBUSY while in use).
 */
#include "common.h"
#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;

#define WC_WAIT_S 30.0  /* wait_wc's limit (s) */

/* no completion arrives on cq within a short while (all earlier ones polled) */
static void expect_empty(struct ibv_cq *cq, const char *what)
{
    struct ibv_wc wc;
    double until = now() + 0.3;
    while (now() < until)
        CHECK(ibv_poll_cq(cq, 1, &wc) == 0, "unexpected completion (wr_id %#llx) for %s",
              (unsigned long long)wc.wr_id, what);
}

static struct ibv_qp *make_qp(enum ibv_qp_type type, struct ibv_cq *scq, struct ibv_cq *rcq,
                              struct ibv_srq *srq, int sig_all)
{
    struct ibv_qp_init_attr init;
    struct ibv_qp *qp;

    memset(&init, 0, sizeof(init));
    init.send_cq = scq;
    init.recv_cq = rcq;
    init.srq = srq;
    init.qp_type = type;
    init.sq_sig_all = sig_all;
    init.cap.max_send_wr = 32;
    init.cap.max_recv_wr = srq ? 0 : 32;
    init.cap.max_send_sge = 4;
    init.cap.max_recv_sge = 4;
    init.cap.max_inline_data = 256;
    qp = ibv_create_qp(pd, &init);
    CHECK(qp, "ibv_create_qp(type %d): %s", type, strerror(errno));
    return qp;
}

static void rc_connect(struct ibv_qp *qp, uint32_t dest)
{
    rc_to_rts(qp, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
              dest, &gid, 1, 7);
}

static void ud_ready(struct ibv_qp *qp)
{
    struct ibv_qp_attr a;

    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qkey = 0x11111111;
    CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY),
          "UD INIT");
    a.qp_state = IBV_QPS_RTR;
    CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE), "UD RTR");
    a.qp_state = IBV_QPS_RTS;
    CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN), "UD RTS");
}

static void post_recv(struct ibv_qp *qp, struct ibv_srq *srq, uint64_t wr_id, void *buf,
                      uint32_t len, uint32_t lkey)
{
    struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = len, .lkey = lkey };
    struct ibv_recv_wr wr, *bad;

    memset(&wr, 0, sizeof(wr));
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    CHECK(!(srq ? ibv_post_srq_recv(srq, &wr, &bad) : ibv_post_recv(qp, &wr, &bad)),
          "post_recv");
}

static void post_send(struct ibv_qp *qp, uint64_t wr_id, enum ibv_wr_opcode op, void *buf,
                      uint32_t len, uint32_t lkey, unsigned int flags)
{
    struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = len, .lkey = lkey };
    struct ibv_send_wr wr, *bad;
    int ret;

    memset(&wr, 0, sizeof(wr));
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = op;
    wr.send_flags = flags;
    ret = ibv_post_send(qp, &wr, &bad);
    CHECK(!ret, "post_send wr_id %#llx: %s", (unsigned long long)wr_id, strerror(ret));
}

/* ---- the async event fd, non-blocking, and an SRQ limit event ---- */
struct srq_destroyer { struct ibv_srq *srq; int ret; atomic_int done; };

static void *destroy_srq_thread(void *arg)
{
    struct srq_destroyer *d = arg;

    d->ret = ibv_destroy_srq(d->srq);
    atomic_store(&d->done, 1);
    return NULL;
}

static void check_async_fd_srq_limit(void)
{
    struct srq_destroyer d;
    struct timespec pause = { 0, 200000000 };
    pthread_t th;
    static char buf[8][64];
    struct ibv_cq *cq = ibv_create_cq(ctx, 32, NULL, NULL, 0);
    struct ibv_srq_init_attr sa;
    struct ibv_srq_attr attr;
    struct ibv_async_event ev;
    struct ibv_qp *qa, *qb;
    struct ibv_mr *mr;
    struct ibv_srq *srq;
    struct ibv_wc wc;
    struct pollfd pfd;
    char msg[16];
    int flags, i;

    CHECK(cq, "cq");
    memset(&sa, 0, sizeof(sa));
    sa.attr.max_wr = 8;
    sa.attr.max_sge = 1;
    srq = ibv_create_srq(pd, &sa);
    CHECK(srq, "ibv_create_srq: %s", strerror(errno));
    mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr, "reg_mr");
    qa = make_qp(IBV_QPT_RC, cq, cq, NULL, 0);
    qb = make_qp(IBV_QPT_RC, cq, cq, srq, 0);
    rc_connect(qa, qb->qp_num);
    rc_connect(qb, qa->qp_num);
    for (i = 0; i < 4; i++)
        post_recv(NULL, srq, 100 + i, buf[i], 64, mr->lkey);
    /* the program's own descriptor: made non-blocking, nothing pending -> EAGAIN */
    flags = fcntl(ctx->async_fd, F_GETFL);
    CHECK(flags >= 0 && fcntl(ctx->async_fd, F_SETFL, flags | O_NONBLOCK) == 0, "O_NONBLOCK");
    errno = 0;
    CHECK(ibv_get_async_event(ctx, &ev) == -1 && errno == EAGAIN,
          "ibv_get_async_event on an empty non-blocking fd: want -1/EAGAIN, errno %d", errno);
    memset(&attr, 0, sizeof(attr));
    attr.srq_limit = 3;
    CHECK(!ibv_modify_srq(srq, &attr, IBV_SRQ_LIMIT), "ibv_modify_srq(srq_limit 3)");
    memset(&attr, 0, sizeof(attr));
    CHECK(!ibv_query_srq(srq, &attr) && attr.srq_limit == 3 && attr.max_wr >= 8,
          "ibv_query_srq: limit %u max_wr %u", attr.srq_limit, attr.max_wr);
    /* 4 receives queued, limit 3: the second message takes the level below it */
    for (i = 0; i < 2; i++) {
        snprintf(msg, sizeof(msg), "srq-%d", i);
        post_send(qa, 200 + i, IBV_WR_SEND, msg, (uint32_t)strlen(msg) + 1, 0,
                  IBV_SEND_SIGNALED | IBV_SEND_INLINE);
    }
    pfd.fd = ctx->async_fd;
    pfd.events = POLLIN;
    CHECK(poll(&pfd, 1, 30000) == 1 && (pfd.revents & POLLIN), "the async fd never polled readable");
    CHECK(!ibv_get_async_event(ctx, &ev), "ibv_get_async_event: %s", strerror(errno));
    CHECK(ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED && ev.element.srq == srq,
          "async event %d (%s), element %p, want SRQ_LIMIT_REACHED on %p", ev.event_type,
          ibv_event_type_str(ev.event_type), (void *)ev.element.srq, (void *)srq);
    /* the event stays unacknowledged until the SRQ's destroy, below */
    /* the limit is disarmed once it fired (IBA 10.2.9.6) */
    memset(&attr, 0, sizeof(attr));
    CHECK(!ibv_query_srq(srq, &attr) && attr.srq_limit == 0, "limit not disarmed: %u",
          attr.srq_limit);
    for (i = 0; i < 4; i++) {
        wait_wc(cq, &wc, "srq traffic", WC_WAIT_S);
        CHECK(wc.status == IBV_WC_SUCCESS, "srq wc status %d", wc.status);
        if (wc.opcode == IBV_WC_RECV) {
            CHECK(wc.qp_num == qb->qp_num && wc.wr_id >= 100 && wc.wr_id < 102
                  && !strcmp(buf[wc.wr_id - 100], wc.wr_id == 100 ? "srq-0" : "srq-1"),
                  "srq recv wc wr_id %#llx qp %#x", (unsigned long long)wc.wr_id, wc.qp_num);
        }
    }
    errno = 0;
    CHECK(ibv_get_async_event(ctx, &ev) == -1 && errno == EAGAIN, "a second event: %d",
          ev.event_type);
    CHECK(fcntl(ctx->async_fd, F_SETFL, flags) == 0, "restore flags");
    CHECK(!ibv_destroy_qp(qa) && !ibv_destroy_qp(qb), "destroy the QPs");
    /* as libibverbs: ibv_destroy_srq returns once the SRQ's reported event is acked (a
     * thread handling it never reads a freed SRQ) */
    d.srq = srq;
    d.ret = -1;
    atomic_init(&d.done, 0);
    CHECK(!pthread_create(&th, NULL, destroy_srq_thread, &d), "pthread_create");
    nanosleep(&pause, NULL);  /* a negative: the destroy must still be waiting */
    CHECK(!atomic_load(&d.done), "ibv_destroy_srq returned before its event was acked");
    ibv_ack_async_event(&ev);
    CHECK(!pthread_join(th, NULL) && d.done && d.ret == 0, "ibv_destroy_srq after the ack: %d",
          d.ret);
    CHECK(!ibv_dereg_mr(mr) && !ibv_destroy_cq(cq), "teardown");
    printf("ok: async fd non-blocking (EAGAIN, poll); SRQ_LIMIT_REACHED names the SRQ, "
           "limit disarmed; ibv_destroy_srq waits for the event's ack\n");
}

/* ---- UD: the 40-byte GRH in front of the data, the AH back to the sender ---- */
static void check_ud_grh(void)
{
    static char rbuf[2][40 + 256], sbuf[64];
    struct ibv_cq *cq = ibv_create_cq(ctx, 32, NULL, NULL, 0);
    struct ibv_qp *qa, *qb;
    struct ibv_ah_attr aa;
    struct ibv_ah *ah, *back;
    struct ibv_mr *mr;
    struct ibv_sge sge;
    struct ibv_send_wr wr, *bad;
    struct ibv_wc wc;
    const uint8_t *ip;
    int i, got_send = 0;

    CHECK(cq, "cq");
    mr = ibv_reg_mr(pd, rbuf, sizeof(rbuf), IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr, "reg_mr");
    qa = make_qp(IBV_QPT_UD, cq, cq, NULL, 1);
    qb = make_qp(IBV_QPT_UD, cq, cq, NULL, 1);
    ud_ready(qa);
    ud_ready(qb);
    memset(rbuf, 0xee, sizeof(rbuf));
    post_recv(qb, NULL, 0xB0, rbuf[0], sizeof(rbuf[0]), mr->lkey);
    post_recv(qa, NULL, 0xA0, rbuf[1], sizeof(rbuf[1]), mr->lkey);
    memset(&aa, 0, sizeof(aa));
    aa.is_global = 1;
    aa.grh.dgid = gid;
    aa.grh.hop_limit = 64;
    aa.port_num = 1;
    ah = ibv_create_ah(pd, &aa);
    CHECK(ah, "ibv_create_ah: %s", strerror(errno));
    snprintf(sbuf, sizeof(sbuf), "ud-datagram-payload");
    sge.addr = (uintptr_t)sbuf;
    sge.length = 32;
    sge.lkey = 0;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = 0xA1;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_INLINE;
    wr.wr.ud.ah = ah;
    wr.wr.ud.remote_qpn = qb->qp_num;
    wr.wr.ud.remote_qkey = 0x11111111;
    CHECK(!ibv_post_send(qa, &wr, &bad), "ud post_send");
    for (i = 0; i < 2; i++) {
        wait_wc(cq, &wc, "ud", WC_WAIT_S);
        CHECK(wc.status == IBV_WC_SUCCESS, "ud wc status %s", ibv_wc_status_str(wc.status));
        if (wc.opcode == IBV_WC_SEND) {
            got_send = 1;
            continue;
        }
        CHECK(wc.opcode == IBV_WC_RECV && wc.wr_id == 0xB0 && wc.qp_num == qb->qp_num
              && wc.src_qp == qa->qp_num && (wc.wc_flags & IBV_WC_GRH) && wc.byte_len == 40 + 32,
              "ud recv wc: wr_id %#llx qp %#x src_qp %#x flags %#x byte_len %u",
              (unsigned long long)wc.wr_id, wc.qp_num, wc.src_qp, wc.wc_flags, wc.byte_len);
    }
    CHECK(got_send, "no UD send completion");
    /* RoCEv2 over IPv4: the IPv4 header in the GRH area's last 20 bytes (IBA A17.4.5.1) */
    ip = (const uint8_t *)rbuf[0] + 20;
    CHECK((ip[0] >> 4) == 4 && ip[9] == 17 && !memcmp(ip + 12, &gid.raw[12], 4)
          && !memcmp(ip + 16, &gid.raw[12], 4),
          "GRH area: version %d proto %d src %d.%d.%d.%d", ip[0] >> 4, ip[9], ip[12], ip[13],
          ip[14], ip[15]);
    CHECK(!memcmp(rbuf[0] + 40, "ud-datagram-payload", 20), "UD data not after the GRH");
    CHECK((unsigned char)rbuf[0][40 + 32] == 0xee, "UD data overran its byte_len");
    /* the way back: an AH from the receive's GRH */
    back = ibv_create_ah_from_wc(pd, &wc, (struct ibv_grh *)rbuf[0], 1);
    CHECK(back, "ibv_create_ah_from_wc: %s", strerror(errno));
    snprintf(sbuf, sizeof(sbuf), "reply");
    sge.length = 6;
    wr.wr_id = 0xB1;
    wr.wr.ud.ah = back;
    wr.wr.ud.remote_qpn = wc.src_qp;
    CHECK(!ibv_post_send(qb, &wr, &bad), "ud reply post_send");
    for (i = 0; i < 2; i++) {
        wait_wc(cq, &wc, "ud reply", WC_WAIT_S);
        CHECK(wc.status == IBV_WC_SUCCESS, "reply status %d", wc.status);
        if (wc.opcode == IBV_WC_RECV)
            CHECK(wc.wr_id == 0xA0 && wc.src_qp == qb->qp_num && !strcmp(rbuf[1] + 40, "reply"),
                  "reply wc wr_id %#llx", (unsigned long long)wc.wr_id);
    }
    CHECK(!ibv_destroy_ah(back) && !ibv_destroy_ah(ah) && !ibv_destroy_qp(qa)
          && !ibv_destroy_qp(qb) && !ibv_dereg_mr(mr) && !ibv_destroy_cq(cq), "teardown");
    printf("ok: UD receive: GRH in the first 40 bytes (IPv4 header of 127.0.0.1), data after "
           "it, byte_len 72, src_qp; ibv_create_ah_from_wc answers\n");
}

/* ---- unsignaled sends, and multi-SGE inline data from unregistered buffers ---- */
static void check_unsignaled_inline(void)
{
    static char rbuf[8][128];
    struct ibv_cq *scq = ibv_create_cq(ctx, 32, NULL, NULL, 0);
    struct ibv_cq *rcq = ibv_create_cq(ctx, 32, NULL, NULL, 0);
    struct ibv_qp *qa, *qb, *qc;
    struct ibv_mr *mr;
    struct ibv_wc wc;
    struct ibv_sge sg[3];
    struct ibv_send_wr wr, *bad;
    char part1[8] = "alpha-", part2[8] = "beta-", part3[8] = "gamma";
    int i;

    CHECK(scq && rcq, "cqs");
    mr = ibv_reg_mr(pd, rbuf, sizeof(rbuf), IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr, "reg_mr");
    qa = make_qp(IBV_QPT_RC, scq, rcq, NULL, 0);  /* sq_sig_all 0 */
    qb = make_qp(IBV_QPT_RC, scq, rcq, NULL, 0);
    rc_connect(qa, qb->qp_num);
    rc_connect(qb, qa->qp_num);
    for (i = 0; i < 8; i++)
        post_recv(qb, NULL, 0x300 + i, rbuf[i], 128, mr->lkey);
    /* three unsignaled sends, then a signaled one: one send completion, four receives */
    for (i = 0; i < 4; i++) {
        char m[16];
        snprintf(m, sizeof(m), "msg-%d", i);
        post_send(qa, 0x400 + i, IBV_WR_SEND, m, (uint32_t)strlen(m) + 1, 0,
                  IBV_SEND_INLINE | (i == 3 ? IBV_SEND_SIGNALED : 0));
    }
    for (i = 0; i < 4; i++) {
        wait_wc(rcq, &wc, "recv of an unsignaled send", WC_WAIT_S);
        CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 0x300u + (unsigned)i
              && wc.byte_len == 6, "recv %d: wr_id %#llx len %u", i,
              (unsigned long long)wc.wr_id, wc.byte_len);
        CHECK(!strncmp(rbuf[i], "msg-", 4) && rbuf[i][4] == '0' + i, "recv %d data '%s'", i,
              rbuf[i]);
    }
    wait_wc(scq, &wc, "the signaled send", WC_WAIT_S);
    CHECK(wc.wr_id == 0x403 && wc.opcode == IBV_WC_SEND && wc.status == IBV_WC_SUCCESS,
          "send completion wr_id %#llx, want only 0x403", (unsigned long long)wc.wr_id);
    expect_empty(scq, "unsignaled sends");
    printf("ok: sq_sig_all 0: three unsignaled sends and one signaled -> one send "
           "completion (wr_id 0x403), four receives in order\n");

    /* sq_sig_all 1: every send completes, IBV_SEND_SIGNALED or not */
    qc = make_qp(IBV_QPT_RC, scq, rcq, NULL, 1);
    CHECK(!ibv_destroy_qp(qb), "destroy qb");
    qb = make_qp(IBV_QPT_RC, scq, rcq, NULL, 0);
    rc_connect(qc, qb->qp_num);
    rc_connect(qb, qc->qp_num);
    for (i = 0; i < 3; i++)
        post_recv(qb, NULL, 0x500 + i, rbuf[i], 128, mr->lkey);
    for (i = 0; i < 2; i++)
        post_send(qc, 0x600 + i, IBV_WR_SEND, "x", 2, 0, IBV_SEND_INLINE);
    for (i = 0; i < 2; i++) {
        wait_wc(scq, &wc, "sq_sig_all send", WC_WAIT_S);
        CHECK(wc.wr_id == 0x600u + (unsigned)i && wc.status == IBV_WC_SUCCESS,
              "sq_sig_all send wc %#llx", (unsigned long long)wc.wr_id);
        wait_wc(rcq, &wc, "sq_sig_all recv", WC_WAIT_S);
    }
    printf("ok: sq_sig_all 1: every send completes without IBV_SEND_SIGNALED\n");

    /* inline gathered from three unregistered buffers (lkey 0), overwritten at once */
    sg[0].addr = (uintptr_t)part1; sg[0].length = 6; sg[0].lkey = 0;
    sg[1].addr = (uintptr_t)part2; sg[1].length = 5; sg[1].lkey = 0;
    sg[2].addr = (uintptr_t)part3; sg[2].length = 6; sg[2].lkey = 0;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = 0x700;
    wr.sg_list = sg;
    wr.num_sge = 3;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED;
    CHECK(!ibv_post_send(qc, &wr, &bad), "inline gather post_send: %s", strerror(errno));
    memset(part1, 'X', sizeof(part1));
    memset(part2, 'Y', sizeof(part2));
    memset(part3, 'Z', sizeof(part3));
    wait_wc(rcq, &wc, "inline gather recv", WC_WAIT_S);
    CHECK(wc.status == IBV_WC_SUCCESS && wc.byte_len == 17 && !strcmp(rbuf[2], "alpha-beta-gamma"),
          "inline gather: status %d len %u data '%s'", wc.status, wc.byte_len, rbuf[2]);
    wait_wc(scq, &wc, "inline gather send", WC_WAIT_S);
    CHECK(wc.wr_id == 0x700 && wc.status == IBV_WC_SUCCESS, "inline send wc");
    CHECK(!ibv_destroy_qp(qa) && !ibv_destroy_qp(qb) && !ibv_destroy_qp(qc)
          && !ibv_dereg_mr(mr) && !ibv_destroy_cq(scq) && !ibv_destroy_cq(rcq), "teardown");
    printf("ok: inline data gathered from 3 unregistered buffers, copied at post time\n");
}

/* ---- ibv_create_cq_ex and ibv_start_poll/next_poll/end_poll ---- */
static void check_cq_ex(void)
{
    static char buf[4][64];
    struct ibv_cq_init_attr_ex ca;
    struct ibv_poll_cq_attr pa = { .comp_mask = 0 };
    struct ibv_cq_ex *cqx;
    struct ibv_cq *cq;
    struct ibv_qp *qa, *qb;
    struct ibv_mr *mr;
    struct ibv_sge sge;
    struct ibv_send_wr wr, *bad;
    int i, n = 0, recvs = 0, sends = 0, ret;
    double deadline;
    uint64_t t0, wall0, t1, wall1, last_ts = 0, last_wall = 0;
    struct timespec tp;
    struct ibv_values_ex rt = { .comp_mask = IBV_VALUES_MASK_RAW_CLOCK };

    memset(&ca, 0, sizeof(ca));
    ca.cqe = 16;
    ca.wc_flags = IBV_WC_EX_WITH_FLOW_TAG;
    errno = 0;
    CHECK(!ibv_create_cq_ex(ctx, &ca) && errno == EOPNOTSUPP,
          "ibv_create_cq_ex with a flow tag: want NULL/EOPNOTSUPP, errno %d", errno);
    ca.wc_flags = IBV_WC_STANDARD_FLAGS | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP
                  | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;
    cqx = ibv_create_cq_ex(ctx, &ca);
    CHECK(cqx, "ibv_create_cq_ex: %s", strerror(errno));
    cq = ibv_cq_ex_to_cq(cqx);
    CHECK(ibv_start_poll(cqx, &pa) == ENOENT, "empty start_poll: want ENOENT");
    mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr, "reg_mr");
    qa = make_qp(IBV_QPT_RC, cq, cq, NULL, 1);
    qb = make_qp(IBV_QPT_RC, cq, cq, NULL, 1);
    rc_connect(qa, qb->qp_num);
    rc_connect(qb, qa->qp_num);
    for (i = 0; i < 3; i++)
        post_recv(qb, NULL, 0x800 + i, buf[i], 64, mr->lkey);
    /* the completion clock (ns of CLOCK_MONOTONIC) and the wall clock, before the sends */
    clock_gettime(CLOCK_MONOTONIC, &tp);
    t0 = (uint64_t)tp.tv_sec * 1000000000u + (uint64_t)tp.tv_nsec;
    clock_gettime(CLOCK_REALTIME, &tp);
    wall0 = (uint64_t)tp.tv_sec * 1000000000u + (uint64_t)tp.tv_nsec;
    for (i = 0; i < 3; i++) {
        char m[8];
        snprintf(m, sizeof(m), "cqx-%d", i);
        sge.addr = (uintptr_t)m; sge.length = 6; sge.lkey = 0;
        memset(&wr, 0, sizeof(wr));
        wr.wr_id = 0x900 + i;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_SEND_WITH_IMM;
        wr.imm_data = htonl(0xC0DE0000u + (unsigned)i);
        wr.send_flags = IBV_SEND_INLINE;
        CHECK(!ibv_post_send(qa, &wr, &bad), "cqx post_send");
    }
    /* wait until all six are queued, then read them in one pass */
    deadline = now() + 30.0;
    do {
        struct ibv_wc peek;
        (void)peek;
        CHECK(now() < deadline, "cq_ex: completions missing");
        ret = ibv_start_poll(cqx, &pa);
        if (ret == ENOENT)
            continue;
        CHECK(ret == 0, "start_poll: %d", ret);
        do {
            uint64_t ts = ibv_wc_read_completion_ts(cqx);
            uint64_t wall = ibv_wc_read_completion_wallclock_ns(cqx);

            CHECK(cqx->status == IBV_WC_SUCCESS, "cqx status %d", cqx->status);
            /* in CQ order, after the sends were posted; its wall clock after theirs too
             * (a millisecond's slack: it is converted from the completion clock) */
            CHECK(ts >= t0 && ts >= last_ts && wall + 1000000u >= wall0,
                  "completion timestamp %llu (posted at %llu, previous %llu), wall clock "
                  "%llu (posted at %llu)", (unsigned long long)ts, (unsigned long long)t0,
                  (unsigned long long)last_ts, (unsigned long long)wall,
                  (unsigned long long)wall0);
            last_ts = ts;
            last_wall = wall > last_wall ? wall : last_wall;
            if (ibv_wc_read_opcode(cqx) == IBV_WC_RECV) {
                unsigned int k = (unsigned int)(cqx->wr_id - 0x800);
                CHECK(k == (unsigned)recvs && ibv_wc_read_byte_len(cqx) == 6
                      && ibv_wc_read_qp_num(cqx) == qb->qp_num
                      && (ibv_wc_read_wc_flags(cqx) & IBV_WC_WITH_IMM)
                      && ntohl(ibv_wc_read_imm_data(cqx)) == 0xC0DE0000u + k
                      && !strcmp(buf[k], (char[]){'c', 'q', 'x', '-', (char)('0' + k), 0}),
                      "cqx recv %u: len %u qp %#x imm %#x", k, ibv_wc_read_byte_len(cqx),
                      ibv_wc_read_qp_num(cqx), ntohl(ibv_wc_read_imm_data(cqx)));
                recvs++;
            } else {
                CHECK(ibv_wc_read_opcode(cqx) == IBV_WC_SEND
                      && cqx->wr_id == 0x900u + (unsigned)sends
                      && ibv_wc_read_qp_num(cqx) == qa->qp_num, "cqx send wc %#llx",
                      (unsigned long long)cqx->wr_id);
                sends++;
            }
            n++;
        } while (ibv_next_poll(cqx) == 0);
        ibv_end_poll(cqx);
    } while (n < 6);
    clock_gettime(CLOCK_MONOTONIC, &tp);
    t1 = (uint64_t)tp.tv_sec * 1000000000u + (uint64_t)tp.tv_nsec;
    clock_gettime(CLOCK_REALTIME, &tp);
    wall1 = (uint64_t)tp.tv_sec * 1000000000u + (uint64_t)tp.tv_nsec;
    CHECK(last_ts <= t1 && last_wall <= wall1 + 1000000u,
          "the completions' timestamps before the poll's end");
    CHECK(!ibv_query_rt_values_ex(ctx, &rt) && rt.comp_mask == IBV_VALUES_MASK_RAW_CLOCK
          && rt.raw_clock.tv_sec == 0 && (uint64_t)rt.raw_clock.tv_nsec >= t1,
          "ibv_query_rt_values_ex: the completion clock now, %ld", rt.raw_clock.tv_nsec);
    CHECK(recvs == 3 && sends == 3, "cqx: %d recvs %d sends", recvs, sends);
    CHECK(ibv_start_poll(cqx, &pa) == ENOENT, "cq_ex: completions left after the pass");
    CHECK(!ibv_destroy_qp(qa) && !ibv_destroy_qp(qb) && !ibv_dereg_mr(mr)
          && !ibv_destroy_cq(cq), "teardown");
    printf("ok: ibv_create_cq_ex (flow tag -> EOPNOTSUPP); start/next/end_poll read "
           "opcode, byte_len, qp_num, wc_flags, imm_data, completion and wall-clock "
           "timestamps of 6 completions; ibv_query_rt_values_ex\n");
}

/* ---- ibv_resize_cq keeps the queued completions; ibv_rereg_mr moves a region ---- */
static void check_resize_rereg(void)
{
    static char a_buf[64], b_buf[64], src[64];
    struct ibv_cq *cq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
    struct ibv_qp *qa, *qb;
    struct ibv_mr *mr, *smr;
    struct ibv_sge sge;
    struct ibv_send_wr wr, *bad;
    struct ibv_wc wc;
    uint32_t old_rkey;
    int i;

    CHECK(cq, "cq");
    mr = ibv_reg_mr(pd, a_buf, sizeof(a_buf), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    CHECK(mr, "reg_mr");
    /* four receives flushed by the move to ERR: queued when ibv_modify_qp returns */
    qa = make_qp(IBV_QPT_RC, cq, cq, NULL, 1);
    {
        struct ibv_qp_attr a;
        memset(&a, 0, sizeof(a));
        a.qp_state = IBV_QPS_INIT;
        a.port_num = 1;
        CHECK(!ibv_modify_qp(qa, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT
                             | IBV_QP_ACCESS_FLAGS), "INIT");
        for (i = 0; i < 4; i++)
            post_recv(qa, NULL, 0xA00 + i, a_buf, 16, mr->lkey);
        a.qp_state = IBV_QPS_ERR;
        CHECK(!ibv_modify_qp(qa, &a, IBV_QP_STATE), "ERR");
    }
    CHECK(ibv_resize_cq(cq, 3) == EINVAL && cq->cqe == 4,
          "ibv_resize_cq below the 4 queued completions: want EINVAL");
    CHECK(ibv_resize_cq(cq, 64) == 0 && cq->cqe == 64, "ibv_resize_cq(64)");
    for (i = 0; i < 4; i++) {
        wait_wc(cq, &wc, "flushed receive after resize", WC_WAIT_S);
        CHECK(wc.wr_id == 0xA00u + (unsigned)i && wc.status == IBV_WC_WR_FLUSH_ERR
              && wc.qp_num == qa->qp_num, "after resize: wr_id %#llx status %d",
              (unsigned long long)wc.wr_id, wc.status);
    }
    CHECK(!ibv_destroy_qp(qa), "destroy");
    /* 30 completions now fit (the old size was 4; the send queue has 32) */
    qa = make_qp(IBV_QPT_RC, cq, cq, NULL, 1);
    qb = make_qp(IBV_QPT_RC, cq, cq, NULL, 1);
    rc_connect(qa, qb->qp_num);
    rc_connect(qb, qa->qp_num);
    for (i = 0; i < 30; i++)
        post_send(qa, 0xB00 + i, IBV_WR_RDMA_WRITE, "", 0, 0, 0);
    for (i = 0; i < 30; i++) {
        wait_wc(cq, &wc, "30 writes", WC_WAIT_S);
        CHECK(wc.wr_id == 0xB00u + (unsigned)i && wc.status == IBV_WC_SUCCESS,
              "write %d after growth: wr_id %#llx status %d", i, (unsigned long long)wc.wr_id,
              wc.status);
    }
    CHECK(ibv_resize_cq(cq, 0) == EINVAL, "ibv_resize_cq(0): want EINVAL");
    printf("ok: ibv_resize_cq 4 -> 64 keeps the 4 queued completions in order; shrinking "
           "below them or to 0 -> EINVAL\n");
    CHECK(!ibv_dereg_mr(mr), "dereg");

    /* rereg: the region moves from a_buf to b_buf; a write with the new rkey lands there */
    mr = ibv_reg_mr(pd, a_buf, sizeof(a_buf), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    smr = ibv_reg_mr(pd, src, sizeof(src), IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr && smr, "reg_mr");
    errno = 0;
    CHECK(ibv_rereg_mr(mr, 0, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT && errno == EINVAL,
          "rereg with no flags: want IBV_REREG_MR_ERR_INPUT/EINVAL");
    old_rkey = mr->rkey;
    CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, b_buf, sizeof(b_buf), 0) == 0,
          "ibv_rereg_mr: %s", strerror(errno));
    CHECK(mr->addr == b_buf && mr->length == sizeof(b_buf), "rereg fields");
    snprintf(src, sizeof(src), "rereg-target");
    sge.addr = (uintptr_t)src; sge.length = 13; sge.lkey = smr->lkey;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = 0xC00;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.wr.rdma.remote_addr = (uintptr_t)b_buf;
    wr.wr.rdma.rkey = mr->rkey;
    CHECK(!ibv_post_send(qa, &wr, &bad), "write to rereg'd MR");
    wait_wc(cq, &wc, "write to rereg'd MR", WC_WAIT_S);
    CHECK(wc.status == IBV_WC_SUCCESS && !strcmp(b_buf, "rereg-target") && a_buf[0] == 0,
          "rereg write: status %s, b '%s'", ibv_wc_status_str(wc.status), b_buf);
    printf("ok: ibv_rereg_mr(CHANGE_TRANSLATION) moves the region (rkey %#x -> %#x); no "
           "flags -> IBV_REREG_MR_ERR_INPUT\n", old_rkey, mr->rkey);
    CHECK(!ibv_destroy_qp(qa) && !ibv_destroy_qp(qb) && !ibv_dereg_mr(mr)
          && !ibv_dereg_mr(smr) && !ibv_destroy_cq(cq), "teardown");
}

/* ---- ibv_query_device_ex, ODP, ibv_advise_mr, device memory ---- */
static void check_device_ex_dm(void)
{
    static char host[256], odp_buf[4096];
    struct ibv_device_attr_ex ax;
    struct ibv_alloc_dm_attr da;
    struct ibv_cq *cq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
    struct ibv_qp *qa, *qb;
    struct ibv_mr *dmr, *odp, *smr;
    struct ibv_dm *dm;
    struct ibv_sge sge;
    struct ibv_send_wr wr, *bad;
    struct ibv_wc wc;

    CHECK(cq, "cq");
    CHECK(!ibv_query_device_ex(ctx, NULL, &ax), "ibv_query_device_ex");
    CHECK((ax.odp_caps.general_caps & IBV_ODP_SUPPORT)
          && (ax.odp_caps.per_transport_caps.rc_odp_caps & IBV_ODP_SUPPORT_SEND)
          && ax.max_dm_size >= 4096 && ax.completion_timestamp_mask == UINT64_MAX
          && ax.hca_core_clock == 1000000
          && ax.orig_attr.max_qp > 0, "query_device_ex: odp %#x rc %#x dm %llu",
          (unsigned)ax.odp_caps.general_caps, ax.odp_caps.per_transport_caps.rc_odp_caps,
          (unsigned long long)ax.max_dm_size);
    odp = ibv_reg_mr(pd, odp_buf, sizeof(odp_buf), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
    CHECK(odp, "ODP reg_mr: %s", strerror(errno));
    sge.addr = (uintptr_t)odp_buf; sge.length = sizeof(odp_buf); sge.lkey = odp->lkey;
    CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH,
                        &sge, 1) == 0, "ibv_advise_mr prefetch");
    CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0x80, &sge, 1) == EINVAL,
          "ibv_advise_mr bad flags: want EINVAL");
    printf("ok: ibv_query_device_ex: ODP (RC send), max_dm_size %llu, completion clock "
           "1 GHz; "
           "ODP MR and ibv_advise_mr prefetch\n", (unsigned long long)ax.max_dm_size);

    memset(&da, 0, sizeof(da));
    da.length = ax.max_dm_size + 1;
    errno = 0;
    CHECK(!ibv_alloc_dm(ctx, &da) && errno == ENOMEM, "alloc_dm beyond max: want ENOMEM");
    da.length = 4096;
    dm = ibv_alloc_dm(ctx, &da);
    CHECK(dm, "ibv_alloc_dm: %s", strerror(errno));
    errno = 0;
    CHECK(!ibv_reg_dm_mr(pd, dm, 0, 4096, IBV_ACCESS_LOCAL_WRITE) && errno == EINVAL,
          "reg_dm_mr without ZERO_BASED: want EINVAL");
    dmr = ibv_reg_dm_mr(pd, dm, 0, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE
                        | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_ZERO_BASED);
    CHECK(dmr, "ibv_reg_dm_mr: %s", strerror(errno));
    CHECK(ibv_free_dm(dm) == EBUSY, "free_dm with an MR on it: want EBUSY");
    snprintf(host, sizeof(host), "device-memory-bytes");
    CHECK(!ibv_memcpy_to_dm(dm, 100, host, 20), "memcpy_to_dm");
    CHECK(ibv_memcpy_to_dm(dm, 4090, host, 20) == EINVAL, "memcpy_to_dm past the end: EINVAL");
    smr = ibv_reg_mr(pd, host, sizeof(host), IBV_ACCESS_LOCAL_WRITE);
    CHECK(smr, "reg_mr");
    qa = make_qp(IBV_QPT_RC, cq, cq, NULL, 1);
    qb = make_qp(IBV_QPT_RC, cq, cq, NULL, 1);
    rc_connect(qa, qb->qp_num);
    rc_connect(qb, qa->qp_num);
    /* an RDMA READ of the DM region (remote address 100: zero-based) */
    memset(host, 0, sizeof(host));
    sge.addr = (uintptr_t)host; sge.length = 20; sge.lkey = smr->lkey;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = 0xD00;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.wr.rdma.remote_addr = 100;
    wr.wr.rdma.rkey = dmr->rkey;
    CHECK(!ibv_post_send(qa, &wr, &bad), "read DM");
    wait_wc(cq, &wc, "read of DM", WC_WAIT_S);
    CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_READ
          && !strcmp(host, "device-memory-bytes"), "DM read: %s '%s'",
          ibv_wc_status_str(wc.status), host);
    /* an RDMA WRITE into it, read back with ibv_memcpy_from_dm */
    snprintf(host, sizeof(host), "written-into-dm");
    wr.wr_id = 0xD01;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.wr.rdma.remote_addr = 2000;
    sge.length = 16;
    CHECK(!ibv_post_send(qa, &wr, &bad), "write DM");
    wait_wc(cq, &wc, "write of DM", WC_WAIT_S);
    memset(host, 0, sizeof(host));
    CHECK(wc.status == IBV_WC_SUCCESS && !ibv_memcpy_from_dm(host, dm, 2000, 16)
          && !strcmp(host, "written-into-dm"), "DM write: '%s'", host);
    CHECK(!ibv_destroy_qp(qa) && !ibv_destroy_qp(qb) && !ibv_dereg_mr(dmr)
          && !ibv_free_dm(dm) && !ibv_dereg_mr(smr) && !ibv_dereg_mr(odp)
          && !ibv_destroy_cq(cq), "teardown");
    printf("ok: device memory: zero-based MR read and written over RC, memcpy to/from, "
           "EBUSY/ENOMEM/EINVAL\n");
}

/* ---- threads: one blocks in ibv_get_cq_event, another busy-polls and posts ---- */
struct waiter {
    struct ibv_comp_channel *ch;
    struct ibv_cq *cq;
    int want, got, events;
    char err[128];
};

static void *wait_events(void *arg)
{
    struct waiter *w = arg;
    struct ibv_cq *ev_cq;
    void *ev_ctx;
    struct ibv_wc wc;

    while (w->got < w->want) {
        if (ibv_get_cq_event(w->ch, &ev_cq, &ev_ctx)) {
            snprintf(w->err, sizeof(w->err), "ibv_get_cq_event: %s", strerror(errno));
            return NULL;
        }
        if (ev_cq != w->cq || ev_ctx != (void *)w) {
            snprintf(w->err, sizeof(w->err), "event for CQ %p context %p", (void *)ev_cq, ev_ctx);
            return NULL;
        }
        w->events++;
        ibv_ack_cq_events(ev_cq, 1);
        if (ibv_req_notify_cq(ev_cq, 0)) {
            snprintf(w->err, sizeof(w->err), "req_notify");
            return NULL;
        }
        while (ibv_poll_cq(ev_cq, 1, &wc) == 1) {
            if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV) {
                snprintf(w->err, sizeof(w->err), "event CQ wc status %d opcode %d", wc.status,
                         wc.opcode);
                return NULL;
            }
            w->got++;
        }
    }
    return NULL;
}

static void check_threads(void)
{
    static char rbuf[64][32];
    struct waiter w;
    struct ibv_cq *busy = ibv_create_cq(ctx, 128, NULL, NULL, 0);
    struct ibv_qp *qa, *qb;
    struct ibv_mr *mr;
    struct ibv_wc wc;
    pthread_t th;
    int i, sent = 0;

    memset(&w, 0, sizeof(w));
    w.want = 50;
    w.ch = ibv_create_comp_channel(ctx);
    CHECK(w.ch && busy, "channel");
    w.cq = ibv_create_cq(ctx, 128, &w, w.ch, 0);
    CHECK(w.cq, "event cq");
    CHECK(!ibv_req_notify_cq(w.cq, 0), "req_notify");
    mr = ibv_reg_mr(pd, rbuf, sizeof(rbuf), IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr, "reg_mr");
    qa = make_qp(IBV_QPT_RC, busy, busy, NULL, 1);
    qb = make_qp(IBV_QPT_RC, busy, w.cq, NULL, 1);
    rc_connect(qa, qb->qp_num);
    rc_connect(qb, qa->qp_num);
    for (i = 0; i < 32; i++)
        post_recv(qb, NULL, i, rbuf[i], 32, mr->lkey);
    CHECK(!pthread_create(&th, NULL, wait_events, &w), "pthread_create");
    /* this thread busy-polls the send CQ and keeps at most 8 sends in flight */
    {
        double deadline = now() + 60.0;
        int done = 0, reposted = 32;
        while (done < w.want) {
            CHECK(now() < deadline, "threads: %d/%d sends done, %d received", done, w.want, w.got);
            if (sent < w.want && sent - done < 8 && sent < reposted) {
                post_send(qa, 0xE00 + sent, IBV_WR_SEND, "t", 2, 0, IBV_SEND_INLINE);
                sent++;
            }
            if (ibv_poll_cq(busy, 1, &wc) == 1) {
                CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 0xE00u + (unsigned)done,
                      "busy send wc %#llx status %d", (unsigned long long)wc.wr_id, wc.status);
                done++;
                if (reposted < w.want) {  /* the receiver needs more buffers */
                    post_recv(qb, NULL, reposted % 64, rbuf[reposted % 64], 32, mr->lkey);
                    reposted++;
                }
            }
        }
    }
    CHECK(!pthread_join(th, NULL), "join");
    CHECK(!w.err[0], "event thread: %s", w.err);
    CHECK(w.got == w.want && w.events >= 1, "event thread got %d, %d events", w.got, w.events);
    CHECK(!ibv_destroy_qp(qa) && !ibv_destroy_qp(qb) && !ibv_dereg_mr(mr)
          && !ibv_destroy_cq(busy) && !ibv_destroy_cq(w.cq)
          && !ibv_destroy_comp_channel(w.ch), "teardown");
    printf("ok: threads: %d receives through ibv_get_cq_event (%d events) while another "
           "thread busy-polled %d sends\n", w.got, w.events, w.want);
}

/* ---- XRC in one context: a domain without a file, an XRC SRQ, TGT and INI QPs; sends
 * name the SRQ by ibv_post_send (qp_type.xrc.remote_srqn) and by ibv_wr_set_xrc_srqn ---- */
static void check_xrc(void)
{
    static char rbuf[4][64];
    struct ibv_xrcd_init_attr xa;
    struct ibv_srq_init_attr_ex sa;
    struct ibv_qp_init_attr_ex qa;
    struct ibv_srq_init_attr basic;
    struct ibv_cq *scq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
    struct ibv_cq *rcq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
    struct ibv_srq *srq, *plain;
    struct ibv_xrcd *xrcd;
    struct ibv_qp *tgt, *ini;
    struct ibv_qp_ex *qpx;
    struct ibv_qp_attr a;
    struct ibv_mr *mr;
    struct ibv_sge sge;
    struct ibv_send_wr wr, *bad;
    struct ibv_wc wc;
    uint32_t srqn = 0, n2;
    char m1[8] = "xrc-pp", m2[8] = "xrc-wr";
    int i;

    CHECK(scq && rcq, "cqs");
    memset(&xa, 0, sizeof(xa));
    xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
    xa.fd = -1;
    xrcd = ibv_open_xrcd(ctx, &xa);
    CHECK(xrcd, "ibv_open_xrcd: %s", strerror(errno));
    mr = ibv_reg_mr(pd, rbuf, sizeof(rbuf), IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr, "reg_mr");
    memset(&sa, 0, sizeof(sa));
    sa.attr.max_wr = 8;
    sa.attr.max_sge = 1;
    sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ
                   | IBV_SRQ_INIT_ATTR_PD;
    sa.srq_type = IBV_SRQT_XRC;
    sa.xrcd = xrcd;
    sa.cq = rcq;
    sa.pd = pd;
    srq = ibv_create_srq_ex(ctx, &sa);
    CHECK(srq, "ibv_create_srq_ex(XRC): %s", strerror(errno));
    CHECK(!ibv_get_srq_num(srq, &srqn) && srqn, "ibv_get_srq_num");
    memset(&basic, 0, sizeof(basic));
    basic.attr.max_wr = 2;
    basic.attr.max_sge = 1;
    plain = ibv_create_srq(pd, &basic);
    CHECK(plain && ibv_get_srq_num(plain, &n2) == EOPNOTSUPP,
          "ibv_get_srq_num of a basic SRQ: want EOPNOTSUPP");
    memset(&qa, 0, sizeof(qa));
    qa.qp_type = IBV_QPT_XRC_RECV;
    qa.comp_mask = IBV_QP_INIT_ATTR_XRCD;
    qa.xrcd = xrcd;
    tgt = ibv_create_qp_ex(ctx, &qa);
    CHECK(tgt, "TGT QP: %s", strerror(errno));
    memset(&qa, 0, sizeof(qa));
    qa.qp_type = IBV_QPT_XRC_SEND;
    qa.send_cq = scq;
    qa.cap.max_send_wr = 8;
    qa.cap.max_send_sge = 1;
    qa.cap.max_inline_data = 64;
    qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    qa.pd = pd;
    qa.send_ops_flags = IBV_QP_EX_WITH_SEND;
    ini = ibv_create_qp_ex(ctx, &qa);
    CHECK(ini, "INI QP: %s", strerror(errno));
    /* TGT: INIT, RTR, RTS; INI: INIT, RTR, RTS (as ibv_xsrq_pingpong) */
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    CHECK(!ibv_modify_qp(tgt, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT
                         | IBV_QP_ACCESS_FLAGS), "TGT INIT");
    CHECK(!ibv_modify_qp(ini, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT
                         | IBV_QP_ACCESS_FLAGS), "INI INIT");
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.min_rnr_timer = 1;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = gid;
    a.ah_attr.grh.hop_limit = 1;
    a.ah_attr.port_num = 1;
    a.dest_qp_num = ini->qp_num;
    CHECK(!ibv_modify_qp(tgt, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN
                         | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
          "TGT RTR");
    a.dest_qp_num = tgt->qp_num;
    CHECK(!ibv_modify_qp(ini, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN
                         | IBV_QP_RQ_PSN), "INI RTR");
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    CHECK(!ibv_modify_qp(tgt, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN), "TGT RTS");
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    CHECK(!ibv_modify_qp(ini, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN
                         | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC), "INI RTS");
    for (i = 0; i < 2; i++)
        post_recv(NULL, srq, 0xF00 + i, rbuf[i], 64, mr->lkey);
    /* by ibv_post_send */
    sge.addr = (uintptr_t)m1; sge.length = 7; sge.lkey = 0;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = 0xF10;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
    wr.qp_type.xrc.remote_srqn = srqn;
    CHECK(!ibv_post_send(ini, &wr, &bad), "XRC post_send");
    /* by the ibv_wr_* API */
    qpx = ibv_qp_to_qp_ex(ini);
    CHECK(qpx, "ibv_qp_to_qp_ex");
    ibv_wr_start(qpx);
    qpx->wr_id = 0xF11;
    qpx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_send(qpx);
    ibv_wr_set_xrc_srqn(qpx, srqn);
    ibv_wr_set_inline_data(qpx, m2, 7);
    CHECK(!ibv_wr_complete(qpx), "ibv_wr_complete (XRC)");
    for (i = 0; i < 2; i++) {
        wait_wc(rcq, &wc, "XRC receive", WC_WAIT_S);
        CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV
              && wc.wr_id == 0xF00u + (unsigned)i && wc.byte_len == 7
              && wc.qp_num == tgt->qp_num && !strcmp(rbuf[i], i ? "xrc-wr" : "xrc-pp"),
              "XRC recv %d: status %s wr_id %#llx qp %#x (TGT %#x) data '%s'", i,
              ibv_wc_status_str(wc.status), (unsigned long long)wc.wr_id, wc.qp_num,
              tgt->qp_num, rbuf[i]);
        wait_wc(scq, &wc, "XRC send", WC_WAIT_S);
        CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 0xF10u + (unsigned)i
              && wc.qp_num == ini->qp_num, "XRC send %d wc", i);
    }
    CHECK(!ibv_destroy_qp(ini) && !ibv_destroy_qp(tgt) && !ibv_destroy_srq(srq)
          && !ibv_destroy_srq(plain) && !ibv_close_xrcd(xrcd) && !ibv_dereg_mr(mr)
          && !ibv_destroy_cq(scq) && !ibv_destroy_cq(rcq), "teardown");
    printf("ok: XRC: SRQ %#x receives from an INI QP by ibv_post_send and by "
           "ibv_wr_set_xrc_srqn, completions name the TGT QP; a basic SRQ has no number\n",
           srqn);
}

/* ---- error completions: a message longer than the receive buffer (IBA 9.9.3.1) ---- */
static void check_error_completions(void)
{
    static char small[4];
    struct ibv_cq *scq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
    struct ibv_cq *rcq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
    struct ibv_qp *qa, *qb;
    struct ibv_mr *mr;
    struct ibv_wc wc;

    CHECK(scq && rcq, "cqs");
    mr = ibv_reg_mr(pd, small, sizeof(small), IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr, "reg_mr");
    qa = make_qp(IBV_QPT_RC, scq, scq, NULL, 1);
    qb = make_qp(IBV_QPT_RC, rcq, rcq, NULL, 1);
    rc_connect(qa, qb->qp_num);
    rc_connect(qb, qa->qp_num);
    post_recv(qb, NULL, 0x1B0, small, sizeof(small), mr->lkey);
    post_recv(qb, NULL, 0x1B1, small, sizeof(small), mr->lkey);
    post_send(qa, 0x1A0, IBV_WR_SEND, "sixteen-bytes!!", 16, 0, IBV_SEND_INLINE);
    post_send(qa, 0x1A1, IBV_WR_SEND, "x", 2, 0, IBV_SEND_INLINE);
    wait_wc(rcq, &wc, "too long a message", WC_WAIT_S);
    CHECK(wc.status == IBV_WC_LOC_LEN_ERR && wc.wr_id == 0x1B0 && wc.qp_num == qb->qp_num,
          "responder: status %s wr_id %#llx qp %#x", ibv_wc_status_str(wc.status),
          (unsigned long long)wc.wr_id, wc.qp_num);
    wait_wc(scq, &wc, "the NAKed send", WC_WAIT_S);
    CHECK(wc.status == IBV_WC_REM_INV_REQ_ERR && wc.wr_id == 0x1A0 && wc.qp_num == qa->qp_num,
          "requester: status %s wr_id %#llx", ibv_wc_status_str(wc.status),
          (unsigned long long)wc.wr_id);
    wait_wc(scq, &wc, "the send behind it", WC_WAIT_S);
    CHECK(wc.status == IBV_WC_WR_FLUSH_ERR && wc.wr_id == 0x1A1, "requester flush: %s",
          ibv_wc_status_str(wc.status));
    wait_wc(rcq, &wc, "the receive behind it", WC_WAIT_S);
    CHECK(wc.status == IBV_WC_WR_FLUSH_ERR && wc.wr_id == 0x1B1, "responder flush: %s",
          ibv_wc_status_str(wc.status));
    CHECK(!ibv_destroy_qp(qa) && !ibv_destroy_qp(qb) && !ibv_dereg_mr(mr)
          && !ibv_destroy_cq(scq) && !ibv_destroy_cq(rcq), "teardown");
    printf("ok: a message longer than the receive buffer: local length error (responder), "
           "remote invalid request error (requester), then flush errors on both\n");
}

/* ---- ibv_post_recv's rules, which the C receive ring keeps (IBA 11.4.1.2) ---- */
/* one one-SGE receive posted to srq, or to qp when srq is NULL: the verb's return value */
static int post_rq_ret(struct ibv_qp *qp, struct ibv_srq *srq, uint64_t wr_id, void *buf,
                       uint32_t len, uint32_t lkey, struct ibv_recv_wr **bad)
{
    struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = len, .lkey = lkey };
    struct ibv_recv_wr wr;

    memset(&wr, 0, sizeof(wr));
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    *bad = NULL;
    return srq ? ibv_post_srq_recv(srq, &wr, bad) : ibv_post_recv(qp, &wr, bad);
}

static void to_state(struct ibv_qp *qp, enum ibv_qp_state state)
{
    struct ibv_qp_attr a;

    memset(&a, 0, sizeof(a));
    a.qp_state = state;
    a.port_num = 1;
    CHECK(!ibv_modify_qp(qp, &a, state == IBV_QPS_INIT
                         ? IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS
                         : IBV_QP_STATE), "modify to state %d", state);
}

static void check_recv_ring(void)
{
    enum { DEPTH = 32, SLOT = 64 };
    static char rbuf[DEPTH + 8][SLOT], sbuf[DEPTH][SLOT];
    struct ibv_cq *scq = ibv_create_cq(ctx, 2 * DEPTH, NULL, NULL, 0);
    struct ibv_cq *rcq = ibv_create_cq(ctx, 2 * DEPTH, NULL, NULL, 0);
    struct ibv_sge two[2];
    struct ibv_recv_wr chain[3], *bad;
    uint64_t want[DEPTH];
    struct ibv_qp *qa, *qb;
    struct ibv_mr *mr;
    struct ibv_wc wc;
    int i, n = 0, ret;

    CHECK(scq && rcq, "cqs");
    mr = ibv_reg_mr(pd, rbuf, sizeof(rbuf), IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr, "reg_mr");
    qa = make_qp(IBV_QPT_RC, scq, scq, NULL, 1);
    qb = make_qp(IBV_QPT_RC, rcq, rcq, NULL, 1);
    ret = post_rq_ret(qb, NULL, 0xC0, rbuf[0], SLOT, mr->lkey, &bad);
    CHECK(ret == EINVAL && bad, "post_recv in RESET: %d, want EINVAL", ret);
    rc_connect(qa, qb->qp_num);
    rc_connect(qb, qa->qp_num);
    for (i = 0; i < DEPTH; i++)  /* one call each, as ibv_rc_pingpong fills its queue */
        CHECK(!post_rq_ret(qb, NULL, 0xC00 + (unsigned)i, rbuf[i], SLOT, mr->lkey, &bad),
              "post_recv %d of %d", i + 1, DEPTH);
    ret = post_rq_ret(qb, NULL, 0xCFF, rbuf[0], SLOT, mr->lkey, &bad);
    CHECK(ret == ENOMEM && bad, "post_recv beyond max_recv_wr: %d, want ENOMEM", ret);
    for (i = 0; i < 12; i++) {  /* 12 messages take the first 12 receives, in order */
        snprintf(sbuf[i], SLOT, "message %d for the ring", i);
        post_send(qa, 0xA00 + (unsigned)i, IBV_WR_SEND, sbuf[i], SLOT, 0, IBV_SEND_INLINE);
    }
    for (i = 0; i < 12; i++) {
        wait_wc(rcq, &wc, "a receive from the ring", WC_WAIT_S);
        CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 0xC00u + (unsigned)i
              && wc.opcode == IBV_WC_RECV && wc.byte_len == SLOT && wc.qp_num == qb->qp_num,
              "receive %d: status %s wr_id %#llx byte_len %u", i, ibv_wc_status_str(wc.status),
              (unsigned long long)wc.wr_id, wc.byte_len);
        CHECK(!memcmp(rbuf[i], sbuf[i], SLOT), "receive %d: data", i);
        wait_wc(scq, &wc, "a send", WC_WAIT_S);
        CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 0xA00u + (unsigned)i, "send %d", i);
    }
    for (i = 0; i < DEPTH - 12; i++)
        want[n++] = 0xC00u + 12 + (unsigned)i;
    /* refill: exactly 12 more fit (9 one call each, then a chain of 3), then ENOMEM */
    for (i = 0; i < 9; i++) {
        CHECK(!post_rq_ret(qb, NULL, 0xD00 + (unsigned)i, rbuf[DEPTH + (i % 8)], SLOT, mr->lkey,
                             &bad), "refill %d", i);
        want[n++] = 0xD00u + (unsigned)i;
    }
    /* a chain of three, the middle one with two SGEs (not stored in the ring) */
    memset(chain, 0, sizeof(chain));
    two[0] = (struct ibv_sge){ (uintptr_t)rbuf[DEPTH], 16, mr->lkey };
    two[1] = (struct ibv_sge){ (uintptr_t)rbuf[DEPTH + 1], 16, mr->lkey };
    for (i = 0; i < 3; i++) {
        chain[i].wr_id = 0xE00u + (unsigned)i;
        chain[i].next = i < 2 ? &chain[i + 1] : NULL;
        chain[i].sg_list = i == 1 ? two : &two[0];
        chain[i].num_sge = i == 1 ? 2 : 1;
        want[n++] = chain[i].wr_id;
    }
    CHECK(!ibv_post_recv(qb, chain, &bad), "a chain of three receives");
    ret = post_rq_ret(qb, NULL, 0xCFE, rbuf[0], SLOT, mr->lkey, &bad);
    CHECK(ret == ENOMEM && bad, "post_recv beyond max_recv_wr after a refill: %d", ret);
    CHECK(n == DEPTH, "bookkeeping");
    /* ERR flushes every receive, in posting order; one posted in ERR is flushed at once */
    to_state(qb, IBV_QPS_ERR);
    for (i = 0; i < DEPTH; i++) {
        wait_wc(rcq, &wc, "a flushed receive", WC_WAIT_S);
        CHECK(wc.status == IBV_WC_WR_FLUSH_ERR && wc.wr_id == want[i] && wc.qp_num == qb->qp_num,
              "flush %d: status %s wr_id %#llx, want %#llx", i, ibv_wc_status_str(wc.status),
              (unsigned long long)wc.wr_id, (unsigned long long)want[i]);
    }
    CHECK(!post_rq_ret(qb, NULL, 0xF00, rbuf[0], SLOT, mr->lkey, &bad), "post_recv in ERR");
    wait_wc(rcq, &wc, "a receive posted in ERR", WC_WAIT_S);
    CHECK(wc.status == IBV_WC_WR_FLUSH_ERR && wc.wr_id == 0xF00, "posted in ERR: %s %#llx",
          ibv_wc_status_str(wc.status), (unsigned long long)wc.wr_id);
    expect_empty(rcq, "the receive queue in ERR");
    /* RESET empties the queue and refuses posts again; INIT takes them */
    to_state(qb, IBV_QPS_RESET);
    ret = post_rq_ret(qb, NULL, 0xF01, rbuf[0], SLOT, mr->lkey, &bad);
    CHECK(ret == EINVAL, "post_recv in RESET after ERR: %d, want EINVAL", ret);
    to_state(qb, IBV_QPS_INIT);
    for (i = 0; i < DEPTH; i++)
        CHECK(!post_rq_ret(qb, NULL, 0xF10 + (unsigned)i, rbuf[i], SLOT, mr->lkey, &bad),
              "post_recv %d in INIT", i);
    ret = post_rq_ret(qb, NULL, 0xF0F, rbuf[0], SLOT, mr->lkey, &bad);
    CHECK(ret == ENOMEM, "post_recv beyond max_recv_wr in INIT: %d", ret);
    to_state(qb, IBV_QPS_ERR);
    for (i = 0; i < DEPTH; i++) {
        wait_wc(rcq, &wc, "a flushed receive", WC_WAIT_S);
        CHECK(wc.status == IBV_WC_WR_FLUSH_ERR && wc.wr_id == 0xF10u + (unsigned)i,
              "flush after INIT %d: %#llx", i, (unsigned long long)wc.wr_id);
    }
    CHECK(!ibv_destroy_qp(qa) && !ibv_destroy_qp(qb) && !ibv_dereg_mr(mr)
          && !ibv_destroy_cq(scq) && !ibv_destroy_cq(rcq), "teardown");
    printf("ok: post_recv: EINVAL in RESET, ENOMEM past max_recv_wr (also after a refill), "
           "data and completions in posting order, flushed in order in ERR\n");
}

/* ---- ibv_post_srq_recv's rules, which the SRQ's C ring keeps (IBA 10.2.9, 11.4.1.2) ---- */
/* send slot i from qa[i % 2] and take its receive: the SRQ's next WQE, want_id */
static void srq_message(struct ibv_qp **qa, struct ibv_qp **qb, struct ibv_cq *scq,
                        struct ibv_cq *rcq, char (*rbuf)[64], int i, uint64_t want_id)
{
    char msg[64];
    struct ibv_wc wc;

    memset(msg, 0, sizeof(msg));
    snprintf(msg, sizeof(msg), "srq ring message %d", i);
    post_send(qa[i % 2], 0x700 + (unsigned)i, IBV_WR_SEND, msg, sizeof(msg), 0,
              IBV_SEND_SIGNALED | IBV_SEND_INLINE);
    wait_wc(rcq, &wc, "a receive from the SRQ", WC_WAIT_S);
    CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == want_id && wc.opcode == IBV_WC_RECV
          && wc.byte_len == sizeof(msg) && wc.qp_num == qb[i % 2]->qp_num,
          "srq message %d: status %s wr_id %#llx (want %#llx) qp %#x", i,
          ibv_wc_status_str(wc.status), (unsigned long long)wc.wr_id,
          (unsigned long long)want_id, wc.qp_num);
    if (want_id >= 0x500 && want_id < 0x500 + 16)
        CHECK(!memcmp(rbuf[want_id - 0x500], msg, sizeof(msg)), "srq message %d: data", i);
    wait_wc(scq, &wc, "a send to the SRQ", WC_WAIT_S);
    CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 0x700u + (unsigned)i, "srq send %d", i);
}

static void check_srq_ring(void)
{
    enum { DEPTH = 16 };
    static char rbuf[DEPTH][64];
    struct ibv_cq *scq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
    struct ibv_cq *rcq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
    struct ibv_srq_init_attr sa;
    struct ibv_srq_attr attr;
    struct ibv_async_event ev;
    struct ibv_recv_wr chain[3], *bad;
    struct ibv_sge two[2], one;
    struct ibv_qp *qa[2], *qb[2];
    struct ibv_srq *srq;
    struct ibv_mr *mr;
    struct pollfd pfd;
    uint64_t want[64];
    int i, k, n = 0, got = 0, ret, flags;

    CHECK(scq && rcq, "cqs");
    memset(&sa, 0, sizeof(sa));
    sa.attr.max_wr = DEPTH;
    sa.attr.max_sge = 2;
    srq = ibv_create_srq(pd, &sa);
    CHECK(srq, "ibv_create_srq: %s", strerror(errno));
    mr = ibv_reg_mr(pd, rbuf, sizeof(rbuf), IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr, "reg_mr");
    for (i = 0; i < 2; i++) {  /* two QPs take receives from the one SRQ */
        qa[i] = make_qp(IBV_QPT_RC, scq, scq, NULL, 0);
        qb[i] = make_qp(IBV_QPT_RC, rcq, rcq, srq, 0);
        rc_connect(qa[i], qb[i]->qp_num);
        rc_connect(qb[i], qa[i]->qp_num);
    }
    for (i = 0; i < DEPTH; i++) {  /* one call each: the first through Python, then the ring */
        CHECK(!post_rq_ret(NULL, srq, 0x500 + (unsigned)i, rbuf[i], 64, mr->lkey, &bad),
              "post_srq_recv %d of %d", i + 1, DEPTH);
        want[n++] = 0x500u + (unsigned)i;
    }
    /* a resize below the WQEs queued is refused: 15 of the 16 wait in the ring */
    memset(&attr, 0, sizeof(attr));
    attr.max_wr = DEPTH / 2;
    ret = ibv_modify_srq(srq, &attr, IBV_SRQ_MAX_WR);
    CHECK(ret == EINVAL, "ibv_modify_srq(max_wr %d) with %d queued: %d, want EINVAL", DEPTH / 2,
          DEPTH, ret);
    ret = post_rq_ret(NULL, srq, 0x5FF, rbuf[0], 64, mr->lkey, &bad);
    CHECK(ret == ENOMEM && bad, "post_srq_recv beyond max_wr: %d, want ENOMEM", ret);
    for (k = 0; k < 6; k++, got++)  /* both QPs take the SRQ's WQEs in posting order */
        srq_message(qa, qb, scq, rcq, rbuf, k, want[got]);
    /* refill: a chain of three, the middle one with two SGEs (not stored in the ring) */
    memset(chain, 0, sizeof(chain));
    two[0] = (struct ibv_sge){ (uintptr_t)rbuf[0], 32, mr->lkey };
    two[1] = (struct ibv_sge){ (uintptr_t)rbuf[0] + 32, 32, mr->lkey };
    one = (struct ibv_sge){ (uintptr_t)rbuf[0], 64, mr->lkey };
    for (i = 0; i < 3; i++) {
        chain[i].wr_id = 0x600u + (unsigned)i;
        chain[i].next = i < 2 ? &chain[i + 1] : NULL;
        chain[i].sg_list = i == 1 ? two : &one;
        chain[i].num_sge = i == 1 ? 2 : 1;
        want[n++] = chain[i].wr_id;
    }
    CHECK(!ibv_post_srq_recv(srq, chain, &bad), "a chain of three SRQ receives");
    for (i = 0; i < 3; i++) {  /* these three wait in the ring */
        CHECK(!post_rq_ret(NULL, srq, 0x610 + (unsigned)i, rbuf[0], 64, mr->lkey, &bad), "refill %d", i);
        want[n++] = 0x610u + (unsigned)i;
    }
    /* arm a limit of 4 with 16 queued (3 in the ring): the event comes exactly when the
     * level drops to 3; two receives posted while it is armed count too */
    flags = fcntl(ctx->async_fd, F_GETFL);
    CHECK(flags >= 0 && fcntl(ctx->async_fd, F_SETFL, flags | O_NONBLOCK) == 0, "O_NONBLOCK");
    memset(&attr, 0, sizeof(attr));
    attr.srq_limit = 4;
    CHECK(!ibv_modify_srq(srq, &attr, IBV_SRQ_LIMIT), "ibv_modify_srq(srq_limit 4)");
    ret = post_rq_ret(NULL, srq, 0x5FE, rbuf[0], 64, mr->lkey, &bad);
    CHECK(ret == ENOMEM && bad, "post_srq_recv beyond max_wr after a refill: %d", ret);
    for (i = 0; got < n - 4; k++, got++, i++) {
        srq_message(qa, qb, scq, rcq, rbuf, k, want[got]);
        errno = 0;
        CHECK(ibv_get_async_event(ctx, &ev) == -1 && errno == EAGAIN,
              "an async event (%d) with %d WQEs queued, limit 4", ev.event_type, n - got - 1);
        if (i == 5 || i == 6) {  /* with room: the first would reopen the ring */
            CHECK(!post_rq_ret(NULL, srq, 0x618 + (unsigned)i, rbuf[2], 64, mr->lkey, &bad),
                  "post while the limit is armed %d", i);
            want[n++] = 0x618u + (unsigned)i;
        }
    }
    srq_message(qa, qb, scq, rcq, rbuf, k++, want[got++]);  /* the level drops to 3 */
    pfd.fd = ctx->async_fd;
    pfd.events = POLLIN;
    CHECK(poll(&pfd, 1, 30000) == 1, "no SRQ_LIMIT_REACHED at level 3");
    CHECK(!ibv_get_async_event(ctx, &ev) && ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED
          && ev.element.srq == srq, "async event %d, want SRQ_LIMIT_REACHED", ev.event_type);
    ibv_ack_async_event(&ev);
    CHECK(fcntl(ctx->async_fd, F_SETFL, flags) == 0, "restore flags");
    memset(&attr, 0, sizeof(attr));
    CHECK(!ibv_query_srq(srq, &attr) && attr.srq_limit == 0, "limit not disarmed: %u",
          attr.srq_limit);
    /* disarmed: posts reach the ring again; the last three WQEs, then these, in order */
    for (i = 0; i < 4; i++) {
        CHECK(!post_rq_ret(NULL, srq, 0x620 + (unsigned)i, rbuf[1 + i], 64, mr->lkey, &bad),
              "post after the limit %d", i);
        want[n++] = 0x620u + (unsigned)i;
    }
    while (got < n)
        srq_message(qa, qb, scq, rcq, rbuf, k++, want[got++]);
    expect_empty(rcq, "the SRQ, emptied");
    /* destroyed with receives in its ring */
    for (i = 0; i < 4; i++)
        CHECK(!post_rq_ret(NULL, srq, 0x630 + (unsigned)i, rbuf[i], 64, mr->lkey, &bad), "last %d", i);
    for (i = 0; i < 2; i++)
        CHECK(!ibv_destroy_qp(qa[i]) && !ibv_destroy_qp(qb[i]), "destroy QPs %d", i);
    CHECK(!ibv_destroy_srq(srq) && !ibv_dereg_mr(mr) && !ibv_destroy_cq(scq)
          && !ibv_destroy_cq(rcq), "teardown");
    printf("ok: post_srq_recv: ENOMEM past max_wr (also after a refill), a resize below the "
           "queued WQEs refused, two QPs take them in posting order, the limit event exactly "
           "at its level\n");
}

/* ---- verbs softrdma does not serve fail the libibverbs way (NULL + errno), no crash ---- */
/* ---- thread and parent domains: a parent domain's allocators make the C rings of the CQ
 * made with it and of its QP's and SRQ's receive queues; traffic on them; the counts that
 * keep a PD, TD or parent domain in use ---- */
struct pd_allocs { int allocs, frees, defaults; uint64_t types[8]; size_t sizes[8]; };

static void *pd_alloc(struct ibv_pd *d, void *context, size_t size, size_t alignment,
                      uint64_t type)
{
    struct pd_allocs *a = context;
    void *p = NULL;

    (void)d;
    if (a->defaults)  /* the allocator that leaves it to the provider */
        return IBV_ALLOCATOR_USE_DEFAULT;
    CHECK(a->allocs < 8 && alignment >= 8 && !(alignment & (alignment - 1)),
          "pd_alloc: %d allocs, alignment %zu", a->allocs, alignment);
    CHECK(!posix_memalign(&p, alignment, size), "posix_memalign");
    memset(p, 0xa5, size);  /* the provider must clear what it needs cleared */
    a->types[a->allocs] = type;
    a->sizes[a->allocs++] = size;
    return p;
}

static void pd_free(struct ibv_pd *d, void *context, void *ptr, uint64_t type)
{
    struct pd_allocs *a = context;

    (void)d;
    (void)type;
    CHECK(!a->defaults, "pd_free of a buffer the provider allocated itself");
    a->frees++;
    free(ptr);
}

static void parent_domain_traffic(struct pd_allocs *a)
{
    struct ibv_td_init_attr tda = { .comp_mask = 0 };
    struct ibv_parent_domain_init_attr pa;
    struct ibv_cq_init_attr_ex ca;
    struct ibv_srq_init_attr sa;
    struct ibv_qp_init_attr qa;
    struct ibv_td *td = ibv_alloc_td(ctx, &tda);
    struct ibv_pd *dom;
    struct ibv_cq_ex *cqx;
    struct ibv_cq *cq;
    struct ibv_srq *srq;
    struct ibv_qp *q1, *q2;
    struct ibv_mr *mr;
    struct ibv_wc wc;
    char buf[256];
    int i;

    CHECK(td && td->context == ctx, "ibv_alloc_td: %s", strerror(errno));
    memset(&pa, 0, sizeof(pa));
    pa.pd = pd;
    pa.td = td;
    pa.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
    pa.alloc = pd_alloc;
    pa.free = pd_free;
    pa.pd_context = a;
    dom = ibv_alloc_parent_domain(ctx, &pa);
    CHECK(dom && dom->context == ctx, "ibv_alloc_parent_domain: %s", strerror(errno));
    memset(&ca, 0, sizeof(ca));
    ca.cqe = 64;
    ca.wc_flags = IBV_WC_STANDARD_FLAGS;
    ca.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
    ca.parent_domain = dom;
    cqx = ibv_create_cq_ex(ctx, &ca);
    CHECK(cqx, "ibv_create_cq_ex with a parent domain: %s", strerror(errno));
    cq = ibv_cq_ex_to_cq(cqx);
    memset(&sa, 0, sizeof(sa));
    sa.attr.max_wr = 16;
    sa.attr.max_sge = 1;
    srq = ibv_create_srq(dom, &sa);
    CHECK(srq && srq->pd == dom, "ibv_create_srq on a parent domain: %s", strerror(errno));
    memset(&qa, 0, sizeof(qa));
    qa.send_cq = qa.recv_cq = cq;
    qa.qp_type = IBV_QPT_RC;
    qa.cap.max_send_wr = qa.cap.max_recv_wr = 16;
    qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
    q1 = ibv_create_qp(dom, &qa);  /* its own receive queue */
    qa.srq = srq;
    q2 = ibv_create_qp(dom, &qa);  /* receives from the SRQ */
    CHECK(q1 && q2 && q1->pd == dom, "ibv_create_qp on a parent domain: %s", strerror(errno));
    mr = ibv_reg_mr(dom, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr && mr->pd == dom, "ibv_reg_mr on a parent domain: %s", strerror(errno));
    CHECK(ibv_dealloc_pd(pd) == EBUSY && ibv_dealloc_td(td) == EBUSY
          && ibv_dealloc_pd(dom) == EBUSY, "a PD, TD or parent domain in use was freed");
    rc_connect(q1, q2->qp_num);
    rc_connect(q2, q1->qp_num);
    for (i = 0; i < 3; i++) {  /* q1 -> q2 (the SRQ), q2 -> q1 (q1's own queue) */
        struct ibv_qp *to = i % 2 ? q1 : q2;
        memset(buf + 128, 0, 64);
        snprintf(buf, 64, "parent domain message %d", i);
        post_recv(to, i % 2 ? NULL : srq, 100 + (uint64_t)i, buf + 128, 64, mr->lkey);
        post_send(i % 2 ? q2 : q1, 200 + (uint64_t)i, IBV_WR_SEND, buf, 32, mr->lkey,
                  IBV_SEND_SIGNALED);
        for (int got = 0; got < 2; got++) {
            wait_wc(cq, &wc, "parent domain traffic", WC_WAIT_S);
            CHECK(wc.status == IBV_WC_SUCCESS, "parent domain: %s", ibv_wc_status_str(wc.status));
            if (wc.opcode == IBV_WC_RECV)
                CHECK(wc.wr_id == 100 + (uint64_t)i && wc.byte_len == 32 && wc.qp_num == to->qp_num
                      && !strcmp(buf + 128, buf), "parent domain receive %d: wr_id %llu len %u",
                      i, (unsigned long long)wc.wr_id, wc.byte_len);
            else
                CHECK(wc.wr_id == 200 + (uint64_t)i, "parent domain send %d", i);
        }
    }
    CHECK(!ibv_destroy_qp(q1) && !ibv_destroy_qp(q2) && !ibv_destroy_srq(srq)
          && !ibv_dereg_mr(mr) && !ibv_destroy_cq(cq), "parent domain objects' teardown");
    CHECK(!ibv_dealloc_pd(dom) && !ibv_dealloc_td(td), "ibv_dealloc_pd (parent), ibv_dealloc_td");
}

static void check_parent_domain(void)
{
    struct pd_allocs mine, defaults;
    uint64_t rxe = (uint64_t)RDMA_DRIVER_RXE << 32;
    struct ibv_parent_domain_init_attr bad;
    int cq = 0, rq = 0, srq = 0, i;

    memset(&mine, 0, sizeof(mine));
    parent_domain_traffic(&mine);
    for (i = 0; i < mine.allocs; i++) {
        cq += mine.types[i] == (rxe | 1) && mine.sizes[i] >= 64 * sizeof(struct ibv_wc);
        rq += mine.types[i] == (rxe | 2);
        srq += mine.types[i] == (rxe | 3);
    }
    CHECK(mine.allocs == 3 && cq == 1 && rq == 1 && srq == 1 && mine.frees == 3,
          "allocator: %d allocs (CQ %d, RQ %d, SRQ %d), %d frees", mine.allocs, cq, rq, srq,
          mine.frees);
    memset(&defaults, 0, sizeof(defaults));
    defaults.defaults = 1;
    parent_domain_traffic(&defaults);
    memset(&bad, 0, sizeof(bad));
    bad.pd = pd;
    bad.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS;  /* without the functions */
    errno = 0;
    CHECK(!ibv_alloc_parent_domain(ctx, &bad) && errno == EINVAL,
          "a parent domain with NULL allocators: errno %d", errno);
    printf("ok: a parent domain's allocators make the CQ, RQ and SRQ rings (USE_DEFAULT "
           "too); traffic on them; PD, TD and parent domain EBUSY while used\n");
}

static void check_unsupported(void)
{
    struct ibv_cq *cq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
    struct ibv_qp *qp;
    struct {
        struct ibv_flow_attr attr;
        struct ibv_flow_spec_eth eth;
    } flow;

    CHECK(cq, "cq");
    qp = make_qp(IBV_QPT_UD, cq, cq, NULL, 0);
    memset(&flow, 0, sizeof(flow));
    flow.attr.size = sizeof(flow);
    flow.attr.num_of_specs = 1;
    flow.attr.port = 1;
    flow.eth.type = IBV_FLOW_SPEC_ETH;
    flow.eth.size = sizeof(flow.eth);
    errno = 0;
    CHECK(!ibv_create_flow(qp, &flow.attr) && errno == EOPNOTSUPP, "ibv_create_flow: errno %d",
          errno);
    errno = 0;
    CHECK(!ibv_reg_dmabuf_mr(pd, 0, 4096, 0, -1, IBV_ACCESS_LOCAL_WRITE) && errno == EOPNOTSUPP,
          "ibv_reg_dmabuf_mr: errno %d", errno);
    CHECK(!ibv_destroy_qp(qp) && !ibv_destroy_cq(cq), "teardown");
    printf("ok: ibv_create_flow, ibv_reg_dmabuf_mr -> NULL, EOPNOTSUPP\n");
}

int main(int argc, char **argv)
{
    struct ibv_device **list;

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2)
        FAIL("usage: verbs_check DEVICE");
    CHECK(ibv_fork_init() == 0 && ibv_is_fork_initialized() == IBV_FORK_UNNEEDED,
          "ibv_fork_init");
    ctx = open_device(argv[1], &list);
    CHECK(!ibv_query_gid(ctx, 1, 0, &gid), "ibv_query_gid");
    pd = ibv_alloc_pd(ctx);
    CHECK(pd, "pd");
    check_async_fd_srq_limit();
    check_ud_grh();
    check_unsignaled_inline();
    check_cq_ex();
    check_resize_rereg();
    check_device_ex_dm();
    check_threads();
    check_xrc();
    check_error_completions();
    check_recv_ring();
    check_srq_ring();
    check_parent_domain();
    check_unsupported();
    CHECK(!ibv_dealloc_pd(pd) && !ibv_close_device(ctx), "close");
    ibv_free_device_list(list);
    printf("ok: teardown\n");
    return 0;
}
