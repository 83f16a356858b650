/* softrdma's libibverbs interposer: the C half of softrdma.capi (docs/design.md, "C programs").
 *
 * Built by cffi in embedding mode (softrdma/capi/build.py) into a shared library that is
 * LD_PRELOADed into an unmodified program. Its unversioned ibv_* exports take precedence over
 * the real libibverbs' versioned ones; the real library stays loaded for its pure helpers
 * (ibv_wc_status_str, ibv_node_type_str...).
 *
 * The objects handed to the program are real libibverbs structs (struct ibv_context, ibv_cq,
 * ibv_qp ...) embedded first in a softrdma wrapper that carries the Python object's handle.
 * The verbs that verbs.h inlines (ibv_post_send, ibv_post_recv, ibv_post_srq_recv,
 * ibv_poll_cq, ibv_req_notify_cq) go through ibv_context.ops, which point here.
 *
 * Completions: the Python progress thread produces work completions into a ring in C memory
 * (sr_ring_push, one producer at a time under the engine lock); ibv_poll_cq consumes it with
 * acquire/release atomics and never enters Python, so an empty poll costs no GIL and a
 * program spinning on ibv_poll_cq never starves the progress thread (ACKs, timers).
 *
 * Errors follow libibverbs: NULL or -1 with errno for object verbs, an errno value for the
 * int verbs. Python exceptions are turned into errno values on the Python side.
 */
#include <infiniband/verbs.h>
#include <arpa/inet.h>
#include <dlfcn.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* ---- flat records exchanged with the Python half (declared again in cdefs.py) ---- */
struct sr_swr {
    uint64_t wr_id;
    uint64_t sg;            /* struct ibv_sge * */
    uint32_t num_sge, opcode, send_flags, imm_data;  /* imm_data in host order */
    uint64_t remote_addr, compare_add, swap;
    uint64_t bind_length;   /* BIND_MW: the window's length (remote_addr its address) */
    uint32_t rkey, ah, remote_qpn, remote_qkey;
    uint32_t xrc_srqn;      /* XRC INI QPs: the remote XRC SRQ (qp_type.xrc.remote_srqn) */
    uint32_t mw, mr, mw_access;  /* BIND_MW: the window's and the MR's handles, the access */
    uint32_t gen;           /* sr_same_gen: the request's content number, 0: none */
};

struct sr_rwr {
    uint64_t wr_id;
    uint64_t sg;
    uint32_t num_sge;
};

struct sr_qp_init {
    int32_t qp_type, send_cq, recv_cq, srq, sq_sig_all;
    uint32_t max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data;
    uint32_t qp_num;        /* out */
};

struct sr_ah_attr {
    uint8_t dgid[16];
    uint32_t flow_label;
    uint32_t sgid_index, hop_limit, traffic_class, is_global, dlid, sl, src_path_bits,
        static_rate, port_num;
};

struct sr_qp_attr {
    uint32_t qp_state, cur_qp_state, path_mtu, qkey, rq_psn, sq_psn, dest_qp_num,
        qp_access_flags, pkey_index, max_rd_atomic, max_dest_rd_atomic, min_rnr_timer,
        port_num, timeout, retry_cnt, rnr_retry, sq_draining;
    uint32_t max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data;
    struct sr_ah_attr ah;
};

struct sr_srq_attr {
    uint32_t max_wr, max_sge, srq_limit;
};

/* librdmacm (rdmacm.c): an IP address and port; an id's device and addresses; a
 * struct rdma_conn_param; an event */
struct sr_cm_addr { uint32_t family; uint16_t port; uint8_t ip[16]; };
struct sr_cm_info {
    int32_t ctx, dev_index, async_fd, port_num;
    void *ctx_wrapper;      /* the context's sr_context, NULL until C makes one */
    struct sr_cm_addr src, dst;
};
struct sr_conn_param {
    uint8_t private_data[256];
    uint32_t private_data_len, responder_resources, initiator_depth, flow_control,
        retry_count, rnr_retry_count, srq, qp_num;
    int32_t has;            /* 0: the program passed NULL */
};
struct sr_cm_event_rec {
    int32_t event, status, id, listen_id;
    void *id_wrapper;       /* NULL: a new id (CONNECT_REQUEST), C makes its wrapper */
    void *listen_id_wrapper;
    uint8_t private_data[256];
    uint32_t private_data_len, responder_resources, initiator_depth, flow_control,
        retry_count, rnr_retry_count, srq, qp_num;
    uint32_t has_ud, ud_qp_num, ud_qkey;
    struct sr_ah_attr ah;
};

/* ---- the Python half (extern "Python"): build.py puts cdefs.PY_EXPORTS here ---- */
/* SR_PY_EXPORTS */

/* ---- wrappers ---- */
struct sr_ring {
    _Atomic uint32_t head;   /* consumer index */
    _Atomic uint32_t tail;   /* producer index */
    uint32_t capacity, mask;
    pthread_spinlock_t consumer;
    struct ibv_wc *wc;     /* from dom's allocator when custom */
    int custom;
    struct sr_pd *dom;     /* the parent domain the CQ was made with (ibv_create_cq_ex), or NULL */
    uint64_t *ts;            /* each entry's completion time (CLOCK_MONOTONIC ns); NULL but
                              * for a CQ made with a completion timestamp (ibv_create_cq_ex) */
};
/* the completion clock: CLOCK_MONOTONIC in ns, so hca_core_clock is 1 GHz (1,000,000 kHz)
 * and the timestamp mask all 64 bits */
#define SR_CORE_CLOCK_KHZ 1000000

struct sr_device { struct ibv_device dev; int index; uint64_t guid; };
/* the context is a verbs_context (its ops for the extended verbs in front, the
 * ibv_context last): the handle goes before it */
struct sr_context { int h; int async_own; size_t dm_used; struct verbs_context vctx; };
#define SR_CTX(c) ((struct sr_context *)((char *)(c) - offsetof(struct sr_context, vctx.context)))
/* A PD, or a parent domain (ibv_alloc_parent_domain): a PD that stands for its protection
 * domain (h is that PD's handle, so every verb that takes a PD takes it) with a thread
 * domain and the program's allocators, which the C rings of the QPs, SRQs and CQs made
 * with it use (sr_dom_calloc). users: a PD's parent domains; a parent domain's QPs, SRQs
 * and CQs (ibv_dealloc_pd is EBUSY while there are any). */
struct sr_td { struct ibv_td td; _Atomic int users; };
struct sr_pd {
    struct ibv_pd pd;
    int h;
    _Atomic int users;
    struct sr_pd *base;    /* a parent domain's PD; NULL for a PD */
    struct sr_td *td;
    void *(*alloc)(struct ibv_pd *pd, void *pd_context, size_t size, size_t alignment,
                   uint64_t resource_type);
    void (*free)(struct ibv_pd *pd, void *pd_context, void *ptr, uint64_t resource_type);
    void *pd_context;
};
struct sr_dm;
struct sr_mr { struct ibv_mr mr; int h; int access; uint64_t iova; struct sr_dm *dm; };
struct sr_channel { struct ibv_comp_channel ch; int h; int own_fd; };
/* cq and cqx share their first fields (ibv_cq_ex_to_cq is a cast); ex_cur: an
 * ibv_start_poll..ibv_end_poll pass holds the consumer lock and has a current entry */
struct sr_cq {
    union { struct ibv_cq cq; struct ibv_cq_ex cqx; };
    int h;
    struct sr_ring ring;
    int ex_polling, ex_cur;
};
struct sr_xwr;  /* a work request built with the ibv_wr_* API, posted by wr_complete */
/* A QP's receive ring (seam.queues.RecvFeed): ibv_post_recv stores one-SGE receives here
 * without entering Python, as a NIC's ring in host memory, while the ring is open and its
 * entries plus the Python queue's length (as last told, an upper bound: that queue only
 * shrinks between) stay below the QP's capacity. Otherwise the receive goes through Python,
 * which gives the exact answer (ENOMEM, EINVAL in RESET, a flush in ERR) and tells the ring
 * the queue's length. The QP's receive queue takes the entries when it runs empty, and all
 * of them before a post, a flush or a reset (capi/posting.py, RecvRing). */
struct sr_rq_ent { uint64_t wr_id, addr; uint32_t length, lkey; };
struct sr_rqring {
    pthread_spinlock_t lock;
    int open;              /* 0 (until a post through Python succeeds; RESET, ERR) */
    uint32_t cap, qlen;    /* the QP's max_recv_wr; its Python queue's length, as told */
    uint32_t head, count;
    struct sr_rq_ent *e;   /* cap entries; NULL: no ring (XRC, max_recv_wr 0, none attached) */
    struct sr_pd *dom;     /* the QP's or SRQ's parent domain, whose allocator made e; NULL */
    int custom;            /* e came from that allocator */
    uint64_t type;         /* the resource type it was asked for */
};
#define SR_KEYED_SGES 4  /* requests with more SGEs than this get no content number */
struct sr_qp {
    struct ibv_qp_ex qpx;  /* qpx.qp_base is the program's ibv_qp */
    int h;
    int is_ex;             /* created by ibv_create_qp_ex with send_ops_flags */
    struct sr_xwr *xw;
    int nx, xcap, xerr;
    /* the last request posted (but its wr_id) and its SGEs, numbered (sr_same_gen) */
    pthread_spinlock_t last_lock;
    uint32_t last_gen;
    struct sr_swr last;
    struct ibv_sge last_sg[SR_KEYED_SGES];
    struct sr_rqring rq;
};
struct sr_srq { struct ibv_srq srq; int h; uint32_t srq_num; int xrc; struct sr_rqring rq; };
struct sr_ah { struct ibv_ah ah; int h; };
struct sr_mw { struct ibv_mw mw; int h; };

#define SR_H(type, p) (((struct type *)(p))->h)

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sr_device *g_devs;
static int g_ndev = -1;

/* ---- parent domains' allocators (ibv_alloc_parent_domain(3)) ----
 * The resource types softrdma passes them, as a provider's (mlx5dv.h's MLX5DV_RES_TYPE_*):
 * the driver id in the high 32 bits (softrdma's C interface stands for rxe), then what the
 * buffer is: a CQ's completion entries, a QP's or an SRQ's receive ring. */
#define SR_RES(n) ((uint64_t)RDMA_DRIVER_RXE << 32 | (n))
#define SR_RES_CQ SR_RES(1)
#define SR_RES_RQ SR_RES(2)
#define SR_RES_SRQ SR_RES(3)

/* pd's parent domain, counted as used by one more object; NULL for a plain PD */
static struct sr_pd *sr_dom_hold(struct ibv_pd *pd)
{
    struct sr_pd *d = (struct sr_pd *)pd;

    if (!d || !d->base)
        return NULL;
    atomic_fetch_add(&d->users, 1);
    return d;
}

static void sr_dom_put(struct sr_pd *d)
{
    if (d)
        atomic_fetch_sub(&d->users, 1);
}

/* The program's allocators run with the GIL held, as the verb that needs the buffer was
 * called: a Python host's allocator is Python code behind a C function (pyverbs'
 * ParentDomainContext), and a QP's receive ring is allocated from inside Python, whose
 * cffi call let the GIL go. */
static int sr_gil_take(PyGILState_STATE *st)
{
    if (!Py_IsInitialized() || PyGILState_Check())
        return 0;
    *st = PyGILState_Ensure();
    return 1;
}

/* n zeroed bytes for a buffer of the resource type: from the parent domain's allocator
 * when it has one and does not answer IBV_ALLOCATOR_USE_DEFAULT (*custom set), else calloc */
static void *sr_dom_calloc(struct sr_pd *d, size_t n, uint64_t type, int *custom)
{
    PyGILState_STATE st;
    void *p;
    int took;

    *custom = 0;
    if (d && d->alloc) {
        took = sr_gil_take(&st);
        p = d->alloc(&d->pd, d->pd_context, n, 64, type);
        if (took)
            PyGILState_Release(st);
        if (p != IBV_ALLOCATOR_USE_DEFAULT) {
            if (p) {
                memset(p, 0, n);
                *custom = 1;
            }
            return p;
        }
    }
    return calloc(1, n);
}

static void sr_dom_free(struct sr_pd *d, void *p, int custom, uint64_t type)
{
    PyGILState_STATE st;
    int took;

    if (!custom) {
        free(p);
        return;
    }
    took = sr_gil_take(&st);
    d->free(&d->pd, d->pd_context, p, type);
    if (took)
        PyGILState_Release(st);
}

/* ---- the completion ring ---- */
/* the entries of a ring for cqe completions: the power of two above cqe */
static uint32_t sr_ring_slots(uint32_t cqe)
{
    uint32_t size = 1;
    while (size <= cqe)
        size <<= 1;
    return size;
}

static int sr_ring_init(struct sr_ring *r, uint32_t cqe)
{
    uint32_t size = sr_ring_slots(cqe);
    r->wc = sr_dom_calloc(r->dom, (size_t)size * sizeof(struct ibv_wc), SR_RES_CQ, &r->custom);
    if (!r->wc)
        return -1;
    r->capacity = cqe;
    r->mask = size - 1;
    atomic_init(&r->head, 0);
    atomic_init(&r->tail, 0);
    pthread_spin_init(&r->consumer, PTHREAD_PROCESS_PRIVATE);
    return 0;
}

/* ---- waiting for a completion: a poller that found its CQ empty for a while sleeps ----
 * A program that spins on ibv_poll_cq holds a core that the progress thread needs (it
 * receives, ACKs and completes): on a loaded machine sched_yield alone leaves it waiting for
 * scheduler ticks. So after sr_spin consecutive empty polls a poll sleeps on a futex for at
 * most sr_wait_ns; sr_ring_push bumps sr_seq (any CQ of the process) and wakes sleepers, so a
 * completion ends the sleep at once. The sleep is in C: an empty poll never enters Python.
 * A poller sleeps only while the process is busy: a post or a completion in the last
 * SR_BUSY_NS; a program that waits long for a first message, or that only polls, spins
 * (and yields) as before. $SOFTRDMA_CAPI_SPIN and $SOFTRDMA_CAPI_WAIT_US (0: never sleep)
 * set the two; the spin is SR_SLEEP_SPIN polls before a sleep, SR_STEP_SPIN before a
 * receive step (below).
 * By default the poller does not sleep on the futex but runs one receive step of the device
 * itself (sr_py_progress: Python's busy poll, drivers.runtime.progress.PollPacer, which spins a
 * little and then sleeps in the kernel on the device's socket): the answer is then taken
 * and completed by the thread that waits for it, without a hand-off from the progress
 * thread (two thread switches per message). The progress thread stands back while it does.
 * $SOFTRDMA_CAPI_INLINE=0 sleeps on the futex instead ($SOFTRDMA_CAPI_WAIT_US=0: neither,
 * the poller spins and yields).
 * The step spins in Python itself (the pacer, bridge.STEP_POLLS empty polls) and returns
 * empty when that spin is over; the C spin between two steps is then a window in which a
 * datagram that arrives waits unread, so it is short: SR_STEP_SPIN polls (about 0.5 us),
 * where 256 (about 8 us) cost ibv_rc_pingpong -s 64 about 4 % of its round trip. */
#define SR_BUSY_NS 50000000LL
static _Atomic uint32_t sr_seq;      /* completions pushed into any ring of the process */
static _Atomic uint32_t sr_sleepers; /* pollers sleeping on sr_seq */
static _Atomic long long sr_active_ns; /* CLOCK_MONOTONIC of the last post or completion */
#define SR_SLEEP_SPIN 256  /* empty polls before a futex sleep */
#define SR_STEP_SPIN 16    /* empty polls before a receive step */
static unsigned int sr_spin = SR_STEP_SPIN;
static long sr_wait_ns = 200000;
static int sr_inline = 1;
static __thread unsigned int sr_empty_run;
/* the last receive step stopped at a completion of its CQ, leaving the datagrams behind
 * it: the next empty poll runs a step at once (sr_ring_empty) */
static __thread int sr_step_next;
static __thread int sr_taken;        /* completions taken since this thread's last step */
static atomic_int sr_stepped;          /* a receive step ran (sr_at_exit) */

static long long sr_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* a post (send, receive) or a completion: the process is busy for SR_BUSY_NS */
static void sr_posted(void)
{
    atomic_store_explicit(&sr_active_ns, sr_now_ns(), memory_order_relaxed);
}

static int sr_busy(void)
{
    return sr_now_ns() - atomic_load_explicit(&sr_active_ns, memory_order_relaxed)
           < SR_BUSY_NS;
}

static void sr_pushed(void)
{
    sr_posted();
    atomic_fetch_add_explicit(&sr_seq, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&sr_sleepers, memory_order_seq_cst))
        syscall(SYS_futex, &sr_seq, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
}

