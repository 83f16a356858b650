/* A signal during a blocking wait (tests/capi/test_capi_host_state.py): libibverbs waits in
 * read(2) of the channel, which a handler installed without SA_RESTART interrupts (EINTR)
 * and one with SA_RESTART lets the kernel restart (signal(7)). qperf ends its test loop,
 * blocked in ibv_get_cq_event, with such a SIGALRM.
 *
 * signal_wait DEVICE norestart: SIGALRM without SA_RESTART, 0.2 s into a wait:
 *   ibv_get_cq_event and then ibv_get_async_event return -1 with EINTR, once the handler ran.
 * signal_wait DEVICE restart: SIGALRM with SA_RESTART, 0.1 s into ibv_get_cq_event, whose
 *   CQ completes a loopback SEND that another thread posts 0.6 s in: the wait goes on
 *   through the signal and returns that CQ's event.
 * signal_wait DEVICE sigint: SIGPIPE and SIGXFSZ are the default from the start (Python,
 *   which ran `softrdma run`, ignores them), SIGINT is still the default once softrdma's
 *   Python is up (prints "sigint default"), and then a SIGINT ends the program as it ends
 *   any.
 * signal_wait DEVICE sigint-own: a SIGINT handler the program installed before its first
 *   verb is still its own afterwards (prints "sigint own").
 * signal_wait DEVICE sigwait: with the device open (softrdma's threads started), the
 *   program blocks SIGUSR1 and SIGTERM and takes them with sigwait(3) in a thread of its
 *   own: the process's SIGUSR1s and SIGTERM reach that thread (prints "sigwait got"), none
 *   a softrdma thread, where their default action ended the process. */
#include "common.h"
#include <pthread.h>
#include <signal.h>
#include <sys/time.h>
#include <unistd.h>

static volatile sig_atomic_t alarms;

static void on_alarm(int sig)
{
    (void)sig;
    alarms++;
}

static void on_int(int sig)
{
    (void)sig;
}

/* the handler signal sig has now (SIG_DFL, SIG_IGN or a function) */
static void *handler_of(int sig)
{
    struct sigaction sa;

    CHECK(!sigaction(sig, NULL, &sa), "sigaction");
    return (sa.sa_flags & SA_SIGINFO) ? (void *)sa.sa_sigaction : (void *)sa.sa_handler;
}

static sigset_t sigwait_set;

static void *take_signals(void *arg)
{
    int sig = 0, got = 0;

    (void)arg;
    while (sig != SIGTERM) {
        CHECK(!sigwait(&sigwait_set, &sig), "sigwait");
        got++;
    }
    printf("sigwait got %d signals, the last SIGTERM\n", got);
    return NULL;
}

static void arm(double seconds, int flags)
{
    struct sigaction sa;
    struct itimerval it;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_alarm;
    sa.sa_flags = flags;
    sigemptyset(&sa.sa_mask);
    CHECK(!sigaction(SIGALRM, &sa, NULL), "sigaction");
    memset(&it, 0, sizeof(it));
    it.it_value.tv_sec = (time_t)seconds;
    it.it_value.tv_usec = (suseconds_t)((seconds - (double)(time_t)seconds) * 1e6);
    CHECK(!setitimer(ITIMER_REAL, &it, NULL), "setitimer");
}

struct sender {
    struct ibv_qp *qp;
    struct ibv_mr *mr;
};

static void *send_later(void *arg)
{
    struct sender *s = arg;
    struct ibv_sge sge = { (uintptr_t)s->mr->addr, 64, s->mr->lkey };
    struct ibv_send_wr wr, *bad;

    usleep(600000);
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = 1;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    CHECK(!ibv_post_send(s->qp, &wr, &bad), "ibv_post_send");
    return NULL;
}

