/* A libibverbs program for tests/test_capi_verbs.py, run under `softrdma run`.
 *
 *   wc_check DEVICE          checks: completion fields of a SEND with immediate whose
 *                            inline data comes from an unregistered buffer, an error
 *                            completion (RDMA WRITE to a bad R_Key), errors the libibverbs
 *                            way (NULL + errno). Prints "ok: ..." lines, exits 0 when all pass.
 *   wc_check DEVICE fork     forks first: the child opens the device anew and uses it,
 *                            its inherited QP fails without hanging; then the checks.
 *   wc_check DEVICE bench [POLLS]
 *                            prints the cost of an empty ibv_poll_cq (the mean of POLLS,
 *                            default 1000000), of one ibv_post_recv (the mean of 4000,
 *                            one call each) and of one SEND + completions round on a
 *                            loopback RC pair (wall time, and CPU time: the thread's for
 *                            a poll or a post, the process's for a round).
 *   wc_check DEVICE hops     busy-polls 400 loopback SEND rounds and prints
 *                            "hops_nvcsw N rounds R": the voluntary context switches of
 *                            the process's other threads (softrdma's progress thread)
 *                            meanwhile. A poller that receives itself needs no hand-off.
 *   wc_check DEVICE hopsx    the same with extended CQs (ibv_create_cq_ex), polled with
 *                            ibv_start_poll/ibv_end_poll.
 */
#include "common.h"
#include <arpa/inet.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <dirent.h>
#include <unistd.h>

/* this thread's CPU time: what a poll costs, whatever else the machine runs */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* the process's CPU time, all its threads */
static double proc_cpu(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* the voluntary context switches of every thread of the process but the calling one */
static long others_nvcsw(void)
{
    char path[300], line[128];
    struct dirent *d;
    long total = 0, v;
    DIR *dir = opendir("/proc/self/task");
    pid_t self = (pid_t)syscall(SYS_gettid);
    FILE *f;

    if (!dir)
        FAIL("opendir /proc/self/task");
    while ((d = readdir(dir)) != NULL) {
        if (d->d_name[0] == '.' || atoi(d->d_name) == self)
            continue;
        snprintf(path, sizeof(path), "/proc/self/task/%s/status", d->d_name);
        if (!(f = fopen(path, "r")))
            continue;  /* the thread ended */
        while (fgets(line, sizeof(line), f))
            if (sscanf(line, "voluntary_ctxt_switches: %ld", &v) == 1)
                total += v;
        fclose(f);
    }
    closedir(dir);
    return total;
}

/* the extended CQ's way: ibv_start_poll until a completion, one read, ibv_end_poll */
static void wait_wcx(struct ibv_cq_ex *cqx, enum ibv_wc_opcode want, const char *what)
{
    struct ibv_poll_cq_attr pa = { .comp_mask = 0 };
    double deadline = now() + 20.0;
    int ret;
    while ((ret = ibv_start_poll(cqx, &pa)) == ENOENT)
        if (now() > deadline)
            FAIL("no completion for %s", what);
    if (ret)
        FAIL("ibv_start_poll failed for %s: %d", what, ret);
    if (cqx->status != IBV_WC_SUCCESS || ibv_wc_read_opcode(cqx) != want)
        FAIL("%s: status %d opcode %d", what, cqx->status, ibv_wc_read_opcode(cqx));
    ibv_end_poll(cqx);
}

/* the loopback pair's QPs: RDMA WRITE allowed (the bad R_Key check) */
static void to_rts(struct ibv_qp *qp, uint32_t dest, union ibv_gid *gid)
{
    rc_to_rts(qp, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, dest, gid, 12, 7);
}

/* bench: the cost of one ibv_post_recv, posted one call each (as ibv_rc_pingpong refills
 * its queue) on a QP of its own in INIT, then destroyed */
static void post_recv_cost(struct ibv_pd *pd, struct ibv_cq *cq, char *buf, uint32_t lkey)
{
    enum { N = 4000 };
    struct ibv_qp_init_attr init;
    struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 64, .lkey = lkey };
    struct ibv_recv_wr wr, *bad;
    struct ibv_qp_attr a;
    struct ibv_qp *qp;
    double t0, c0;
    int i;

    memset(&init, 0, sizeof(init));
    init.send_cq = init.recv_cq = cq;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = 1;
    init.cap.max_recv_wr = N;
    init.cap.max_send_sge = init.cap.max_recv_sge = 1;
    qp = ibv_create_qp(pd, &init);
    if (!qp)
        FAIL("post_recv bench QP: %s", strerror(errno));
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        FAIL("post_recv bench QP INIT");
    memset(&wr, 0, sizeof(wr));
    wr.sg_list = &sge;
    wr.num_sge = 1;
    t0 = now();
    c0 = cpu_now();
    for (i = 0; i < N; i++) {
        wr.wr_id = (uint64_t)i;
        if (ibv_post_recv(qp, &wr, &bad))
            FAIL("post_recv %d of %d", i + 1, N);
    }
    printf("post_recv_ns %.1f\n", (now() - t0) / N * 1e9);
    printf("post_recv_cpu_ns %.1f\n", (cpu_now() - c0) / N * 1e9);
    if (ibv_destroy_qp(qp))  /* its receives go with it, no completion */
        FAIL("post_recv bench QP destroy");
}