/* The ring is empty: sleep until a completion is pushed (into any ring) or sr_wait_ns. */
static void sr_sleep_empty(struct sr_ring *r)
{
    struct timespec ts = { 0, sr_wait_ns };
    uint32_t seq;

    atomic_fetch_add_explicit(&sr_sleepers, 1, memory_order_seq_cst);
    seq = atomic_load_explicit(&sr_seq, memory_order_seq_cst);
    if (atomic_load_explicit(&r->tail, memory_order_seq_cst)
        == atomic_load_explicit(&r->head, memory_order_relaxed))
        syscall(SYS_futex, &sr_seq, FUTEX_WAIT_PRIVATE, seq, &ts, NULL, 0);
    atomic_fetch_sub_explicit(&sr_sleepers, 1, memory_order_seq_cst);
}

static void sr_wait_config(void)
{
    const char *v = getenv("SOFTRDMA_CAPI_INLINE");
    if (v && *v)
        sr_inline = strtol(v, NULL, 0) != 0;
    sr_spin = sr_inline ? SR_STEP_SPIN : SR_SLEEP_SPIN;
    v = getenv("SOFTRDMA_CAPI_SPIN");
    if (v && *v)
        sr_spin = (unsigned int)strtoul(v, NULL, 0);
    v = getenv("SOFTRDMA_CAPI_WAIT_US");
    if (v && *v) {
        long us = strtol(v, NULL, 0);
        sr_wait_ns = us <= 0 ? 0 : (us >= 1000000 ? 999999999 : us * 1000);
    }
}

/* Called from Python (one producer at a time): 0, or -1 when the ring is full (overrun). */
int sr_ring_push(void *ring, uint64_t wr_id, int status, int opcode, uint32_t vendor_err,
                 uint32_t byte_len, uint32_t imm_or_rkey, uint32_t qp_num, uint32_t src_qp,
                 unsigned int wc_flags, uint16_t pkey_index, uint16_t slid, uint8_t sl,
                 uint8_t dlid_path_bits)
{
    struct sr_ring *r = ring;
    uint32_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    uint32_t head = atomic_load_explicit(&r->head, memory_order_acquire);
    struct ibv_wc *wc;

    if (tail - head >= r->capacity)
        return -1;
    wc = &r->wc[tail & r->mask];
    memset(wc, 0, sizeof(*wc));
    wc->wr_id = wr_id;
    wc->status = (enum ibv_wc_status)status;
    wc->opcode = (enum ibv_wc_opcode)opcode;
    wc->vendor_err = vendor_err;
    wc->byte_len = byte_len;
    if (wc_flags & IBV_WC_WITH_INV)
        wc->invalidated_rkey = imm_or_rkey;
    else
        wc->imm_data = htonl(imm_or_rkey);
    wc->qp_num = qp_num;
    wc->src_qp = src_qp;
    wc->wc_flags = wc_flags;
    wc->pkey_index = pkey_index;
    wc->slid = slid;
    wc->sl = sl;
    wc->dlid_path_bits = dlid_path_bits;
    if (r->ts)  /* the completion's time: when it reached the CQ */
        r->ts[tail & r->mask] = (uint64_t)sr_now_ns();
    atomic_store_explicit(&r->tail, tail + 1, memory_order_release);
    sr_pushed();
    return 0;
}

/* Completions queued in the ring (for tests and Python-side checks). */
int sr_ring_count(void *ring)
{
    struct sr_ring *r = ring;
    return (int)(atomic_load_explicit(&r->tail, memory_order_acquire)
                 - atomic_load_explicit(&r->head, memory_order_acquire));
}

/* an empty poll yields the CPU once every sr_yield_mask + 1 times ($SOFTRDMA_CAPI_YIELD) */
static unsigned int sr_yield_mask = 15;
static int sr_holds_gil(void);
static __thread unsigned int sr_empty_polls;

/* The ring of CQ h was found empty by ibv_poll_cq or ibv_start_poll: spin (yielding now
 * and then), then, once the spin is over and the process waits for a completion, receive
 * (sr_py_progress) or sleep (see "waiting for a completion" above). Returns 1 when the
 * ring now holds a completion, 0 for an empty poll. No lock, no Python while spinning. */
static int sr_ring_empty(struct sr_ring *r, int h)
{
    /* A program spinning here must leave the CPU to the progress thread now and then (it
     * runs ACKs, timers and the receive path), or on a busy machine every message waits
     * for a scheduler tick. */
    if (sr_wait_ns && (sr_step_next || ++sr_empty_run > sr_spin)) {
        int chained = sr_step_next;

        sr_step_next = 0;
        if (!sr_busy()) {
            sr_empty_run = 0;  /* look again after sr_spin more polls */
            return 0;
        }
        int step = 0;

        if (sr_inline) {
            /* receive here (Python's busy poll: it paces itself, see above); the ACKs
             * of what it received stay pending (sr_at_exit) */
            atomic_store_explicit(&sr_stepped, 1, memory_order_relaxed);
            /* taken: the pacer's idle streak begins anew; 1: the step stopped at a
             * receive's completion of this CQ, with the datagrams behind it (an ACK the
             * program may await next) left for the next step: the next empty poll runs
             * it at once; -1: the device's progress thread serves (the program left
             * input unread, ProgressCore.took): sleep until it completes, as below */
            step = sr_py_progress(h, sr_taken);
            sr_step_next = step > 0;
            sr_taken = 0;
        }
        if (sr_inline && step >= 0) {
            /* a step run at once after one that stopped early: this poll stays empty, its
             * completion is the next poll's. A CQ is then read as a NIC's is, a poll sees
             * what had arrived before it: a program that polls until the CQ is empty (the
             * rsockets loop) does not take, in one drain, every message behind the one it
             * waits for, its peer's disconnect included (rstream -T a saw POLLIN with
             * POLLHUP so and failed). A program that polls again finds it there. */
            if (chained)
                return 0;
        } else if (sr_holds_gil()) {
            /* a Python host's thread: the progress thread needs the GIL to
             * produce the completion that ends the sleep */
            PyThreadState *ts = PyEval_SaveThread();
            sr_sleep_empty(r);
            PyEval_RestoreThread(ts);
        } else {
            sr_sleep_empty(r);
        }
        return atomic_load_explicit(&r->tail, memory_order_acquire)
               != atomic_load_explicit(&r->head, memory_order_relaxed);
    }
    /* a busy process's poller that receives itself spins without yielding (the spin is
     * short): a yield on a loaded machine can last a time slice, and the progress thread
     * would take the answer meanwhile, every time */
    if ((++sr_empty_polls & sr_yield_mask) == 0 && !(sr_inline && sr_busy())) {
        if (sr_holds_gil())
            PyEval_RestoreThread(PyEval_SaveThread());  /* the progress thread's turn */
        else
            sched_yield();
    }
    return 0;
}

static int sr_poll_cq(struct ibv_cq *ibcq, int num_entries, struct ibv_wc *wc)
{
    struct sr_ring *r = &((struct sr_cq *)ibcq)->ring;
    uint32_t head, tail;
    int n = 0;

    if (num_entries < 0)
        return -1;
    if (atomic_load_explicit(&r->tail, memory_order_acquire)
        == atomic_load_explicit(&r->head, memory_order_relaxed)
        && !sr_ring_empty(r, SR_H(sr_cq, ibcq)))
        return 0;
    sr_empty_run = 0;
    sr_taken = 1;
    pthread_spin_lock(&r->consumer);
    head = atomic_load_explicit(&r->head, memory_order_relaxed);
    tail = atomic_load_explicit(&r->tail, memory_order_acquire);
    while (head != tail && n < num_entries) {
        wc[n++] = r->wc[head & r->mask];
        head++;
    }
    atomic_store_explicit(&r->head, head, memory_order_release);
    pthread_spin_unlock(&r->consumer);
    return n;
}

static int sr_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
    return sr_py_req_notify_cq(SR_H(sr_cq, cq), solicited_only);
}

/* ---- posting: flatten the chain, one Python call ----
 * A program posts the same request again and again (ib_write_bw, ibv_rc_pingpong: the same
 * buffer, length, opcode and flags; only wr_id changes). Each QP numbers the contents of its
 * last request (the flat record but wr_id, and its SGEs): a request equal to it gets the same
 * number in sr_swr.gen, a new one the next number, one with no SGE or more than
 * SR_KEYED_SGES none (0). The Python half (capi/posting.py) posts the request object it made
 * for that number again, with the new wr_id, instead of comparing the bytes itself. A number
 * names one content only, so threads posting on one QP cannot mix them up. */
#define SR_BATCH 64
#define SR_KEY_FROM offsetof(struct sr_swr, sg)
#define SR_KEY_LEN (offsetof(struct sr_swr, gen) - SR_KEY_FROM)

static uint32_t sr_same_gen(struct sr_qp *q, const struct sr_swr *f)
{
    const struct ibv_sge *sg = (const struct ibv_sge *)(uintptr_t)f->sg;
    uint32_t n = f->num_sge, gen;

    if (!n || n > SR_KEYED_SGES || !sg)
        return 0;
    pthread_spin_lock(&q->last_lock);
    if (q->last_gen && q->last.num_sge == n
        && !memcmp((const char *)f + SR_KEY_FROM, (const char *)&q->last + SR_KEY_FROM,
                   SR_KEY_LEN)
        && !memcmp(sg, q->last_sg, n * sizeof(*sg))) {
        gen = q->last_gen;
    } else {
        memcpy((char *)&q->last + SR_KEY_FROM, (const char *)f + SR_KEY_FROM, SR_KEY_LEN);
        memcpy(q->last_sg, sg, n * sizeof(*sg));
        gen = q->last_gen = q->last_gen + 1 ? q->last_gen + 1 : 1;
    }
    pthread_spin_unlock(&q->last_lock);
    return gen;
}

/* A BIND_MW request's fields (ibv_post_send, ibv_wr_bind_mw): type 2 window mw takes key
 * rkey and the range and access of info (IBA 10.6.7.2.2) */
static void sr_bind_fields(struct sr_swr *f, struct ibv_mw *mw, uint32_t rkey,
                           const struct ibv_mw_bind_info *info)
{
    f->mw = mw ? (uint32_t)SR_H(sr_mw, mw) : 0;
    f->rkey = rkey;
    f->mr = info->mr ? (uint32_t)SR_H(sr_mr, info->mr) : 0;
    f->remote_addr = info->addr;
    f->bind_length = info->length;
    f->mw_access = info->mw_access_flags;
}

static int sr_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    struct sr_swr flat[SR_BATCH];
    struct ibv_send_wr *first = wr, *w, *stop = NULL;
    int n = 0, ret, i;

    while (wr) {
        for (n = 0, first = wr; wr && n < SR_BATCH; wr = wr->next, n++) {
            struct sr_swr *f = &flat[n];
            if (wr->opcode == IBV_WR_ATOMIC_WRITE) {
                /* its 8 bytes come with ibv_wr_atomic_write only: struct ibv_send_wr has
                 * no member for them (the Python verbs refuse it the same way) */
                stop = wr;
                break;
            }
            memset(f, 0, sizeof(*f));
            f->wr_id = wr->wr_id;
            f->sg = (uint64_t)(uintptr_t)wr->sg_list;
            f->num_sge = wr->num_sge < 0 ? 0xffffffffu : (uint32_t)wr->num_sge;
            f->opcode = wr->opcode;
            f->send_flags = wr->send_flags;
            f->imm_data = ntohl(wr->imm_data);
            if (wr->opcode == IBV_WR_SEND_WITH_INV || wr->opcode == IBV_WR_LOCAL_INV)
                f->imm_data = wr->invalidate_rkey;
            if (qp->qp_type == IBV_QPT_XRC_SEND)
                f->xrc_srqn = wr->qp_type.xrc.remote_srqn;
            if (wr->opcode == IBV_WR_BIND_MW) {
                sr_bind_fields(f, wr->bind_mw.mw, wr->bind_mw.rkey, &wr->bind_mw.bind_info);
            } else if (qp->qp_type == IBV_QPT_UD) {
                f->ah = wr->wr.ud.ah ? (uint32_t)SR_H(sr_ah, wr->wr.ud.ah) : 0;
                f->remote_qpn = wr->wr.ud.remote_qpn;
                f->remote_qkey = wr->wr.ud.remote_qkey;
            } else if (wr->opcode == IBV_WR_ATOMIC_CMP_AND_SWP
                       || wr->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
                f->remote_addr = wr->wr.atomic.remote_addr;
                f->rkey = wr->wr.atomic.rkey;
                f->compare_add = wr->wr.atomic.compare_add;
                f->swap = wr->wr.atomic.swap;
            } else {
                f->remote_addr = wr->wr.rdma.remote_addr;
                f->rkey = wr->wr.rdma.rkey;
            }
            f->gen = sr_same_gen((struct sr_qp *)qp, f);
        }
        i = 0;  /* the Python half sets the index of the WR that failed */
        sr_posted();
        ret = n ? sr_py_post_send(SR_H(sr_qp, qp), flat, n, &i) : 0;
        if (ret) {
            for (w = first; i > 0 && w->next; i--)
                w = w->next;
            if (bad)
                *bad = w;
            return ret;
        }
        if (stop) {
            if (bad)
                *bad = stop;
            return EOPNOTSUPP;
        }
    }
    return 0;
}

static int sr_flatten_recv(struct ibv_recv_wr *wr, struct sr_rwr *flat, struct ibv_recv_wr **next)
{
    int n;
    for (n = 0; wr && n < SR_BATCH; wr = wr->next, n++) {
        flat[n].wr_id = wr->wr_id;
        flat[n].sg = (uint64_t)(uintptr_t)wr->sg_list;
        flat[n].num_sge = wr->num_sge < 0 ? 0xffffffffu : (uint32_t)wr->num_sge;
    }
    *next = wr;
    return n;
}

static int sr_post_recv_h(int h, int is_srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    struct sr_rwr flat[SR_BATCH];
    struct ibv_recv_wr *first, *next;
    int n, i, ret;

    while (wr) {
        first = wr;
        n = sr_flatten_recv(wr, flat, &next);
        i = 0;
        sr_posted();
        ret = sr_py_post_recv(h, is_srq, flat, n, &i);
        if (ret) {
            for (; i > 0 && first->next; i--)
                first = first->next;
            if (bad)
                *bad = first;
            return ret;
        }
        wr = next;
    }
    return 0;
}

/* Store the one-SGE receives at the head of the chain wr in ring r while it is open and
 * has room; returns the first receive not stored (NULL: all were). */
static struct ibv_recv_wr *sr_rqring_store(struct sr_rqring *r, struct ibv_recv_wr *wr)
{
    pthread_spin_lock(&r->lock);
    while (wr && r->open && wr->num_sge == 1 && wr->sg_list && r->count + r->qlen < r->cap) {
        struct sr_rq_ent *x = &r->e[(r->head + r->count) % r->cap];
        x->wr_id = wr->wr_id;
        x->addr = wr->sg_list->addr;
        x->length = wr->sg_list->length;
        x->lkey = wr->sg_list->lkey;
        r->count++;
        wr = wr->next;
    }
    pthread_spin_unlock(&r->lock);
    sr_posted();
    return wr;
}

static int sr_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    struct sr_rqring *r = &((struct sr_qp *)qp)->rq;

    if (r->e && wr && !(wr = sr_rqring_store(r, wr)))
        return 0;
    return sr_post_recv_h(SR_H(sr_qp, qp), 0, wr, bad);
}

static void *sr_rqring_init(struct sr_rqring *r, uint32_t cap, uint64_t type)
{
    if (r->e || !cap)
        return NULL;
    r->type = type;
    r->e = sr_dom_calloc(r->dom, (size_t)cap * sizeof(*r->e), type, &r->custom);
    if (!r->e)
        return NULL;
    pthread_spin_init(&r->lock, PTHREAD_PROCESS_PRIVATE);
    r->cap = cap;
    return r;
}

static void sr_rqring_free(struct sr_rqring *r)
{
    if (r->e) {
        pthread_spin_destroy(&r->lock);
        sr_dom_free(r->dom, r->e, r->custom, r->type);
        r->e = NULL;
    }
}

/* Called from Python: give the QP wrapper a receive ring of cap entries; NULL: none. */
void *sr_rq_ring(void *wrapper, uint32_t cap)
{
    return sr_rqring_init(&((struct sr_qp *)wrapper)->rq, cap, SR_RES_RQ);
}

/* Called from Python: the same for an SRQ wrapper (cap: the SRQ's max_wr). */
void *sr_srq_ring(void *wrapper, uint32_t cap)
{
    return sr_rqring_init(&((struct sr_srq *)wrapper)->rq, cap, SR_RES_SRQ);
}

/* Called from Python (under the engine lock): move up to most entries, oldest first, into
 * the arrays; the Python queue then holds qlen + that many. close: store no more. */
