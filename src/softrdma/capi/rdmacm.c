
/* ==== librdmacm (rdma_cma.h) over softrdma.cm.rdma_cm (docs/design.md, "C programs") ====
 *
 * Appended to shim.c by build.py (one translation unit: the verbs wrappers are shared).
 * librdmacm opens /dev/infiniband/rdma_cm, which softrdma does not have: every rdma_* export
 * that takes an id, a channel or an event is served here, the pure helpers
 * (rdma_event_str) stay the real library's. An id is a struct rdma_cm_id first in a wrapper
 * holding the handle of its Python CmId; its verbs context is the program's ibv_context of
 * the Context the rdma_cm layer opened (made here the first time it is seen), so the PD,
 * CQs and QP the program makes on id->verbs are on the id's device.
 *
 * Events: sr_py_cm_get_event takes one without blocking; rdma_get_cm_event waits in poll(2)
 * on the program's own descriptor of the channel's pipe (rdma_event_channel.fd), so a
 * program may poll it or block in one thread while others work. An id created without a
 * channel (rdma_create_id(NULL, ...), rdma_create_ep) is synchronous as in librdmacm: each
 * call waits for its event and fails with its status. Multicast (RoCE): a join attaches the
 * id's UD QP to the group's MGID (its IP address as a GID) and queues MULTICAST_JOIN with the
 * group's AH, QPN 0xFFFFFF and Q_Key (softrdma.cm.rdma_mcast). Errors: -1 (or NULL) with
 * errno; nothing goes through the real library (an option not served is ENOSYS, XRC
 * through rdma_cm EOPNOTSUPP). */
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>  /* rdma_create_srq(_ex), rdma_destroy_srq */
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

struct sr_cm_channel { struct rdma_event_channel ch; int h; _Atomic int dead; };
struct sr_cm_event;
/* After the rdma_cm_id, an id begins as librdmacm's own private id (struct cma_id_private,
 * the same from rdma-core 25 to today): rsockets, which is part of librdmacm (rstream,
 * riostream, rcopy, udpong, librspreload), calls the library's internal ucma_complete and
 * ucma_max_qpsize on our ids, and those read its cma_dev and sync. cma_dev stays NULL, so
 * ucma_max_qpsize asks the devices (ibv_query_device, served here); sync is ours, so
 * ucma_complete takes the id's next event from its channel (rdma_get_cm_event, served
 * here) exactly when librdmacm's would. */
struct sr_cm_id {
    struct rdma_cm_id id;
    void *lib_cma_dev;            /* librdmacm's cma_dev: always NULL */
    void *lib_connect;            /* its connect, connect_len, events_completed and */
    size_t lib_connect_len;       /* connect_error: never read by the library's */
    int lib_events_completed;     /* internal calls on an id it did not make */
    int lib_connect_error;
    int sync;         /* no channel of the program's: each call waits for its event */
    int h;
    int own_cqs;      /* rdma_create_qp made the CQs and their channels */
    struct ibv_qp_init_attr *listen_attr;  /* rdma_create_ep on a passive id */
    struct ibv_pd *listen_pd;
    void *mc_context;  /* rdma_join_multicast's context: MULTICAST_JOIN's ud.private_data */
    struct sr_cm_event *held;  /* events returned about this id and not acknowledged yet */
    int orphan;  /* rdma_destroy_id returned while the caller held events: the last ack frees it */
    struct ibv_qp *cm_qp;  /* the QP rdma_create_qp gave the CM (sr_cm_released) */
};
struct sr_cm_event {
    struct rdma_cm_event ev;
    uint8_t data[256];
    struct sr_cm_id *owner;    /* the id it counts against (a CONNECT_REQUEST's: the listener) */
    pthread_t thread;          /* the thread rdma_get_cm_event returned it to */
    struct sr_cm_event *next, *prev;
};

#define SR_CHAN(c) ((struct sr_cm_channel *)(c))
#define SR_CMID(i) ((struct sr_cm_id *)(i))

static pthread_mutex_t g_cm_lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- events held by the program ----
 * librdmacm's rdma_destroy_id (and rdma_migrate_id) blocks until every event already
 * returned about the id is acknowledged (its events_completed against the kernel's
 * events_reported): a program may destroy an id in one thread while its CM thread still
 * handles an event about it, and that handler reads event->id->context (rping at
 * DISCONNECTED). Here each returned event is linked to its id under g_cm_ev_lock, which
 * also covers taking an event from Python and rdma_destroy_id's teardown, so no event about
 * an id is returned once its destroy has begun. The wait skips events held by the calling
 * thread itself: it could never acknowledge them while it waits (librdmacm hangs for ever
 * there); such an id is freed by its last rdma_ack_cm_event instead. */
static pthread_mutex_t g_cm_ev_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cm_ev_cond = PTHREAD_COND_INITIALIZER;

static void sr_cm_hold(struct sr_cm_event *e, struct sr_cm_id *owner)
{
    e->owner = owner;
    e->thread = pthread_self();
    e->prev = NULL;
    e->next = owner->held;
    if (owner->held)
        owner->held->prev = e;
    owner->held = e;
}

/* under g_cm_ev_lock: an event about c held by a thread other than the caller */
static int sr_cm_held_elsewhere(const struct sr_cm_id *c)
{
    const struct sr_cm_event *e;

    for (e = c->held; e; e = e->next)
        if (!pthread_equal(e->thread, pthread_self()))
            return 1;
    return 0;
}

/* under g_cm_ev_lock: wait until no other thread holds an event about c */
static void sr_cm_wait_acked(const struct sr_cm_id *c)
{
    while (sr_cm_held_elsewhere(c))
        pthread_cond_wait(&g_cm_ev_cond, &g_cm_ev_lock);
}

static void sr_cm_free_id(struct sr_cm_id *c)
{
    free(c->listen_attr);
    free(c);
}

/* ---- live ids ----
 * Every id this library made, until rdma_destroy_id. An rdma_* call given any other pointer
 * (an id destroyed already, or garbage) fails with EINVAL and never reads through it:
 * perftest 4.5-0.17's rdma_cm_client_connection retries with the ids of the nodes array its
 * rdma_cm_destroy_cma destroyed and freed, so its next rdma_resolve_addr and
 * rdma_destroy_id read a pointer out of freed memory (SIGBUS/SIGSEGV in librdmacm's place);
 * here the retry fails cleanly and the program exits with its own message. */
#define SR_CM_LIVE_BUCKETS 256
struct sr_cm_live { const void *p; struct sr_cm_live *next; };
static struct sr_cm_live *g_cm_live[SR_CM_LIVE_BUCKETS];
static pthread_mutex_t g_cm_live_lock = PTHREAD_MUTEX_INITIALIZER;

static unsigned sr_cm_live_bucket(const void *p)
{
    uintptr_t v = (uintptr_t)p;
    return (unsigned)((v >> 4) ^ (v >> 12)) % SR_CM_LIVE_BUCKETS;
}

static int sr_cm_live_add(const void *p)
{
    struct sr_cm_live *n = malloc(sizeof(*n));
    unsigned b = sr_cm_live_bucket(p);

    if (!n) {
        errno = ENOMEM;
        return -1;
    }
    n->p = p;
    pthread_mutex_lock(&g_cm_live_lock);
    n->next = g_cm_live[b];
    g_cm_live[b] = n;
    pthread_mutex_unlock(&g_cm_live_lock);
    return 0;
}