int main(int argc, char **argv)
{
    struct ibv_context *ctx;
    struct ibv_comp_channel *ch;
    struct ibv_cq *cq, *ev_cq;
    void *ev_ctx;
    double t0, waited;
    int ret, err;

    CHECK(argc == 3, "usage: signal_wait DEVICE norestart|restart|sigint|sigint-own|sigwait");
    if (!strcmp(argv[2], "sigint-own")) {
        struct sigaction sa;

        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = on_int;
        sigemptyset(&sa.sa_mask);
        CHECK(!sigaction(SIGINT, &sa, NULL), "sigaction");
    } else if (!strcmp(argv[2], "sigint")) {
        CHECK(handler_of(SIGINT) == (void *)SIG_DFL, "SIGINT is not the default to begin with");
        CHECK(handler_of(SIGPIPE) == (void *)SIG_DFL, "SIGPIPE is not the default (%p)",
              handler_of(SIGPIPE));
        CHECK(handler_of(SIGXFSZ) == (void *)SIG_DFL, "SIGXFSZ is not the default (%p)",
              handler_of(SIGXFSZ));
    }
    ctx = open_device(argv[1], NULL);
    if (!strcmp(argv[2], "sigint-own")) {
        CHECK(handler_of(SIGINT) == (void *)on_int, "the program's SIGINT handler was replaced");
        printf("sigint own\n");
        CHECK(!ibv_close_device(ctx), "ibv_close_device");
        return 0;
    }
    if (!strcmp(argv[2], "sigwait")) {
        struct ibv_cq *c2 = ibv_create_cq(ctx, 4, NULL, NULL, 0);
        pthread_t t;
        int k;

        CHECK(c2, "ibv_create_cq");
        sigemptyset(&sigwait_set);
        sigaddset(&sigwait_set, SIGUSR1);
        sigaddset(&sigwait_set, SIGTERM);
        CHECK(!pthread_sigmask(SIG_BLOCK, &sigwait_set, NULL), "pthread_sigmask");
        CHECK(!pthread_create(&t, NULL, take_signals, NULL), "pthread_create");
        for (k = 0; k < 20; k++) {  /* (pending ones of a kind merge: fewer may be taken) */
            CHECK(!kill(getpid(), SIGUSR1), "kill");
            usleep(10000);
        }
        CHECK(!kill(getpid(), SIGTERM), "kill");
        CHECK(!pthread_join(t, NULL), "pthread_join");
        CHECK(!ibv_destroy_cq(c2) && !ibv_close_device(ctx), "teardown");
        printf("ok\n");
        return 0;
    }
    if (!strcmp(argv[2], "sigint")) {
        CHECK(handler_of(SIGINT) == (void *)SIG_DFL, "SIGINT is no longer the default: %p",
              handler_of(SIGINT));
        printf("sigint default\n");
        fflush(stdout);
        raise(SIGINT);
        FAIL("SIGINT did not end the program");
    }
    ch = ibv_create_comp_channel(ctx);
    CHECK(ch, "ibv_create_comp_channel");
    cq = ibv_create_cq(ctx, 16, NULL, ch, 0);
    CHECK(cq, "ibv_create_cq");
    CHECK(!ibv_req_notify_cq(cq, 0), "ibv_req_notify_cq");

    if (!strcmp(argv[2], "norestart")) {
        struct ibv_async_event ae;

        t0 = now();  /* before the timer starts: a late clock read never shortens the wait */
        arm(0.2, 0);
        ret = ibv_get_cq_event(ch, &ev_cq, &ev_ctx);
        err = errno;
        waited = now() - t0;
        CHECK(ret == -1 && err == EINTR, "ibv_get_cq_event: %d, errno %d (%s), want EINTR",
              ret, err, strerror(err));
        CHECK(alarms == 1 && waited >= 0.15, "returned after %.3f s, %d alarms", waited,
              (int)alarms);
        printf("cq_event EINTR after %.3f s\n", waited);
        t0 = now();  /* before the timer starts: a late clock read never shortens the wait */
        arm(0.2, 0);
        ret = ibv_get_async_event(ctx, &ae);
        err = errno;
        waited = now() - t0;
        CHECK(ret == -1 && err == EINTR, "ibv_get_async_event: %d, errno %d (%s), want EINTR",
              ret, err, strerror(err));
        CHECK(alarms == 2 && waited >= 0.15, "returned after %.3f s, %d alarms", waited,
              (int)alarms);
        printf("async_event EINTR after %.3f s\n", waited);
    } else if (!strcmp(argv[2], "restart")) {
        struct ibv_pd *pd = ibv_alloc_pd(ctx);
        struct ibv_cq *scq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
        struct ibv_qp *qa, *qb;
        union ibv_gid gid;
        static char buf[2][64];
        struct ibv_mr *mr;
        struct ibv_sge sge;
        struct ibv_recv_wr rwr, *rbad;
        struct ibv_wc wc;
        struct sender s;
        pthread_t t;

        CHECK(pd && scq, "ibv_alloc_pd / ibv_create_cq");
        mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
        CHECK(mr, "ibv_reg_mr");
        CHECK(!ibv_query_gid(ctx, 1, 0, &gid), "ibv_query_gid");
        qa = make_rc_qp(pd, scq, 4, 0);  /* the sender: its completions on scq */
        qb = make_rc_qp_cqs(pd, scq, cq, 4, 0);  /* its receives: on the CQ with the channel */
        rc_to_rts(qa, IBV_ACCESS_LOCAL_WRITE, qb->qp_num, &gid, 12, 7);
        rc_to_rts(qb, IBV_ACCESS_LOCAL_WRITE, qa->qp_num, &gid, 12, 7);
        sge.addr = (uintptr_t)buf[1];
        sge.length = 64;
        sge.lkey = mr->lkey;
        memset(&rwr, 0, sizeof(rwr));
        rwr.wr_id = 2;
        rwr.sg_list = &sge;
        rwr.num_sge = 1;
        CHECK(!ibv_post_recv(qb, &rwr, &rbad), "ibv_post_recv");
        memset(buf[0], 0x5a, 64);
        s.qp = qa;
        s.mr = mr;
        t0 = now();  /* before the timer and the sender start (see above) */
        arm(0.1, SA_RESTART);
        CHECK(!pthread_create(&t, NULL, send_later, &s), "pthread_create");
        ret = ibv_get_cq_event(ch, &ev_cq, &ev_ctx);
        err = errno;
        waited = now() - t0;
        CHECK(ret == 0 && ev_cq == cq, "ibv_get_cq_event: %d, errno %d (%s), want the CQ",
              ret, err, strerror(err));
        CHECK(alarms == 1 && waited >= 0.5, "returned after %.3f s, %d alarms", waited,
              (int)alarms);
        ibv_ack_cq_events(cq, 1);
        wait_wc(cq, &wc, "the receive", 30);
        CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 2 && wc.byte_len == 64
              && wc.opcode == IBV_WC_RECV && wc.qp_num == qb->qp_num,
              "receive completion: status %d wr_id %llu byte_len %u", wc.status,
              (unsigned long long)wc.wr_id, wc.byte_len);
        CHECK(!memcmp(buf[0], buf[1], 64), "the received bytes differ");
        wait_wc(scq, &wc, "the send", 30);
        CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 1 && wc.opcode == IBV_WC_SEND,
              "send completion: status %d wr_id %llu", wc.status, (unsigned long long)wc.wr_id);
        pthread_join(t, NULL);
        printf("cq_event through SA_RESTART after %.3f s\n", waited);
        CHECK(!ibv_destroy_qp(qa) && !ibv_destroy_qp(qb) && !ibv_dereg_mr(mr)
              && !ibv_destroy_cq(scq) && !ibv_dealloc_pd(pd), "teardown");
    } else {
        FAIL("unknown mode %s", argv[2]);
    }
    CHECK(!ibv_destroy_cq(cq) && !ibv_destroy_comp_channel(ch) && !ibv_close_device(ctx),
          "teardown");
    printf("ok\n");
    return 0;
}