int sr_rq_drain(void *ring, uint64_t *wr_id, uint64_t *addr, uint32_t *length, uint32_t *lkey,
                int most, uint32_t qlen, int close)
{
    struct sr_rqring *r = ring;
    int n, i;

    pthread_spin_lock(&r->lock);
    n = (uint32_t)most < r->count ? most : (int)r->count;
    for (i = 0; i < n; i++) {
        struct sr_rq_ent *x = &r->e[(r->head + (uint32_t)i) % r->cap];
        wr_id[i] = x->wr_id;
        addr[i] = x->addr;
        length[i] = x->length;
        lkey[i] = x->lkey;
    }
    r->head = (r->head + (uint32_t)n) % r->cap;
    r->count -= (uint32_t)n;
    r->qlen = qlen + (uint32_t)n;
    if (close)
        r->open = 0;
    pthread_spin_unlock(&r->lock);
    return n;
}

/* Called from Python after a post through it succeeded: store receives again. */
void sr_rq_reopen(void *ring, uint32_t qlen)
{
    struct sr_rqring *r = ring;

    pthread_spin_lock(&r->lock);
    r->qlen = qlen;
    r->open = 1;
    pthread_spin_unlock(&r->lock);
}

static int sr_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    struct sr_rqring *r = &((struct sr_srq *)srq)->rq;

    if (r->e && wr && !(wr = sr_rqring_store(r, wr)))
        return 0;
    return sr_post_recv_h(SR_H(sr_srq, srq), 1, wr, bad);
}

/* ---- fork ----
 * A C fork() runs none of Python's at-fork handlers, and the child's interpreter would be
 * left with its GIL held by a thread the child does not have. Around a fork by the
 * program (a thread without the GIL) this does what os.fork() does: take the GIL and
 * PyOS_BeforeFork() before, PyOS_AfterFork_Parent()/_Child() after, so softrdma's
 * handlers run (the child gives up the device links it inherited, drivers/devd/client.py)
 * and the child can open devices of its own. A fork by Python itself (it holds the GIL)
 * is left to Python. */
static __thread int sr_fork_held;
static __thread PyGILState_STATE sr_fork_gil;

static void sr_fork_prepare(void)
{
    sr_fork_held = 0;
    if (!Py_IsInitialized() || PyGILState_Check())
        return;
    sr_fork_gil = PyGILState_Ensure();
    PyOS_BeforeFork();
    sr_fork_held = 1;
}

static void sr_fork_parent(void)
{
    if (!sr_fork_held)
        return;
    sr_fork_held = 0;
    PyOS_AfterFork_Parent();
    PyGILState_Release(sr_fork_gil);
}

static void sr_fork_child(void)
{
    if (!sr_fork_held)
        return;
    sr_fork_held = 0;
    PyOS_AfterFork_Child();
    PyGILState_Release(sr_fork_gil);
}

static void sr_at_exit(void);

static void sr_fork_clear(void)
{
    atomic_store_explicit(&sr_stepped, 0, memory_order_relaxed);
}

__attribute__((constructor)) static void sr_init(void)
{
    pthread_atfork(sr_fork_prepare, sr_fork_parent, sr_fork_child);
    pthread_atfork(NULL, NULL, sr_fork_clear);
    atexit(sr_at_exit);
}

/* ---- helpers ---- */
static void *sr_fail(int err)
{
    errno = err;
    return NULL;
}

/* a handle (> 0) or a negative errno from Python: NULL with errno set for the latter */
static int sr_handle_ok(int h)
{
    if (h > 0)
        return 1;
    errno = h < 0 ? -h : EIO;
    return 0;
}

/* The program's own open file description of one of Python's (non-blocking) pipes: it
 * starts blocking and is the program's to change. -1 if /proc cannot give one. */
static int sr_own_fd(int fd)
{
    char path[64];

    if (fd < 0)
        return -1;
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    return open(path, O_RDONLY | O_CLOEXEC);
}

/* Wait for a pipe that the Python half writes a byte to per event: EAGAIN at once when
 * the program made its descriptor non-blocking. 0 to look again, -1 with errno. */
/* ---- a Python program as the host (python3-pyverbs: Cython over libibverbs) ----
 * cffi's embedding mode initializes Python only when the process runs none, so in a Python
 * program softrdma runs in the program's own interpreter. That interpreter must be the
 * Python this library was built and linked for: the loader binds the library's Py_*
 * references to the program's interpreter first. Another major.minor is refused before
 * Python is entered (a message once, ELIBBAD), never a crash or a hang. A thread of the
 * program may hold the GIL when it calls a verb: a verb that blocks lets it go, and an
 * empty poll lets it go now and then, or softrdma's progress thread could never run. */
static atomic_int sr_python_state;  /* 0 unchecked, 1 good, -1 another Python or rspreload */

/* librspreload (rsockets under a socket program) is preloaded too: with no preload_config
 * it makes every TCP and UDP socket of the process an rsocket, those of softrdma's own
 * Python (its RoCE link, its route lookups) among them, and the process hangs. Its verbs
 * are then refused (a message once): rsockets falls back to the kernel's sockets, so the
 * program runs, without RDMA, instead of hanging. */
static int sr_rspreload(void)
{
    Dl_info info;
    void *sym = dlsym(RTLD_DEFAULT, "socket");

    return sym && dladdr(sym, &info) && info.dli_fname
           && strstr(info.dli_fname, "rspreload") != NULL;
}

/* SIGINT as the program had it before softrdma's Python began (a C program's: the first
 * import of Python's signal module in a new interpreter replaces a default SIGINT with the
 * handler that raises KeyboardInterrupt, and Ctrl-C then no longer ended the program, but
 * failed a verb or went unnoticed): sr_keep_program_sigint puts it back. */
static struct sigaction sr_sigint_saved;
static atomic_int sr_sigint_held;  /* 1: saved, to put back once (a C host) */

/* Called by the library's init code (build.py), once softrdma's Python is up and has
 * imported the signal module: a C program's SIGINT as it was; a Python host's stays. */
void sr_keep_program_sigint(void)
{
    if (atomic_exchange(&sr_sigint_held, 0) == 1)
        sigaction(SIGINT, &sr_sigint_saved, NULL);
}

/* softrdma's directories (SOFTRDMA_CAPI_PATH: the sys.path of the Python that runs
 * softrdma run) are given to the interpreter that serves the program, not through
 * PYTHONPATH, which every Python the program starts would read too (a Python of another
 * version then imported this one's standard library and failed: "SRE module mismatch"). */
#define SR_PATH_ENV "SOFTRDMA_CAPI_PATH"
static atomic_int sr_started_python;  /* 1: this library started the interpreter (a C host) */
static atomic_int sr_start_failed;    /* 1: it could not (a message was printed) */

/* A C program's interpreter, started before cffi would start it (once), as Py_InitializeEx(0)
 * does but:
 * - it leaves the program's locale alone (configure_locale 0: Python's start-up otherwise
 *   calls setlocale(LC_CTYPE, "") in the program, whose LC_CTYPE then went from "C" to the
 *   environment's) and takes UTF-8 for text and file names (utf8_mode 1, PEP 540), which it
 *   took from that locale;
 * - its module search path begins with SOFTRDMA_CAPI_PATH, then the program's PYTHONPATH;
 * - a failure is a message and verbs that fail with ELIBBAD, not Py_FatalError's abort.
 * cffi then finds Python running and takes the GIL like a Python host's thread. */
static void sr_start_python(void)
{
    PyPreConfig pre;
    PyConfig config;
    PyStatus status;
    const char *ours = getenv(SR_PATH_ENV), *theirs = getenv("PYTHONPATH");

    atomic_store(&sr_started_python, 1);
    PyPreConfig_InitPythonConfig(&pre);
    pre.configure_locale = 0;
    pre.coerce_c_locale = 0;  /* (PEP 538 sets LC_CTYPE in the environment) */
    pre.utf8_mode = 1;
    status = Py_PreInitialize(&pre);
    if (PyStatus_Exception(status))
        goto failed;
    PyConfig_InitPythonConfig(&config);
    config.install_signal_handlers = 0;  /* Py_InitializeEx(0), as cffi starts it */
    config.configure_c_stdio = 0;        /* the program's stdio as it is */
    config.parse_argv = 0;
    if (!theirs || !*theirs)
        theirs = NULL;
    if (ours && *ours) {
        size_t n = strlen(ours) + (theirs ? strlen(theirs) + 1 : 0) + 1;
        char *path = malloc(n);

        if (path) {
            snprintf(path, n, "%s%s%s", ours, theirs ? ":" : "", theirs ? theirs : "");
            status = PyConfig_SetBytesString(&config, &config.pythonpath_env, path);
            free(path);
        } else {
            status = PyStatus_NoMemory();
        }
    }
    if (!PyStatus_Exception(status))
        status = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(status))
        goto failed;
    PyEval_SaveThread();  /* the GIL is cffi's to take, as after its own start */
    return;
failed:
    atomic_store(&sr_start_failed, 1);
    fprintf(stderr, "softrdma: cannot start Python %d.%d to serve this program's verbs "
            "(%s%s%s): they fail with ELIBBAD\n", PY_MAJOR_VERSION, PY_MINOR_VERSION,
            status.func ? status.func : "", status.func ? ": " : "",
            status.err_msg ? status.err_msg : "unknown error");
}

/* A Python program (its interpreter was running before softrdma's first verb): softrdma's
 * directories go first on its sys.path (those it lacks), before cffi starts softrdma in it
 * and imports _cffi_backend, as PYTHONPATH would have put them. */
static void sr_host_path(void)
{
    const char *ours = getenv(SR_PATH_ENV);
    PyGILState_STATE gil;
    PyObject *path;
    Py_ssize_t at = 0;

    if (!ours || !*ours)
        return;
    gil = PyGILState_Ensure();
    path = PySys_GetObject("path");  /* borrowed */
    while (path && PyList_Check(path) && *ours) {
        size_t n = strcspn(ours, ":");
        PyObject *dir = n ? PyUnicode_DecodeFSDefaultAndSize(ours, (Py_ssize_t)n) : NULL;

        if (dir && PySequence_Contains(path, dir) == 0 && PyList_Insert(path, at, dir) == 0)
            at++;
        Py_XDECREF(dir);
        PyErr_Clear();
        ours += n + (ours[n] == ':');
    }
    PyGILState_Release(gil);
}

static pthread_once_t sr_preinit_once = PTHREAD_ONCE_INIT;
static pthread_once_t sr_host_path_once = PTHREAD_ONCE_INIT;

static int sr_python_ok(void)
{
    char want[16];
    const char *got;
    int state = atomic_load(&sr_python_state);

    if (state == 0 && !Py_IsInitialized() && !atomic_load(&sr_sigint_held)
        && sigaction(SIGINT, NULL, &sr_sigint_saved) == 0)
        atomic_store(&sr_sigint_held, 1);  /* a C host: Python is not up yet */
    if (state == 0 && sr_rspreload()) {
        fprintf(stderr, "softrdma: librspreload is preloaded too: it takes every TCP and UDP "
                "socket of the process, softrdma's own among them, so softrdma cannot serve "
                "this process (its verbs fail with ELIBBAD; rsockets then uses the kernel's "
                "sockets)\n");
        atomic_store(&sr_python_state, -1);
        state = -1;
    }
    /* (not for a program refused above: its interpreter is never started) */
    if (state == 0 && !Py_IsInitialized())
        pthread_once(&sr_preinit_once, sr_start_python);
    if (state == 0 && atomic_load(&sr_start_failed)) {
        atomic_store(&sr_python_state, -1);  /* (said so) */
        state = -1;
    }
    if (state == 0) {
        snprintf(want, sizeof(want), "%d.%d.", PY_MAJOR_VERSION, PY_MINOR_VERSION);
        got = Py_GetVersion();  /* the host's interpreter when it is a Python program */
        state = strncmp(got, want, strlen(want)) == 0 ? 1 : -1;
        if (state < 0)
            fprintf(stderr, "softrdma: this program runs Python %.*s, and softrdma's C "
                    "interface is built for Python %d.%d: its verbs fail with ELIBBAD. Run "
                    "it with a Python %d.%d, or install softrdma in this Python and run "
                    "that one's softrdma\n", (int)strcspn(got, " "), got, PY_MAJOR_VERSION,
                    PY_MINOR_VERSION, PY_MAJOR_VERSION, PY_MINOR_VERSION);
        if (state > 0 && !atomic_load(&sr_started_python))
            pthread_once(&sr_host_path_once, sr_host_path);
        atomic_store(&sr_python_state, state);
    }
    if (state < 0)
        errno = ELIBBAD;
    return state > 0;
}

/* ---- exit ----
 * A receive step (sr_py_progress) leaves the ACKs of what it received pending, as Python's
 * busy poll does (but a prompt one, for a peer that awaits it, which the step sends): they
 * leave with the program's next post, right after its request (on a contended machine in
 * one batch with it). A C program may exit right after its last completion, and its
 * embedded Python has no shutdown that would send them: at exit they are sent
 * (sr_py_at_exit), or the peer's SEND would complete in error once its retries are spent.
 * Not in a Python host (its interpreter is finalized by then: it closed its devices) nor
 * in a forked child that ran no receive step of its own (the flag is cleared at fork). */
static void sr_at_exit(void)
{
    if (!atomic_load_explicit(&sr_stepped, memory_order_relaxed)
        || atomic_load(&sr_python_state) <= 0 || !Py_IsInitialized()
        || PyGILState_Check())  /* exit() from inside a verb (a signal handler's) */
        return;
    sr_py_at_exit();
}

/* true when the calling thread holds the GIL (a Python host's thread inside a verb) */
static int sr_holds_gil(void)
{
    return atomic_load(&sr_python_state) > 0 && Py_IsInitialized() && PyGILState_Check();
}

/* True when a handler of the program for a signal that may come while it waits lacks
 * SA_RESTART. The fault signals a thread raises itself (SIGSEGV, SIGBUS, SIGFPE, SIGILL,
 * SIGTRAP, SIGSYS) and SIGABRT do not count: crash handlers (Python's faulthandler, a C
 * program's crash reporter) are installed without SA_RESTART and never end a wait. */
static int sr_handler_without_restart(void)
{
    static const int fault[] = { SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT };
    struct sigaction sa;
    unsigned int i;
    int s;

    for (s = 1; s < NSIG; s++) {
        for (i = 0; i < sizeof(fault) / sizeof(fault[0]) && fault[i] != s; i++)
            ;
        if (i < sizeof(fault) / sizeof(fault[0]) || s == SIGKILL || s == SIGSTOP
            || sigaction(s, NULL, &sa))
            continue;  /* (glibc refuses its own two real-time signals: skipped) */
        if ((sa.sa_flags & SA_SIGINFO) ? sa.sa_sigaction == NULL
            : (sa.sa_handler == SIG_DFL || sa.sa_handler == SIG_IGN))
            continue;
        if (!(sa.sa_flags & SA_RESTART))
            return 1;
    }
    return 0;
}

/* Wait until fd (a channel's descriptor) is readable: 0, or -1 with errno. The verbs that
 * wait here (ibv_get_cq_event, ibv_get_async_event, rdma_get_cm_event) block in libibverbs
 * in read(2) of the channel and in librdmacm in write(2) of its event command, which a
 * signal handler interrupts with EINTR unless it was installed with SA_RESTART, when the
 * kernel restarts the call (signal(7)); poll(2) is never restarted. So a poll that a
 * signal interrupted fails with EINTR when a handler lacks SA_RESTART (which signal came
 * is not known here), and waits on otherwise: qperf ends its test loop, blocked in
 * ibv_get_cq_event, by a SIGALRM handler without SA_RESTART (and without it waited for
 * an event that never came: "failed to receive results: timed out"); perftest's
 * signal(3) handlers (SA_RESTART) leave the wait as it was. */
static int sr_wait_fd(int fd)
{
    struct pollfd pfd = { .fd = fd, .events = POLLIN };
    PyThreadState *saved = NULL;
    int ret = 0;

    if (fcntl(fd, F_GETFL) & O_NONBLOCK) {
        errno = EAGAIN;
        return -1;
    }
    if (sr_holds_gil())
        saved = PyEval_SaveThread();
    while (poll(&pfd, 1, -1) < 0) {
        if (errno != EINTR || sr_handler_without_restart()) {
            ret = -1;
            break;
        }
    }
    if (saved) {
        int err = errno;

        PyEval_RestoreThread(saved);
        errno = err;
    }
    return ret;
}