/* 1 if p was live (and is not any more), 0 otherwise */
static int sr_cm_live_del(const void *p)
{
    struct sr_cm_live **pp, *n = NULL;

    pthread_mutex_lock(&g_cm_live_lock);
    for (pp = &g_cm_live[sr_cm_live_bucket(p)]; *pp; pp = &(*pp)->next) {
        if ((*pp)->p == p) {
            n = *pp;
            *pp = n->next;
            break;
        }
    }
    pthread_mutex_unlock(&g_cm_live_lock);
    free(n);
    return n != NULL;
}

/* 1 if id is an id of ours not destroyed yet; 0 (errno EINVAL) for NULL or any other */
static int sr_cm_live(const struct rdma_cm_id *id)
{
    struct sr_cm_live *n;
    int found = 0;

    if (id) {
        pthread_mutex_lock(&g_cm_live_lock);
        for (n = g_cm_live[sr_cm_live_bucket(id)]; n; n = n->next) {
            if (n->p == id) {
                found = 1;
                break;
            }
        }
        pthread_mutex_unlock(&g_cm_live_lock);
    }
    if (!found)
        errno = EINVAL;
    return found;
}

/* librdmacm moves only id->qp (ucma_modify_qp_*), and a program may clear it once
 * connected to keep the QP past the CM connection: libfabric's XRC endpoints set id->qp to
 * NULL, then tear the connection down (rdma_disconnect, the peer's DREQ) and go on using
 * the QP. So an id whose id->qp was cleared hands its QP back (the CM moves it no more):
 * checked for the id at rdma_disconnect and rdma_destroy_id, and for every id at each
 * rdma_get_cm_event, before the event a DREQ from the peer could bring. */
static void sr_cm_released(struct sr_cm_id *only)
{
    int hs[64], n = 0, i;
    struct sr_cm_live *l;
    unsigned b;

    pthread_mutex_lock(&g_cm_live_lock);
    for (b = 0; b < SR_CM_LIVE_BUCKETS && n < 64; b++)
        for (l = g_cm_live[b]; l && n < 64; l = l->next) {
            struct sr_cm_id *c = (struct sr_cm_id *)l->p;
            if ((!only || c == only) && c->cm_qp && !c->id.qp) {
                c->cm_qp = NULL;
                hs[n++] = c->h;
            }
        }
    pthread_mutex_unlock(&g_cm_live_lock);
    for (i = 0; i < n; i++)  /* outside the lock: Python may call back into C */
        sr_py_cm_drop_qp(hs[i]);
}

/* int verb result from Python (0 or an errno value) -> 0 or -1 with errno */
static int sr_cm_ret(int err)
{
    if (!err)
        return 0;
    errno = err;
    return -1;
}

static int sr_cm_from_sockaddr(const struct sockaddr *sa, struct sr_cm_addr *a)
{
    memset(a, 0, sizeof(*a));
    if (!sa)
        return 0;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        a->family = AF_INET;
        a->port = ntohs(in->sin_port);
        memcpy(a->ip, &in->sin_addr, 4);
        return 0;
    }
    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        a->family = AF_INET6;
        a->port = ntohs(in6->sin6_port);
        memcpy(a->ip, &in6->sin6_addr, 16);
        return 0;
    }
    errno = EAFNOSUPPORT;  /* AF_IB: softrdma speaks IP (RoCE, iWARP) */
    return -1;
}

static void sr_cm_to_sockaddr(const struct sr_cm_addr *a, struct sockaddr_storage *ss)
{
    if (a->family == AF_INET) {
        struct sockaddr_in *in = (struct sockaddr_in *)ss;
        memset(ss, 0, sizeof(*ss));
        in->sin_family = AF_INET;
        in->sin_port = htons(a->port);
        memcpy(&in->sin_addr, a->ip, 4);
    } else if (a->family == AF_INET6) {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
        memset(ss, 0, sizeof(*ss));
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons(a->port);
        memcpy(&in6->sin6_addr, a->ip, 16);
    }
}

/* The id's device context and addresses, from the Python CmId (after each call that may
 * change them and each event). */
/* Each device context's rdma_cm objects, made at their first need and kept for the
 * process: the PD that every cm_id bound to the device carries in id->pd once it has the
 * device (librdmacm's ucma_get_device: pyverbs' PD(cmid) takes id->pd right after
 * rdma_bind_addr / rdma_resolve_route), and the XRC domain of its rdma_cm XRC TGT QPs and
 * SRQs, opened with no file (librdmacm's ucma_get_xrcd). */
#define SR_CM_MAX_DEVICES 64
static struct {
    struct ibv_context *verbs;
    struct ibv_pd *pd;
    struct ibv_xrcd *xrcd;
} g_cm_devs[SR_CM_MAX_DEVICES];

/* the table's entry of verbs, claimed at its first use; -1 (ENOMEM) when the table is
 * full. Under g_cm_lock. */
static int sr_cm_device_slot(struct ibv_context *verbs)
{
    int i;

    for (i = 0; i < SR_CM_MAX_DEVICES && g_cm_devs[i].verbs; i++)
        if (g_cm_devs[i].verbs == verbs)
            return i;
    if (i == SR_CM_MAX_DEVICES) {
        errno = ENOMEM;
        return -1;
    }
    g_cm_devs[i].verbs = verbs;
    return i;
}

static struct ibv_pd *sr_cm_device_pd(struct ibv_context *verbs)
{
    struct ibv_pd *pd = NULL;
    int i;

    pthread_mutex_lock(&g_cm_lock);
    i = sr_cm_device_slot(verbs);
    if (i >= 0) {
        if (!g_cm_devs[i].pd)
            g_cm_devs[i].pd = ibv_alloc_pd(verbs);
        pd = g_cm_devs[i].pd;
    }
    pthread_mutex_unlock(&g_cm_lock);
    return pd;
}

static struct ibv_xrcd *sr_cm_device_xrcd(struct ibv_context *verbs)
{
    struct ibv_xrcd_init_attr attr;
    struct ibv_xrcd *xrcd = NULL;
    int i;

    pthread_mutex_lock(&g_cm_lock);
    i = sr_cm_device_slot(verbs);
    if (i >= 0) {
        if (!g_cm_devs[i].xrcd) {
            memset(&attr, 0, sizeof(attr));
            attr.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
            attr.fd = -1;
            attr.oflags = O_CREAT;
            g_cm_devs[i].xrcd = ibv_open_xrcd(verbs, &attr);
        }
        xrcd = g_cm_devs[i].xrcd;
    }
    pthread_mutex_unlock(&g_cm_lock);
    return xrcd;
}

