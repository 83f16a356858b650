/* rdma_destroy_id against events the program still holds (tests/test_capi_rdmacm.py), as
 * librdmacm: it returns only once every event returned about the id is acknowledged.
 *   1. Another thread holds the id's event: rdma_destroy_id (main thread) does not return
 *      within the holder's 0.3 s window; the holder then reads event->id->context, which
 *      is still the id's, and acknowledges; only then does the destroy return.
 *   2. The calling thread holds the event itself (it could never acknowledge it while it
 *      waited): rdma_destroy_id returns at once, the event still reads the id's context,
 *      and its acknowledgement ends the id.
 *   3. An event queued and not taken yet is dropped by the destroy: the channel is empty.
 * Prints "ok", or "FAIL <what>". */
#include <rdma/rdma_cma.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CHECK(cond, what)                                                    \
    do {                                                                     \
        if (!(cond)) {                                                       \
            printf("FAIL %s (errno %d %s)\n", what, errno, strerror(errno)); \
            fflush(stdout);                                                  \
            _exit(1);                                                        \
        }                                                                    \
    } while (0)

static struct rdma_event_channel *ch;
static struct rdma_cm_id *id1;
static int marker1 = 1;
static atomic_int taken, destroyed, acked;
static void *seen_context;
static int destroyed_before_ack;

static void resolve(struct rdma_cm_id *id)
{
    struct sockaddr_in dst;
    struct pollfd pfd = { .fd = ch->fd, .events = POLLIN };

    memset(&dst, 0, sizeof(dst));
    dst.sin_family = AF_INET;
    dst.sin_port = htons(7);
    dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000) == 0, "rdma_resolve_addr");
    CHECK(poll(&pfd, 1, 60000) == 1 && (pfd.revents & POLLIN), "an event is pending");
}

static void *holder(void *arg)
{
    struct rdma_cm_event *ev;
    struct timespec window = { 0, 300 * 1000 * 1000 };

    (void)arg;
    CHECK(rdma_get_cm_event(ch, &ev) == 0, "rdma_get_cm_event (holder)");
    CHECK(ev->id == id1 && ev->event == RDMA_CM_EVENT_ADDR_RESOLVED, "the holder's event");
    atomic_store(&taken, 1);
    /* the window in which the destroy must not return (it may start late on a busy
     * machine: then this case proves less, but never fails wrongly) */
    nanosleep(&window, NULL);
    destroyed_before_ack = atomic_load(&destroyed);
    seen_context = ev->id->context;
    atomic_store(&acked, 1);
    CHECK(rdma_ack_cm_event(ev) == 0, "rdma_ack_cm_event (holder)");
    return NULL;
}

int main(void)
{
    struct rdma_cm_id *id2, *id3;
    struct rdma_cm_event *ev;
    pthread_t t;
    int marker2 = 2;

    ch = rdma_create_event_channel();
    CHECK(ch != NULL, "rdma_create_event_channel");

    /* 1 */
    CHECK(rdma_create_id(ch, &id1, &marker1, RDMA_PS_TCP) == 0, "rdma_create_id 1");
    resolve(id1);
    CHECK(pthread_create(&t, NULL, holder, NULL) == 0, "pthread_create");
    while (!atomic_load(&taken))
        sched_yield();
    CHECK(rdma_destroy_id(id1) == 0, "rdma_destroy_id 1");
    CHECK(atomic_load(&acked), "rdma_destroy_id returned before the other thread's ack");
    atomic_store(&destroyed, 1);
    pthread_join(t, NULL);
    CHECK(!destroyed_before_ack, "the destroy returned inside the holder's window");
    CHECK(seen_context == &marker1, "the held event's id kept its context");

    /* 2 */
    CHECK(rdma_create_id(ch, &id2, &marker2, RDMA_PS_TCP) == 0, "rdma_create_id 2");
    resolve(id2);
    CHECK(rdma_get_cm_event(ch, &ev) == 0, "rdma_get_cm_event 2");
    CHECK(ev->id == id2, "event 2's id");
    CHECK(rdma_destroy_id(id2) == 0, "rdma_destroy_id 2 with its event held by this thread");
    CHECK(ev->id->context == &marker2, "the held event's id after its destroy");
    CHECK(rdma_ack_cm_event(ev) == 0, "rdma_ack_cm_event 2");
    errno = 0;
    CHECK(rdma_destroy_id(id2) == -1 && errno == EINVAL, "a second destroy is EINVAL");

    /* 3 */
    CHECK(rdma_create_id(ch, &id3, NULL, RDMA_PS_TCP) == 0, "rdma_create_id 3");
    resolve(id3);
    CHECK(rdma_destroy_id(id3) == 0, "rdma_destroy_id 3 with its event queued");
    CHECK(fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK) == 0, "fcntl");
    errno = 0;
    CHECK(rdma_get_cm_event(ch, &ev) == -1 && errno == EAGAIN, "the destroyed id's event was dropped");

    rdma_destroy_event_channel(ch);
    printf("ok\n");
    return 0;
}