static int sr_load_devices(void)
{
    int n, i, iwarp;

    if (!sr_python_ok())
        return -1;
    pthread_mutex_lock(&g_lock);
    if (g_ndev >= 0) {
        pthread_mutex_unlock(&g_lock);
        return g_ndev;
    }
    n = sr_py_ndevices();
    if (n < 0) {
        pthread_mutex_unlock(&g_lock);
        errno = -n;
        return -1;
    }
    g_devs = calloc(n > 0 ? (size_t)n : 1, sizeof(*g_devs));
    if (!g_devs) {
        pthread_mutex_unlock(&g_lock);
        errno = ENOMEM;
        return -1;
    }
    for (i = 0; i < n; i++) {
        struct sr_device *d = &g_devs[i];
        iwarp = 0;
        sr_py_device(i, d->dev.name, &d->guid, &iwarp);
        d->index = i;
        d->dev.node_type = iwarp ? IBV_NODE_RNIC : IBV_NODE_CA;
        d->dev.transport_type = iwarp ? IBV_TRANSPORT_IWARP : IBV_TRANSPORT_IB;
        snprintf(d->dev.dev_name, sizeof(d->dev.dev_name), "uverbs%d", i);
        snprintf(d->dev.dev_path, sizeof(d->dev.dev_path), "/sys/class/infiniband_verbs/uverbs%d", i);
        snprintf(d->dev.ibdev_path, sizeof(d->dev.ibdev_path), "/sys/class/infiniband/%s", d->dev.name);
    }
    g_ndev = n;
    pthread_mutex_unlock(&g_lock);
    return n;
}

static struct ibv_qp *sr_create_qp_ex(struct ibv_context *context,
                                      struct ibv_qp_init_attr_ex *attr);
static void sr_x_free(struct sr_qp *q);
static void sr_ext_context_ops(struct verbs_context *vctx);
static struct ibv_qp *sr_create_xrc_tgt(struct ibv_context *context,
                                        struct ibv_qp_init_attr_ex *attr, int cm_id);

/* ---- devices ---- */
struct ibv_device **ibv_get_device_list(int *num_devices)
{
    struct ibv_device **list;
    int n = sr_load_devices(), i;

    if (n < 0)
        return NULL;
    list = calloc((size_t)n + 1, sizeof(*list));
    if (!list)
        return sr_fail(ENOMEM);
    for (i = 0; i < n; i++)
        list[i] = &g_devs[i].dev;
    if (num_devices)
        *num_devices = n;
    return list;
}

void ibv_free_device_list(struct ibv_device **list)
{
    free(list);
}

const char *ibv_get_device_name(struct ibv_device *device)
{
    return device ? device->name : NULL;
}

__be64 ibv_get_device_guid(struct ibv_device *device)
{
    return htobe64(((struct sr_device *)device)->guid);
}

int ibv_get_device_index(struct ibv_device *device)
{
    return ((struct sr_device *)device)->index;
}

int ibv_fork_init(void)
{
    return 0;
}

/* softrdma's memory regions are not pinned for a device's DMA: a forked child's copy-on-write
 * pages never change what the parent's MRs read and write, so fork needs no protection
 * (rdma-core: IBV_FORK_UNNEEDED, as on kernels with copy-on-fork for pinned pages). */
enum ibv_fork_status ibv_is_fork_initialized(void)
{
    return IBV_FORK_UNNEEDED;
}

/* The context's cmd_fd: no uverbs file behind softrdma, but programs dup(2) and poll it
 * (pyverbs' Context.cmd_fd, then ibv_import_device, which fails with EOPNOTSUPP): one
 * /dev/null descriptor of the process, opened on first use (-1 if it cannot be). */
static int sr_cmd_fd(void)
{
    static int fd = -1;

    pthread_mutex_lock(&g_lock);
    if (fd < 0)
        fd = open("/dev/null", O_RDWR | O_CLOEXEC);
    pthread_mutex_unlock(&g_lock);
    return fd;
}

/* The program's struct ibv_context for the Context of handle h (NULL with errno). */
static struct ibv_context *sr_wrap_context(int h, int afd, struct ibv_device *device)
{
    struct sr_context *c;
    struct ibv_context *ctx;

    c = calloc(1, sizeof(*c));
    if (!c)
        return sr_fail(ENOMEM);
    c->async_own = sr_own_fd(afd);
    {
        const char *y = getenv("SOFTRDMA_CAPI_YIELD");
        if (y && *y)
            sr_yield_mask = (unsigned int)strtoul(y, NULL, 0);
        sr_wait_config();
    }
    c->h = h;
    ctx = &c->vctx.context;
    ctx->device = device;
    ctx->cmd_fd = sr_cmd_fd();
    ctx->async_fd = c->async_own >= 0 ? c->async_own : afd;
    ctx->num_comp_vectors = 1;
    pthread_mutex_init(&ctx->mutex, NULL);
    ctx->ops.poll_cq = sr_poll_cq;
    ctx->ops.req_notify_cq = sr_req_notify_cq;
    ctx->ops.post_send = sr_post_send;
    ctx->ops.post_recv = sr_post_recv;
    ctx->ops.post_srq_recv = sr_post_srq_recv;
    /* the extended verbs inlined in verbs.h look for their op here; those left NULL fail
     * with EOPNOTSUPP or fall back to the legacy exports (ibv_query_port, ibv_query_device) */
    ctx->abi_compat = __VERBS_ABI_IS_EXTENDED;
    c->vctx.sz = sizeof(c->vctx);
    c->vctx.create_qp_ex = sr_create_qp_ex;
    sr_ext_context_ops(&c->vctx);
    return ctx;
}

struct ibv_context *ibv_open_device(struct ibv_device *device)
{
    struct ibv_context *ctx;
    int h, afd = -1;

    if (!device)
        return sr_fail(EINVAL);
    h = sr_py_open(((struct sr_device *)device)->index, &afd);
    if (!sr_handle_ok(h))
        return NULL;
    ctx = sr_wrap_context(h, afd, device);
    if (!ctx)
        sr_py_destroy(h);
    return ctx;
}

int ibv_close_device(struct ibv_context *context)
{
    struct sr_context *c = SR_CTX(context);
    int ret = sr_py_destroy(c->h);

    if (ret) {
        errno = ret;
        return -1;
    }
    if (c->async_own >= 0)
        close(c->async_own);
    free(c);
    return 0;
}

int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *attr)
{
    memset(attr, 0, sizeof(*attr));
    return sr_py_query_device(SR_CTX(context)->h, attr);
}

#undef ibv_query_port
/* verbs.h's ibv_query_port macro calls this with the full struct ibv_port_attr (zeroed). */
int ibv_query_port(struct ibv_context *context, uint8_t port_num, struct _compat_ibv_port_attr *attr)
{
    return sr_py_query_port(SR_CTX(context)->h, port_num, (struct ibv_port_attr *)attr);
}

int ibv_query_gid(struct ibv_context *context, uint8_t port_num, int index, union ibv_gid *gid)
{
    int ret = sr_py_query_gid(SR_CTX(context)->h, port_num, index, gid->raw);
    if (ret) {
        errno = ret;
        return -1;
    }
    return 0;
}

/* rdma-core's private verb (IBVERBS_PRIVATE_*), used by ibv_devinfo; type is driver.h's
 * enum ibv_gid_type_sysfs (0 IB/RoCE v1, 1 RoCE v2) */
int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num, unsigned int index,
                       unsigned int *type)
{
    int t = 0, ret = sr_py_query_gid_type(SR_CTX(context)->h, port_num, (int)index, &t);
    if (ret) {
        errno = ret;
        return -1;
    }
    *type = t == IBV_GID_TYPE_ROCE_V2 ? 1 : 0;  /* Python gives enum ibv_gid_type */
    return 0;
}

int _ibv_query_gid_ex(struct ibv_context *context, uint32_t port_num, uint32_t gid_index,
                      struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size)
{
    struct ibv_gid_entry e;
    int t = 0, ret;

    if (flags || entry_size < sizeof(e))
        return EINVAL;
    memset(&e, 0, sizeof(e));
    ret = sr_py_query_gid(SR_CTX(context)->h, (int)port_num, (int)gid_index, e.gid.raw);
    if (!ret)
        ret = sr_py_query_gid_type(SR_CTX(context)->h, (int)port_num, (int)gid_index, &t);
    if (ret)
        return ret;
    e.gid_index = gid_index;
    e.port_num = port_num;
    e.gid_type = (uint32_t)t;
    memcpy(entry, &e, sizeof(e));
    return 0;
}

int ibv_query_pkey(struct ibv_context *context, uint8_t port_num, int index, __be16 *pkey)
{
    uint16_t p = 0;
    int ret = sr_py_query_pkey(SR_CTX(context)->h, port_num, index, &p);
    if (ret) {
        errno = ret;
        return -1;
    }
    *pkey = htons(p);
    return 0;
}

/* ---- affiliated async events: a destroy waits for their acks ----
 * As libibverbs: ibv_destroy_qp/cq/srq return only once every event reported about the
 * object was acknowledged (ibv_ack_async_event), so a thread that handles an event never
 * reads a freed object (UCX's async thread reads element.qp->qp_num). Unread events of a
 * destroyed object are dropped (bridge._get_async_event, Context._unregister_owner). */
struct sr_ev_ref { const void *el; unsigned int n; };
static pthread_mutex_t sr_ev_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sr_ev_cond = PTHREAD_COND_INITIALIZER;
static struct sr_ev_ref *sr_ev_refs;
static size_t sr_ev_len, sr_ev_cap;

static struct sr_ev_ref *sr_ev_find(const void *el)
{
    for (size_t i = 0; i < sr_ev_len; i++)
        if (sr_ev_refs[i].el == el)
            return &sr_ev_refs[i];
    return NULL;
}

/* an event about ``el`` was reported to the program: 0, or -1 (ENOMEM) */
static int sr_ev_reported(const void *el)
{
    struct sr_ev_ref *r;
    int ret = 0;

    pthread_mutex_lock(&sr_ev_lock);
    r = sr_ev_find(el);
    if (!r && sr_ev_len == sr_ev_cap) {
        size_t cap = sr_ev_cap ? 2 * sr_ev_cap : 8;
        struct sr_ev_ref *grown = realloc(sr_ev_refs, cap * sizeof(*grown));
        if (grown) {
            sr_ev_refs = grown;
            sr_ev_cap = cap;
        }
    }
    if (!r && sr_ev_len < sr_ev_cap) {
        r = &sr_ev_refs[sr_ev_len++];
        r->el = el;
        r->n = 0;
    }
    if (r)
        r->n++;
    else
        ret = -1;
    pthread_mutex_unlock(&sr_ev_lock);
    return ret;
}

/* the object ``el`` is destroyed: wait until its reported events were acknowledged */
static void sr_ev_wait_acked(const void *el)
{
    pthread_mutex_lock(&sr_ev_lock);
    while (sr_ev_find(el))
        pthread_cond_wait(&sr_ev_cond, &sr_ev_lock);
    pthread_mutex_unlock(&sr_ev_lock);
}

int ibv_get_async_event(struct ibv_context *context, struct ibv_async_event *event)
{
    int type = 0, port = 0, r;
    void *element = NULL;

    for (;;) {
        r = sr_py_get_async_event(SR_CTX(context)->h, &type, &element, &port);
        if (r > 0) {
            memset(event, 0, sizeof(*event));
            event->event_type = (enum ibv_event_type)type;
            if (element) {  /* the wrapper of the QP, CQ or SRQ: its libibverbs struct is first */
                if (sr_ev_reported(element)) {
                    errno = ENOMEM;
                    return -1;
                }
                event->element.qp = element;
            } else {
                event->element.port_num = port;
            }
            return 0;
        }
        if (r < 0) {
            errno = -r;
            return -1;
        }
        if (sr_wait_fd(context->async_fd))
            return -1;
    }
}

void ibv_ack_async_event(struct ibv_async_event *event)
{
    struct sr_ev_ref *r;

    /* a port event's element is a port number, never a reported object's address */
    pthread_mutex_lock(&sr_ev_lock);
    r = sr_ev_find(event->element.qp);
    if (r && --r->n == 0) {
        *r = sr_ev_refs[--sr_ev_len];
        pthread_cond_broadcast(&sr_ev_cond);
    }
    pthread_mutex_unlock(&sr_ev_lock);
}

/* A zeroed wrapper of ``size`` bytes for a new handle ``h``: NULL with errno when ``h`` is
 * not a handle (the bridge set errno) or memory is short (ENOMEM, ``h`` destroyed). */
static void *sr_handle_box(int h, size_t size)
{
    void *box;

    if (!sr_handle_ok(h))
        return NULL;
    box = calloc(1, size);
    if (!box) {
        sr_py_destroy(h);
        return sr_fail(ENOMEM);
    }
    return box;
}

/* ---- protection domains, memory regions ---- */
struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)
{
    struct sr_pd *p;
    int h = sr_py_alloc_pd(SR_CTX(context)->h);

    p = sr_handle_box(h, sizeof(*p));
    if (!p)
        return NULL;
    p->h = h;
    p->pd.context = context;
    p->pd.handle = (uint32_t)h;
    return &p->pd;
}

/* destroy an object that has no asynchronous events (a PD, MR, channel, AH) */
static int sr_destroy_obj(int h, void *wrapper)
{
    int ret = sr_py_destroy(h);
    if (ret)
        return ret;
    free(wrapper);
    return 0;
}

int ibv_dealloc_pd(struct ibv_pd *pd)
{
    struct sr_pd *p = (struct sr_pd *)pd;

    if (atomic_load(&p->users))
        return EBUSY;  /* a PD's parent domains, a parent domain's QPs, SRQs or CQs */
    if (!p->base)
        return sr_destroy_obj(p->h, pd);
    sr_dom_put(p->base);
    if (p->td)
        atomic_fetch_sub(&p->td->users, 1);
    free(p);
    return 0;
}

struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
                                unsigned int access)
{
    struct sr_mr *m;
    uint32_t lkey = 0, rkey = 0;
    int h = sr_py_reg_mr(SR_H(sr_pd, pd), addr, length, iova, (int)access, &lkey, &rkey);

    m = sr_handle_box(h, sizeof(*m));
    if (!m)
        return NULL;
    m->h = h;
    m->access = (int)access;
    m->iova = iova;
    m->mr.context = pd->context;
    m->mr.pd = pd;
    m->mr.addr = addr;
    m->mr.length = length;
    m->mr.handle = (uint32_t)h;
    m->mr.lkey = lkey;
    m->mr.rkey = rkey;
    return &m->mr;
}

#undef ibv_reg_mr
struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
    return ibv_reg_mr_iova2(pd, addr, length, (uintptr_t)addr, (unsigned int)access);
}

#undef ibv_reg_mr_iova
struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
                               int access)
{
    return ibv_reg_mr_iova2(pd, addr, length, iova, (unsigned int)access);
}

static void sr_dm_unref(struct sr_dm *dm);
static void sr_clean_cq(struct ibv_cq *cq, uint32_t qp_num);

int ibv_dereg_mr(struct ibv_mr *mr)
{
    struct sr_dm *dm = ((struct sr_mr *)mr)->dm;
    int ret = sr_destroy_obj(SR_H(sr_mr, mr), mr);

    if (!ret && dm)
        sr_dm_unref(dm);
    return ret;
}

/* ---- completion channels and queues ---- */
struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *context)
{
    struct sr_channel *ch;
    int fd = -1, h = sr_py_create_comp_channel(SR_CTX(context)->h, &fd);

    ch = sr_handle_box(h, sizeof(*ch));
    if (!ch)
        return NULL;
    ch->h = h;
    ch->ch.context = context;
    /* The program gets its own open file description of the channel's pipe: Python's is
     * non-blocking, the program's starts blocking and is the program's to change
     * (ibv_get_cq_event fails with EAGAIN once the program sets O_NONBLOCK). */
    ch->own_fd = sr_own_fd(fd);
    if (ch->own_fd >= 0)
        fd = ch->own_fd;
    ch->ch.fd = fd;
    ch->ch.refcnt = 0;
    return &ch->ch;
}

int ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
    int own = ((struct sr_channel *)channel)->own_fd, ret;

    ret = sr_destroy_obj(SR_H(sr_channel, channel), channel);
    if (!ret && own >= 0)
        close(own);
    return ret;
}

static void sr_ring_free(struct sr_ring *r)
{
    sr_dom_free(r->dom, r->wc, r->custom, SR_RES_CQ);
    free(r->ts);
    sr_dom_put(r->dom);
}

/* ibv_create_cq, its ring's entries from parent domain pd's allocator (NULL: none) */
static struct ibv_cq *sr_create_cq(struct ibv_context *context, int cqe, void *cq_context,
                                   struct ibv_comp_channel *channel, int comp_vector,
                                   struct ibv_pd *pd)
{
    struct sr_cq *c;
    int h;