static int sr_cm_refresh(struct sr_cm_id *c)
{
    struct sr_cm_info info;
    int ret;

    if (sr_load_devices() < 0)
        return -1;
    memset(&info, 0, sizeof(info));
    ret = sr_py_cm_info(c->h, &info);
    if (ret)
        return sr_cm_ret(ret);
    if (info.ctx > 0 && !info.ctx_wrapper) {
        pthread_mutex_lock(&g_cm_lock);
        memset(&info, 0, sizeof(info));
        ret = sr_py_cm_info(c->h, &info);  /* again, under the lock: one wrapper per Context */
        if (!ret && info.ctx > 0 && !info.ctx_wrapper) {
            struct ibv_device *dev = NULL;
            struct ibv_context *ctx;
            if (info.dev_index >= 0 && info.dev_index < g_ndev)
                dev = &g_devs[info.dev_index].dev;
            else if (g_ndev > 0)
                dev = &g_devs[0].dev;
            ctx = sr_wrap_context(info.ctx, info.async_fd, dev);
            if (ctx) {
                info.ctx_wrapper = SR_CTX(ctx);
                ret = sr_py_cm_set_wrapper(info.ctx, info.ctx_wrapper);
            } else {
                ret = errno;
            }
        }
        pthread_mutex_unlock(&g_cm_lock);
        if (ret)
            return sr_cm_ret(ret);
    }
    if (info.ctx_wrapper)
        c->id.verbs = &((struct sr_context *)info.ctx_wrapper)->vctx.context;
    if (c->id.verbs && !c->id.pd)
        c->id.pd = sr_cm_device_pd(c->id.verbs);
    c->id.port_num = (uint8_t)info.port_num;
    if (info.src.family)
        sr_cm_to_sockaddr(&info.src, &c->id.route.addr.src_storage);
    if (info.dst.family)
        sr_cm_to_sockaddr(&info.dst, &c->id.route.addr.dst_storage);
    return 0;
}

/* ---- event channels ---- */
struct rdma_event_channel *rdma_create_event_channel(void)
{
    struct sr_cm_channel *c;
    int fd = -1, h;

    if (!sr_python_ok())
        return NULL;
    h = sr_py_cm_channel(&fd);
    if (!sr_handle_ok(h))
        return NULL;
    c = calloc(1, sizeof(*c));
    if (!c) {
        sr_py_destroy(h);
        return sr_fail(ENOMEM);
    }
    c->h = h;
    c->ch.fd = sr_own_fd(fd);  /* blocking, the program's to change */
    if (c->ch.fd < 0) {
        int err = errno;
        sr_py_destroy(h);
        free(c);
        return sr_fail(err ? err : EMFILE);
    }
    return &c->ch;
}

/* A thread may still wait in rdma_get_cm_event on the channel (rping's CM thread does
 * while its main thread tears down): as a read of the kernel's rdma_cm file, that wait
 * never returns (sr_cm_wait_dead), so the struct is kept (a few bytes) and the channel's
 * fd closed. */
void rdma_destroy_event_channel(struct rdma_event_channel *channel)
{
    struct sr_cm_channel *c = SR_CHAN(channel);

    if (!c || atomic_exchange(&c->dead, 1))
        return;  /* destroyed already: its fd number may be another file's by now */
    sr_py_destroy(c->h);
    close(c->ch.fd);
}

static void sr_cm_wait_dead(void)
{
    for (;;)
        pause();
}

/* ---- ids ---- */
static int sr_cm_create_id(struct rdma_event_channel *channel, struct rdma_cm_id **id,
                           void *context, enum rdma_port_space ps, enum ibv_qp_type qpt)
{
    struct sr_cm_id *c;
    int sync = channel == NULL, h;

    if (!id) {
        errno = EINVAL;
        return -1;
    }
    c = calloc(1, sizeof(*c));
    if (!c) {
        errno = ENOMEM;
        return -1;
    }
    if (sync && !(channel = rdma_create_event_channel())) {
        free(c);
        return -1;
    }
    h = sr_py_cm_create_id(SR_CHAN(channel)->h, ps, qpt, c);
    if (!sr_handle_ok(h)) {
        int err = errno;
        if (sync)
            rdma_destroy_event_channel(channel);
        free(c);
        errno = err;
        return -1;
    }
    if (sr_cm_live_add(&c->id)) {
        sr_py_cm_destroy_id(h);
        if (sync)
            rdma_destroy_event_channel(channel);
        free(c);
        errno = ENOMEM;
        return -1;
    }
    c->h = h;
    c->sync = sync;
    c->id.channel = channel;
    c->id.context = context;
    c->id.ps = ps;
    c->id.qp_type = qpt;
    *id = &c->id;
    return 0;
}

int rdma_create_id(struct rdma_event_channel *channel, struct rdma_cm_id **id, void *context,
                   enum rdma_port_space ps)
{
    return sr_cm_create_id(channel, id, context, ps,
                           ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB ? IBV_QPT_UD : IBV_QPT_RC);
}

int rdma_ack_cm_event(struct rdma_cm_event *event)
{
    struct sr_cm_event *e = (struct sr_cm_event *)event;  /* ev is its first member */
    struct sr_cm_id *gone = NULL;

    if (!event) {
        errno = EINVAL;
        return -1;
    }
    pthread_mutex_lock(&g_cm_ev_lock);
    if (e->owner) {
        if (e->prev)
            e->prev->next = e->next;
        else
            e->owner->held = e->next;
        if (e->next)
            e->next->prev = e->prev;
        if (e->owner->orphan && !e->owner->held)
            gone = e->owner;
        pthread_cond_broadcast(&g_cm_ev_cond);
    }
    pthread_mutex_unlock(&g_cm_ev_lock);
    free(e);
    if (gone)
        sr_cm_free_id(gone);
    return 0;
}

int rdma_destroy_id(struct rdma_cm_id *id)
{
    struct sr_cm_id *c = SR_CMID(id);
    int ret, free_now;

    sr_cm_released(c);  /* (only an id in the live table: c is not read otherwise) */
    pthread_mutex_lock(&g_cm_ev_lock);
    if (!sr_cm_live(id)) {
        pthread_mutex_unlock(&g_cm_ev_lock);
        return -1;
    }
    ret = sr_py_cm_destroy_id(c->h);  /* drops its queued events: none is returned after */
    if (ret) {
        pthread_mutex_unlock(&g_cm_ev_lock);
        return sr_cm_ret(ret);
    }
    sr_cm_live_del(id);
    pthread_mutex_unlock(&g_cm_ev_lock);
    if (id->event) {
        rdma_ack_cm_event(id->event);
        id->event = NULL;
    }
    if (c->sync)
        rdma_destroy_event_channel(id->channel);
    pthread_mutex_lock(&g_cm_ev_lock);
    sr_cm_wait_acked(c);
    free_now = !c->held;  /* else the calling thread holds some: its last ack frees c */
    c->orphan = !free_now;
    pthread_mutex_unlock(&g_cm_ev_lock);
    if (free_now)
        sr_cm_free_id(c);
    return 0;
}

/* A synchronous id: wait for the event its call queued (kept in id->event until the next
 * call); an event with a status fails the call (REJECTED: ECONNREFUSED), as librdmacm. */
static int sr_cm_complete(struct sr_cm_id *c)
{
    struct rdma_cm_event *ev;

    if (!c->sync)
        return 0;
    if (c->id.event) {
        rdma_ack_cm_event(c->id.event);
        c->id.event = NULL;
    }
    if (rdma_get_cm_event(c->id.channel, &ev))
        return -1;
    c->id.event = ev;
    if (ev->status) {
        if (ev->event == RDMA_CM_EVENT_REJECTED)
            errno = ECONNREFUSED;
        else
            errno = ev->status < 0 ? -ev->status : ev->status;
        return -1;
    }
    switch (ev->event) {
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_ROUTE_ERROR:
    case RDMA_CM_EVENT_CONNECT_ERROR:
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
        errno = EHOSTUNREACH;
        return -1;
    case RDMA_CM_EVENT_REJECTED:
        errno = ECONNREFUSED;
        return -1;
    default:
        return 0;
    }
}

