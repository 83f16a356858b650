/* A libibverbs program for tests/capi/test_capi_remote_ops.py, run under `softrdma run`:
 * the remote operations the stock tools do not use, between two RC QPs of one device:
 * memory windows (IBA 10.6.7) and the RDMA Atomic Write (IBA 1.5).
 *
 *   remote_ops DEVICE        type 1 (ibv_bind_mw) and type 2 (IBV_WR_BIND_MW,
 *                            ibv_wr_bind_mw) windows: RDMA WRITE and READ through a
 *                            window land in its range and only there, a rebind or an
 *                            unbind revokes the old key, SEND_WITH_INV and LOCAL_INV
 *                            revoke a type 2 window, completion fields (BIND_MW, LOCAL_INV,
 *                            IBV_WC_WITH_INV and invalidated_rkey), errors (a bad type, a
 *                            type 2 window given to ibv_bind_mw, an MR without MW_BIND);
 *                            ibv_wr_atomic_write stores its 8 bytes, and only those.
 *                            Prints "ok: ..." lines, exits 0 when all pass.
 *   remote_ops DEVICE iwarp  an iWARP device has no windows: ibv_alloc_mw fails with
 *                            EOPNOTSUPP, as on siw.
 */
#include "common.h"

#define BUF 4096
#define WIN_OFF 1024
#define WIN_LEN 512
#define QP_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;
static char *abuf, *bbuf;
static struct ibv_mr *amr, *bmr;

/* A's QP (the requester) connected to B's (the window's QP), each with its own CQ;
 * made anew for each check, since an access error leaves both in the error state */
struct pair { struct ibv_cq *cqa, *cqb; struct ibv_qp *qa, *qb; };

static void pair_up(struct pair *p, int ex)
{
    p->cqa = ibv_create_cq(ctx, 16, NULL, NULL, 0);
    p->cqb = ibv_create_cq(ctx, 16, NULL, NULL, 0);
    CHECK(p->cqa && p->cqb, "ibv_create_cq: %s", strerror(errno));
    p->qa = make_rc_qp(pd, p->cqa, 8, 0);
    if (ex) {  /* B's QP with the ibv_wr_* API */
        struct ibv_qp_init_attr_ex x;
        memset(&x, 0, sizeof(x));
        x.send_cq = x.recv_cq = p->cqb;
        x.qp_type = IBV_QPT_RC;
        x.cap.max_send_wr = x.cap.max_recv_wr = 8;
        x.cap.max_send_sge = x.cap.max_recv_sge = 1;
        x.pd = pd;
        x.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        x.send_ops_flags = IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV
                           | IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_ATOMIC_WRITE;
        p->qb = ibv_create_qp_ex(ctx, &x);
        CHECK(p->qb, "ibv_create_qp_ex: %s", strerror(errno));
    } else {
        p->qb = make_rc_qp(pd, p->cqb, 8, 0);
    }
    rc_to_rts(p->qa, QP_ACCESS, p->qb->qp_num, &gid, 12, 7);
    rc_to_rts(p->qb, QP_ACCESS, p->qa->qp_num, &gid, 12, 7);
}

static void pair_down(struct pair *p)
{
    CHECK(!ibv_destroy_qp(p->qa) && !ibv_destroy_qp(p->qb), "ibv_destroy_qp");
    CHECK(!ibv_destroy_cq(p->cqa) && !ibv_destroy_cq(p->cqb), "ibv_destroy_cq");
}

/* B's completion of a bind or invalidation it posted: its opcode, wr_id and status */
static void expect_wc(struct ibv_cq *cq, uint64_t wr_id, enum ibv_wc_opcode op,
                      enum ibv_wc_status status, const char *what)
{
    struct ibv_wc wc;
    wait_wc(cq, &wc, what, 30.0);
    CHECK(wc.wr_id == wr_id && wc.status == status, "%s: wr_id %llu status %s (%d)", what,
          (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status), wc.status);
    CHECK(wc.status != IBV_WC_SUCCESS || wc.opcode == op, "%s: opcode %d, not %d", what,
          wc.opcode, op);
}

/* A's RDMA op of len bytes at B's address addr with key rkey (A's buffer at offset 0);
 * its completion status */