    if (cqe < 1 || comp_vector < 0)
        return sr_fail(EINVAL);
    c = calloc(1, sizeof(*c));
    if (!c)
        return sr_fail(ENOMEM);
    c->ring.dom = sr_dom_hold(pd);
    if (sr_ring_init(&c->ring, (uint32_t)cqe) != 0) {
        sr_dom_put(c->ring.dom);
        free(c);
        return sr_fail(ENOMEM);
    }
    h = sr_py_create_cq(SR_CTX(context)->h, cqe,
                        channel ? SR_H(sr_channel, channel) : 0, comp_vector, &c->ring, c);
    if (!sr_handle_ok(h)) {
        int err = errno;
        sr_ring_free(&c->ring);
        free(c);
        return sr_fail(err);
    }
    c->h = h;
    c->cq.context = context;
    c->cq.channel = channel;
    c->cq.cq_context = cq_context;
    c->cq.handle = (uint32_t)h;
    c->cq.cqe = cqe;
    pthread_mutex_init(&c->cq.mutex, NULL);
    pthread_cond_init(&c->cq.cond, NULL);
    if (channel)
        channel->refcnt++;
    return &c->cq;
}

struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
                             struct ibv_comp_channel *channel, int comp_vector)
{
    return sr_create_cq(context, cqe, cq_context, channel, comp_vector, NULL);
}

int ibv_destroy_cq(struct ibv_cq *cq)
{
    struct sr_cq *c = (struct sr_cq *)cq;
    int ret = sr_py_destroy(c->h);

    if (ret)
        return ret;
    sr_ev_wait_acked(c);
    if (cq->channel)
        cq->channel->refcnt--;
    sr_ring_free(&c->ring);
    free(c);
    return 0;
}

int ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context)
{
    void *found = NULL;
    int h;

    for (;;) {
        h = sr_py_get_cq_event(SR_H(sr_channel, channel), &found);
        if (h > 0 && found) {
            *cq = found;
            *cq_context = ((struct ibv_cq *)found)->cq_context;
            return 0;
        }
        if (h < 0) {
            errno = -h;
            return -1;
        }
        if (sr_wait_fd(channel->fd))
            return -1;
    }
}

void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
    pthread_mutex_lock(&cq->mutex);
    cq->comp_events_completed += nevents;
    pthread_mutex_unlock(&cq->mutex);
}

/* ---- shared receive queues ---- */
/* an SRQ wrapper's ring and memory, and its hold on its parent domain */
static void sr_srq_free(struct sr_srq *s)
{
    sr_rqring_free(&s->rq);
    sr_dom_put(s->rq.dom);
    free(s);
}

struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
    struct sr_srq *s = calloc(1, sizeof(*s));
    struct sr_srq_attr a = { attr->attr.max_wr, attr->attr.max_sge, attr->attr.srq_limit };
    int h;

    if (!s)
        return sr_fail(ENOMEM);
    s->rq.dom = sr_dom_hold(pd);  /* before Python makes its ring */
    h = sr_py_create_srq(SR_H(sr_pd, pd), &a, s);
    if (!sr_handle_ok(h)) {
        int err = errno;
        sr_srq_free(s);
        return sr_fail(err);
    }
    attr->attr.max_wr = a.max_wr;
    attr->attr.max_sge = a.max_sge;
    s->h = h;
    s->srq.context = pd->context;
    s->srq.srq_context = attr->srq_context;
    s->srq.pd = pd;
    s->srq.handle = (uint32_t)h;
    pthread_mutex_init(&s->srq.mutex, NULL);
    pthread_cond_init(&s->srq.cond, NULL);
    return &s->srq;
}

int ibv_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr, int mask)
{
    struct sr_srq_attr a = { attr->max_wr, attr->max_sge, attr->srq_limit };
    return sr_py_modify_srq(SR_H(sr_srq, srq), &a, mask);
}

int ibv_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr)
{
    struct sr_srq_attr a = { 0, 0, 0 };
    int ret = sr_py_query_srq(SR_H(sr_srq, srq), &a);

    if (!ret) {
        attr->max_wr = a.max_wr;
        attr->max_sge = a.max_sge;
        attr->srq_limit = a.srq_limit;
    }
    return ret;
}

int ibv_destroy_srq(struct ibv_srq *srq)
{
    struct sr_srq *s = (struct sr_srq *)srq;
    int ret = sr_py_destroy(s->h);  /* detaches the ring (capi/posting.py forget) */

    if (ret)
        return ret;
    sr_ev_wait_acked(srq);
    sr_srq_free(s);
    return 0;
}

/* ---- queue pairs ---- */
/* a QP wrapper's own locks and memory: its last request's lock, its receive ring */
static void sr_qp_free(struct sr_qp *q)
{
    pthread_spin_destroy(&q->last_lock);
    sr_rqring_free(&q->rq);
    sr_dom_put(q->rq.dom);
    free(q);
}

/* owner: the handle of the QP's PD (of its XRC domain for an XRC TGT QP, pd NULL);
 * cm_id: the handle of the rdma_cm id the QP is made for (rdma_create_qp), or 0 */
static struct sr_qp *sr_create_qp_on(int owner, struct ibv_context *context, struct ibv_pd *pd,
                                     struct ibv_qp_init_attr *attr, int cm_id)
{
    struct sr_qp *q;
    struct sr_qp_init a = {
        .qp_type = attr->qp_type,
        .send_cq = attr->send_cq ? SR_H(sr_cq, attr->send_cq) : 0,
        .recv_cq = attr->recv_cq ? SR_H(sr_cq, attr->recv_cq) : 0,
        .srq = attr->srq ? SR_H(sr_srq, attr->srq) : 0,
        .sq_sig_all = attr->sq_sig_all,
        .max_send_wr = attr->cap.max_send_wr, .max_recv_wr = attr->cap.max_recv_wr,
        .max_send_sge = attr->cap.max_send_sge, .max_recv_sge = attr->cap.max_recv_sge,
        .max_inline_data = attr->cap.max_inline_data,
    };
    int h;

    q = calloc(1, sizeof(*q));
    if (!q)
        return sr_fail(ENOMEM);
    pthread_spin_init(&q->last_lock, PTHREAD_PROCESS_PRIVATE);
    q->rq.dom = sr_dom_hold(pd);  /* before Python makes its receive ring */
    h = cm_id ? sr_py_cm_create_qp(cm_id, owner, &a, q) : sr_py_create_qp(owner, &a, q);
    if (!sr_handle_ok(h)) {
        int err = errno;
        sr_qp_free(q);
        return sr_fail(err);
    }
    attr->cap.max_send_wr = a.max_send_wr;
    attr->cap.max_recv_wr = a.max_recv_wr;
    attr->cap.max_send_sge = a.max_send_sge;
    attr->cap.max_recv_sge = a.max_recv_sge;
    attr->cap.max_inline_data = a.max_inline_data;
    q->h = h;
    q->qpx.qp_base.context = context;
    q->qpx.qp_base.qp_context = attr->qp_context;
    q->qpx.qp_base.pd = pd;
    q->qpx.qp_base.send_cq = attr->send_cq;
    q->qpx.qp_base.recv_cq = attr->recv_cq;
    q->qpx.qp_base.srq = attr->srq;
    q->qpx.qp_base.handle = (uint32_t)h;
    q->qpx.qp_base.qp_num = a.qp_num;
    q->qpx.qp_base.state = IBV_QPS_RESET;
    q->qpx.qp_base.qp_type = attr->qp_type;
    pthread_mutex_init(&q->qpx.qp_base.mutex, NULL);
    pthread_cond_init(&q->qpx.qp_base.cond, NULL);
    return q;
}

static struct sr_qp *sr_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr, int cm_id)
{
    return sr_create_qp_on(SR_H(sr_pd, pd), pd->context, pd, attr, cm_id);
}

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
    struct sr_qp *q = sr_create_qp(pd, attr, 0);
    return q ? &q->qpx.qp_base : NULL;
}

static void sr_ah_to_flat(const struct ibv_ah_attr *in, struct sr_ah_attr *out)
{
    memcpy(out->dgid, in->grh.dgid.raw, 16);
    out->flow_label = in->grh.flow_label;
    out->sgid_index = in->grh.sgid_index;
    out->hop_limit = in->grh.hop_limit;
    out->traffic_class = in->grh.traffic_class;
    out->is_global = in->is_global;
    out->dlid = in->dlid;
    out->sl = in->sl;
    out->src_path_bits = in->src_path_bits;
    out->static_rate = in->static_rate;
    out->port_num = in->port_num;
}

static void sr_ah_from_flat(const struct sr_ah_attr *in, struct ibv_ah_attr *out)
{
    memcpy(out->grh.dgid.raw, in->dgid, 16);
    out->grh.flow_label = in->flow_label;
    out->grh.sgid_index = (uint8_t)in->sgid_index;
    out->grh.hop_limit = (uint8_t)in->hop_limit;
    out->grh.traffic_class = (uint8_t)in->traffic_class;
    out->is_global = (uint8_t)in->is_global;
    out->dlid = (uint16_t)in->dlid;
    out->sl = (uint8_t)in->sl;
    out->src_path_bits = (uint8_t)in->src_path_bits;
    out->static_rate = (uint8_t)in->static_rate;
    out->port_num = (uint8_t)in->port_num;
}

int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
    struct sr_qp_attr a = {
        .qp_state = attr->qp_state, .cur_qp_state = attr->cur_qp_state,
        .path_mtu = attr->path_mtu, .qkey = attr->qkey, .rq_psn = attr->rq_psn,
        .sq_psn = attr->sq_psn, .dest_qp_num = attr->dest_qp_num,
        .qp_access_flags = (uint32_t)attr->qp_access_flags, .pkey_index = attr->pkey_index,
        .max_rd_atomic = attr->max_rd_atomic, .max_dest_rd_atomic = attr->max_dest_rd_atomic,
        .min_rnr_timer = attr->min_rnr_timer, .port_num = attr->port_num,
        .timeout = attr->timeout, .retry_cnt = attr->retry_cnt, .rnr_retry = attr->rnr_retry,
        .max_send_wr = attr->cap.max_send_wr, .max_recv_wr = attr->cap.max_recv_wr,
        .max_send_sge = attr->cap.max_send_sge, .max_recv_sge = attr->cap.max_recv_sge,
        .max_inline_data = attr->cap.max_inline_data,
    };
    int ret;

    sr_ah_to_flat(&attr->ah_attr, &a.ah);
    ret = sr_py_modify_qp(SR_H(sr_qp, qp), &a, mask);
    if (!ret && (mask & IBV_QP_STATE))
        qp->state = attr->qp_state;
    if (!ret && (mask & IBV_QP_STATE) && attr->qp_state == IBV_QPS_RESET) {
        sr_clean_cq(qp->send_cq, qp->qp_num);
        if (qp->recv_cq != qp->send_cq)
            sr_clean_cq(qp->recv_cq, qp->qp_num);
    }
    return ret;
}

/* an ibv_qp_attr from the bridge's flat record (ibv_query_qp, rdma_init_qp_attr) */
static void sr_qp_attr_from_flat(const struct sr_qp_attr *a, struct ibv_qp_attr *attr)
{
    memset(attr, 0, sizeof(*attr));
    attr->qp_state = (enum ibv_qp_state)a->qp_state;
    attr->cur_qp_state = (enum ibv_qp_state)a->cur_qp_state;
    attr->path_mtu = (enum ibv_mtu)a->path_mtu;
    attr->qkey = a->qkey;
    attr->rq_psn = a->rq_psn;
    attr->sq_psn = a->sq_psn;
    attr->dest_qp_num = a->dest_qp_num;
    attr->qp_access_flags = (unsigned int)a->qp_access_flags;
    attr->pkey_index = (uint16_t)a->pkey_index;
    attr->max_rd_atomic = (uint8_t)a->max_rd_atomic;
    attr->max_dest_rd_atomic = (uint8_t)a->max_dest_rd_atomic;
    attr->min_rnr_timer = (uint8_t)a->min_rnr_timer;
    attr->port_num = (uint8_t)a->port_num;
    attr->timeout = (uint8_t)a->timeout;
    attr->retry_cnt = (uint8_t)a->retry_cnt;
    attr->rnr_retry = (uint8_t)a->rnr_retry;
    attr->sq_draining = (uint8_t)a->sq_draining;
    attr->cap.max_send_wr = a->max_send_wr;
    attr->cap.max_recv_wr = a->max_recv_wr;
    attr->cap.max_send_sge = a->max_send_sge;
    attr->cap.max_recv_sge = a->max_recv_sge;
    attr->cap.max_inline_data = a->max_inline_data;
    sr_ah_from_flat(&a->ah, &attr->ah_attr);
}

int ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask,
                 struct ibv_qp_init_attr *init)
{
    struct sr_qp_attr a;
    int ret;

    memset(&a, 0, sizeof(a));
    ret = sr_py_query_qp(SR_H(sr_qp, qp), &a, mask);
    if (ret)
        return ret;
    sr_qp_attr_from_flat(&a, attr);
    if (init) {
        memset(init, 0, sizeof(*init));
        init->qp_context = qp->qp_context;
        init->send_cq = qp->send_cq;
        init->recv_cq = qp->recv_cq;
        init->srq = qp->srq;
        init->qp_type = qp->qp_type;
        init->cap = attr->cap;
    }
    return 0;
}

int ibv_destroy_qp(struct ibv_qp *qp)
{
    struct sr_qp *q = (struct sr_qp *)qp;
    int ret = sr_py_destroy(q->h);

    if (ret)
        return ret;
    sr_ev_wait_acked(q);
    sr_x_free(q);
    free(q->xw);
    sr_qp_free(q);
    return 0;
}

/* ---- extended QPs: the ibv_wr_* API (ibv_create_qp_ex with send_ops_flags) ----
 * ibv_wr_start opens a list, each ibv_wr_<opcode> adds a WR (wr_id and flags from the
 * qp_ex), ibv_wr_set_* complete the last one, ibv_wr_complete posts them all at once (the
 * same path as ibv_post_send) and ibv_wr_abort drops them. */
struct sr_xwr {
    struct sr_swr f;
    struct ibv_sge one;    /* ibv_wr_set_sge, or the inline copy */
    struct ibv_sge *list;  /* ibv_wr_set_sge_list */
    void *inl;             /* inline data, copied when it is set */
};

#define SR_XOPS (IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_WRITE \
                 | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ            \
                 | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD    \
                 | IBV_QP_EX_WITH_SEND_WITH_INV | IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV \
                 | IBV_QP_EX_WITH_ATOMIC_WRITE)

static void sr_x_free(struct sr_qp *q)
{
    int i;
    for (i = 0; i < q->nx; i++) {
        free(q->xw[i].list);
        free(q->xw[i].inl);
    }
    q->nx = 0;
    q->xerr = 0;
}

static struct sr_xwr *sr_x_last(struct ibv_qp_ex *qpx)
{
    struct sr_qp *q = (struct sr_qp *)qpx;
    if (!q->nx) {
        q->xerr = EINVAL;  /* a setter before any ibv_wr_<opcode> */
        return NULL;
    }
    return &q->xw[q->nx - 1];
}

static struct sr_xwr *sr_x_new(struct ibv_qp_ex *qpx, enum ibv_wr_opcode opcode)
{
    struct sr_qp *q = (struct sr_qp *)qpx;
    struct sr_xwr *w;

    if (q->nx == q->xcap) {
        int cap = q->xcap ? 2 * q->xcap : 16;
        struct sr_xwr *grown = realloc(q->xw, (size_t)cap * sizeof(*grown));
        if (!grown) {
            q->xerr = ENOMEM;
            return NULL;
        }
        q->xw = grown;
        q->xcap = cap;
    }
    w = &q->xw[q->nx++];
    memset(w, 0, sizeof(*w));
    w->f.wr_id = qpx->wr_id;
    w->f.send_flags = qpx->wr_flags;
    w->f.opcode = opcode;
    return w;
}

static void sr_x_start(struct ibv_qp_ex *qpx) { sr_x_free((struct sr_qp *)qpx); }
static void sr_x_abort(struct ibv_qp_ex *qpx) { sr_x_free((struct sr_qp *)qpx); }

static int sr_x_complete(struct ibv_qp_ex *qpx)
{
    struct sr_qp *q = (struct sr_qp *)qpx;
    struct sr_swr *flat;
    int i, bad = 0, ret = q->xerr;

    if (!ret && q->nx) {
        flat = calloc((size_t)q->nx, sizeof(*flat));
        if (!flat) {
            ret = ENOMEM;
        } else {
            for (i = 0; i < q->nx; i++) {
                struct sr_xwr *w = &q->xw[i];
                flat[i] = w->f;
                flat[i].sg = (uint64_t)(uintptr_t)(w->list ? w->list : &w->one);
                flat[i].gen = sr_same_gen(q, &flat[i]);
            }
            sr_posted();
            ret = sr_py_post_send(q->h, flat, q->nx, &bad);
            free(flat);
        }
    }
    sr_x_free(q);
    return ret;
}