int rdma_bind_addr(struct rdma_cm_id *id, struct sockaddr *addr)
{
    struct sr_cm_addr a;
    int ret;

    if (!sr_cm_live(id))
        return -1;
    if (!addr) {
        errno = EINVAL;
        return -1;
    }
    if (sr_cm_from_sockaddr(addr, &a))
        return -1;
    ret = sr_py_cm_bind(SR_CMID(id)->h, &a);
    if (ret)
        return sr_cm_ret(ret);
    return sr_cm_refresh(SR_CMID(id));
}

int rdma_resolve_addr(struct rdma_cm_id *id, struct sockaddr *src_addr,
                      struct sockaddr *dst_addr, int timeout_ms)
{
    struct sr_cm_addr s, d;
    int ret;

    if (!sr_cm_live(id))
        return -1;
    if (!dst_addr) {
        errno = EINVAL;
        return -1;
    }
    if (sr_cm_from_sockaddr(src_addr, &s) || sr_cm_from_sockaddr(dst_addr, &d))
        return -1;
    ret = sr_py_cm_resolve_addr(SR_CMID(id)->h, src_addr ? &s : NULL, &d, timeout_ms);
    if (ret)
        return sr_cm_ret(ret);
    if (sr_cm_refresh(SR_CMID(id)) || sr_cm_complete(SR_CMID(id)))
        return -1;
    return sr_cm_refresh(SR_CMID(id));
}

int rdma_resolve_route(struct rdma_cm_id *id, int timeout_ms)
{
    int ret;

    if (!sr_cm_live(id))
        return -1;
    ret = sr_py_cm_resolve_route(SR_CMID(id)->h, timeout_ms);
    if (ret)
        return sr_cm_ret(ret);
    return sr_cm_complete(SR_CMID(id));
}

int rdma_listen(struct rdma_cm_id *id, int backlog)
{
    int ret;

    if (!sr_cm_live(id))
        return -1;
    ret = sr_py_cm_listen(SR_CMID(id)->h, backlog);
    if (ret)
        return sr_cm_ret(ret);
    return sr_cm_refresh(SR_CMID(id));
}

int rdma_migrate_id(struct rdma_cm_id *id, struct rdma_event_channel *channel)
{
    struct sr_cm_id *c = SR_CMID(id);
    struct rdma_event_channel *old;
    int sync = channel == NULL, ret;

    if (!sr_cm_live(id))
        return -1;
    if (sync && !(channel = rdma_create_event_channel()))
        return -1;
    pthread_mutex_lock(&g_cm_ev_lock);
    ret = sr_py_cm_migrate(c->h, SR_CHAN(channel)->h);
    if (!ret)
        sr_cm_wait_acked(c);  /* librdmacm: the events returned on the old channel */
    pthread_mutex_unlock(&g_cm_ev_lock);
    if (ret) {
        if (sync)
            rdma_destroy_event_channel(channel);
        return sr_cm_ret(ret);
    }
    old = id->channel;
    id->channel = channel;
    if (c->sync)
        rdma_destroy_event_channel(old);
    c->sync = sync;
    return 0;
}

int rdma_set_option(struct rdma_cm_id *id, int level, int optname, void *optval, size_t optlen)
{
    int value;

    if (!sr_cm_live(id))
        return -1;
    if (!optval) {
        errno = EINVAL;
        return -1;
    }
    if (level == RDMA_OPTION_ID && (optname == RDMA_OPTION_ID_REUSEADDR
                                    || optname == RDMA_OPTION_ID_AFONLY))
        return 0;  /* softrdma's ports are per process and per family already */
    if (optlen == sizeof(uint8_t))
        value = *(uint8_t *)optval;
    else if (optlen == sizeof(int))
        value = *(int *)optval;
    else {
        errno = EINVAL;
        return -1;
    }
    return sr_cm_ret(sr_py_cm_set_option(SR_CMID(id)->h, level, optname, value));
}

/* ---- QPs ---- */
static void sr_cm_destroy_cqs(struct rdma_cm_id *id)
{
    if (id->recv_cq && id->recv_cq != id->send_cq)
        ibv_destroy_cq(id->recv_cq);
    if (id->send_cq)
        ibv_destroy_cq(id->send_cq);
    if (id->recv_cq_channel)
        ibv_destroy_comp_channel(id->recv_cq_channel);
    if (id->send_cq_channel)
        ibv_destroy_comp_channel(id->send_cq_channel);
    id->recv_cq = id->send_cq = NULL;
    id->recv_cq_channel = id->send_cq_channel = NULL;
    SR_CMID(id)->own_cqs = 0;
}

/* librdmacm's CQs for a QP (or XRC SRQ) made without them: each with its completion
 * channel (the rdma_get_send_comp/rdma_get_recv_comp helpers wait on them); a size of 0
 * makes none. */
static int sr_cm_create_cqs(struct rdma_cm_id *id, uint32_t send_size, uint32_t recv_size)
{
    SR_CMID(id)->own_cqs = 1;
    if (recv_size) {
        id->recv_cq_channel = ibv_create_comp_channel(id->verbs);
        if (!id->recv_cq_channel)
            goto fail;
        id->recv_cq = ibv_create_cq(id->verbs, (int)recv_size, id, id->recv_cq_channel, 0);
        if (!id->recv_cq)
            goto fail;
    }
    if (send_size) {
        id->send_cq_channel = ibv_create_comp_channel(id->verbs);
        if (!id->send_cq_channel)
            goto fail;
        id->send_cq = ibv_create_cq(id->verbs, (int)send_size, id, id->send_cq_channel, 0);
        if (!id->send_cq)
            goto fail;
    }
    return 0;
fail:
    {
        int err = errno;
        sr_cm_destroy_cqs(id);
        errno = err;
    }
    return -1;
}

/* the id's device (resolving or binding gave it one), or EINVAL */
static int sr_cm_has_device(struct rdma_cm_id *id)
{
    if (!sr_cm_live(id))
        return -1;
    if (!id->verbs && sr_cm_refresh(SR_CMID(id)))
        return -1;
    if (!id->verbs) {
        errno = EINVAL;  /* no device yet: resolve or bind the address first */
        return -1;
    }
    return 0;
}

/* id->pd, or (a device whose PD could not be had when the id got it) a PD of its own */
static struct ibv_pd *sr_cm_pd(struct rdma_cm_id *id)
{
    if (!id->pd)
        id->pd = ibv_alloc_pd(id->verbs);
    return id->pd;
}

/* As librdmacm: the PD defaults to id->pd, the CQs to the id's (made here, with their
 * channels, when neither the attributes nor the id have them), the SRQ to id->srq
 * (rdma_create_srq); the attributes are updated in place. XRC (an RDMA_PS_IB id of type
 * IBV_QPT_XRC_SEND or _RECV): an XRC TGT QP belongs to the XRC domain given, or to the
 * device's (ucma_get_xrcd), and takes no CQ (its SRQs' CQs complete its receives:
 * rdma_create_srq makes the id's receive CQ); an XRC INI QP has no receive CQ. */