static enum ibv_wc_status rdma(struct pair *p, enum ibv_wr_opcode op, uint32_t rkey,
                               uint64_t addr, uint32_t len)
{
    struct ibv_sge sge = { .addr = (uintptr_t)abuf, .length = len, .lkey = amr->lkey };
    struct ibv_send_wr wr, *bad;
    struct ibv_wc wc;

    memset(&wr, 0, sizeof(wr));
    wr.wr_id = 77;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = op;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.rkey = rkey;
    wr.wr.rdma.remote_addr = addr;
    CHECK(!ibv_post_send(p->qa, &wr, &bad), "ibv_post_send (rdma)");
    wait_wc(p->cqa, &wc, "rdma", 30.0);
    CHECK(wc.wr_id == 77, "rdma: wr_id %llu", (unsigned long long)wc.wr_id);
    return wc.status;
}

static uint64_t win(void) { return (uintptr_t)bbuf + WIN_OFF; }

/* a WRITE through the window lands at its start and nowhere else; a READ of it too */
static void write_read_through(struct pair *p, uint32_t rkey, const char *what)
{
    int i;
    memset(bbuf, 0, BUF);
    for (i = 0; i < WIN_LEN; i++)
        abuf[i] = (char)(i * 7 + 3);
    CHECK(rdma(p, IBV_WR_RDMA_WRITE, rkey, win(), WIN_LEN) == IBV_WC_SUCCESS,
          "%s: WRITE through the window failed", what);
    CHECK(!memcmp(bbuf + WIN_OFF, abuf, WIN_LEN), "%s: the window's bytes differ", what);
    for (i = 0; i < WIN_OFF; i++)
        CHECK(!bbuf[i], "%s: byte %d before the window written", what, i);
    for (i = WIN_OFF + WIN_LEN; i < BUF; i++)
        CHECK(!bbuf[i], "%s: byte %d after the window written", what, i);
    memset(abuf, 0, WIN_LEN);
    bbuf[WIN_OFF + 5] = 'R';
    CHECK(rdma(p, IBV_WR_RDMA_READ, rkey, win(), WIN_LEN) == IBV_WC_SUCCESS,
          "%s: READ through the window failed", what);
    CHECK(!memcmp(bbuf + WIN_OFF, abuf, WIN_LEN), "%s: READ brought other bytes", what);
}

static struct ibv_mw_bind_info info_of(struct ibv_mr *mr, uint64_t addr, uint64_t len,
                                       unsigned int access)
{
    struct ibv_mw_bind_info i = { .mr = mr, .addr = addr, .length = len,
                                  .mw_access_flags = access };
    return i;
}

