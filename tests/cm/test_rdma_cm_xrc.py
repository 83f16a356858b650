"""XRC through the rdma_cm API (librdmacm's RDMA_PS_IB ids of type IBV_QPT_XRC_SEND /
IBV_QPT_XRC_RECV, as rdma_xserver/rdma_xclient -c x use them): the server's XRC TGT QP on
an XRC domain, its XRC SRQ's number in the accept's private data, the client's SENDs
naming that SRQ; RDMA_PS_IB ids of the other types; the arguments refused, named."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.rdma_cm import ACC, expect, next_non_timewait, poll_wcs, setup_env

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.cm import rdma_cm as rc
from softrdma.cm.rdma_cm import EventChannel
from softrdma.errors import InvalidArgument

T = rc.RdmaCmEventType
XRC_SEND, XRC_RECV = int(e.IBV_QPT_XRC_SEND), int(e.IBV_QPT_XRC_RECV)


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    yield from setup_env(tmp_path, monkeypatch)


def _listen(ch: EventChannel, qp_type: int) -> tuple[rc.CmId, int]:
    lst = rc.CmId(ch, rc.RDMA_PS_IB, qp_type=qp_type)
    lst.bind_addr(("127.0.0.1", 0), device="roce")
    lst.listen(4)
    assert lst.local_addr is not None
    return lst, lst.local_addr[1]


def _resolve(ch: EventChannel, port: int, qp_type: int) -> rc.CmId:
    cli = rc.CmId(ch, rc.RDMA_PS_IB, qp_type=qp_type)
    cli.resolve_addr(None, ("127.0.0.1", port), 2000, device="roce")
    expect(ch, T.ADDR_RESOLVED)
    cli.resolve_route(2000)
    expect(ch, T.ROUTE_RESOLVED)
    return cli


def test_xrc_connection_through_rdma_cm(env: Path) -> None:
    chs, chc = EventChannel(), EventChannel()
    lst, port = _listen(chs, XRC_RECV)
    cli = _resolve(chc, port, XRC_SEND)
    pd = v.PD(cli.verbs)
    scq = v.CQ(cli.verbs, 16)
    ini = cli.create_qp(pd, v.QPInitAttr(qp_type=XRC_SEND, scq=scq, rcq=scq,
                                         cap=v.QPCap(8, 0, 1, 0)))
    assert ini.qp_type == XRC_SEND and ini.qp_state == e.IBV_QPS_INIT
    cli.connect(rc.ConnParam(private_data=b"xrc please"))
    req = expect(chs, T.CONNECT_REQUEST)
    child = req.id
    # the new id's type is the REQ's (linux cma_ib_new_conn_id): an XRC TGT QP's
    assert child.qp_type == XRC_RECV and child.ps == rc.RDMA_PS_IB
    assert req.private_data.rstrip(b"\0") == b"xrc please"
    xrcd = v.XRCD(child.verbs)
    rcq = v.CQ(child.verbs, 16)
    spd = v.PD(child.verbs)
    srq = v.XrcSRQ(spd, xrcd, rcq, v.SrqInitAttr(v.SrqAttr(8, 1)))
    tgt = child.create_qp(None, v.QPInitAttr(qp_type=XRC_RECV), xrcd=xrcd)
    assert tgt.qp_type == XRC_RECV and tgt.qp_state == e.IBV_QPS_INIT
    rx = v.MR(spd, 256, ACC)
    srq.post_recv(v.RecvWR(7, 1, [v.SGE(rx.addr, 256, rx.lkey)]))
    child.accept(rc.ConnParam(private_data=srq.srq_num.to_bytes(4, "big")))
    est = expect(chc, T.ESTABLISHED)
    expect(chs, T.ESTABLISHED)
    assert ini.qp_state == tgt.qp_state == e.IBV_QPS_RTS
    srqn = int.from_bytes(est.private_data[:4], "big")
    assert srqn == srq.srq_num
    tx = v.MR(pd, 64, ACC)
    tx.write(b"to the SRQ", 10)
    wr = v.SendWR(3, None, 1, [v.SGE(tx.addr, 10, tx.lkey)], e.IBV_WR_SEND,
                  e.IBV_SEND_SIGNALED)
    wr.set_qp_type_xrc(srqn)
    ini.post_send(wr)
    (wc,) = poll_wcs(rcq, 1, 10)
    assert (wc.wr_id, wc.status, wc.byte_len, wc.qp_num) == (7, 0, 10, tgt.qp_num)
    assert rx.read(10, 0) == b"to the SRQ"
    (swc,) = poll_wcs(scq, 1, 10)
    assert swc.wr_id == 3 and swc.status == 0
    cli.disconnect()
    assert next_non_timewait(chc).event == T.DISCONNECTED
    assert next_non_timewait(chs).event == T.DISCONNECTED
    for cid in (cli, child, lst):
        cid.destroy_qp()
        cid.destroy()
    srq.close()
    chs.close()
    chc.close()


def test_xrc_tgt_qp_on_the_devices_xrc_domain(env: Path) -> None:
    """No XRCD given: the device's XRC domain of rdma_cm (librdmacm ucma_get_xrcd), one
    for every XRC TGT QP made on that device."""
    chs, chc = EventChannel(), EventChannel()
    lst, port = _listen(chs, XRC_RECV)
    clis = [_resolve(chc, port, XRC_SEND) for _ in range(2)]
    children = []
    for cli in clis:
        pd = v.PD(cli.verbs)
        cq = v.CQ(cli.verbs, 4)
        cli.create_qp(pd, v.QPInitAttr(qp_type=XRC_SEND, scq=cq, rcq=cq,
                                       cap=v.QPCap(2, 0, 1, 0)))
        cli.connect()
        child = expect(chs, T.CONNECT_REQUEST).id
        child.create_qp(None, v.QPInitAttr(qp_type=XRC_RECV))
        child.accept()
        expect(chc, T.ESTABLISHED)
        expect(chs, T.ESTABLISHED)
        children.append(child)
    assert children[0].qp.xrcd is children[1].qp.xrcd
    for cid in (*clis, *children, lst):
        cid.destroy_qp()
        cid.destroy()


def test_rc_and_ud_ids_in_the_ib_port_space(env: Path) -> None:
    """RDMA_PS_IB ids of type RC connect as RDMA_PS_TCP ids do, on the port space's own
    Service IDs (0x013F in the A11 protocol byte's place, as Linux); UD ids resolve a UD
    service through SIDR."""
    chs, chc = EventChannel(), EventChannel()
    lst, port = _listen(chs, int(e.IBV_QPT_RC))
    cli = _resolve(chc, port, int(e.IBV_QPT_RC))
    assert cli.qp_type == e.IBV_QPT_RC
    cq = v.CQ(cli.verbs, 8)
    cli.create_qp(None, v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq,
                                     cap=v.QPCap(2, 2, 1, 1)))
    cli.connect()
    req = expect(chs, T.CONNECT_REQUEST)
    assert req.info["protocol"] == 0x3F
    scq = v.CQ(req.id.verbs, 8)
    req.id.create_qp(None, v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=scq, rcq=scq,
                                        cap=v.QPCap(2, 2, 1, 1)))
    req.id.accept()
    expect(chc, T.ESTABLISHED)
    expect(chs, T.ESTABLISHED)
    # an RDMA_PS_TCP client finds no listener there: another Service ID
    tcp = rc.CmId(chc, rc.RDMA_PS_TCP)
    tcp.resolve_addr(None, ("127.0.0.1", port), 2000, device="roce")
    expect(chc, T.ADDR_RESOLVED)
    tcp.resolve_route(2000)
    expect(chc, T.ROUTE_RESOLVED)
    tcq = v.CQ(tcp.verbs, 8)
    tcp.create_qp(None, v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=tcq, rcq=tcq,
                                     cap=v.QPCap(2, 2, 1, 1)))
    tcp.connect()
    assert next_non_timewait(chc).event == T.REJECTED
    # UD in the IB port space: SIDR
    uds = rc.CmId(chs, rc.RDMA_PS_IB, qp_type=int(e.IBV_QPT_UD))
    uds.bind_addr(("127.0.0.1", 0), device="roce")
    uds.listen(2)
    assert uds.local_addr is not None
    udc = _resolve(chc, uds.local_addr[1], int(e.IBV_QPT_UD))
    ucq = v.CQ(udc.verbs, 8)
    udc.create_qp(None, v.QPInitAttr(qp_type=e.IBV_QPT_UD, scq=ucq, rcq=ucq,
                                     cap=v.QPCap(2, 2, 1, 1)))
    udc.connect()
    ureq = expect(chs, T.CONNECT_REQUEST)
    srv_cq = v.CQ(ureq.id.verbs, 8)
    sqp = ureq.id.create_qp(None, v.QPInitAttr(qp_type=e.IBV_QPT_UD, scq=srv_cq,
                                               rcq=srv_cq, cap=v.QPCap(2, 2, 1, 1)))
    ureq.id.accept()
    est = expect(chc, T.ESTABLISHED)
    assert est.ud is not None and est.ud.qp_num == sqp.qp_num
    for cid in (cli, req.id, lst, tcp, udc, ureq.id, uds):
        cid.destroy_qp()
        cid.destroy()


def test_bad_ids_and_qps_are_named(env: Path) -> None:
    ch = EventChannel()
    with pytest.raises(InvalidArgument, match="qp_type") as exc:
        rc.CmId(ch, rc.RDMA_PS_IB, qp_type=int(e.IBV_QPT_RAW_PACKET))
    assert exc.value.errno == errno.EINVAL
    with pytest.raises(InvalidArgument, match="ps") as exc:
        rc.CmId(ch, 0x0002)  # RDMA_PS_IPOIB: valid, not served
    assert exc.value.errno == errno.EPROTONOSUPPORT
    lst, port = _listen(EventChannel(), XRC_RECV)
    tcp = rc.CmId(ch, rc.RDMA_PS_TCP)
    tcp.resolve_addr(None, ("127.0.0.1", port), 2000, device="roce")
    expect(ch, T.ADDR_RESOLVED)
    pd = v.PD(tcp.verbs)
    cq = v.CQ(tcp.verbs, 4)
    # an RC id (RDMA_PS_TCP) takes an XRC QP, connected as RC (as Linux; libfabric)
    ini = tcp.create_qp(pd, v.QPInitAttr(qp_type=XRC_SEND, scq=cq, rcq=cq,
                                         cap=v.QPCap(2, 0, 1, 0)))
    assert ini.qp_type == XRC_SEND and ini.qp_state == e.IBV_QPS_INIT
    tcp.destroy_qp()
    udp = rc.CmId(ch, rc.RDMA_PS_UDP)
    udp.resolve_addr(None, ("127.0.0.1", port), 2000, device="roce")
    expect(ch, T.ADDR_RESOLVED)
    with pytest.raises(InvalidArgument, match="init_attr.qp_type"):  # a UD id: UD QPs
        udp.create_qp(pd, v.QPInitAttr(qp_type=XRC_SEND, scq=cq, rcq=cq,
                                       cap=v.QPCap(2, 0, 1, 0)))
    xs = _resolve(ch, port, XRC_SEND)
    with pytest.raises(InvalidArgument, match="init_attr.qp_type"):  # the other XRC type
        xs.create_qp(None, v.QPInitAttr(qp_type=XRC_RECV))
    with pytest.raises(InvalidArgument, match="init_attr.qp_type"):  # not the id's type
        xs.create_qp(pd, v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq,
                                      cap=v.QPCap(2, 2, 1, 1)))
    with pytest.raises(InvalidArgument, match="xrcd"):
        xs.create_qp(None, v.QPInitAttr(qp_type=XRC_SEND), xrcd=object())
    for cid in (tcp, udp, xs, lst):
        cid.destroy()


def test_iwarp_refuses_the_ib_port_space(env: Path) -> None:
    """Linux's iw_cm serves RDMA_PS_TCP ids only: an RDMA_PS_IB id on an iWARP device is
    EPROTONOSUPPORT when it gets the device."""
    cid = rc.CmId(EventChannel(), rc.RDMA_PS_IB)
    with pytest.raises(InvalidArgument, match="ps") as exc:
        cid.bind_addr(("127.0.0.1", 0), device="iwarp")
    assert exc.value.errno == errno.EPROTONOSUPPORT
    cid.destroy()
