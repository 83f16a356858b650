/* librdmacm calls under softrdma run (tests/test_capi_rdmacm.py): the event channel's fd
 * (EAGAIN when non-blocking and empty, readable when an event is pending), an id's
 * device context and addresses after ADDR_RESOLVED, bad arguments (EINVAL), what is not
 * served (an option: ENOSYS; RDMA_PS_IPOIB: EPROTONOSUPPORT; an RDMA_PS_TCP id takes an
 * XRC INI QP, as on Linux),
 * rdma_getaddrinfo (also from the hints' addresses alone), rdma_bind_addr of a loopback
 * address no device owns (no device, as the kernel's); an id destroyed already, or a
 * pointer to unmapped memory (perftest 4.5-0.17's retry after a REJECTED connection
 * passes both), is EINVAL and never read through; an event channel destroyed twice leaves alone the file that
 * has its fd number since. Prints "ok" and the device, or "FAIL <what>". */
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cm_common.h"

int main(void)
{
    struct rdma_event_channel *ch = rdma_create_event_channel();
    struct rdma_cm_id *id, *bad;
    struct rdma_cm_event *ev;
    struct sockaddr_in dst;
    struct pollfd pfd;
    struct ibv_device_attr attr;
    struct rdma_addrinfo hints, *res;
    uint8_t tos = 32;
    int mask;

    CHECK(ch && ch->fd >= 0, "rdma_create_event_channel");
    errno = 0;
    CHECK(rdma_create_id(ch, &bad, NULL, (enum rdma_port_space)0x1234) == -1 && errno == EINVAL,
          "a bad port space is EINVAL");
    errno = 0;
    CHECK(rdma_create_id(ch, &bad, NULL, RDMA_PS_IPOIB) == -1 && errno == EPROTONOSUPPORT,
          "RDMA_PS_IPOIB is not served: EPROTONOSUPPORT");
    CHECK(rdma_create_id(ch, &bad, NULL, RDMA_PS_IB) == 0 && bad->ps == RDMA_PS_IB
          && bad->qp_type == IBV_QPT_RC && rdma_destroy_id(bad) == 0,
          "an RDMA_PS_IB id is an RC id (rdma_create_id)");
    CHECK(rdma_create_id(ch, &id, (void *)0x5, RDMA_PS_TCP) == 0, "rdma_create_id");
    CHECK(fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK) == 0, "fcntl");
    errno = 0;
    CHECK(rdma_get_cm_event(ch, &ev) == -1 && errno == EAGAIN, "an empty non-blocking channel is EAGAIN");

    memset(&dst, 0, sizeof(dst));
    dst.sin_family = AF_INET;
    dst.sin_port = htons(7);
    dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000) == 0, "rdma_resolve_addr");
    pfd.fd = ch->fd;
    pfd.events = POLLIN;
    CHECK(poll(&pfd, 1, 30000) == 1 && (pfd.revents & POLLIN), "the channel's fd polls readable");
    CHECK(rdma_get_cm_event(ch, &ev) == 0, "rdma_get_cm_event");
    CHECK(ev->event == RDMA_CM_EVENT_ADDR_RESOLVED && ev->id == id && ev->status == 0,
          "ADDR_RESOLVED on the id");
    CHECK(rdma_ack_cm_event(ev) == 0, "rdma_ack_cm_event");
    CHECK(id->context == (void *)0x5 && id->channel == ch, "the id's context and channel");
    CHECK(id->verbs && ibv_query_device(id->verbs, &attr) == 0, "id->verbs is a context");
    CHECK(((struct sockaddr_in *)rdma_get_local_addr(id))->sin_addr.s_addr == htonl(INADDR_LOOPBACK),
          "the source address");
    CHECK(rdma_get_dst_port(id) == htons(7) && rdma_get_src_port(id) != 0, "the ports");
    CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof(tos)) == 0, "TOS");
    errno = 0;
    CHECK(rdma_set_option(id, RDMA_OPTION_IB, RDMA_OPTION_IB_PATH, &tos, sizeof(tos)) == -1
          && errno == ENOSYS, "an option not served is ENOSYS");

    errno = 0;
    CHECK(rdma_create_qp(id, NULL, NULL) == -1 && errno == EINVAL, "rdma_create_qp without attributes is EINVAL");
    errno = 0;
    CHECK(rdma_join_multicast(id, (struct sockaddr *)&dst, NULL) == -1 && errno == EINVAL,
          "rdma_join_multicast of a unicast address on a TCP id is EINVAL");
    errno = 0;
    CHECK(rdma_init_qp_attr(id, NULL, &mask) == -1 && errno == EINVAL,
          "rdma_init_qp_attr without attributes is EINVAL");
    errno = 0;
    CHECK(rdma_notify(id, IBV_EVENT_COMM_EST) == -1 && errno == EINVAL,
          "rdma_notify on an id with no connection is EINVAL");
    errno = 0;
    CHECK(rdma_create_srq(id, NULL, NULL) == -1 && errno == EINVAL,
          "rdma_create_srq without attributes is EINVAL");
    {
        struct ibv_qp_init_attr_ex x;

        memset(&x, 0, sizeof(x));
        x.qp_type = IBV_QPT_XRC_SEND;
        errno = 0;
        CHECK(rdma_create_qp_ex(id, &x) == 0 && id->qp && id->qp->qp_type == IBV_QPT_XRC_SEND
              && id->send_cq && !id->recv_cq,
              "an RDMA_PS_TCP id takes an XRC INI QP (as Linux), with a send CQ only");
        rdma_destroy_qp(id);
        CHECK(!id->qp && !id->send_cq, "rdma_destroy_qp frees it and its CQ");
    }
    errno = 0;
    CHECK(rdma_connect(id, NULL) == -1 && errno != 0, "rdma_connect before resolve_route fails");
    printf("device %s\n", ibv_get_device_name(id->verbs->device));
    CHECK(rdma_destroy_id(id) == 0, "rdma_destroy_id");
    errno = 0;
    CHECK(rdma_destroy_id(id) == -1 && errno == EINVAL, "destroying an id twice is EINVAL");
    errno = 0;
    CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000) == -1 && errno == EINVAL,
          "rdma_resolve_addr on a destroyed id is EINVAL");
    {
        /* a page unmapped again: an id read through it would be SIGSEGV */
        void *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        struct rdma_cm_id *gone = (struct rdma_cm_id *)page;
        CHECK(page != MAP_FAILED && munmap(page, 4096) == 0, "mmap");
        errno = 0;
        CHECK(rdma_resolve_addr(gone, NULL, (struct sockaddr *)&dst, 2000) == -1 && errno == EINVAL,
              "rdma_resolve_addr on an unmapped pointer is EINVAL");
        errno = 0;
        CHECK(rdma_connect(gone, NULL) == -1 && errno == EINVAL, "rdma_connect on it is EINVAL");
        errno = 0;
        CHECK(rdma_destroy_id(gone) == -1 && errno == EINVAL, "rdma_destroy_id on it is EINVAL");
        rdma_destroy_qp(gone);
        rdma_destroy_ep(gone);
        CHECK(rdma_get_src_port(gone) == 0, "rdma_get_src_port on it is 0");
    }
    {
        int fd = ch->fd, other;
        rdma_destroy_event_channel(ch);
        other = dup2(STDOUT_FILENO, fd);  /* another file takes the channel's fd number */
        CHECK(other == fd, "dup2");
        rdma_destroy_event_channel(ch);
        CHECK(fcntl(fd, F_GETFD) != -1, "destroying a channel twice closes no other file");
        close(fd);
    }

    memset(&hints, 0, sizeof(hints));
    hints.ai_flags = RAI_NUMERICHOST;
    CHECK(rdma_getaddrinfo("not-an-address", "7471", &hints, &res) != 0, "a bad host fails");
    hints.ai_flags = RAI_PASSIVE;
    CHECK(rdma_getaddrinfo(NULL, "7471", &hints, &res) == 0 && res->ai_src_addr
          && res->ai_port_space == RDMA_PS_TCP && res->ai_qp_type == IBV_QPT_RC
          && ((struct sockaddr_in *)res->ai_src_addr)->sin_port == htons(7471),
          "a passive rdma_getaddrinfo");
    rdma_freeaddrinfo(res);
    {   /* neither node nor service: the addresses come from the hints (librdmacm's
         * addrinfo.c; libfabric's verbs provider passes an endpoint's peer so) */
        struct sockaddr_in peer = {.sin_family = AF_INET, .sin_port = htons(7471)};
        struct sockaddr_in me = {.sin_family = AF_INET, .sin_port = htons(7472)};

        inet_pton(AF_INET, "127.0.0.2", &peer.sin_addr);
        inet_pton(AF_INET, "127.0.0.1", &me.sin_addr);
        memset(&hints, 0, sizeof(hints));
        hints.ai_port_space = RDMA_PS_TCP;
        hints.ai_dst_addr = (struct sockaddr *)&peer;
        hints.ai_dst_len = sizeof(peer);
        CHECK(rdma_getaddrinfo(NULL, NULL, &hints, &res) == 0 && res->ai_dst_addr
              && res->ai_dst_len == sizeof(peer) && !res->ai_src_addr
              && !memcmp(res->ai_dst_addr, &peer, sizeof(peer))
              && res->ai_dst_addr != hints.ai_dst_addr && res->ai_family == AF_INET
              && res->ai_port_space == RDMA_PS_TCP && res->ai_qp_type == IBV_QPT_RC,
              "the destination of the hints");
        rdma_freeaddrinfo(res);
        hints.ai_src_addr = (struct sockaddr *)&me;
        hints.ai_src_len = sizeof(me);
        hints.ai_flags = RAI_PASSIVE;
        CHECK(rdma_getaddrinfo(NULL, NULL, &hints, &res) == 0 && res->ai_dst_addr
              && res->ai_src_addr && !memcmp(res->ai_src_addr, &me, sizeof(me))
              && res->ai_flags == RAI_PASSIVE, "both addresses of the hints, passive too");
        rdma_freeaddrinfo(res);
        hints.ai_src_addr = NULL;  /* a length without an address: no source, no read */
        hints.ai_flags = 0;
        CHECK(rdma_getaddrinfo(NULL, NULL, &hints, &res) == 0 && res->ai_dst_addr
              && !res->ai_src_addr && res->ai_src_len == 0
              && !memcmp(res->ai_dst_addr, &peer, sizeof(peer)),
              "a source length with a NULL source is no source");
        rdma_freeaddrinfo(res);
        memset(&hints, 0, sizeof(hints));
        errno = 0;
        CHECK(rdma_getaddrinfo(NULL, NULL, &hints, &res) != 0 && errno == EINVAL,
              "no node, no service, no address: EINVAL");
    }
    {   /* a loopback address no device owns binds none, as the kernel's cma_any_addr
         * has it (the test's device on lo owns 127.0.0.1, not 127.0.0.2) */
        struct sockaddr_in lo = {.sin_family = AF_INET};
        struct rdma_cm_id *lid;

        inet_pton(AF_INET, "127.0.0.2", &lo.sin_addr);
        CHECK(rdma_create_id(NULL, &lid, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
        CHECK(rdma_bind_addr(lid, (struct sockaddr *)&lo) == 0 && lid->verbs == NULL,
              "rdma_bind_addr(127.0.0.2) leaves verbs NULL");
        CHECK(rdma_listen(lid, 4) == 0 && rdma_get_src_port(lid) != 0,
              "it listens, on a port of its own");
        CHECK(rdma_destroy_id(lid) == 0, "rdma_destroy_id");
    }
    printf("ok\n");
    return 0;
}