static void type1(void)
{
    struct pair p;
    struct ibv_mw_bind b;
    struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
    uint32_t before, first;

    CHECK(mw && mw->type == IBV_MW_TYPE_1 && mw->pd == pd && mw->context == ctx,
          "ibv_alloc_mw type 1: %s", strerror(errno));
    pair_up(&p, 0);
    before = mw->rkey;
    memset(&b, 0, sizeof(b));
    b.wr_id = 11;
    b.send_flags = IBV_SEND_SIGNALED;
    b.bind_info = info_of(bmr, win(), WIN_LEN, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    CHECK(!ibv_bind_mw(p.qb, mw, &b), "ibv_bind_mw");
    CHECK(mw->rkey == ibv_inc_rkey(before), "bind: rkey %#x, not ibv_inc_rkey(%#x)",
          mw->rkey, before);
    expect_wc(p.cqb, 11, IBV_WC_BIND_MW, IBV_WC_SUCCESS, "type 1 bind");
    printf("ok: type 1 bind completes as BIND_MW with the next key\n");
    write_read_through(&p, mw->rkey, "type 1");
    printf("ok: type 1 WRITE and READ through the window land in its range\n");
    CHECK(rdma(&p, IBV_WR_RDMA_WRITE, mw->rkey, win() + WIN_LEN - 8, 16)
          == IBV_WC_REM_ACCESS_ERR, "a WRITE past the window's end did not fail");
    printf("ok: type 1 WRITE past the window's end -> remote access error\n");
    pair_down(&p);

    /* a rebind moves the window: the old key stops working, the new one works */
    pair_up(&p, 0);
    first = mw->rkey;
    b.wr_id = 12;
    CHECK(!ibv_bind_mw(p.qb, mw, &b), "ibv_bind_mw again");
    expect_wc(p.cqb, 12, IBV_WC_BIND_MW, IBV_WC_SUCCESS, "type 1 rebind");
    write_read_through(&p, mw->rkey, "type 1 rebound");
    CHECK(rdma(&p, IBV_WR_RDMA_WRITE, first, win(), 8) == IBV_WC_REM_ACCESS_ERR,
          "the key of the first bind still works");
    printf("ok: type 1 rebind: the new key works, the old one -> remote access error\n");
    pair_down(&p);

    /* an unbind (length 0, as rdma-core's test_invalidate_mw_type1) revokes it */
    pair_up(&p, 0);
    b.wr_id = 13;
    b.bind_info = info_of(bmr, win(), 0, 0);
    CHECK(!ibv_bind_mw(p.qb, mw, &b), "ibv_bind_mw (unbind)");
    expect_wc(p.cqb, 13, IBV_WC_BIND_MW, IBV_WC_SUCCESS, "type 1 unbind");
    CHECK(rdma(&p, IBV_WR_RDMA_WRITE, mw->rkey, win(), 8) == IBV_WC_REM_ACCESS_ERR,
          "an unbound window still takes a WRITE");
    printf("ok: type 1 unbind -> remote access error\n");
    pair_down(&p);
    CHECK(!ibv_dealloc_mw(mw), "ibv_dealloc_mw");
}

/* type 2 window mw bound on B's QP with key rkey by a BIND_MW work request */
static void bind2(struct pair *p, struct ibv_mw *mw, uint32_t rkey, unsigned int access,
                  uint64_t wr_id)
{
    struct ibv_send_wr wr, *bad;

    memset(&wr, 0, sizeof(wr));
    wr.wr_id = wr_id;
    wr.opcode = IBV_WR_BIND_MW;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.bind_mw.mw = mw;
    wr.bind_mw.rkey = rkey;
    wr.bind_mw.bind_info = info_of(bmr, win(), WIN_LEN, access);
    CHECK(!ibv_post_send(p->qb, &wr, &bad), "ibv_post_send (BIND_MW)");
    expect_wc(p->cqb, wr_id, IBV_WC_BIND_MW, IBV_WC_SUCCESS, "type 2 bind");
}

static void type2(void)
{
    struct pair p;
    struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
    struct ibv_send_wr wr, *bad;
    struct ibv_recv_wr rwr, *rbad;
    struct ibv_sge sge;
    struct ibv_wc wc;
    uint32_t key;

    CHECK(mw && mw->type == IBV_MW_TYPE_2, "ibv_alloc_mw type 2: %s", strerror(errno));
    /* bind, use, then a SEND_WITH_INV from the peer revokes it */
    pair_up(&p, 0);
    key = ibv_inc_rkey(mw->rkey);
    bind2(&p, mw, key, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ, 21);
    write_read_through(&p, key, "type 2");
    printf("ok: type 2 BIND_MW work request; WRITE and READ through the window\n");
    sge.addr = (uintptr_t)bbuf;
    sge.length = 64;
    sge.lkey = bmr->lkey;
    memset(&rwr, 0, sizeof(rwr));
    rwr.wr_id = 22;
    rwr.sg_list = &sge;
    rwr.num_sge = 1;
    CHECK(!ibv_post_recv(p.qb, &rwr, &rbad), "ibv_post_recv");
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = 23;
    wr.opcode = IBV_WR_SEND_WITH_INV;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.invalidate_rkey = key;
    CHECK(!ibv_post_send(p.qa, &wr, &bad), "ibv_post_send (SEND_WITH_INV)");
    wait_wc(p.cqa, &wc, "SEND_WITH_INV", 30.0);
    CHECK(wc.wr_id == 23 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND,
          "SEND_WITH_INV's completion: %s", ibv_wc_status_str(wc.status));
    wait_wc(p.cqb, &wc, "the receive of SEND_WITH_INV", 30.0);
    CHECK(wc.wr_id == 22 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV
          && (wc.wc_flags & IBV_WC_WITH_INV) && wc.invalidated_rkey == key
          && wc.byte_len == 0, "the receive: status %s flags %#x invalidated %#x (want %#x)",
          ibv_wc_status_str(wc.status), wc.wc_flags, wc.invalidated_rkey, key);
    CHECK(rdma(&p, IBV_WR_RDMA_WRITE, key, win(), 8) == IBV_WC_REM_ACCESS_ERR,
          "a window invalidated by SEND_WITH_INV still takes a WRITE");
    printf("ok: SEND_WITH_INV revokes a type 2 window (WITH_INV, invalidated_rkey)\n");
    pair_down(&p);

    /* bind again with the next key, then a LOCAL_INV revokes it */
    pair_up(&p, 0);
    key = ibv_inc_rkey(key);
    bind2(&p, mw, key, IBV_ACCESS_REMOTE_WRITE, 31);
    CHECK(rdma(&p, IBV_WR_RDMA_WRITE, key, win(), 8) == IBV_WC_SUCCESS, "WRITE after rebind");
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = 32;
    wr.opcode = IBV_WR_LOCAL_INV;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.invalidate_rkey = key;
    CHECK(!ibv_post_send(p.qb, &wr, &bad), "ibv_post_send (LOCAL_INV)");
    expect_wc(p.cqb, 32, IBV_WC_LOCAL_INV, IBV_WC_SUCCESS, "LOCAL_INV");
    CHECK(rdma(&p, IBV_WR_RDMA_WRITE, key, win(), 8) == IBV_WC_REM_ACCESS_ERR,
          "a window invalidated by LOCAL_INV still takes a WRITE");
    printf("ok: LOCAL_INV revokes a type 2 window, completes as LOCAL_INV\n");
    pair_down(&p);

    /* the ibv_wr_* API: a window bound without REMOTE_WRITE refuses a WRITE (rdma-core's
     * test_qp_ex_rc_bind_mw), one with it takes it, ibv_wr_local_inv revokes it */
    pair_up(&p, 1);
    {
        struct ibv_qp_ex *x = ibv_qp_to_qp_ex(p.qb);
        struct ibv_mw_bind_info i = info_of(bmr, win(), WIN_LEN, IBV_ACCESS_REMOTE_WRITE);
        struct ibv_mw_bind_info none = info_of(bmr, win(), WIN_LEN, IBV_ACCESS_REMOTE_READ);

        CHECK(x, "ibv_qp_to_qp_ex");
        key = ibv_inc_rkey(key);
        ibv_wr_start(x);
        x->wr_id = 41;
        x->wr_flags = IBV_SEND_SIGNALED;
        ibv_wr_bind_mw(x, mw, key, &i);
        CHECK(!ibv_wr_complete(x), "ibv_wr_complete (bind)");
        expect_wc(p.cqb, 41, IBV_WC_BIND_MW, IBV_WC_SUCCESS, "ibv_wr_bind_mw");
        CHECK(rdma(&p, IBV_WR_RDMA_WRITE, key, win(), 8) == IBV_WC_SUCCESS,
              "WRITE through a window of ibv_wr_bind_mw");
        ibv_wr_start(x);
        x->wr_id = 42;
        ibv_wr_local_inv(x, key);
        CHECK(!ibv_wr_complete(x), "ibv_wr_complete (local_inv)");
        expect_wc(p.cqb, 42, IBV_WC_LOCAL_INV, IBV_WC_SUCCESS, "ibv_wr_local_inv");
        key = ibv_inc_rkey(key);
        ibv_wr_start(x);
        x->wr_id = 43;
        ibv_wr_bind_mw(x, mw, key, &none);
        CHECK(!ibv_wr_complete(x), "ibv_wr_complete (bind, read only)");
        expect_wc(p.cqb, 43, IBV_WC_BIND_MW, IBV_WC_SUCCESS, "ibv_wr_bind_mw read only");
        CHECK(rdma(&p, IBV_WR_RDMA_WRITE, key, win(), 8) == IBV_WC_REM_ACCESS_ERR,
              "a window without REMOTE_WRITE took a WRITE");
    }
    printf("ok: ibv_wr_bind_mw and ibv_wr_local_inv; a read-only window refuses a WRITE\n");
    pair_down(&p);

    /* deallocating a bound window revokes it (a fresh one: the last is still bound, to
     * the QP just destroyed, and a bound type 2 window cannot be bound again) */
    CHECK(!ibv_dealloc_mw(mw), "ibv_dealloc_mw");
    mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
    CHECK(mw, "ibv_alloc_mw type 2: %s", strerror(errno));
    pair_up(&p, 0);
    key = ibv_inc_rkey(mw->rkey);
    bind2(&p, mw, key, IBV_ACCESS_REMOTE_WRITE, 51);
    CHECK(!ibv_dealloc_mw(mw), "ibv_dealloc_mw (type 2)");
    CHECK(rdma(&p, IBV_WR_RDMA_WRITE, key, win(), 8) == IBV_WC_REM_ACCESS_ERR,
          "a deallocated window took a WRITE");
    printf("ok: ibv_dealloc_mw revokes a bound type 2 window\n");
    pair_down(&p);
}

/* ibv_wr_atomic_write from B's extended QP into A's buffer: 8 bytes at an aligned
 * address, the bytes around them untouched; the completion says ATOMIC_WRITE */
static void atomic_write(void)
{
    static const char data[8] = { 'A', 'T', 'O', 'M', 'I', 'C', '!', '\n' };
    struct ibv_mr *target;
    struct ibv_qp_ex *x;
    struct ibv_wc wc;
    struct pair p;
    char *tbuf = calloc(1, BUF);
    int i;

    CHECK(tbuf, "calloc");
    target = ibv_reg_mr(pd, tbuf, BUF, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    CHECK(target, "ibv_reg_mr");
    memset(tbuf, 0x5a, BUF);
    pair_up(&p, 1);
    x = ibv_qp_to_qp_ex(p.qb);
    CHECK(x, "ibv_qp_to_qp_ex");
    ibv_wr_start(x);
    x->wr_id = 71;
    x->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_atomic_write(x, target->rkey, (uintptr_t)tbuf + 64, data);
    CHECK(!ibv_wr_complete(x), "ibv_wr_complete (atomic write)");
    wait_wc(p.cqb, &wc, "atomic write", 30.0);
    CHECK(wc.wr_id == 71 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_ATOMIC_WRITE,
          "atomic write: wr_id %llu status %s opcode %d", (unsigned long long)wc.wr_id,
          ibv_wc_status_str(wc.status), wc.opcode);
    CHECK(!memcmp(tbuf + 64, data, 8), "the atomic write's bytes differ");
    for (i = 0; i < BUF; i++)
        CHECK(i >= 64 && i < 72 ? 1 : tbuf[i] == 0x5a, "byte %d changed", i);
    /* an unaligned address is refused when posted */
    ibv_wr_start(x);
    ibv_wr_atomic_write(x, target->rkey, (uintptr_t)tbuf + 68, data);
    CHECK(ibv_wr_complete(x) == EINVAL, "an unaligned atomic write was taken");
    /* ibv_post_send has no member for the 8 bytes: the WRs before it are posted, it is
     * refused */
    {
        struct ibv_sge sge = { .addr = (uintptr_t)tbuf, .length = 8, .lkey = target->lkey };
        struct ibv_send_wr w[2], *bad = NULL;

        memset(w, 0, sizeof(w));
        w[0].wr_id = 72;
        w[0].sg_list = &sge;
        w[0].num_sge = 1;
        w[0].opcode = IBV_WR_RDMA_WRITE;
        w[0].send_flags = IBV_SEND_SIGNALED;
        w[0].wr.rdma.rkey = target->rkey;
        w[0].wr.rdma.remote_addr = (uintptr_t)tbuf + 128;
        w[0].next = &w[1];
        w[1] = w[0];
        w[1].wr_id = 73;
        w[1].opcode = IBV_WR_ATOMIC_WRITE;
        w[1].next = NULL;
        CHECK(ibv_post_send(p.qb, w, &bad) == EOPNOTSUPP && bad == &w[1],
              "an ATOMIC_WRITE through ibv_post_send was taken");
        wait_wc(p.cqb, &wc, "the WRITE before the refused ATOMIC_WRITE", 30.0);
        CHECK(wc.wr_id == 72 && wc.status == IBV_WC_SUCCESS, "the WRITE before it: %s",
              ibv_wc_status_str(wc.status));
    }
    printf("ok: ibv_wr_atomic_write stores 8 bytes; unaligned -> EINVAL; ibv_post_send "
           "refuses ATOMIC_WRITE (EOPNOTSUPP, bad_wr)\n");
    pair_down(&p);
    CHECK(!ibv_dereg_mr(target), "ibv_dereg_mr");
    free(tbuf);
}

static void errors(void)
{
    struct pair p;
    struct ibv_mw *mw1, *mw2;
    struct ibv_mw_bind b;
    struct ibv_mr *plain;
    char *pbuf = calloc(1, BUF);

    errno = 0;
    CHECK(!ibv_alloc_mw(pd, (enum ibv_mw_type)3) && errno == EINVAL,
          "ibv_alloc_mw of type 3: errno %d", errno);
    mw1 = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
    mw2 = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
    CHECK(mw1 && mw2, "ibv_alloc_mw");
    pair_up(&p, 0);
    memset(&b, 0, sizeof(b));
    b.send_flags = IBV_SEND_SIGNALED;
    b.bind_info = info_of(bmr, win(), WIN_LEN, IBV_ACCESS_REMOTE_WRITE);
    CHECK(ibv_bind_mw(p.qb, mw2, &b) == EINVAL, "ibv_bind_mw of a type 2 window");
    /* a type 1 window in a BIND_MW work request is refused when posted */
    {
        struct ibv_send_wr wr, *bad = NULL;
        memset(&wr, 0, sizeof(wr));
        wr.opcode = IBV_WR_BIND_MW;
        wr.bind_mw.mw = mw1;
        wr.bind_mw.rkey = ibv_inc_rkey(mw1->rkey);
        wr.bind_mw.bind_info = b.bind_info;
        CHECK(ibv_post_send(p.qb, &wr, &bad) == EINVAL && bad == &wr,
              "a BIND_MW work request of a type 1 window was taken");
    }
    printf("ok: bad types -> EINVAL (ibv_alloc_mw, ibv_bind_mw, a BIND_MW request)\n");
    plain = ibv_reg_mr(pd, pbuf, BUF, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    CHECK(plain, "ibv_reg_mr");
    b.wr_id = 61;
    b.bind_info = info_of(plain, (uintptr_t)pbuf, 64, IBV_ACCESS_REMOTE_WRITE);
    CHECK(!ibv_bind_mw(p.qb, mw1, &b), "ibv_bind_mw (MR without MW_BIND)");
    expect_wc(p.cqb, 61, IBV_WC_BIND_MW, IBV_WC_MW_BIND_ERR, "bind to an MR without MW_BIND");
    printf("ok: a bind to an MR without MW_BIND -> MW bind error completion\n");
    pair_down(&p);
    CHECK(!ibv_dealloc_mw(mw1) && !ibv_dealloc_mw(mw2), "ibv_dealloc_mw");
    CHECK(!ibv_dereg_mr(plain), "ibv_dereg_mr");
    free(pbuf);
}

int main(int argc, char **argv)
{
    struct ibv_device_attr attr;
    struct ibv_device **list;

    if (argc < 2)
        FAIL("usage: remote_ops DEVICE [iwarp]");
    setvbuf(stdout, NULL, _IOLBF, 0);
    ctx = open_device(argv[1], &list);
    pd = ibv_alloc_pd(ctx);
    CHECK(pd, "ibv_alloc_pd");
    if (argc > 2 && !strcmp(argv[2], "iwarp")) {
        errno = 0;
        CHECK(!ibv_alloc_mw(pd, IBV_MW_TYPE_1) && errno == EOPNOTSUPP,
              "ibv_alloc_mw on iWARP: errno %d", errno);
        printf("ok: iWARP: ibv_alloc_mw -> EOPNOTSUPP\n");
        return 0;
    }
    CHECK(!ibv_query_device(ctx, &attr), "ibv_query_device");
    CHECK((attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW)
          && (attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B) && attr.max_mw > 0,
          "device: cap flags %#x max_mw %d", attr.device_cap_flags, attr.max_mw);
    CHECK(!ibv_query_gid(ctx, 1, 0, &gid), "ibv_query_gid");
    abuf = calloc(1, BUF);
    bbuf = calloc(1, BUF);
    amr = ibv_reg_mr(pd, abuf, BUF, IBV_ACCESS_LOCAL_WRITE);
    bmr = ibv_reg_mr(pd, bbuf, BUF, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE
                     | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_MW_BIND);
    CHECK(amr && bmr, "ibv_reg_mr: %s", strerror(errno));
    type1();
    type2();
    atomic_write();
    errors();
    CHECK(!ibv_dereg_mr(amr) && !ibv_dereg_mr(bmr), "ibv_dereg_mr");
    CHECK(!ibv_dealloc_pd(pd), "ibv_dealloc_pd");
    CHECK(!ibv_close_device(ctx), "ibv_close_device");
    ibv_free_device_list(list);
    printf("ok: all\n");
    return 0;
}