int rdma_create_qp_ex(struct rdma_cm_id *id, struct ibv_qp_init_attr_ex *attr)
{
    struct sr_cm_id *c = SR_CMID(id);
    uint32_t send_size, recv_size;
    int made = 0;
    struct sr_qp *q;

    if (sr_cm_has_device(id))
        return -1;
    if (!attr || id->qp) {
        errno = EINVAL;
        return -1;
    }
    if (attr->qp_type == IBV_QPT_XRC_RECV) {
        if (!(attr->comp_mask & IBV_QP_INIT_ATTR_XRCD) || !attr->xrcd) {
            attr->xrcd = sr_cm_device_xrcd(id->verbs);
            if (!attr->xrcd)
                return -1;
            attr->comp_mask |= IBV_QP_INIT_ATTR_XRCD;
        } else if (attr->xrcd->context != id->verbs) {
            errno = EINVAL;
            return -1;
        }
    }
    if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd) {
        if (!sr_cm_pd(id))
            return -1;
        attr->comp_mask |= IBV_QP_INIT_ATTR_PD;
        attr->pd = id->pd;
    } else if (attr->pd->context != id->verbs) {
        errno = EINVAL;
        return -1;
    }
    if ((id->recv_cq && attr->recv_cq && id->recv_cq != attr->recv_cq)
        || (id->send_cq && attr->send_cq && id->send_cq != attr->send_cq)) {
        errno = EINVAL;
        return -1;
    }
    /* the CQs neither the attributes nor the id have (at least one entry each) */
    send_size = attr->send_cq || id->send_cq || attr->qp_type == IBV_QPT_XRC_RECV ? 0
                : attr->cap.max_send_wr ? attr->cap.max_send_wr : 1;
    recv_size = attr->recv_cq || id->recv_cq || attr->qp_type == IBV_QPT_XRC_RECV
                || attr->qp_type == IBV_QPT_XRC_SEND ? 0
                : attr->cap.max_recv_wr ? attr->cap.max_recv_wr : 1;
    if (send_size || recv_size) {
        if (sr_cm_create_cqs(id, send_size, recv_size))
            return -1;
        made = 1;
    }
    if (!attr->send_cq)
        attr->send_cq = id->send_cq;
    if (!attr->recv_cq)
        attr->recv_cq = id->recv_cq;
    if (id->srq && !attr->srq)
        attr->srq = id->srq;
    q = sr_create_qp_ex_for(id->verbs, attr, c->h);
    if (!q) {
        int err = errno;
        if (made)
            sr_cm_destroy_cqs(id);
        errno = err;
        return -1;
    }
    q->qpx.qp_base.state = attr->qp_type == IBV_QPT_UD ? IBV_QPS_RTS : IBV_QPS_INIT;
    id->pd = attr->pd;
    id->qp = &q->qpx.qp_base;
    c->cm_qp = id->qp;
    return 0;
}

int rdma_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *qp_init_attr)
{
    struct ibv_qp_init_attr_ex ex;
    int ret;

    if (!sr_cm_live(id))
        return -1;
    if (!qp_init_attr) {
        errno = EINVAL;
        return -1;
    }
    memset(&ex, 0, sizeof(ex));
    memcpy(&ex, qp_init_attr, sizeof(*qp_init_attr));
    ex.comp_mask = IBV_QP_INIT_ATTR_PD;
    ex.pd = pd ? pd : id->pd;
    ret = rdma_create_qp_ex(id, &ex);
    memcpy(qp_init_attr, &ex, sizeof(*qp_init_attr));
    return ret;
}

void rdma_destroy_qp(struct rdma_cm_id *id)
{
    struct sr_cm_id *c = SR_CMID(id);

    if (!sr_cm_live(id) || !id->qp)
        return;
    sr_py_cm_drop_qp(c->h);
    c->cm_qp = NULL;
    ibv_destroy_qp(id->qp);
    id->qp = NULL;
    if (c->own_cqs && !id->srq)  /* an SRQ (XRC: its CQ is the id's) keeps them */
        sr_cm_destroy_cqs(id);
}

/* ---- connections ---- */
static struct sr_conn_param *sr_cm_param(const struct rdma_conn_param *in, struct sr_conn_param *out)
{
    memset(out, 0, sizeof(*out));
    if (!in)
        return out;
    out->has = 1;
    if (in->private_data && in->private_data_len) {
        out->private_data_len = in->private_data_len > sizeof(out->private_data)
                                ? sizeof(out->private_data) : in->private_data_len;
        memcpy(out->private_data, in->private_data, out->private_data_len);
    }
    out->responder_resources = in->responder_resources;
    out->initiator_depth = in->initiator_depth;
    out->flow_control = in->flow_control;
    out->retry_count = in->retry_count;
    out->rnr_retry_count = in->rnr_retry_count;
    out->srq = in->srq;
    out->qp_num = in->qp_num;
    return out;
}

int rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *conn_param)
{
    struct sr_conn_param p;
    int ret;

    if (!sr_cm_live(id))
        return -1;
    ret = sr_py_cm_connect(SR_CMID(id)->h, sr_cm_param(conn_param, &p));
    if (ret)
        return sr_cm_ret(ret);
    if (sr_cm_complete(SR_CMID(id)))
        return -1;
    return sr_cm_refresh(SR_CMID(id));
}

int rdma_accept(struct rdma_cm_id *id, struct rdma_conn_param *conn_param)
{
    struct sr_conn_param p;
    int ret;

    if (!sr_cm_live(id))
        return -1;
    ret = sr_py_cm_accept(SR_CMID(id)->h, sr_cm_param(conn_param, &p));
    if (ret)
        return sr_cm_ret(ret);
    if (id->qp_type == IBV_QPT_UD)
        return 0;  /* no ESTABLISHED for a UD service (librdmacm) */
    return sr_cm_complete(SR_CMID(id));
}

int rdma_reject(struct rdma_cm_id *id, const void *private_data, uint8_t private_data_len)
{
    if (!sr_cm_live(id))
        return -1;
    return sr_cm_ret(sr_py_cm_reject(SR_CMID(id)->h, (uint8_t *)private_data,
                                     private_data ? private_data_len : 0));
}

int rdma_disconnect(struct rdma_cm_id *id)
{
    int ret;

    if (!sr_cm_live(id))
        return -1;
    sr_cm_released(SR_CMID(id));
    ret = sr_py_cm_disconnect(SR_CMID(id)->h);
    if (ret)
        return sr_cm_ret(ret);
    return sr_cm_complete(SR_CMID(id));
}

/* ---- events ---- */
/* The program's id for an event's handle: a new id (CONNECT_REQUEST) gets its wrapper,
 * with the listener's channel, context and port space (librdmacm). */
static struct rdma_cm_id *sr_cm_event_id(struct sr_cm_event_rec *rec)
{
    struct sr_cm_id *listen = rec->listen_id_wrapper, *c = rec->id_wrapper;
    int ret;

    if (c)
        return &c->id;
    c = calloc(1, sizeof(*c));
    if (!c)
        return sr_fail(ENOMEM);
    c->h = rec->id;
    if (listen) {
        c->id.channel = listen->id.channel;
        c->id.context = listen->id.context;
        c->id.ps = listen->id.ps;
        c->id.qp_type = listen->id.qp_type;
    }
    if (sr_cm_live_add(&c->id)) {
        free(c);
        return NULL;
    }
    ret = sr_py_cm_set_wrapper(rec->id, c);
    if (ret) {
        sr_cm_live_del(&c->id);
        free(c);
        return sr_fail(ret);
    }
    return &c->id;
}