static void sr_x_send(struct ibv_qp_ex *qpx) { sr_x_new(qpx, IBV_WR_SEND); }

static void sr_x_send_imm(struct ibv_qp_ex *qpx, __be32 imm)
{
    struct sr_xwr *w = sr_x_new(qpx, IBV_WR_SEND_WITH_IMM);
    if (w)
        w->f.imm_data = ntohl(imm);
}

static void sr_x_send_inv(struct ibv_qp_ex *qpx, uint32_t rkey)
{
    struct sr_xwr *w = sr_x_new(qpx, IBV_WR_SEND_WITH_INV);
    if (w)
        w->f.imm_data = rkey;
}

static void sr_x_rdma(struct ibv_qp_ex *qpx, enum ibv_wr_opcode op, uint32_t rkey,
                      uint64_t addr, uint32_t imm)
{
    struct sr_xwr *w = sr_x_new(qpx, op);
    if (w) {
        w->f.rkey = rkey;
        w->f.remote_addr = addr;
        w->f.imm_data = imm;
    }
}

static void sr_x_write(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t addr)
{ sr_x_rdma(qpx, IBV_WR_RDMA_WRITE, rkey, addr, 0); }

static void sr_x_write_imm(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t addr, __be32 imm)
{ sr_x_rdma(qpx, IBV_WR_RDMA_WRITE_WITH_IMM, rkey, addr, ntohl(imm)); }

static void sr_x_read(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t addr)
{ sr_x_rdma(qpx, IBV_WR_RDMA_READ, rkey, addr, 0); }

static void sr_x_cmp_swp(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t addr, uint64_t compare,
                         uint64_t swap)
{
    struct sr_xwr *w = sr_x_new(qpx, IBV_WR_ATOMIC_CMP_AND_SWP);
    if (w) {
        w->f.rkey = rkey;
        w->f.remote_addr = addr;
        w->f.compare_add = compare;
        w->f.swap = swap;
    }
}

static void sr_x_fetch_add(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t addr, uint64_t add)
{
    struct sr_xwr *w = sr_x_new(qpx, IBV_WR_ATOMIC_FETCH_AND_ADD);
    if (w) {
        w->f.rkey = rkey;
        w->f.remote_addr = addr;
        w->f.compare_add = add;
    }
}

static void sr_x_ud_addr(struct ibv_qp_ex *qpx, struct ibv_ah *ah, uint32_t qpn, uint32_t qkey)
{
    struct sr_xwr *w = sr_x_last(qpx);
    if (w) {
        w->f.ah = ah ? (uint32_t)SR_H(sr_ah, ah) : 0;
        w->f.remote_qpn = qpn;
        w->f.remote_qkey = qkey;
    }
}

static void sr_x_sge(struct ibv_qp_ex *qpx, uint32_t lkey, uint64_t addr, uint32_t length)
{
    struct sr_xwr *w = sr_x_last(qpx);
    if (w) {
        w->one.addr = addr;
        w->one.length = length;
        w->one.lkey = lkey;
        w->f.num_sge = 1;
    }
}

static void sr_x_sge_list(struct ibv_qp_ex *qpx, size_t n, const struct ibv_sge *list)
{
    struct sr_xwr *w = sr_x_last(qpx);
    if (!w)
        return;
    w->list = malloc((n ? n : 1) * sizeof(*list));
    if (!w->list) {
        ((struct sr_qp *)qpx)->xerr = ENOMEM;
        return;
    }
    memcpy(w->list, list, n * sizeof(*list));
    w->f.num_sge = (uint32_t)n;
}

static void sr_x_inline_list(struct ibv_qp_ex *qpx, size_t n, const struct ibv_data_buf *bufs)
{
    struct sr_xwr *w = sr_x_last(qpx);
    size_t total = 0, i;
    char *p;

    if (!w)
        return;
    for (i = 0; i < n; i++)
        total += bufs[i].length;
    p = malloc(total ? total : 1);
    if (!p) {
        ((struct sr_qp *)qpx)->xerr = ENOMEM;
        return;
    }
    w->inl = p;
    for (i = 0; i < n; i++) {  /* copied now: the buffers are the program's again at once */
        memcpy(p, bufs[i].addr, bufs[i].length);
        p += bufs[i].length;
    }
    w->one.addr = (uintptr_t)w->inl;
    w->one.length = (uint32_t)total;
    w->f.num_sge = 1;
    w->f.send_flags |= IBV_SEND_INLINE;
}

static void sr_x_inline(struct ibv_qp_ex *qpx, void *addr, size_t length)
{
    struct ibv_data_buf b = { .addr = addr, .length = length };
    sr_x_inline_list(qpx, 1, &b);
}

/* a type 2 window bound by a work request (ibv_wr_bind_mw) and its revocation */
static void sr_x_bind_mw(struct ibv_qp_ex *qpx, struct ibv_mw *mw, uint32_t rkey,
                         const struct ibv_mw_bind_info *info)
{
    struct sr_xwr *w = sr_x_new(qpx, IBV_WR_BIND_MW);
    if (w)
        sr_bind_fields(&w->f, mw, rkey, info);
}

static void sr_x_local_inv(struct ibv_qp_ex *qpx, uint32_t rkey)
{
    struct sr_xwr *w = sr_x_new(qpx, IBV_WR_LOCAL_INV);
    if (w)
        w->f.imm_data = rkey;
}

/* ibv_wr_* not served yet: the WR list fails at ibv_wr_complete */
static void sr_x_unsupported(struct sr_qp *q) { q->xerr = EOPNOTSUPP; }
static void sr_x_tso(struct ibv_qp_ex *qpx, void *hdr, uint16_t hdr_sz, uint16_t mss)
{ (void)hdr; (void)hdr_sz; (void)mss; sr_x_unsupported((struct sr_qp *)qpx); }
/* the remote XRC SRQ of the last WR (XRC INI QPs) */
static void sr_x_xrc(struct ibv_qp_ex *qpx, uint32_t srqn)
{
    struct sr_xwr *w = sr_x_last(qpx);
    if (w)
        w->f.xrc_srqn = srqn;
}
/* an RDMA Atomic Write (IBA 1.5): its 8 bytes travel in compare_add, as they lie in memory */
static void sr_x_atomic_write(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t addr, const void *wr)
{
    struct sr_xwr *w = sr_x_new(qpx, IBV_WR_ATOMIC_WRITE);
    if (w) {
        w->f.rkey = rkey;
        w->f.remote_addr = addr;
        memcpy(&w->f.compare_add, wr, sizeof(w->f.compare_add));
    }
}

/* ibv_create_qp_ex; cm_id: the handle of the rdma_cm id it is made for
 * (rdma_create_qp_ex), or 0 */
static struct sr_qp *sr_create_qp_ex_for(struct ibv_context *context,
                                         struct ibv_qp_init_attr_ex *attr, int cm_id)
{
    struct ibv_qp_init_attr init;
    struct ibv_qp_ex *x;
    struct sr_qp *q;
    uint32_t known = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_XRCD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;

    if (attr->qp_type == IBV_QPT_XRC_RECV)  /* rdma_cm: on its id (cm_id), as the others */
        return (struct sr_qp *)sr_create_xrc_tgt(context, attr, cm_id);
    if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd)
        return sr_fail(EINVAL);
    if (attr->comp_mask & ~(known | IBV_QP_INIT_ATTR_CREATE_FLAGS))
        return sr_fail(EOPNOTSUPP);  /* XRC, RSS, TSO, source QPN... */
    if ((attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && attr->create_flags)
        return sr_fail(EOPNOTSUPP);  /* none served; zero flags are no flags (as rxe) */
    if ((attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) && (attr->send_ops_flags & ~(uint64_t)SR_XOPS))
        return sr_fail(EOPNOTSUPP);
    if (attr->pd->context != context)
        return sr_fail(EINVAL);
    memset(&init, 0, sizeof(init));
    init.qp_context = attr->qp_context;
    init.send_cq = attr->send_cq;
    init.recv_cq = attr->recv_cq;
    init.srq = attr->srq;
    init.cap = attr->cap;
    init.qp_type = attr->qp_type;
    init.sq_sig_all = attr->sq_sig_all;
    q = sr_create_qp(attr->pd, &init, cm_id);
    if (!q)
        return NULL;
    attr->cap = init.cap;
    if (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) {
        x = &q->qpx;
        q->is_ex = 1;
        x->wr_send = sr_x_send;
        x->wr_send_imm = sr_x_send_imm;
        x->wr_send_inv = sr_x_send_inv;
        x->wr_rdma_write = sr_x_write;
        x->wr_rdma_write_imm = sr_x_write_imm;
        x->wr_rdma_read = sr_x_read;
        x->wr_atomic_cmp_swp = sr_x_cmp_swp;
        x->wr_atomic_fetch_add = sr_x_fetch_add;
        x->wr_set_ud_addr = sr_x_ud_addr;
        x->wr_set_sge = sr_x_sge;
        x->wr_set_sge_list = sr_x_sge_list;
        x->wr_set_inline_data = sr_x_inline;
        x->wr_set_inline_data_list = sr_x_inline_list;
        x->wr_start = sr_x_start;
        x->wr_complete = sr_x_complete;
        x->wr_abort = sr_x_abort;
        x->wr_bind_mw = sr_x_bind_mw;
        x->wr_local_inv = sr_x_local_inv;
        x->wr_send_tso = sr_x_tso;
        x->wr_set_xrc_srqn = sr_x_xrc;
        x->wr_atomic_write = sr_x_atomic_write;
    }
    return q;
}

static struct ibv_qp *sr_create_qp_ex(struct ibv_context *context,
                                      struct ibv_qp_init_attr_ex *attr)
{
    struct sr_qp *q = sr_create_qp_ex_for(context, attr, 0);
    return q ? &q->qpx.qp_base : NULL;
}

/* the ibv_wr_* view of a QP made by ibv_create_qp_ex with send_ops_flags (as rdma-core:
 * NULL for the others) */
struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *qp)
{
    struct sr_qp *q = (struct sr_qp *)qp;
    return q->is_ex ? &q->qpx : sr_fail(EOPNOTSUPP);
}

/* ---- address handles ---- */
struct ibv_ah *ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
    struct sr_ah *a;
    struct sr_ah_attr f;
    int h;

    sr_ah_to_flat(attr, &f);
    h = sr_py_create_ah(SR_H(sr_pd, pd), &f);
    a = sr_handle_box(h, sizeof(*a));
    if (!a)
        return NULL;
    a->h = h;
    a->ah.context = pd->context;
    a->ah.pd = pd;
    a->ah.handle = (uint32_t)h;
    return &a->ah;
}

int ibv_destroy_ah(struct ibv_ah *ah)
{
    return sr_destroy_obj(SR_H(sr_ah, ah), ah);
}

int ibv_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
    union ibv_gid g = *gid;
    return sr_py_mcast(SR_H(sr_qp, qp), g.raw, lid, 1);
}

int ibv_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
    union ibv_gid g = *gid;
    return sr_py_mcast(SR_H(sr_qp, qp), g.raw, lid, 0);
}

/* ---- more of libibverbs over the same objects ---- */
ssize_t _ibv_query_gid_table(struct ibv_context *context, struct ibv_gid_entry *entries,
                             size_t max_entries, uint32_t flags, size_t entry_size)
{
    struct ibv_port_attr pa;
    size_t n = 0;
    int i;

    if (flags || entry_size < sizeof(*entries))
        return -EINVAL;
    memset(&pa, 0, sizeof(pa));
    if (sr_py_query_port(SR_CTX(context)->h, 1, &pa))
        return -EIO;
    for (i = 0; i < pa.gid_tbl_len; i++) {
        struct ibv_gid_entry e;
        /* an empty entry has no type (ENODATA): the table lists the populated ones */
        if (_ibv_query_gid_ex(context, 1, (uint32_t)i, &e, 0, sizeof(e)))
            continue;
        if (n == max_entries)
            return -EINVAL;
        memcpy((char *)entries + n * entry_size, &e, sizeof(e));
        n++;
    }
    return (ssize_t)n;
}

int ibv_get_pkey_index(struct ibv_context *context, uint8_t port_num, __be16 pkey)
{
    __be16 p;
    int i;

    for (i = 0; ibv_query_pkey(context, port_num, i, &p) == 0; i++)
        if (p == pkey)
            return i;
    return -1;
}

/* ---- not served yet: fail the libibverbs way (the real library would take these objects
 * for its own and crash) ---- */
#define SR_NOT_YET_INT  { errno = EOPNOTSUPP; return EOPNOTSUPP; }
#define SR_NOT_YET_PTR  { return sr_fail(EOPNOTSUPP); }

struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
                                 uint64_t iova, int fd, int access)
{ (void)pd; (void)offset; (void)length; (void)iova; (void)fd; (void)access; SR_NOT_YET_PTR }

/* The address vector back to the sender of a UD receive (IBA 11.4.1.1 CreateAddress-
 * HandleFromWC): the destination GID is the packet's source, the source GID index the
 * one of the packet's destination. RoCEv2 over IPv4 leaves the IPv4 header in the GRH
 * area's last 20 bytes (IBA A17.4.5.1, as rxe; the pyverbs layer reads it the same way,
 * compat/pyverbs/addr.py). 0, or -1 with errno (ENOENT: not a GID of the port). */
int ibv_init_ah_from_wc(struct ibv_context *context, uint8_t port_num, struct ibv_wc *wc,
                        struct ibv_grh *grh, struct ibv_ah_attr *ah_attr)
{
    const uint8_t *raw = (const uint8_t *)grh;
    union ibv_gid src, dst, g;
    struct ibv_port_attr pattr;
    uint32_t flow = 0, word;
    uint8_t tclass;
    int i;

    if (!context || !wc || !grh || !ah_attr) {
        errno = EINVAL;
        return -1;
    }
    if ((raw[20] >> 4) == 4) {
        memset(&src, 0, sizeof(src));
        memset(&dst, 0, sizeof(dst));
        src.raw[10] = src.raw[11] = dst.raw[10] = dst.raw[11] = 0xff;
        memcpy(&src.raw[12], raw + 20 + 12, 4);
        memcpy(&dst.raw[12], raw + 20 + 16, 4);
        tclass = raw[21];
    } else {
        memcpy(&word, raw, 4);
        word = ntohl(word);
        tclass = (uint8_t)(word >> 20);
        flow = word & 0xfffff;
        memcpy(src.raw, raw + 8, 16);
        memcpy(dst.raw, raw + 24, 16);
    }
    memset(&pattr, 0, sizeof(pattr));
    i = sr_py_query_port(SR_CTX(context)->h, port_num, &pattr);
    if (i) {
        errno = i;
        return -1;
    }
    for (i = 0; i < pattr.gid_tbl_len; i++) {
        if (ibv_query_gid(context, port_num, i, &g) == 0 && !memcmp(g.raw, dst.raw, 16))
            break;
    }
    if (i >= pattr.gid_tbl_len) {
        errno = ENOENT;
        return -1;
    }
    memset(ah_attr, 0, sizeof(*ah_attr));
    ah_attr->is_global = 1;
    ah_attr->grh.dgid = src;
    ah_attr->grh.flow_label = flow;
    ah_attr->grh.sgid_index = (uint8_t)i;
    ah_attr->grh.hop_limit = 0xff;
    ah_attr->grh.traffic_class = tclass;
    ah_attr->dlid = wc->slid;
    ah_attr->sl = wc->sl;
    ah_attr->src_path_bits = wc->dlid_path_bits;
    ah_attr->port_num = port_num;
    return 0;
}

struct ibv_ah *ibv_create_ah_from_wc(struct ibv_pd *pd, struct ibv_wc *wc, struct ibv_grh *grh,
                                     uint8_t port_num)
{
    struct ibv_ah_attr attr;

    if (!pd)
        return sr_fail(EINVAL);
    if (ibv_init_ah_from_wc(pd->context, port_num, wc, grh, &attr))
        return NULL;
    return ibv_create_ah(pd, &attr);
}

int ibv_resolve_eth_l2_from_gid(struct ibv_context *context, struct ibv_ah_attr *attr,
                                uint8_t eth_mac[ETHERNET_LL_SIZE], uint16_t *vid)
{ (void)context; (void)attr; (void)eth_mac; (void)vid; SR_NOT_YET_INT }

int ibv_query_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{ (void)qp; (void)ece; SR_NOT_YET_INT }

int ibv_set_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{ (void)qp; (void)ece; SR_NOT_YET_INT }

int ibv_query_qp_data_in_order(struct ibv_qp *qp, enum ibv_wr_opcode op, uint32_t flags)
{ (void)qp; (void)op; (void)flags; return 0; /* no in-order guarantee promised */ }

struct ibv_context *ibv_import_device(int cmd_fd)
{ (void)cmd_fd; SR_NOT_YET_PTR }