int main(int argc, char **argv)
{
    struct ibv_device **list;
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *cqa, *cqb;
    struct ibv_qp *qa, *qb;
    struct ibv_mr *mr;
    struct ibv_wc wc;
    struct ibv_sge sge;
    struct ibv_send_wr swr, *bad_s;
    struct ibv_recv_wr rwr, *bad_r;
    union ibv_gid gid;
    static char buf[4096];
    char msg[64];
    int i, bench = argc > 2 && !strcmp(argv[2], "bench");
    int forking = argc > 2 && !strcmp(argv[2], "fork");
    int hopsx = argc > 2 && !strcmp(argv[2], "hopsx");
    int hops = hopsx || (argc > 2 && !strcmp(argv[2], "hops"));
    struct ibv_cq_ex *cqxa = NULL, *cqxb = NULL;

    if (argc < 2)
        FAIL("usage: wc_check DEVICE [fork|bench [POLLS]|hops|hopsx]");
    ctx = open_device(argv[1], &list);
    if (ibv_query_gid(ctx, 1, 0, &gid))
        FAIL("ibv_query_gid");
    pd = ibv_alloc_pd(ctx);
    if (hopsx) {
        struct ibv_cq_init_attr_ex ca = { .cqe = 16, .wc_flags = IBV_WC_STANDARD_FLAGS };
        cqxa = ibv_create_cq_ex(ctx, &ca);
        cqxb = ibv_create_cq_ex(ctx, &ca);
        if (!cqxa || !cqxb)
            FAIL("ibv_create_cq_ex: %s", strerror(errno));
        cqa = ibv_cq_ex_to_cq(cqxa);
        cqb = ibv_cq_ex_to_cq(cqxb);
    } else {
        cqa = ibv_create_cq(ctx, 16, NULL, NULL, 0);
        cqb = ibv_create_cq(ctx, 16, NULL, NULL, 0);
    }
    if (!pd || !cqa || !cqb)
        FAIL("pd/cq");

    /* errors the libibverbs way */
    errno = 0;
    if (ibv_create_cq(ctx, 1 << 20, NULL, NULL, 0) != NULL || errno != EINVAL)
        FAIL("ibv_create_cq(cqe=2^20): want NULL/EINVAL, errno %d", errno);
    printf("ok: ibv_create_cq beyond max_cqe -> NULL, EINVAL\n");

    qa = make_rc_qp(pd, cqa, 16, 64);
    qb = make_rc_qp(pd, cqb, 16, 64);
    errno = 0;
    if (ibv_qp_to_qp_ex(qa) != NULL || errno != EOPNOTSUPP)
        FAIL("ibv_qp_to_qp_ex: want NULL/EOPNOTSUPP");
    printf("ok: ibv_qp_to_qp_ex -> NULL, EOPNOTSUPP\n");
    /* verbs served without a Python-side object of their own, and verbs not served yet:
     * the real libibverbs would take softrdma's objects for its own and crash */
    {
        struct ibv_gid_entry tbl[8];
        ssize_t ng = ibv_query_gid_table(ctx, tbl, 8, 0);
        if (ng < 1 || memcmp(&tbl[0].gid, &gid, sizeof(gid)) || tbl[0].gid_type != IBV_GID_TYPE_ROCE_V2)
            FAIL("ibv_query_gid_table: %zd", ng);
        if (ibv_get_pkey_index(ctx, 1, htons(0xffff)) != 0)
            FAIL("ibv_get_pkey_index");
        if (ibv_resize_cq(cqa, 32) != 0 || cqa->cqe != 32)
            FAIL("ibv_resize_cq(32)");
        errno = 0;
        if (ibv_create_ah_from_wc(pd, &wc, NULL, 1) != NULL || errno != EINVAL)
            FAIL("ibv_create_ah_from_wc without a GRH: want EINVAL");
        printf("ok: ibv_query_gid_table (%zd entries), ibv_get_pkey_index, ibv_resize_cq; "
               "ibv_create_ah_from_wc without a GRH -> EINVAL\n", ng);
    }
    to_rts(qa, qb->qp_num, &gid);
    to_rts(qb, qa->qp_num, &gid);
    mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!mr)
        FAIL("ibv_reg_mr");
    if (ibv_poll_cq(cqa, 1, &wc) != 0)
        FAIL("empty CQ polled a completion");

    if (forking) {
        pid_t pid = fork();
        int status = 0;
        double deadline = now() + 30.0;
        if (pid < 0)
            FAIL("fork");
        if (pid == 0) {
            /* the child: the inherited device is the parent's; its own works */
            struct ibv_context *own = ibv_open_device(ctx->device);
            struct ibv_pd *opd;
            struct ibv_cq *ocq;
            char one = 1;
            struct ibv_sge s1 = { .addr = (uintptr_t)&one, .length = 1, .lkey = 0 };
            memset(&swr, 0, sizeof(swr));
            swr.sg_list = &s1; swr.num_sge = 1;
            swr.opcode = IBV_WR_SEND;
            swr.send_flags = IBV_SEND_INLINE;
            if (ibv_post_send(qa, &swr, &bad_s) == 0)
                _exit(3);  /* the parent's QP must not be usable here */
            if (!own)
                _exit(4);
            opd = ibv_alloc_pd(own);
            ocq = ibv_create_cq(own, 4, NULL, NULL, 0);
            if (!opd || !ocq || ibv_poll_cq(ocq, 1, &wc) != 0)
                _exit(5);
            if (ibv_destroy_cq(ocq) || ibv_dealloc_pd(opd) || ibv_close_device(own))
                _exit(6);
            _exit(0);
        }
        while (waitpid(pid, &status, WNOHANG) == 0) {
            if (now() > deadline) {
                kill(pid, SIGKILL);
                waitpid(pid, &status, 0);
                FAIL("the forked child hangs");
            }
            usleep(10000);
        }
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            FAIL("forked child: status %#x", status);
        printf("ok: fork: the child opens its own device, its inherited QP fails\n");
    }

    if (bench || hops) {
        int polls = hops ? 0 : (argc > 3 ? atoi(argv[3]) : 1000000), rounds = hops ? 400 : 500;
        if (polls < 0 || (bench && polls == 0))
            FAIL("POLLS must be a positive number");
        double t0 = now(), c0 = cpu_now();
        long sw0 = 0;
        for (i = 0; i < polls; i++)
            ibv_poll_cq(cqa, 1, &wc);
        if (bench) {
            printf("empty_poll_ns %.1f\n", (now() - t0) / polls * 1e9);
            printf("empty_poll_cpu_ns %.1f\n", (cpu_now() - c0) / polls * 1e9);
            post_recv_cost(pd, cqb, buf, mr->lkey);
        }
        t0 = now();
        sw0 = others_nvcsw();
        c0 = proc_cpu();
        for (i = 0; i < rounds; i++) {
            sge.addr = (uintptr_t)buf; sge.length = 64; sge.lkey = mr->lkey;
            memset(&rwr, 0, sizeof(rwr));
            rwr.sg_list = &sge; rwr.num_sge = 1;
            if (ibv_post_recv(qb, &rwr, &bad_r))
                FAIL("post_recv");
            memset(&swr, 0, sizeof(swr));
            swr.sg_list = &sge; swr.num_sge = 1;
            swr.opcode = IBV_WR_SEND;
            swr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
            if (ibv_post_send(qa, &swr, &bad_s))
                FAIL("post_send");
            if (hopsx) {
                wait_wcx(cqxb, IBV_WC_RECV, "bench recv");
                wait_wcx(cqxa, IBV_WC_SEND, "bench send");
            } else {
                wait_wc(cqb, &wc, "bench recv", 20.0);
                wait_wc(cqa, &wc, "bench send", 20.0);
            }
        }
        if (hops)
            printf("hops_nvcsw %ld rounds %d seconds %.3f cpu_us_per_round %.1f\n",
                   others_nvcsw() - sw0, rounds, now() - t0, (proc_cpu() - c0) / rounds * 1e6);
        else
            printf("send_round_us %.1f\nsend_round_cpu_us %.1f\n", (now() - t0) / rounds * 1e6,
                   (proc_cpu() - c0) / rounds * 1e6);
        return 0;
    }

    /* SEND with immediate, inline data from an unregistered buffer */
    memset(buf, 0, sizeof(buf));
    snprintf(msg, sizeof(msg), "inline-from-the-stack");
    sge.addr = (uintptr_t)buf; sge.length = sizeof(buf); sge.lkey = mr->lkey;
    memset(&rwr, 0, sizeof(rwr));
    rwr.wr_id = 0xBBBB; rwr.sg_list = &sge; rwr.num_sge = 1;
    if (ibv_post_recv(qb, &rwr, &bad_r))
        FAIL("ibv_post_recv");
    {
        struct ibv_sge isge = { .addr = (uintptr_t)msg, .length = (uint32_t)strlen(msg) + 1, .lkey = 0 };
        memset(&swr, 0, sizeof(swr));
        swr.wr_id = 0xAAAA; swr.sg_list = &isge; swr.num_sge = 1;
        swr.opcode = IBV_WR_SEND_WITH_IMM;
        swr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
        swr.imm_data = htonl(0x12345678);
        if (ibv_post_send(qa, &swr, &bad_s))
            FAIL("ibv_post_send inline");
        memset(msg, 'X', 8);  /* inline: the buffer is the program's again at once */
    }
    wait_wc(cqb, &wc, "recv", 20.0);
    if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV || wc.wr_id != 0xBBBB
        || wc.byte_len != strlen("inline-from-the-stack") + 1 || !(wc.wc_flags & IBV_WC_WITH_IMM)
        || ntohl(wc.imm_data) != 0x12345678 || wc.qp_num != qb->qp_num)
        FAIL("recv wc: status %d opcode %d wr_id %#llx byte_len %u flags %#x imm %#x qp %#x",
             wc.status, wc.opcode, (unsigned long long)wc.wr_id, wc.byte_len, wc.wc_flags,
             ntohl(wc.imm_data), wc.qp_num);
    if (strcmp(buf, "inline-from-the-stack"))
        FAIL("received '%s'", buf);
    printf("ok: recv wc opcode RECV, WITH_IMM 0x12345678, byte_len %u, data intact\n", wc.byte_len);
    wait_wc(cqa, &wc, "send", 20.0);
    if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_SEND || wc.wr_id != 0xAAAA
        || wc.qp_num != qa->qp_num)
        FAIL("send wc: status %d opcode %d", wc.status, wc.opcode);
    printf("ok: send wc opcode SEND, wr_id 0xaaaa\n");

    /* one request posted again and again, changed in place between posts (its SGE's length,
     * then its address through the same sg_list pointer, then its opcode), then the same
     * once more: each post sends what the request says now (the Python half reuses the
     * request object it made only for the same content, capi/posting.py) */
    {
        static const uint32_t lens[5] = { 100, 300, 300, 300, 300 };
        static const uint32_t offs[5] = { 1024, 1024, 2048, 2048, 2048 };
        struct ibv_sge ssge = { .lkey = mr->lkey };
        for (i = 1024; i < (int)sizeof(buf); i++)
            buf[i] = (char)(i * 7);
        memset(&swr, 0, sizeof(swr));
        swr.sg_list = &ssge; swr.num_sge = 1;
        swr.opcode = IBV_WR_SEND;
        swr.send_flags = IBV_SEND_SIGNALED;
        for (i = 0; i < 5; i++) {
            memset(buf, 0, 1024);
            sge.addr = (uintptr_t)buf; sge.length = 1024; sge.lkey = mr->lkey;
            memset(&rwr, 0, sizeof(rwr));
            rwr.wr_id = 0xD0 + i; rwr.sg_list = &sge; rwr.num_sge = 1;
            if (ibv_post_recv(qb, &rwr, &bad_r))
                FAIL("repost: ibv_post_recv");
            ssge.addr = (uintptr_t)(buf + offs[i]);
            ssge.length = lens[i];
            if (i == 3) {
                swr.opcode = IBV_WR_SEND_WITH_IMM;
                swr.imm_data = htonl(0xC0DE);
            }
            swr.wr_id = 0xE0 + i;
            if (ibv_post_send(qa, &swr, &bad_s))
                FAIL("repost %d: ibv_post_send", i);
            wait_wc(cqb, &wc, "repost recv", 20.0);
            if (wc.status != IBV_WC_SUCCESS || wc.wr_id != 0xD0 + (uint64_t)i
                || wc.byte_len != lens[i] || !(wc.wc_flags & IBV_WC_WITH_IMM) != (i < 3)
                || (i >= 3 && ntohl(wc.imm_data) != 0xC0DE))
                FAIL("repost %d: recv wc status %d wr_id %#llx byte_len %u flags %#x", i,
                     wc.status, (unsigned long long)wc.wr_id, wc.byte_len, wc.wc_flags);
            if (memcmp(buf, buf + offs[i], lens[i]) || buf[lens[i]])
                FAIL("repost %d: the data received is not the request's", i);
            wait_wc(cqa, &wc, "repost send", 20.0);
            if (wc.status != IBV_WC_SUCCESS || wc.wr_id != 0xE0 + (uint64_t)i)
                FAIL("repost %d: send wc status %d wr_id %#llx", i, wc.status,
                     (unsigned long long)wc.wr_id);
        }
        printf("ok: a request changed in place between posts sends what it says now\n");
    }

    /* an RDMA WRITE to a bad R_Key: a remote access error completion */
    sge.length = 16;
    memset(&swr, 0, sizeof(swr));
    swr.wr_id = 0xCCCC; swr.sg_list = &sge; swr.num_sge = 1;
    swr.opcode = IBV_WR_RDMA_WRITE;
    swr.send_flags = IBV_SEND_SIGNALED;
    swr.wr.rdma.remote_addr = (uintptr_t)buf;
    swr.wr.rdma.rkey = mr->rkey ^ 0x5a5a00;
    if (ibv_post_send(qa, &swr, &bad_s))
        FAIL("ibv_post_send write");
    wait_wc(cqa, &wc, "bad write", 20.0);
    if (wc.status != IBV_WC_REM_ACCESS_ERR || wc.wr_id != 0xCCCC)
        FAIL("bad write wc: status %d (%s)", wc.status, ibv_wc_status_str(wc.status));
    printf("ok: bad R_Key -> %s\n", ibv_wc_status_str(wc.status));

    /* a bad argument: EINVAL from ibv_post_send, bad_wr set */
    bad_s = NULL;
    swr.num_sge = -1;
    if (ibv_post_send(qb, &swr, &bad_s) == 0 || bad_s != &swr)
        FAIL("ibv_post_send(num_sge=-1) accepted");
    printf("ok: ibv_post_send(num_sge=-1) refused, bad_wr set\n");

    /* a CQ overrun: the asynchronous event IBV_EVENT_CQ_ERR names the CQ */
    {
        struct ibv_cq *cqo = ibv_create_cq(ctx, 1, NULL, NULL, 0);
        struct ibv_qp *qo;
        struct ibv_qp_attr a;
        struct ibv_async_event ev;

        if (!cqo)
            FAIL("overrun CQ");
        qo = make_rc_qp_cqs(pd, cqb, cqo, 16, 64);  /* the pair's attributes, cqo for receives */
        qp_to_init(qo, 0);
        sge.length = 16;
        memset(&rwr, 0, sizeof(rwr));
        rwr.sg_list = &sge; rwr.num_sge = 1;
        if (ibv_post_recv(qo, &rwr, &bad_r) || ibv_post_recv(qo, &rwr, &bad_r))
            FAIL("overrun post_recv");
        memset(&a, 0, sizeof(a));
        a.qp_state = IBV_QPS_ERR;
        if (ibv_modify_qp(qo, &a, IBV_QP_STATE))  /* two flushed receives, room for one */
            FAIL("overrun QP ERR");
        /* first the responder's event of the bad R_Key above, then the overrun */
        if (ibv_get_async_event(ctx, &ev))
            FAIL("ibv_get_async_event: %s", strerror(errno));
        if (ev.event_type != IBV_EVENT_QP_ACCESS_ERR || ev.element.qp != qb)
            FAIL("async event %d (%s), element %p, want QP_ACCESS_ERR on %p", ev.event_type,
                 ibv_event_type_str(ev.event_type), (void *)ev.element.qp, (void *)qb);
        ibv_ack_async_event(&ev);
        printf("ok: bad R_Key -> %s on the responder's QP\n", ibv_event_type_str(ev.event_type));
        if (ibv_get_async_event(ctx, &ev))
            FAIL("ibv_get_async_event: %s", strerror(errno));
        if (ev.event_type != IBV_EVENT_CQ_ERR || ev.element.cq != cqo)
            FAIL("async event %d (%s), element %p, want CQ_ERR on %p", ev.event_type,
                 ibv_event_type_str(ev.event_type), (void *)ev.element.cq, (void *)cqo);
        ibv_ack_async_event(&ev);
        wait_wc(cqo, &wc, "flushed receive", 20.0);
        if (wc.status != IBV_WC_WR_FLUSH_ERR || ibv_poll_cq(cqo, 1, &wc) != 0)
            FAIL("overrun CQ: status %d", wc.status);
        if (ibv_destroy_qp(qo) || ibv_destroy_cq(cqo))
            FAIL("overrun teardown");
        printf("ok: CQ overrun -> %s on that CQ; the queued completion stays pollable\n",
               ibv_event_type_str(ev.event_type));
    }

    if (ibv_destroy_qp(qa) || ibv_destroy_qp(qb) || ibv_dereg_mr(mr) || ibv_destroy_cq(cqa)
        || ibv_destroy_cq(cqb) || ibv_dealloc_pd(pd) || ibv_close_device(ctx))
        FAIL("teardown");
    ibv_free_device_list(list);
    printf("ok: teardown\n");
    return 0;
}