int rdma_get_cm_event(struct rdma_event_channel *channel, struct rdma_cm_event **event)
{
    struct sr_cm_event_rec rec;
    struct sr_cm_event *e;
    struct rdma_cm_event *ev;
    int r;

    if (!channel || !event) {
        errno = EINVAL;
        return -1;
    }
    sr_cm_released(NULL);
    e = calloc(1, sizeof(*e));  /* before an event is taken: none is lost to ENOMEM */
    if (!e) {
        errno = ENOMEM;
        return -1;
    }
    ev = &e->ev;
    for (;;) {
        if (atomic_load(&SR_CHAN(channel)->dead))
            sr_cm_wait_dead();
        memset(&rec, 0, sizeof(rec));
        pthread_mutex_lock(&g_cm_ev_lock);
        r = sr_py_cm_get_event(SR_CHAN(channel)->h, &rec);
        if (r > 0) {
            ev->id = sr_cm_event_id(&rec);
            if (ev->id)  /* held before the lock is let go: a destroy now waits for its ack */
                sr_cm_hold(e, rec.listen_id_wrapper ? (struct sr_cm_id *)rec.listen_id_wrapper
                                                    : SR_CMID(ev->id));
        }
        pthread_mutex_unlock(&g_cm_ev_lock);
        if (r > 0)
            break;
        if (atomic_load(&SR_CHAN(channel)->dead))
            sr_cm_wait_dead();
        if (r < 0) {
            free(e);
            errno = -r;
            return -1;
        }
        if (sr_wait_fd(channel->fd) && !atomic_load(&SR_CHAN(channel)->dead)) {
            free(e);
            return -1;
        }
    }
    if (!ev->id) {
        free(e);
        return -1;
    }
    ev->event = (enum rdma_cm_event_type)rec.event;
    ev->status = rec.status;
    ev->listen_id = rec.listen_id_wrapper ? &((struct sr_cm_id *)rec.listen_id_wrapper)->id : NULL;
    sr_cm_refresh(SR_CMID(ev->id));
    if (rec.private_data_len > sizeof(e->data))
        rec.private_data_len = sizeof(e->data);
    memcpy(e->data, rec.private_data, rec.private_data_len);
    if (rec.has_ud) {
        ev->param.ud.private_data = rec.private_data_len ? e->data : NULL;
        ev->param.ud.private_data_len = (uint8_t)rec.private_data_len;
        if (ev->event == RDMA_CM_EVENT_MULTICAST_JOIN) {  /* librdmacm: the join's context */
            ev->param.ud.private_data = SR_CMID(ev->id)->mc_context;
            ev->param.ud.private_data_len = 0;
        }
        sr_ah_from_flat(&rec.ah, &ev->param.ud.ah_attr);
        ev->param.ud.qp_num = rec.ud_qp_num;
        ev->param.ud.qkey = rec.ud_qkey;
    } else {
        ev->param.conn.private_data = rec.private_data_len ? e->data : NULL;
        ev->param.conn.private_data_len = (uint8_t)rec.private_data_len;
        ev->param.conn.responder_resources = (uint8_t)rec.responder_resources;
        ev->param.conn.initiator_depth = (uint8_t)rec.initiator_depth;
        ev->param.conn.flow_control = (uint8_t)rec.flow_control;
        ev->param.conn.retry_count = (uint8_t)rec.retry_count;
        ev->param.conn.rnr_retry_count = (uint8_t)rec.rnr_retry_count;
        ev->param.conn.srq = (uint8_t)rec.srq;
        ev->param.conn.qp_num = rec.qp_num;
    }
    *event = ev;
    return 0;
}

/* ---- ports ---- */
static __be16 sr_cm_port(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return ((const struct sockaddr_in *)sa)->sin_port;
    if (sa->sa_family == AF_INET6)
        return ((const struct sockaddr_in6 *)sa)->sin6_port;
    return 0;
}

__be16 rdma_get_src_port(struct rdma_cm_id *id)
{
    return sr_cm_live(id) ? sr_cm_port(&id->route.addr.src_addr) : 0;
}

__be16 rdma_get_dst_port(struct rdma_cm_id *id)
{
    return sr_cm_live(id) ? sr_cm_port(&id->route.addr.dst_addr) : 0;
}

/* ---- addresses: rdma_getaddrinfo over getaddrinfo(3) (IP only) ---- */
/* *dst: a copy of the n bytes at src, and *len = n. 0, or -1 (*dst NULL, *len untouched)
 * when the copy cannot be allocated. */
static int sr_copy_addr(struct sockaddr **dst, socklen_t *len, const struct sockaddr *src,
                        socklen_t n)
{
    *dst = malloc(n);
    if (!*dst)
        return -1;
    memcpy(*dst, src, n);
    *len = n;
    return 0;
}

/* Neither node nor service: the addresses in the hints (librdmacm's addrinfo.c does
 * the same): the result carries the hints' destination and source. libfabric's verbs
 * provider passes an endpoint's peer this way (fi_pingpong's client), pyverbs'
 * AddrInfo(src=...) of a multicast group a source only. */
static int sr_cm_from_hints(const struct rdma_addrinfo *hints, struct rdma_addrinfo **res)
{
    struct rdma_addrinfo *r = calloc(1, sizeof(*r));

    /* an address is taken where both its pointer and its length are set */
    if (!r || (hints->ai_dst_addr && hints->ai_dst_len
               && sr_copy_addr(&r->ai_dst_addr, &r->ai_dst_len, hints->ai_dst_addr,
                               hints->ai_dst_len))
           || (hints->ai_src_addr && hints->ai_src_len
               && sr_copy_addr(&r->ai_src_addr, &r->ai_src_len, hints->ai_src_addr,
                               hints->ai_src_len))) {
        rdma_freeaddrinfo(r);
        errno = ENOMEM;
        return EAI_MEMORY;
    }
    r->ai_flags = hints->ai_flags;
    r->ai_family = hints->ai_family ? hints->ai_family
                   : (r->ai_dst_addr ? r->ai_dst_addr : r->ai_src_addr)->sa_family;
    r->ai_qp_type = hints->ai_qp_type ? hints->ai_qp_type : IBV_QPT_RC;
    r->ai_port_space = hints->ai_port_space ? hints->ai_port_space : RDMA_PS_TCP;
    *res = r;
    return 0;
}

int rdma_getaddrinfo(const char *node, const char *service, const struct rdma_addrinfo *hints,
                     struct rdma_addrinfo **res)
{
    struct addrinfo ah, *ai = NULL;
    struct rdma_addrinfo *r;
    int passive = hints && (hints->ai_flags & RAI_PASSIVE), ret;