struct ibv_pd *ibv_import_pd(struct ibv_context *context, uint32_t pd_handle)
{ (void)context; (void)pd_handle; SR_NOT_YET_PTR }

struct ibv_mr *ibv_import_mr(struct ibv_pd *pd, uint32_t mr_handle)
{ (void)pd; (void)mr_handle; SR_NOT_YET_PTR }

struct ibv_dm *ibv_import_dm(struct ibv_context *context, uint32_t dm_handle)
{ (void)context; (void)dm_handle; SR_NOT_YET_PTR }

void ibv_unimport_pd(struct ibv_pd *pd) { (void)pd; }
void ibv_unimport_mr(struct ibv_mr *mr) { (void)mr; }
void ibv_unimport_dm(struct ibv_dm *dm) { (void)dm; }

/* ==== extended verbs: ibv_query_device_ex, ODP, device memory, XRC, ibv_cq_ex,
 * ibv_resize_cq, ibv_rereg_mr (the verbs_context ops verbs.h's inline helpers call) ==== */

/* Device memory a context may allocate (ibv_alloc_dm), as the pyverbs layer reports it
 * (compat/pyverbs/device.py MAX_DM_SIZE): a buffer of the process, reached through a
 * zero-based MR (ibv_reg_dm_mr). */
#define SR_MAX_DM_SIZE (256u * 1024u)
#define SR_ODP_RC (IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE \
                   | IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_ATOMIC | IBV_ODP_SUPPORT_SRQ_RECV)

/* ibv_query_device_ex: the legacy attributes, and on-demand paging (softrdma never pins
 * memory: the engine reaches registered bytes in place when a packet needs them, which is
 * what ODP promises; implicit ODP on RoCE devices, softrdma.verbs.procmem), device memory,
 * the completion clock (ns of CLOCK_MONOTONIC: a 64-bit mask at 1 GHz; rxe has none).
 * attr_size: the caller's struct may be older. */
static int sr_query_device_ex(struct ibv_context *context,
                              const struct ibv_query_device_ex_input *input,
                              struct ibv_device_attr_ex *attr, size_t attr_size)
{
    struct ibv_device_attr_ex a;
    int ret;

    if (input && input->comp_mask)
        return EINVAL;
    if (attr_size < sizeof(a.orig_attr))
        return EINVAL;
    memset(&a, 0, sizeof(a));
    ret = ibv_query_device(context, &a.orig_attr);
    if (ret)
        return ret;
    a.odp_caps.general_caps = IBV_ODP_SUPPORT;
    if (context->device->transport_type == IBV_TRANSPORT_IB)
        a.odp_caps.general_caps |= IBV_ODP_SUPPORT_IMPLICIT;
    a.odp_caps.per_transport_caps.rc_odp_caps = SR_ODP_RC;
    a.odp_caps.per_transport_caps.uc_odp_caps = SR_ODP_RC & ~(uint32_t)(IBV_ODP_SUPPORT_READ
                                                                 | IBV_ODP_SUPPORT_ATOMIC);
    a.odp_caps.per_transport_caps.ud_odp_caps = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV
                                                | IBV_ODP_SUPPORT_SRQ_RECV;
    a.xrc_odp_caps = SR_ODP_RC & ~(uint32_t)IBV_ODP_SUPPORT_RECV;
    a.completion_timestamp_mask = UINT64_MAX;
    a.hca_core_clock = SR_CORE_CLOCK_KHZ;
    a.device_cap_flags_ex = a.orig_attr.device_cap_flags;
    a.max_dm_size = SR_MAX_DM_SIZE;
    a.phys_port_cnt_ex = a.orig_attr.phys_port_cnt;
    memcpy(attr, &a, attr_size < sizeof(a) ? attr_size : sizeof(a));
    return 0;
}

/* ibv_query_rt_values_ex: the completion clock now, in its cycles (ns), in
 * raw_clock.tv_nsec as the mlx5 provider gives its own */
static int sr_query_rt_values(struct ibv_context *context, struct ibv_values_ex *values)
{
    (void)context;
    if (!values || (values->comp_mask & ~(uint32_t)IBV_VALUES_MASK_RAW_CLOCK))
        return EINVAL;
    if (values->comp_mask & IBV_VALUES_MASK_RAW_CLOCK) {
        values->raw_clock.tv_sec = 0;
        values->raw_clock.tv_nsec = (long)sr_now_ns();
    }
    return 0;
}

/* ibv_advise_mr: a prefetch has nothing to fault in (see above); the arguments are
 * checked as the kernel does. */
static int sr_advise_mr(struct ibv_pd *pd, enum ibv_advise_mr_advice advice, uint32_t flags,
                        struct ibv_sge *sg_list, uint32_t num_sges)
{
    if (!pd || !sg_list || !num_sges)
        return EINVAL;
    if (advice != IBV_ADVISE_MR_ADVICE_PREFETCH && advice != IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE
        && advice != IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT)
        return EOPNOTSUPP;
    if (flags & ~(uint32_t)IBV_ADVISE_MR_FLAG_FLUSH)
        return EINVAL;
    return 0;
}

/* ---- device memory ---- */
struct sr_dm {
    struct ibv_dm dm;
    char *buf;
    size_t length;
    int refs;               /* 1 + the MRs registered on it */
};

/* ibv_memcpy_to_dm / ibv_memcpy_from_dm: device memory is accessed in 4-byte words, so
 * the offset and the length must be multiples of 4 and inside the allocation (as mlx5,
 * the one provider with device memory; rdma-core's test_dm_bad_access) */
#define SR_DM_ALIGN 4u
static int sr_dm_range_ok(const struct sr_dm *d, uint64_t offset, size_t length)
{
    return offset % SR_DM_ALIGN == 0 && length % SR_DM_ALIGN == 0 && offset <= d->length
        && length <= d->length - offset;
}

static int sr_dm_copy_in(struct ibv_dm *ibdm, uint64_t offset, const void *host, size_t length)
{
    struct sr_dm *d = (struct sr_dm *)ibdm;
    if (!sr_dm_range_ok(d, offset, length))
        return EINVAL;
    memcpy(d->buf + offset, host, length);
    return 0;
}

static int sr_dm_copy_out(void *host, struct ibv_dm *ibdm, uint64_t offset, size_t length)
{
    struct sr_dm *d = (struct sr_dm *)ibdm;
    if (!sr_dm_range_ok(d, offset, length))
        return EINVAL;
    memcpy(host, d->buf + offset, length);
    return 0;
}

static struct ibv_dm *sr_alloc_dm(struct ibv_context *context, struct ibv_alloc_dm_attr *attr)
{
    struct sr_context *c = SR_CTX(context);
    struct sr_dm *d;

    if (!attr || attr->comp_mask || !attr->length)
        return sr_fail(EINVAL);
    pthread_mutex_lock(&g_lock);
    if (attr->length > SR_MAX_DM_SIZE - c->dm_used) {
        pthread_mutex_unlock(&g_lock);
        return sr_fail(ENOMEM);
    }
    c->dm_used += attr->length;
    pthread_mutex_unlock(&g_lock);
    d = calloc(1, sizeof(*d));
    if (d)
        d->buf = calloc(1, attr->length);
    if (!d || !d->buf) {
        free(d);
        pthread_mutex_lock(&g_lock);
        c->dm_used -= attr->length;
        pthread_mutex_unlock(&g_lock);
        return sr_fail(ENOMEM);
    }
    d->length = attr->length;
    d->refs = 1;
    d->dm.context = context;
    d->dm.memcpy_to_dm = sr_dm_copy_in;
    d->dm.memcpy_from_dm = sr_dm_copy_out;
    return &d->dm;
}

static void sr_dm_unref(struct sr_dm *d)
{
    struct sr_context *c = SR_CTX(d->dm.context);
    int last;

    pthread_mutex_lock(&g_lock);
    last = --d->refs == 0;
    if (last)
        c->dm_used -= d->length;
    pthread_mutex_unlock(&g_lock);
    if (last) {
        free(d->buf);
        free(d);
    }
}

/* ibv_free_dm: EBUSY while an MR is registered on it (as the kernel) */
static int sr_free_dm(struct ibv_dm *ibdm)
{
    struct sr_dm *d = (struct sr_dm *)ibdm;
    int busy;

    pthread_mutex_lock(&g_lock);
    busy = d->refs > 1;
    pthread_mutex_unlock(&g_lock);
    if (busy)
        return EBUSY;
    sr_dm_unref(d);
    return 0;
}

/* marks the access flags of a device-memory MR for the bridge (_reg_mr), which then
 * accepts a zero length; above every IBV_ACCESS_* flag */
#define SR_ACCESS_DM (1 << 30)

/* ibv_reg_dm_mr: zero-based only (the kernel refuses others with EINVAL); a zero length
 * is accepted, as the kernel does (it checks only that offset and length lie inside) */
static struct ibv_mr *sr_reg_dm_mr(struct ibv_pd *pd, struct ibv_dm *ibdm, uint64_t dm_offset,
                                   size_t length, unsigned int access)
{
    struct sr_dm *d = (struct sr_dm *)ibdm;
    struct ibv_mr *mr;

    if (!pd || !ibdm || !(access & IBV_ACCESS_ZERO_BASED) || (access & IBV_ACCESS_ON_DEMAND))
        return sr_fail(EINVAL);
    if (dm_offset > d->length || length > d->length - dm_offset)
        return sr_fail(EINVAL);
    mr = ibv_reg_mr_iova2(pd, d->buf + dm_offset, length, 0, access | SR_ACCESS_DM);
    if (!mr)
        return NULL;
    ((struct sr_mr *)mr)->access = (int)access;
    mr->addr = NULL;
    ((struct sr_mr *)mr)->dm = d;
    pthread_mutex_lock(&g_lock);
    d->refs++;
    pthread_mutex_unlock(&g_lock);
    return mr;
}

/* ---- XRC (IBA Annex A14): domains, XRC SRQs, INI and TGT QPs ---- */
struct sr_xrcd { struct ibv_xrcd xrcd; int h; };

static struct ibv_xrcd *sr_open_xrcd(struct ibv_context *context,
                                     struct ibv_xrcd_init_attr *attr)
{
    uint32_t need = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
    struct sr_xrcd *x;
    int h;

    if (!attr || (attr->comp_mask & need) != need
        || (attr->comp_mask & ~(uint32_t)(IBV_XRCD_INIT_ATTR_RESERVED - 1)))
        return sr_fail(EINVAL);
    h = sr_py_open_xrcd(SR_CTX(context)->h, attr->fd, attr->oflags);
    x = sr_handle_box(h, sizeof(*x));
    if (!x)
        return NULL;
    x->h = h;
    x->xrcd.context = context;
    return &x->xrcd;
}

static int sr_close_xrcd(struct ibv_xrcd *xrcd)
{
    return sr_destroy_obj(((struct sr_xrcd *)xrcd)->h, xrcd);
}

static struct ibv_qp *sr_create_xrc_tgt(struct ibv_context *context,
                                        struct ibv_qp_init_attr_ex *attr, int cm_id)
{
    struct ibv_qp_init_attr init;
    struct sr_qp *q;

    if (!(attr->comp_mask & IBV_QP_INIT_ATTR_XRCD) || !attr->xrcd
        || attr->xrcd->context != context)
        return sr_fail(EINVAL);
    memset(&init, 0, sizeof(init));
    init.qp_type = IBV_QPT_XRC_RECV;
    init.qp_context = attr->qp_context;
    q = sr_create_qp_on(((struct sr_xrcd *)attr->xrcd)->h, context, NULL, &init, cm_id);
    return q ? &q->qpx.qp_base : NULL;
}

static struct ibv_srq *sr_create_srq_ex(struct ibv_context *context,
                                        struct ibv_srq_init_attr_ex *attr)
{
    uint32_t known = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD
                     | IBV_SRQ_INIT_ATTR_CQ;
    struct ibv_srq_init_attr basic;
    struct sr_srq_attr a;
    struct ibv_srq *srq;
    struct sr_srq *s;
    uint32_t num = 0;
    int h;

    if (!attr || attr->comp_mask & ~known)
        return sr_fail(attr && (attr->comp_mask & IBV_SRQ_INIT_ATTR_TM) ? EOPNOTSUPP : EINVAL);
    if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !attr->pd || attr->pd->context != context)
        return sr_fail(EINVAL);
    if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) || attr->srq_type == IBV_SRQT_BASIC) {
        memset(&basic, 0, sizeof(basic));
        basic.srq_context = attr->srq_context;
        basic.attr = attr->attr;
        srq = ibv_create_srq(attr->pd, &basic);
        if (srq)
            attr->attr = basic.attr;
        return srq;
    }
    if (attr->srq_type != IBV_SRQT_XRC)
        return sr_fail(EOPNOTSUPP);  /* tag matching */
    if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_XRCD) || !attr->xrcd
        || !(attr->comp_mask & IBV_SRQ_INIT_ATTR_CQ) || !attr->cq)
        return sr_fail(EINVAL);
    s = calloc(1, sizeof(*s));
    if (!s)
        return sr_fail(ENOMEM);
    s->rq.dom = sr_dom_hold(attr->pd);
    a.max_wr = attr->attr.max_wr;
    a.max_sge = attr->attr.max_sge;
    a.srq_limit = attr->attr.srq_limit;
    h = sr_py_create_xrc_srq(SR_H(sr_pd, attr->pd), ((struct sr_xrcd *)attr->xrcd)->h,
                             SR_H(sr_cq, attr->cq), &a, s, &num);
    if (!sr_handle_ok(h)) {
        int err = errno;
        sr_srq_free(s);
        return sr_fail(err);
    }
    attr->attr.max_wr = a.max_wr;
    attr->attr.max_sge = a.max_sge;
    s->h = h;
    s->xrc = 1;
    s->srq_num = num;
    s->srq.context = context;
    s->srq.srq_context = attr->srq_context;
    s->srq.pd = attr->pd;
    s->srq.handle = (uint32_t)h;
    pthread_mutex_init(&s->srq.mutex, NULL);
    pthread_cond_init(&s->srq.cond, NULL);
    return &s->srq;
}

/* ibv_get_srq_num: the number senders put in the XRCETH (XRC SRQs only) */
static int sr_get_srq_num(struct ibv_srq *srq, uint32_t *srq_num)
{
    struct sr_srq *s = (struct sr_srq *)srq;
    if (!s->xrc)
        return EOPNOTSUPP;
    *srq_num = s->srq_num;
    return 0;
}

/* ---- ibv_cq_ex: ibv_start_poll / ibv_next_poll / ibv_end_poll over the ring ----
 * A pass holds the ring's consumer lock from a successful start_poll to end_poll; the
 * current completion is the ring's head, consumed by next_poll or end_poll. */
#define SR_CQX(cqx) ((struct sr_cq *)(cqx))
#define SR_CUR(cqx) (&SR_CQX(cqx)->ring.wc[atomic_load_explicit(&SR_CQX(cqx)->ring.head, \
                                              memory_order_relaxed) & SR_CQX(cqx)->ring.mask])

static int sr_cqx_load(struct sr_cq *c)
{
    struct sr_ring *r = &c->ring;
    uint32_t head = atomic_load_explicit(&r->head, memory_order_relaxed);

    if (head == atomic_load_explicit(&r->tail, memory_order_acquire)) {
        c->ex_cur = 0;
        return ENOENT;
    }
    c->ex_cur = 1;
    c->cqx.status = r->wc[head & r->mask].status;
    c->cqx.wr_id = r->wc[head & r->mask].wr_id;
    return 0;
}

static int sr_cqx_start(struct ibv_cq_ex *cqx, struct ibv_poll_cq_attr *attr)
{
    struct sr_cq *c = SR_CQX(cqx);
    struct sr_ring *r = &c->ring;

    if (attr && attr->comp_mask)
        return EINVAL;
    /* empty: as ibv_poll_cq (the spin, then the receive step or the sleep) */
    if (atomic_load_explicit(&r->tail, memory_order_acquire)
        == atomic_load_explicit(&r->head, memory_order_relaxed)
        && !sr_ring_empty(r, c->h))
        return ENOENT;
    sr_empty_run = 0;
    sr_taken = 1;
    pthread_spin_lock(&r->consumer);
    if (sr_cqx_load(c)) {
        pthread_spin_unlock(&r->consumer);
        return ENOENT;
    }
    c->ex_polling = 1;
    return 0;
}

static void sr_cqx_consume(struct sr_cq *c)
{
    struct sr_ring *r = &c->ring;
    if (c->ex_cur)
        atomic_store_explicit(&r->head, atomic_load_explicit(&r->head, memory_order_relaxed) + 1,
                              memory_order_release);
    c->ex_cur = 0;
}

static int sr_cqx_next(struct ibv_cq_ex *cqx)
{
    struct sr_cq *c = SR_CQX(cqx);
    sr_cqx_consume(c);
    return sr_cqx_load(c);
}