    if (res && !node && !service && hints
        && ((hints->ai_src_addr && hints->ai_src_len)
            || (hints->ai_dst_addr && hints->ai_dst_len)))
        return sr_cm_from_hints(hints, res);
    if (!res || (!node && !service && !passive)) {
        errno = EINVAL;
        return EAI_NONAME;
    }
    if (hints && hints->ai_family && hints->ai_family != AF_INET && hints->ai_family != AF_INET6) {
        errno = EAFNOSUPPORT;
        return EAI_FAMILY;
    }
    memset(&ah, 0, sizeof(ah));
    ah.ai_family = hints ? hints->ai_family : AF_UNSPEC;
    ah.ai_socktype = SOCK_STREAM;
    ah.ai_flags = (passive ? AI_PASSIVE : 0)
                  | (hints && (hints->ai_flags & RAI_NUMERICHOST) ? AI_NUMERICHOST : 0);
    ret = getaddrinfo(node, service, &ah, &ai);
    if (ret)
        return ret;
    /* the address found is the source of a passive result, else the destination */
    r = calloc(1, sizeof(*r));
    if (!r || (passive ? sr_copy_addr(&r->ai_src_addr, &r->ai_src_len, ai->ai_addr,
                                      ai->ai_addrlen)
                       : sr_copy_addr(&r->ai_dst_addr, &r->ai_dst_len, ai->ai_addr,
                                      ai->ai_addrlen))) {
        free(r);
        freeaddrinfo(ai);
        errno = ENOMEM;
        return EAI_MEMORY;
    }
    r->ai_flags = hints ? hints->ai_flags : 0;
    r->ai_family = ai->ai_family;
    r->ai_qp_type = hints && hints->ai_qp_type ? hints->ai_qp_type : IBV_QPT_RC;
    r->ai_port_space = hints && hints->ai_port_space ? hints->ai_port_space : RDMA_PS_TCP;
    /* beside a destination, the hints' source, if it can be copied (as before: a failed
     * copy leaves the result without one) */
    if (!passive && hints && hints->ai_src_addr && hints->ai_src_len)
        (void)sr_copy_addr(&r->ai_src_addr, &r->ai_src_len, hints->ai_src_addr,
                           hints->ai_src_len);
    freeaddrinfo(ai);
    *res = r;
    return 0;
}

void rdma_freeaddrinfo(struct rdma_addrinfo *res)
{
    struct rdma_addrinfo *next;

    for (; res; res = next) {
        next = res->ai_next;
        free(res->ai_connect);
        free(res->ai_route);
        free(res->ai_src_canonname);
        free(res->ai_dst_canonname);
        free(res->ai_src_addr);
        free(res->ai_dst_addr);
        free(res);
    }
}

/* ---- endpoints: rdma_create_ep, rdma_get_request, rdma_destroy_ep (synchronous ids) ---- */
int rdma_create_ep(struct rdma_cm_id **id, struct rdma_addrinfo *res, struct ibv_pd *pd,
                   struct ibv_qp_init_attr *qp_init_attr)
{
    struct rdma_cm_id *cid;
    struct sr_cm_id *c;
    enum rdma_port_space ps;
    enum ibv_qp_type qpt;

    if (!id || !res) {
        errno = EINVAL;
        return -1;
    }
    ps = res->ai_port_space ? (enum rdma_port_space)res->ai_port_space : RDMA_PS_TCP;
    qpt = res->ai_qp_type ? (enum ibv_qp_type)res->ai_qp_type
                          : (ps == RDMA_PS_UDP ? IBV_QPT_UD : IBV_QPT_RC);
    if (sr_cm_create_id(NULL, &cid, NULL, ps, qpt))
        return -1;
    c = SR_CMID(cid);
    if (res->ai_flags & RAI_PASSIVE) {
        if (rdma_bind_addr(cid, res->ai_src_addr))
            goto fail;
        if (qp_init_attr) {  /* for the QPs of rdma_get_request */
            c->listen_attr = malloc(sizeof(*qp_init_attr));
            if (!c->listen_attr) {
                errno = ENOMEM;
                goto fail;
            }
            *c->listen_attr = *qp_init_attr;
            c->listen_pd = pd;
        }
    } else {
        if (rdma_resolve_addr(cid, res->ai_src_len ? res->ai_src_addr : NULL,
                              res->ai_dst_addr, 2000)
            || rdma_resolve_route(cid, 2000))
            goto fail;
        if (qp_init_attr) {
            qp_init_attr->qp_type = qpt;
            if (rdma_create_qp(cid, pd, qp_init_attr))
                goto fail;
        }
    }
    *id = cid;
    return 0;
fail:
    {
        int err = errno;
        rdma_destroy_ep(cid);
        errno = err;
    }
    return -1;
}

int rdma_get_request(struct rdma_cm_id *listen, struct rdma_cm_id **id)
{
    struct sr_cm_id *l = SR_CMID(listen);
    struct rdma_cm_event *ev;
    struct rdma_cm_id *child;

    if (!sr_cm_live(listen))
        return -1;
    if (!id || !l->sync) {
        errno = EINVAL;
        return -1;
    }
    if (listen->event) {
        rdma_ack_cm_event(listen->event);
        listen->event = NULL;
    }
    for (;;) {
        if (rdma_get_cm_event(listen->channel, &ev))
            return -1;
        if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST)
            break;
        rdma_ack_cm_event(ev);
    }
    child = ev->id;
    if (rdma_migrate_id(child, NULL))  /* a synchronous id of its own (librdmacm) */
        goto fail;
    if (l->listen_attr) {
        struct ibv_qp_init_attr attr = *l->listen_attr;
        attr.qp_type = listen->qp_type;
        if (rdma_create_qp(child, l->listen_pd, &attr))
            goto fail;
    }
    child->event = ev;
    *id = child;
    return 0;
fail:
    {
        int err = errno;
        rdma_ack_cm_event(ev);
        rdma_reject(child, NULL, 0);
        rdma_destroy_ep(child);
        errno = err;
    }
    return -1;
}

void rdma_destroy_ep(struct rdma_cm_id *id)
{
    if (!sr_cm_live(id))
        return;
    if (id->qp)
        rdma_destroy_qp(id);
    if (id->srq)
        rdma_destroy_srq(id);
    rdma_destroy_id(id);
}

/* ---- a QP the application creates and moves itself (conn_param.qp_num) ---- */
/* the attributes and mask that move it to qp_attr->qp_state (INIT, RTR, RTS) */
int rdma_init_qp_attr(struct rdma_cm_id *id, struct ibv_qp_attr *qp_attr, int *qp_attr_mask)
{
    struct sr_qp_attr a;
    int mask = 0;

    if (!id || !qp_attr || !qp_attr_mask) {
        errno = EINVAL;
        return -1;
    }
    memset(&a, 0, sizeof(a));
    if (sr_cm_ret(sr_py_cm_init_qp_attr(SR_CMID(id)->h, (int)qp_attr->qp_state, &a, &mask)))
        return -1;
    sr_qp_attr_from_flat(&a, qp_attr);
    *qp_attr_mask = mask;
    return 0;
}

/* after RDMA_CM_EVENT_CONNECT_RESPONSE: send the RTU (no ESTABLISHED event follows) */
int rdma_establish(struct rdma_cm_id *id)
{
    if (!id) {
        errno = EINVAL;
        return -1;
    }
    return sr_cm_ret(sr_py_cm_establish(SR_CMID(id)->h));
}

/* the application saw `event` on the id's QP: IBV_EVENT_COMM_EST before the RTU
 * establishes a RoCE connection (IBA 12.9.7.3; ESTABLISHED follows, EISCONN once
 * established, as Linux ib_cm_notify); iWARP ignores it, as Linux cma.c */
int rdma_notify(struct rdma_cm_id *id, enum ibv_event_type event)
{
    if (!sr_cm_live(id))
        return -1;
    return sr_cm_ret(sr_py_cm_notify(SR_CMID(id)->h, (int)event));
}