static void sr_cqx_end(struct ibv_cq_ex *cqx)
{
    struct sr_cq *c = SR_CQX(cqx);
    if (!c->ex_polling)
        return;
    sr_cqx_consume(c);
    c->ex_polling = 0;
    pthread_spin_unlock(&c->ring.consumer);
}

static enum ibv_wc_opcode sr_cqx_opcode(struct ibv_cq_ex *cqx) { return SR_CUR(cqx)->opcode; }
static uint32_t sr_cqx_vendor_err(struct ibv_cq_ex *cqx) { return SR_CUR(cqx)->vendor_err; }
static uint32_t sr_cqx_byte_len(struct ibv_cq_ex *cqx) { return SR_CUR(cqx)->byte_len; }
static __be32 sr_cqx_imm(struct ibv_cq_ex *cqx)
{
    struct ibv_wc *wc = SR_CUR(cqx);
    return wc->wc_flags & IBV_WC_WITH_INV ? wc->invalidated_rkey : wc->imm_data;
}
static uint32_t sr_cqx_qp_num(struct ibv_cq_ex *cqx) { return SR_CUR(cqx)->qp_num; }
static uint32_t sr_cqx_src_qp(struct ibv_cq_ex *cqx) { return SR_CUR(cqx)->src_qp; }
static unsigned int sr_cqx_wc_flags(struct ibv_cq_ex *cqx) { return SR_CUR(cqx)->wc_flags; }
static uint32_t sr_cqx_slid(struct ibv_cq_ex *cqx) { return SR_CUR(cqx)->slid; }
static uint8_t sr_cqx_sl(struct ibv_cq_ex *cqx) { return SR_CUR(cqx)->sl; }
static uint8_t sr_cqx_dlid_path_bits(struct ibv_cq_ex *cqx) { return SR_CUR(cqx)->dlid_path_bits; }
/* 0 on a CQ made without a timestamp */
static uint64_t sr_cqx_ts(struct ibv_cq_ex *cqx)
{
    struct sr_ring *r = &SR_CQX(cqx)->ring;
    return r->ts ? r->ts[atomic_load_explicit(&r->head, memory_order_relaxed) & r->mask] : 0;
}
/* the same instant on CLOCK_REALTIME (ns since the epoch) */
static uint64_t sr_cqx_wallclock(struct ibv_cq_ex *cqx)
{
    struct timespec rt;
    long long mono = sr_now_ns();

    if (!SR_CQX(cqx)->ring.ts)
        return 0;
    clock_gettime(CLOCK_REALTIME, &rt);
    return (uint64_t)((long long)rt.tv_sec * 1000000000LL + rt.tv_nsec - mono)
           + sr_cqx_ts(cqx);
}
static uint16_t sr_cqx_zero16(struct ibv_cq_ex *cqx) { (void)cqx; return 0; }
static uint32_t sr_cqx_zero32(struct ibv_cq_ex *cqx) { (void)cqx; return 0; }
static void sr_cqx_tm(struct ibv_cq_ex *cqx, struct ibv_wc_tm_info *tm)
{ (void)cqx; memset(tm, 0, sizeof(*tm)); }

/* ibv_create_cq_ex: the standard fields, and the completion timestamp (the time the
 * completion reached the CQ, in ns of CLOCK_MONOTONIC: hca_core_clock 1 GHz) and its
 * wall-clock time; other fields (flow tag, CVLAN, tag matching) are EOPNOTSUPP */
#define SR_WC_TS_FLAGS (IBV_WC_EX_WITH_COMPLETION_TIMESTAMP \
                        | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK)
static struct ibv_cq_ex *sr_create_cq_ex(struct ibv_context *context,
                                         struct ibv_cq_init_attr_ex *attr)
{
    uint32_t known = IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD;
    struct ibv_cq *cq;
    struct sr_cq *c;

    if (!attr || attr->comp_mask & ~known)
        return sr_fail(EINVAL);
    if (attr->wc_flags & ~(uint64_t)(IBV_WC_STANDARD_FLAGS | SR_WC_TS_FLAGS))
        return sr_fail(EOPNOTSUPP);
    if ((attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS)
        && (attr->flags & ~(uint32_t)IBV_CREATE_CQ_ATTR_SINGLE_THREADED))
        return sr_fail(EOPNOTSUPP);  /* IGNORE_OVERRUN */
    if (attr->cqe > INT32_MAX)
        return sr_fail(EINVAL);
    if (attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD) {  /* a parent domain, as mlx5 */
        struct sr_pd *d = (struct sr_pd *)attr->parent_domain;
        if (!d || !d->base || d->pd.context != context)
            return sr_fail(EINVAL);
    }
    cq = sr_create_cq(context, (int)attr->cqe, attr->cq_context, attr->channel,
                      (int)attr->comp_vector,
                      attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD ? attr->parent_domain : NULL);
    if (!cq)
        return NULL;
    c = (struct sr_cq *)cq;
    if (attr->wc_flags & SR_WC_TS_FLAGS) {  /* no producer yet: no QP uses the CQ */
        c->ring.ts = calloc(c->ring.mask + 1, sizeof(uint64_t));
        if (!c->ring.ts) {
            ibv_destroy_cq(cq);
            return sr_fail(ENOMEM);
        }
    }
    c->cqx.comp_mask = 0;
    c->cqx.start_poll = sr_cqx_start;
    c->cqx.next_poll = sr_cqx_next;
    c->cqx.end_poll = sr_cqx_end;
    c->cqx.read_opcode = sr_cqx_opcode;
    c->cqx.read_vendor_err = sr_cqx_vendor_err;
    c->cqx.read_byte_len = sr_cqx_byte_len;
    c->cqx.read_imm_data = sr_cqx_imm;
    c->cqx.read_qp_num = sr_cqx_qp_num;
    c->cqx.read_src_qp = sr_cqx_src_qp;
    c->cqx.read_wc_flags = sr_cqx_wc_flags;
    c->cqx.read_slid = sr_cqx_slid;
    c->cqx.read_sl = sr_cqx_sl;
    c->cqx.read_dlid_path_bits = sr_cqx_dlid_path_bits;
    c->cqx.read_completion_ts = sr_cqx_ts;
    c->cqx.read_completion_wallclock_ns = sr_cqx_wallclock;
    c->cqx.read_cvlan = sr_cqx_zero16;
    c->cqx.read_flow_tag = sr_cqx_zero32;
    c->cqx.read_tm_info = sr_cqx_tm;
    return &c->cqx;
}

/* ---- a QP moved to RESET leaves no completions behind in its CQs (as the mlx4/mlx5
 * providers clean them on that transition): rdma-core's tests restate a QP from ERR
 * through RESET and expect no flushed completions of its old life. Called from Python
 * under the engine lock (no producer), the consumer lock held by ibv_modify_qp. */
void sr_ring_clean(void *ring, uint32_t qp_num)
{
    struct sr_ring *r = ring;
    uint32_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    uint32_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    uint32_t kept = tail, i;

    /* walk back from the tail, packing the entries of other QPs towards it */
    for (i = tail; i != head; i--) {
        struct ibv_wc *wc = &r->wc[(i - 1) & r->mask];
        if (wc->qp_num != qp_num) {
            kept--;
            if (kept != i - 1) {
                r->wc[kept & r->mask] = *wc;
                if (r->ts)
                    r->ts[kept & r->mask] = r->ts[(i - 1) & r->mask];
            }
        }
    }
    atomic_store_explicit(&r->head, kept, memory_order_release);
}

static void sr_clean_cq(struct ibv_cq *cq, uint32_t qp_num)
{
    struct sr_cq *c = (struct sr_cq *)cq;

    if (!cq)
        return;
    pthread_spin_lock(&c->ring.consumer);
    sr_py_clean_cq(c->h, qp_num);
    pthread_spin_unlock(&c->ring.consumer);
}

/* ---- ibv_resize_cq: a larger (or smaller, if the queued completions fit) ring ----
 * Called from Python under the engine lock (no producer), with the consumer lock held by
 * ibv_resize_cq (no consumer): the queued completions move to a new array. */
int sr_ring_resize(void *ring, uint32_t cqe)
{
    struct sr_ring *r = ring;
    uint32_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    uint32_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    uint32_t n = tail - head, size = sr_ring_slots(cqe), i;
    struct ibv_wc *wc;
    uint64_t *ts = NULL;
    int custom;

    if (cqe < n)
        return EINVAL;
    wc = sr_dom_calloc(r->dom, (size_t)size * sizeof(*wc), SR_RES_CQ, &custom);
    if (r->ts)
        ts = calloc(size, sizeof(*ts));
    if (!wc || (r->ts && !ts)) {
        if (wc)
            sr_dom_free(r->dom, wc, custom, SR_RES_CQ);
        free(ts);
        return ENOMEM;
    }
    for (i = 0; i < n; i++) {
        wc[i] = r->wc[(head + i) & r->mask];
        if (ts)
            ts[i] = r->ts[(head + i) & r->mask];
    }
    sr_dom_free(r->dom, r->wc, r->custom, SR_RES_CQ);
    free(r->ts);
    r->wc = wc;
    r->custom = custom;
    r->ts = ts;
    r->capacity = cqe;
    r->mask = size - 1;
    atomic_store_explicit(&r->head, 0, memory_order_relaxed);
    atomic_store_explicit(&r->tail, n, memory_order_release);
    return 0;
}

int ibv_resize_cq(struct ibv_cq *cq, int cqe)
{
    struct sr_cq *c = (struct sr_cq *)cq;
    int ret;

    if (!cq || cqe < 1)
        return EINVAL;
    pthread_spin_lock(&c->ring.consumer);
    ret = sr_py_resize_cq(c->h, cqe);
    pthread_spin_unlock(&c->ring.consumer);
    if (!ret)
        cq->cqe = cqe;
    return ret;
}

/* ---- ibv_rereg_mr: the region takes its new memory, PD and/or access in place and
 * keeps its lkey and rkey, as rxe does (the rereg tests of rdma-core reuse the keys read
 * before). Errors: IBV_REREG_MR_ERR_INPUT (bad flags or arguments, errno EINVAL), or
 * IBV_REREG_MR_ERR_CMD with errno, the old registration left as it was. */
int ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t length,
                 int access)
{
    struct sr_mr *m = (struct sr_mr *)mr;
    struct ibv_pd *npd;
    void *naddr;
    size_t nlen;
    uint64_t iova;
    int nacc, ret, translation;

    if (!mr || flags <= 0 || (flags & ~IBV_REREG_MR_FLAGS_SUPPORTED)
        || m->dm) {
        errno = EINVAL;
        return IBV_REREG_MR_ERR_INPUT;
    }
    translation = (flags & IBV_REREG_MR_CHANGE_TRANSLATION) != 0;
    npd = (flags & IBV_REREG_MR_CHANGE_PD) ? pd : mr->pd;
    naddr = translation ? addr : mr->addr;
    nlen = translation ? length : mr->length;
    iova = translation ? (uint64_t)(uintptr_t)addr : m->iova;
    nacc = (flags & IBV_REREG_MR_CHANGE_ACCESS) ? access : m->access;
    if (!npd || !naddr || !nlen || npd->context != mr->context) {
        errno = EINVAL;
        return IBV_REREG_MR_ERR_INPUT;
    }
    ret = sr_py_rereg_mr(m->h, SR_H(sr_pd, npd), naddr, nlen, iova, nacc, translation);
    if (ret) {
        errno = ret;
        return IBV_REREG_MR_ERR_CMD;
    }
    m->access = nacc;
    m->iova = iova;
    mr->pd = npd;
    mr->addr = naddr;
    mr->length = nlen;
    return 0;
}

/* ---- memory windows (IBA 10.6.7; ibv_alloc_mw, ibv_bind_mw, ibv_dealloc_mw: the ops
 * verbs.h's inline helpers call). Type 1 is bound by ibv_bind_mw, which posts the bind on
 * the QP's send queue and gives the window its next key (as rxe's provider: the new key
 * is written into mw->rkey once posted); type 2 by a BIND_MW work request (sr_bind_fields).
 * RoCE only: iWARP devices fail ibv_alloc_mw with EOPNOTSUPP (siw has none). */
static struct ibv_mw *sr_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type)
{
    struct sr_mw *m;
    uint32_t rkey = 0;
    int h = sr_py_alloc_mw(SR_H(sr_pd, pd), (int)type, &rkey);

    m = sr_handle_box(h, sizeof(*m));
    if (!m)
        return NULL;
    m->h = h;
    m->mw.context = pd->context;
    m->mw.pd = pd;
    m->mw.rkey = rkey;
    m->mw.handle = (uint32_t)h;
    m->mw.type = type;
    return &m->mw;
}

static int sr_dealloc_mw(struct ibv_mw *mw)
{
    return sr_destroy_obj(SR_H(sr_mw, mw), mw);
}

static int sr_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *bind)
{
    const struct ibv_mw_bind_info *info = &bind->bind_info;
    uint32_t rkey = mw->rkey;
    int ret;

    sr_posted();
    ret = sr_py_bind_mw(SR_H(sr_qp, qp), SR_H(sr_mw, mw),
                        info->mr ? SR_H(sr_mr, info->mr) : 0, info->addr, info->length,
                        info->mw_access_flags, bind->wr_id, bind->send_flags, &rkey);
    if (!ret)
        mw->rkey = rkey;
    return ret;
}

/* ---- thread and parent domains (ibv_alloc_td(3), ibv_alloc_parent_domain(3)) ----
 * A thread domain promises that one thread uses the objects made with it; softrdma takes
 * its locks all the same, so a TD is only counted (EBUSY while a parent domain holds it). A
 * parent domain is a struct sr_pd over its PD (above): QPs, SRQs, MRs, AHs and windows made
 * on it are its PD's, and the C rings of its QPs and SRQs, and of the CQs made with it
 * (ibv_create_cq_ex with IBV_CQ_INIT_ATTR_MASK_PD), come from its allocators. */
static struct ibv_td *sr_alloc_td(struct ibv_context *context, struct ibv_td_init_attr *attr)
{
    struct sr_td *t;

    if (!attr || attr->comp_mask)
        return sr_fail(EINVAL);
    t = calloc(1, sizeof(*t));
    if (!t)
        return sr_fail(ENOMEM);
    t->td.context = context;
    return &t->td;
}

static int sr_dealloc_td(struct ibv_td *td)
{
    struct sr_td *t = (struct sr_td *)td;

    if (atomic_load(&t->users))
        return EBUSY;
    free(t);
    return 0;
}

static struct ibv_pd *sr_alloc_parent_domain(struct ibv_context *context,
                                             struct ibv_parent_domain_init_attr *attr)
{
    uint32_t known = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
    struct sr_pd *base, *d;

    if (!attr || !attr->pd || attr->comp_mask & ~known)
        return sr_fail(EINVAL);
    base = (struct sr_pd *)attr->pd;
    if (base->base || attr->pd->context != context
        || (attr->td && attr->td->context != context))
        return sr_fail(EINVAL);  /* a parent domain over a parent domain, another device */
    if ((attr->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS)
        && (!attr->alloc || !attr->free))
        return sr_fail(EINVAL);
    d = calloc(1, sizeof(*d));
    if (!d)
        return sr_fail(ENOMEM);
    d->h = base->h;
    d->base = base;
    d->pd.context = context;
    d->pd.handle = base->pd.handle;
    d->td = (struct sr_td *)attr->td;
    if (attr->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS) {
        d->alloc = attr->alloc;
        d->free = attr->free;
    }
    if (attr->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT)
        d->pd_context = attr->pd_context;
    atomic_fetch_add(&base->users, 1);
    if (d->td)
        atomic_fetch_add(&d->td->users, 1);
    return &d->pd;
}

static void sr_ext_context_ops(struct verbs_context *vctx)
{
    vctx->alloc_td = sr_alloc_td;
    vctx->dealloc_td = sr_dealloc_td;
    vctx->alloc_parent_domain = sr_alloc_parent_domain;
    vctx->context.ops.alloc_mw = sr_alloc_mw;
    vctx->context.ops.bind_mw = sr_bind_mw;
    vctx->context.ops.dealloc_mw = sr_dealloc_mw;
    vctx->query_device_ex = sr_query_device_ex;
    vctx->query_rt_values = sr_query_rt_values;
    vctx->advise_mr = sr_advise_mr;
    vctx->alloc_dm = sr_alloc_dm;
    vctx->free_dm = sr_free_dm;
    vctx->reg_dm_mr = sr_reg_dm_mr;
    vctx->open_xrcd = sr_open_xrcd;
    vctx->close_xrcd = sr_close_xrcd;
    vctx->create_srq_ex = sr_create_srq_ex;
    vctx->get_srq_num = sr_get_srq_num;
    vctx->create_cq_ex = sr_create_cq_ex;
}