/* ---- multicast (RoCE: the group's IP address as its MGID, rdma_mcast) ---- */
static int sr_cm_mcast(struct rdma_cm_id *id, struct sockaddr *addr, int send_only, int join)
{
    struct sr_cm_addr a;

    if (!sr_cm_live(id))
        return -1;
    if (!addr) {
        errno = EINVAL;
        return -1;
    }
    if (sr_cm_from_sockaddr(addr, &a))
        return -1;
    return sr_cm_ret(sr_py_cm_mcast(SR_CMID(id)->h, &a, send_only, join));
}

int rdma_join_multicast(struct rdma_cm_id *id, struct sockaddr *addr, void *context)
{
    if (sr_cm_mcast(id, addr, 0, 1))
        return -1;
    SR_CMID(id)->mc_context = context;
    return 0;
}

int rdma_join_multicast_ex(struct rdma_cm_id *id, struct rdma_cm_join_mc_attr_ex *mc_join_attr,
                           void *context)
{
    uint32_t flags;

    if (!mc_join_attr || !(mc_join_attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS)) {
        errno = EINVAL;
        return -1;
    }
    flags = mc_join_attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS
            ? mc_join_attr->join_flags : RDMA_MC_JOIN_FLAG_FULLMEMBER;
    if (flags != RDMA_MC_JOIN_FLAG_FULLMEMBER && flags != RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER) {
        errno = EINVAL;
        return -1;
    }
    if (sr_cm_mcast(id, mc_join_attr->addr, flags == RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER, 1))
        return -1;
    SR_CMID(id)->mc_context = context;
    return 0;
}

/* A send-only member is left as it joined (never attached): the Python side knows which
 * groups were joined send-only. */
int rdma_leave_multicast(struct rdma_cm_id *id, struct sockaddr *addr)
{
    return sr_cm_mcast(id, addr, -1, 0);
}

/* ---- SRQs (librdmacm): an SRQ on the id, which rdma_create_qp and rdma_post_recv use ---- */
/* As librdmacm: IBV_SRQ_INIT_ATTR_TYPE is required, the PD defaults to id->pd. An XRC SRQ
 * (rdma_create_srq on an IBV_QPT_XRC_RECV id) defaults to the device's XRC domain and to
 * the id's receive CQ, made here (with its channel: rdma_get_recv_comp waits on it). */
int rdma_create_srq_ex(struct rdma_cm_id *id, struct ibv_srq_init_attr_ex *attr)
{
    struct ibv_srq *srq;
    int made = 0;

    if (sr_cm_has_device(id))
        return -1;
    if (!attr || !(attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) || id->srq) {
        errno = EINVAL;
        return -1;
    }
    if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !attr->pd) {
        if (!sr_cm_pd(id))
            return -1;
        attr->pd = id->pd;
        attr->comp_mask |= IBV_SRQ_INIT_ATTR_PD;
    }
    if (attr->srq_type == IBV_SRQT_XRC) {
        if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_XRCD) || !attr->xrcd) {
            attr->xrcd = sr_cm_device_xrcd(id->verbs);
            if (!attr->xrcd)
                return -1;
        }
        if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_CQ) || !attr->cq) {
            if (!id->recv_cq) {
                if (sr_cm_create_cqs(id, 0, attr->attr.max_wr ? attr->attr.max_wr : 1))
                    return -1;
                made = 1;  /* freed again if the SRQ cannot be made */
            }
            attr->cq = id->recv_cq;
        }
        attr->comp_mask |= IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
    }
    srq = ibv_create_srq_ex(id->verbs, attr);
    if (!srq) {
        int err = errno;
        if (made) {  /* only the receive CQ made above: a QP of the id keeps its own */
            ibv_destroy_cq(id->recv_cq);
            ibv_destroy_comp_channel(id->recv_cq_channel);
            id->recv_cq = NULL;
            id->recv_cq_channel = NULL;
        }
        errno = err;
        return -1;
    }
    if (!id->pd)
        id->pd = attr->pd;
    id->srq = srq;
    return 0;
}

int rdma_create_srq(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
    struct ibv_srq_init_attr_ex ex;
    int ret;

    if (!sr_cm_live(id))
        return -1;
    if (!attr) {
        errno = EINVAL;
        return -1;
    }
    memset(&ex, 0, sizeof(ex));
    memcpy(&ex, attr, sizeof(*attr));
    ex.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
    ex.srq_type = id->qp_type == IBV_QPT_XRC_RECV ? IBV_SRQT_XRC : IBV_SRQT_BASIC;
    ex.pd = pd;
    ret = rdma_create_srq_ex(id, &ex);
    memcpy(attr, &ex, sizeof(*attr));
    return ret;
}

void rdma_destroy_srq(struct rdma_cm_id *id)
{
    if (!sr_cm_live(id) || !id->srq)
        return;
    ibv_destroy_srq(id->srq);
    id->srq = NULL;
    if (SR_CMID(id)->own_cqs && !id->qp)  /* the CQs an XRC SRQ kept (rdma_destroy_qp) */
        sr_cm_destroy_cqs(id);
}

/* librdmacm's device list: the rdma_cm layer's own open context of each device (the one
 * its ids there use, id->verbs), kept open for the process as librdmacm keeps them; only
 * the array is the caller's (rdma_free_devices). libfabric's verbs provider starts here. */
static struct ibv_context *sr_cm_device_context(int index)
{
    struct sr_cm_info info;
    struct ibv_context *ctx = NULL;
    int ret;

    pthread_mutex_lock(&g_cm_lock);
    memset(&info, 0, sizeof(info));
    ret = sr_py_cm_device(index, &info);
    if (!ret && info.ctx > 0 && !info.ctx_wrapper) {
        ctx = sr_wrap_context(info.ctx, info.async_fd, &g_devs[index].dev);
        if (ctx)
            ret = sr_py_cm_set_wrapper(info.ctx, SR_CTX(ctx));
        else
            ret = errno;
    } else if (!ret && info.ctx_wrapper) {
        ctx = &((struct sr_context *)info.ctx_wrapper)->vctx.context;
    }
    pthread_mutex_unlock(&g_cm_lock);
    if (ret) {
        errno = ret;
        return NULL;
    }
    return ctx;
}

struct ibv_context **rdma_get_devices(int *num_devices)
{
    struct ibv_context **list;
    int n = sr_load_devices(), i, k = 0;

    if (num_devices)
        *num_devices = 0;
    if (n < 0)
        return NULL;
    list = calloc((size_t)n + 1, sizeof(*list));
    if (!list)
        return sr_fail(ENOMEM);
    for (i = 0; i < n; i++) {
        struct ibv_context *ctx = sr_cm_device_context(i);

        if (ctx)
            list[k++] = ctx;
    }
    if (num_devices)
        *num_devices = k;
    return list;
}

void rdma_free_devices(struct ibv_context **list) { free(list); }

int rdma_set_local_ece(struct rdma_cm_id *id, struct ibv_ece *ece)
{
    (void)id; (void)ece;
    errno = EOPNOTSUPP;
    return -1;
}

int rdma_get_remote_ece(struct rdma_cm_id *id, struct ibv_ece *ece)
{
    (void)id; (void)ece;
    errno = EOPNOTSUPP;
    return -1;
}

int rdma_reject_ece(struct rdma_cm_id *id, const void *private_data, uint8_t private_data_len)
{
    return rdma_reject(id, private_data, private_data_len);
}
