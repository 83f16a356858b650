"""IBA Annex A16 (RDMA over Converged Ethernet): every endnode compliance statement.

| id           | statement (Annex A16 words, abridged)                                   | tests |
|--------------|--------------------------------------------------------------------------|-------|
| CA16-8       | "A packet arriving at a RoCE port containing a BTH with the destination QP field set to QP0 shall be silently dropped." | test_ca16_8_qp0_dropped_silently_and_counted |
| CA16-9       | "The default value for RespTimeValue shall be 19. The default value for SubnetTimeout shall be 18. These default values can be modified" | test_ca16_9_cm_timer_defaults, test_ca16_9_cm_timers_configurable |
| CA16-10      | REQ LID fields between RoCE ports are not validated (A16.5.2)          | test_ca16_10_req_lids_not_validated (-> test_cm_ibcm.test_req_lids_are_not_validated) |
| CA16-11      | REJ codes 13 and 19 never sent between RoCE ports                      | test_ca16_11_13_forbidden_codes (-> test_cm_ibcm.test_roce_forbidden_codes_are_never_sent, test_wire_cm) |
| CA16-12      | LAP alternate LIDs "shall not be checked or validated"                  | test_ca16_12_13_lap_lids_ignored (-> test_cm_ibcm.test_lap_gets_apr_unsupported_and_lids_ignored) |
| CA16-13      | APR code 7 "shall not be sent"                                          | test_ca16_11_13_forbidden_codes, test_ca16_12_13_lap_lids_ignored |
| CA16-14      | "shall not support the concept of a Raw service on a RoCE port"        | test_ca16_14_19_no_raw_qp_types |
| CA16-15      | "compliant with the InfiniBand transport as defined in Chapter 9"       | test_ca16_15_transport_property_tests_run (-> test_fabric_property, test_engine_property each over RoCEv2 and RoCEv1) |
| CA16-15.1.1  | "A RoCE port shall support static rate control."                        | test_ca16_15_1_1_static_rate (-> test_static_rate.py: two rates on the virtual clock, one real-time check) |
| CA16-16      | "The B (BECN) and F (FECN) bits ... are unused and shall be ignored"    | test_ca16_16_fecn_becn_ignored |
| CA16-17      | "the address vector shall not contain layer 2 references"               | test_ca16_17_address_vector_is_gid_only |
| CA16-18      | "a reserved SL value shall result in the Invalid Address Vector verb result"; SL 0-7 -> priorities 0-7 (A16.8.1) | test_ca16_18_reserved_sl_is_invalid_av, test_ca16_18_sl_maps_to_ethernet_priority |
| CA16-19      | "A QP associated with a RoCE port does not support any operations for the Raw service type." | test_ca16_14_19_no_raw_qp_types |
| CA16-20      | "A RoCE port shall not support Client Reregistration."                  | test_ca16_20_21_no_reregistration_no_port_change_events |
| CA16-21      | "A RoCE port shall not support the optional Port Change Event."         | test_ca16_20_21_no_reregistration_no_port_change_events |
| A16.9.1      | Query HCA: Base LID, LMC, SM address, VLs, InitTypeReply unused; IsSM, IsSMDisabled, IsSNMPTunnelingSupported, IsClientReregistrationSupported unused; the port type is reported | test_a16_9_1_query_port_reports_a_roce_port |
| CA16-22      | "source and sink locally routed packets, including those containing a GRH"; A16.7.2: SGID or DGID ::1 "silently dropped" | test_ca16_22_self_addressed_packets_work, test_ca16_22_loopback_gid_dropped |
| CA16-23      | "check for link, network and transport layer errors in all incoming packets" | test_ca16_23_each_check_has_its_own_reason (parametrised over opcode, P_Key, Q_Key, QP state, PSN, length, ICRC, QP0, unknown QP, TVer, malformed) |
| A16.9.12     | UD completions from a RoCE peer carry no SLID and no path bits          | test_a16_9_12_ud_completion_has_no_slid |

Every packet-level test here runs on a RoCEv2 port and on a RoCEv1 port (the fabric's
``roce_ver``: UDP/IP encapsulation, or a real GRH, Annex A16); the CM ones
(CA16-9..13) over both too, as test_cm_ibcm.py runs them; CA16-15's property tests run
over both in test_fabric_property.py and test_engine_property.py.
"""

from __future__ import annotations

import ast
import inspect
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from harness import cm as cm_harness
from harness.cm import Pair as CmPair
from harness.cm_ibcm import SID, connect
from harness.cm_ibcm import check_lap_lids_ignored as _lap_lids
from harness.cm_ibcm import check_req_lids_are_not_validated as _req_lids
from harness.cm_ibcm import check_roce_forbidden_codes_are_never_sent as _forbidden
from harness.device import ib_port
from harness.fabric_mix import roce_ver_of
from harness.rc_mix import run_mix, v1_of
from harness.static_rate import Net as RateNet
from harness.static_rate import check_rc_qp_static_rate_is_kept as _rc_rate
from harness.static_rate import check_ud_ah_static_rate_is_kept as _ud_rate

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.links.fabric import Fabric
from softrdma.drivers.runtime.clock import VirtualClock
from softrdma.drivers.runtime.roce import Runtime, icrc_v2
from softrdma.errors import InvalidArgument, NotSupported
from softrdma.ib.port import RxMeta
from softrdma.ibcm.agent import CmConfig
from softrdma.seam.counters import DropReason
from softrdma.verbs.ah import ethernet_priority
from softrdma.verbs.device import _ENGINE_EVENTS, PORT_CAP_FLAGS
from softrdma.wire.cm import CmAttr
from softrdma.wire.roce import icrc_v1
from softrdma.wire.rocev1 import build_grh_v1

RC, UC, UD = int(e.IBV_QPT_RC), int(e.IBV_QPT_UC), int(e.IBV_QPT_UD)
ALL = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ)
A_IP, RAW_IP = "10.8.0.1", "10.8.0.9"
A_RAW, RAW_RAW = bytes([10, 8, 0, 1]), bytes([10, 8, 0, 9])
PEER_GID = "::ffff:" + RAW_IP
PEER_QPN = 0x99
QKEY = 0x3333
EPSN = 100
SPORT = 0xC123
IBV_PORT_SM_DISABLED = 1 << 10  # <infiniband/verbs.h> IBV_PORT_SM_DISABLED
IBV_LINK_LAYER_ETHERNET = 2  # <infiniband/verbs.h>
_BTH = struct.Struct("!BBHII")
_DETH = struct.Struct("!II")


def bth(opcode: int, dqpn: int, psn: int = EPSN, pkey: int = 0xFFFF, tver: int = 0,
        fb: int = 0, pad: int = 0) -> bytes:
    return _BTH.pack(opcode, (pad << 4) | tver, pkey, (fb << 24) | dqpn, psn)


class Node:
    """A context on the fabric plus a raw fabric endpoint that injects crafted packets;
    ``roce_ver`` "2" (UDP/IP) or "1" (GRH, Annex A16)."""

    def __init__(self, roce_ver: str = "2") -> None:
        self.v1 = roce_ver == "1"
        self.clock = VirtualClock()
        self.fab = Fabric(self.clock)
        self.ctx = v.Context(fabric=self.fab.link(A_IP, roce_ver=roce_ver))
        self.raw = self.fab.link(RAW_IP, roce_ver=roce_ver)
        # the port's IPv4-mapped GID (a RoCEv1 port lists its link-local GID first)
        self.sgid_index = self.ctx.gid_index("::ffff:" + A_IP)
        self.pd = v.PD(self.ctx)
        self.cq = v.CQ(self.ctx, 64)
        self.mr = v.MR(self.pd, 1 << 16, ALL)

    def qp(self, qpt: int, state: str = "rts") -> v.QP:
        qp = v.QP(self.pd, v.QPInitAttr(qpt, scq=self.cq, rcq=self.cq, cap=v.QPCap(8, 8)))
        if qpt == UD:
            at = v.QPAttr(qkey=QKEY)
        else:
            at = v.QPAttr(path_mtu=e.IBV_MTU_1024, dest_qp_num=PEER_QPN, rq_psn=EPSN,
                          max_dest_rd_atomic=1, max_rd_atomic=1, timeout=14, retry_cnt=7,
                          rnr_retry=7)
            at.qp_access_flags = ALL
            at.ah_attr = v.AHAttr(gr=v.GlobalRoute(dgid=PEER_GID, hop_limit=64,
                                                   sgid_index=self.sgid_index))
        {"init": qp.to_init, "rts": qp.to_rts}[state](at)
        for i in range(4):
            qp.post_recv(v.RecvWR(i, 1, [v.SGE(self.mr.addr, 4096, self.mr.lkey)]))
        return qp

    def inject(self, pkt: bytes, *, good_icrc: bool = True) -> None:
        """Send ``pkt`` (BTH ..) from the raw endpoint with its RoCEv2 ICRC (a packet
        shorter than a BTH gets 4 zero bytes: it has no ICRC to compute)."""
        if self.v1:  # A16.3.1: a GRH, always
            sgid, dgid = v.GID(PEER_GID).raw, v.GID("::ffff:" + A_IP).raw
            grh = build_grh_v1(sgid, dgid, len(pkt) + 4, 0, 0, 64)
            icrc = icrc_v1(grh, [pkt]) if len(pkt) >= 12 else bytes(4)
            if not good_icrc:
                icrc = bytes(b ^ 0xFF for b in icrc)
            self.raw.send_v1(dgid, [grh, pkt, icrc])
        else:
            if len(pkt) < 12:
                icrc = bytes(4)
            else:
                icrc = icrc_v2(RAW_RAW, A_RAW, SPORT, 4791, [pkt], len(pkt))
            if not good_icrc:
                icrc = bytes(b ^ 0xFF for b in icrc)
            self.raw.send(A_RAW, 4791, SPORT, [pkt, icrc])
        self.clock.run()

    def drops(self) -> dict[str, int]:
        return self.ctx.query_port_counters().drops

    def close(self) -> None:
        self.ctx.close()


@pytest.fixture(params=["2", "1"], ids=["rocev2", "rocev1"])
def node(request: pytest.FixtureRequest) -> Iterator[Node]:
    n = Node(str(request.param))
    yield n
    n.close()


@pytest.fixture(params=["2", "1"], ids=["rocev2", "rocev1"])
def cm_roce_ver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The CM tests' fabric links speak RoCEv2 or RoCEv1 (cm_harness.ROCE_VER)."""
    monkeypatch.setattr(cm_harness, "ROCE_VER", request.param)
    return str(request.param)


def _dropped_for(n: Node, pkt: bytes, reason: DropReason, *, fatal: bool = False,
                 **kw: Any) -> None:
    """Inject ``pkt``: exactly one drop, under ``reason``, and no completion (``fatal``:
    the error also moves the QP to the Error state, which flushes its receives)."""
    before = n.drops()
    n.inject(pkt, **kw)
    after = n.drops()
    changed = {k: after[k] - before[k] for k in after if after[k] != before[k]}
    assert changed == {reason.value: 1}
    wcs = n.cq.poll(8)[1]
    if fatal:
        assert wcs and all(w.status == e.IBV_WC_WR_FLUSH_ERR for w in wcs)
    else:
        assert wcs == []


# ---------------------------------------------------------------------------- CA16-8
def test_ca16_8_qp0_dropped_silently_and_counted(node: Node) -> None:
    sent = len(node.raw.recv_batch())
    _dropped_for(node, bth(0x64, 0) + _DETH.pack(QKEY, PEER_QPN) + bytes(256), DropReason.QP0)
    assert len(node.raw.recv_batch()) == sent == 0  # silently: nothing comes back
    assert node.ctx.query_port_counters()["rcvd_qp0"] == 1


# ---------------------------------------------------------------------------- CA16-9
def test_ca16_9_cm_timer_defaults(cm_roce_ver: str) -> None:
    cfg = CmConfig()
    assert (cfg.resp_time_value, cfg.subnet_timeout) == (19, 18)
    p = CmPair()
    connect(p)
    p.run(1)
    (req,) = p.sent(CmAttr.REQ)
    assert req.local_cm_response_timeout == 19  # RespTimeValue
    assert req.primary_local_ack_timeout == 18 + 1  # SubnetTimeout 18 (+1 as Linux)


def test_ca16_9_cm_timers_configurable(cm_roce_ver: str) -> None:
    cfg = CmConfig(resp_time_value=16, subnet_timeout=14)
    p = CmPair(config_a=cfg)
    connect(p)
    p.run(1)
    (req,) = p.sent(CmAttr.REQ)
    assert req.local_cm_response_timeout == 16 and req.primary_local_ack_timeout == 15
    assert req.service_id == SID


# ---------------------------------------------------------------------------- CA16-10..13
def test_ca16_10_req_lids_not_validated(cm_roce_ver: str) -> None:
    _req_lids()


def test_ca16_11_13_forbidden_codes(cm_roce_ver: str) -> None:
    _forbidden()


def test_ca16_12_13_lap_lids_ignored(cm_roce_ver: str) -> None:
    _lap_lids()


# ---------------------------------------------------------------------------- CA16-14, 19
@pytest.mark.parametrize("qpt", [int(e.IBV_QPT_RAW_PACKET), 5, 6],
                         ids=["raw-packet", "raw-ipv6", "raw-ethertype"])
def test_ca16_14_19_no_raw_qp_types(node: Node, qpt: int) -> None:
    with pytest.raises((NotSupported, InvalidArgument)) as ei:
        v.QP(node.pd, v.QPInitAttr(qpt, scq=node.cq, rcq=node.cq, cap=v.QPCap(4, 4)))
    if qpt == e.IBV_QPT_RAW_PACKET:
        assert isinstance(ei.value, NotSupported) and "CA16-14" in str(ei.value)
    else:
        assert getattr(ei.value, "argument", None) == "init_attr.qp_type"
    attr = node.ctx.query_device()
    assert not attr.device_cap_flags & e.IBV_DEVICE_RAW_MULTI


# ---------------------------------------------------------------------------- CA16-15
def test_ca16_15_transport_property_tests_run() -> None:
    """The chapter 9 transport's property tests (RC/UC/UD, atomics, faults) live in
    test_fabric_property.py and test_engine_property.py; this checks they are there and
    collect, so the mapping cannot silently go stale."""
    tests = {f.name: _functions(f) for f in Path(__file__).resolve().parents[1].rglob("*.py")
             if f.name in ("test_fabric_property.py", "test_engine_property.py")}
    assert len(tests) == 2
    names = [n for funcs in tests.values() for n in funcs if n.startswith("test_")]
    assert len(names) >= 3
    # both property tests split their examples between RoCEv2 and RoCEv1 by seed parity
    assert {roce_ver_of(s) for s in range(4)} == {"1", "2"}
    assert {v1_of(s) for s in range(4)} == {False, True}
    assert "roce_ver_of(seed)" in tests["test_fabric_property.py"][
        "test_random_ops_over_faulty_fabric"]
    assert "run_mix(" in tests["test_engine_property.py"]["test_random_mix_exactly_once"]
    assert "v1_of(seed)" in inspect.getsource(run_mix)


def _functions(path: Path) -> dict[str, str]:
    """The top-level functions of a test file, by name: their source (read, not imported:
    a test file never imports another)."""
    text = path.read_text()
    return {n.name: ast.get_source_segment(text, n) or "" for n in ast.parse(text).body
            if isinstance(n, ast.FunctionDef)}


@pytest.mark.iba("9.11")
def test_ca16_15_1_1_static_rate() -> None:
    for rate in (int(e.IBV_RATE_2_5_GBPS), int(e.IBV_RATE_10_GBPS)):
        n = RateNet()
        try:
            _ud_rate(n, rate)
        finally:
            n.close()
    n = RateNet()
    try:
        _rc_rate(n, int(e.IBV_RATE_5_GBPS))
    finally:
        n.close()


# ---------------------------------------------------------------------------- CA16-16
class _MarkFB:
    """A link that sets BTH F and B on every packet it sends, after the ICRC was computed
    (the ICRC masks that byte: rxe_icrc.c, IBA 7.8.1, Annex A17; ../shared/specs/roce.md §2)."""

    def __init__(self, link: Any) -> None:
        self._link = link

    def __getattr__(self, name: str) -> Any:
        return getattr(self._link, name)

    def send(self, dst: bytes, dport: int, sport: int, parts: list[Any], *rest: Any) -> None:
        head = bytearray(bytes(parts[0]))
        head[4] |= 0xC0
        self._link.send(dst, dport, sport, [bytes(head), *parts[1:]], *rest)

    def send_v1(self, dgid: bytes, parts: list[Any], *rest: Any) -> None:
        head = bytearray(bytes(parts[1]))  # parts: GRH, BTH .., ICRC
        head[4] |= 0xC0
        self._link.send_v1(dgid, [parts[0], bytes(head), *parts[2:]], *rest)


def _rc_transfer(fecn_becn: bool, roce_ver: str
                 ) -> tuple[bytes, list[int], Mapping[str, int], Mapping[str, int]]:
    clock = VirtualClock()
    fab = Fabric(clock)
    a = v.Context(fabric=fab.link("10.8.1.1", roce_ver=roce_ver))
    b = v.Context(fabric=fab.link("10.8.1.2", roce_ver=roce_ver))
    try:
        if fecn_becn:  # set F and B on every packet a sends (masked in the ICRC, IBA 7.8.1, Annex A17; ../shared/specs/roce.md §2)
            rt = a.runtime
            assert isinstance(rt, Runtime)
            rt.link = _MarkFB(rt.link)  # type: ignore[assignment]
        sides = []
        for c in (a, b):
            pd = v.PD(c)
            cq = v.CQ(c, 16)
            qp = v.QP(pd, v.QPInitAttr(RC, scq=cq, rcq=cq, cap=v.QPCap(4, 4)))
            sides.append((cq, qp, v.MR(pd, 8192, ALL)))
        for (_, qp, _), (_, peer, _), pc in ((sides[0], sides[1], b), (sides[1], sides[0], a)):
            at = v.QPAttr(path_mtu=e.IBV_MTU_1024, dest_qp_num=peer.qp_num, timeout=14,
                          retry_cnt=7, rnr_retry=7, max_rd_atomic=1, max_dest_rd_atomic=1)
            at.qp_access_flags = ALL
            at.ah_attr = v.AHAttr(gr=v.GlobalRoute(dgid=pc.query_gid(1, 0), hop_limit=64))
            qp.to_rts(at)
        (cqa, qa, ma), (cqb, qb, mb) = sides
        ma.write(bytes(range(256)) * 12, 3000)
        qb.post_recv(v.RecvWR(1, 1, [v.SGE(mb.addr, 4096, mb.lkey)]))
        qa.post_send(v.SendWR(2, sg=[v.SGE(ma.addr, 3000, ma.lkey)]))
        w = v.SendWR(3, opcode=int(e.IBV_WR_RDMA_READ), sg=[v.SGE(ma.addr + 4096, 2000, ma.lkey)])
        w.set_wr_rdma(mb.rkey, mb.addr)
        qa.post_send(w)
        clock.run()
        statuses = [int(x.status) for x in cqa.poll(8)[1] + cqb.poll(8)[1]]
        return (mb.read(3000, 0) + ma.read(2000, 4096), statuses,
                a.query_port_counters().counters, b.query_port_counters().counters)
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("roce_ver", ["2", "1"], ids=["rocev2", "rocev1"])
def test_ca16_16_fecn_becn_ignored(roce_ver: str) -> None:
    data0, st0, a0, b0 = _rc_transfer(False, roce_ver)
    data1, st1, a1, b1 = _rc_transfer(True, roce_ver)
    assert data1 == data0 and st1 == st0 == [0, 0, 0]
    assert b1["rcvd_fecn"] == b1["rcvd_becn"] == b1["rcvd_pkts"] > 0  # seen, counted
    assert b0["rcvd_fecn"] == 0
    ignore = {"rcvd_fecn", "rcvd_becn"}
    assert {k: x for k, x in b1.items() if k not in ignore} == \
        {k: x for k, x in b0.items() if k not in ignore}  # and nothing else differs
    assert a1 == a0


# ---------------------------------------------------------------------------- CA16-17/18
def test_ca16_17_address_vector_is_gid_only(node: Node) -> None:
    gr = v.GlobalRoute(dgid=PEER_GID, sgid_index=node.sgid_index)
    with pytest.raises(InvalidArgument) as ei:
        v.AH(node.pd, v.AHAttr(gr=gr, dlid=0x12))
    assert ei.value.argument == "attr.dlid" and "CA16-17" in str(ei.value)
    with pytest.raises(InvalidArgument) as ei:
        v.AH(node.pd, v.AHAttr(gr=gr, src_path_bits=1))
    assert ei.value.argument == "attr.src_path_bits"
    with pytest.raises(InvalidArgument) as ei:
        v.AH(node.pd, v.AHAttr(is_global=0, gr=None))  # a GRH (GIDs) is mandatory
    assert ei.value.argument == "attr.is_global"
    ah = v.AH(node.pd, v.AHAttr(gr=gr))
    assert ah.av.dlid == 0 and ah.av.dgid == v.GID(PEER_GID).raw


@pytest.mark.parametrize("sl", range(8, 16))
def test_ca16_18_reserved_sl_is_invalid_av(node: Node, sl: int) -> None:
    with pytest.raises(InvalidArgument) as ei:
        v.AH(node.pd, v.AHAttr(gr=v.GlobalRoute(dgid=PEER_GID, sgid_index=node.sgid_index), sl=sl))
    assert ei.value.argument == "attr.sl" and "invalid address vector" in str(ei.value)
    qp = v.QP(node.pd, v.QPInitAttr(RC, scq=node.cq, rcq=node.cq, cap=v.QPCap(4, 4)))
    at = v.QPAttr(path_mtu=e.IBV_MTU_1024, dest_qp_num=PEER_QPN)
    at.ah_attr = v.AHAttr(gr=v.GlobalRoute(dgid=PEER_GID, sgid_index=node.sgid_index), sl=sl)
    with pytest.raises(InvalidArgument) as ei:
        qp.to_rtr(at)  # the QP's address vector (A16.9.6) too
    assert ei.value.argument.endswith(".sl")


def test_ca16_18_sl_maps_to_ethernet_priority(node: Node) -> None:
    for sl in range(8):
        assert ethernet_priority(sl) == sl  # A16.8.1 default mapping
        ah = v.AH(node.pd, v.AHAttr(gr=v.GlobalRoute(dgid=PEER_GID, sgid_index=node.sgid_index), sl=sl))
        assert ah.av.sl == sl
    with pytest.raises(InvalidArgument):
        ethernet_priority(8)


# ---------------------------------------------------------------------------- CA16-20/21, A16.9.1
def test_ca16_20_21_no_reregistration_no_port_change_events(node: Node) -> None:
    pa = node.ctx.query_port()
    assert not pa.port_cap_flags & e.IBV_PORT_CLIENT_REG_SUP  # CA16-20
    assert not PORT_CAP_FLAGS & e.IBV_PORT_CLIENT_REG_SUP
    port_change = {e.IBV_EVENT_LID_CHANGE, e.IBV_EVENT_PKEY_CHANGE, e.IBV_EVENT_SM_CHANGE,
                   e.IBV_EVENT_CLIENT_REREGISTER, e.IBV_EVENT_GID_CHANGE}
    assert not port_change & set(_ENGINE_EVENTS.values())  # CA16-21: never raised
    qp = node.qp(RC)
    node.inject(bth(0x04, qp.qp_num) + b"x" * 8)  # traffic, then look for any event
    seen = []
    while True:
        try:
            seen.append(node.ctx.get_async_event(timeout=0.05))
        except TimeoutError:
            break
    assert not [ev for ev in seen if ev.event_type in port_change]


def test_a16_9_1_query_port_reports_a_roce_port(node: Node) -> None:
    pa = node.ctx.query_port()
    assert pa.lid == pa.lmc == pa.sm_lid == pa.sm_sl == 0  # unused
    assert pa.init_type_reply == 0
    for bit in (e.IBV_PORT_SM, IBV_PORT_SM_DISABLED, e.IBV_PORT_SNMP_TUNNEL_SUP,
                e.IBV_PORT_CLIENT_REG_SUP):
        assert not pa.port_cap_flags & bit
    assert pa.link_layer == IBV_LINK_LAYER_ETHERNET  # the port type: RoCE
    assert node.ctx.query_gid_type(1, 0) in (e.IBV_GID_TYPE_ROCE_V2, e.IBV_GID_TYPE_ROCE_V1)


# ---------------------------------------------------------------------------- CA16-22
def test_ca16_22_self_addressed_packets_work(node: Node) -> None:
    """Two QPs of one port talk to each other: SGID == DGID, every packet with its GRH
    (here the IP header), through the port's own link."""
    qa = v.QP(node.pd, v.QPInitAttr(RC, scq=node.cq, rcq=node.cq, cap=v.QPCap(4, 4)))
    qb = v.QP(node.pd, v.QPInitAttr(RC, scq=node.cq, rcq=node.cq, cap=v.QPCap(4, 4)))
    own = node.ctx.query_gid(1, 0)
    for q, peer in ((qa, qb), (qb, qa)):
        at = v.QPAttr(path_mtu=e.IBV_MTU_1024, dest_qp_num=peer.qp_num, timeout=14,
                      retry_cnt=7, rnr_retry=7, max_rd_atomic=1, max_dest_rd_atomic=1)
        at.qp_access_flags = ALL
        at.ah_attr = v.AHAttr(gr=v.GlobalRoute(dgid=own, hop_limit=64))
        q.to_rts(at)
    node.mr.write(b"self-addressed", 14, 0)
    qb.post_recv(v.RecvWR(7, 1, [v.SGE(node.mr.addr + 8192, 64, node.mr.lkey)]))
    qa.post_send(v.SendWR(8, sg=[v.SGE(node.mr.addr, 14, node.mr.lkey)]))
    node.clock.run()
    wcs = node.cq.poll(4)[1]
    assert sorted(int(w.wr_id) for w in wcs) == [7, 8]
    assert all(w.status == e.IBV_WC_SUCCESS for w in wcs)
    assert node.mr.read(14, 8192) == b"self-addressed"
    pc = node.ctx.query_port_counters()
    assert pc.sent_pkts == pc.rcvd_pkts > 0 and pc.total_drops == 0


def test_ca16_22_loopback_gid_dropped(node: Node) -> None:
    """A16.7.2: a packet whose SGID or DGID is ::1 is silently dropped (on RoCEv2 over the
    loopback netdev, where ::1 is the port's own address, it is a self-addressed packet)."""
    qp = node.qp(UD)
    pkt = bth(0x64, qp.qp_num) + _DETH.pack(QKEY, 0x42) + b"hello"
    loop = bytes(15) + b"\x01"
    port = ib_port(node.ctx)
    for sgid, dgid in ((loop, port.gids[0]), (v.GID(PEER_GID).raw, loop)):
        before = port.counters.rcvd_loopback_gid
        port.receive(memoryview(pkt), RxMeta(sgid, dgid, grh=bytes(40)), 0.0)
        assert port.counters.rcvd_loopback_gid == before + 1
    assert node.cq.poll(4)[0] == 0
    # the same packet from a real address is delivered
    port.receive(memoryview(pkt), RxMeta(v.GID(PEER_GID).raw, port.gids[0], grh=bytes(40)), 0.0)
    assert node.cq.poll(4)[0] == 1


# ---------------------------------------------------------------------------- CA16-23
def _case(node: Node, name: str) -> tuple[bytes, DropReason, dict[str, Any]]:
    if name == "opcode":  # a UC opcode to an RC QP
        return bth(0x24, node.qp(RC).qp_num) + b"data", DropReason.BAD_OPCODE, {}
    if name == "pkey":
        return bth(0x04, node.qp(RC).qp_num, pkey=0x1234) + b"data", DropReason.BAD_PKEY, {}
    if name == "qkey":
        qp = node.qp(UD)
        return (bth(0x64, qp.qp_num) + _DETH.pack(QKEY + 1, 0x42) + b"data",
                DropReason.BAD_QKEY, {})
    if name == "qp-state":  # a QP in INIT does not receive
        return bth(0x04, node.qp(RC, "init").qp_num) + b"data", DropReason.BAD_STATE, {}
    if name == "psn":
        return (bth(0x04, node.qp(RC).qp_num, psn=EPSN + 5) + b"data",
                DropReason.OUT_OF_SEQ, {})
    if name == "length":  # a SEND_FIRST must carry exactly one MTU (IBA 9.7.4.1.5): an
        # Invalid Request NAK, the QP goes to Error (IBA 9.9.3.1.3)
        return (bth(0x00, node.qp(RC).qp_num) + bytes(100), DropReason.BAD_LENGTH,
                {"fatal": True})
    if name == "icrc":
        return (bth(0x04, node.qp(RC).qp_num) + b"data", DropReason.ICRC,
                {"good_icrc": False})
    if name == "qp0":
        return bth(0x64, 0) + _DETH.pack(QKEY, 0x42), DropReason.QP0, {}
    if name == "unknown-qp":
        return bth(0x04, 0x5555) + b"data", DropReason.UNKNOWN_QP, {}
    if name == "tver":
        return bth(0x04, node.qp(RC).qp_num, tver=1) + b"data", DropReason.BAD_TVER, {}
    if name == "malformed":  # shorter than a BTH
        return b"\x04\x00\xff\xff\x00\x00", DropReason.MALFORMED, {}
    raise AssertionError(name)


@pytest.mark.parametrize("name", ["opcode", "pkey", "qkey", "qp-state", "psn", "length",
                                  "icrc", "qp0", "unknown-qp", "tver", "malformed"])
def test_ca16_23_each_check_has_its_own_reason(node: Node, name: str) -> None:
    pkt, reason, kw = _case(node, name)
    _dropped_for(node, pkt, reason, **kw)


# ---------------------------------------------------------------------------- A16.9.12
def test_a16_9_12_ud_completion_has_no_slid(node: Node) -> None:
    qp = node.qp(UD)
    node.inject(bth(0x64, qp.qp_num) + _DETH.pack(QKEY, 0x42) + b"from a RoCE peer")
    (wc,) = node.cq.poll(4)[1]
    assert wc.status == e.IBV_WC_SUCCESS and wc.src_qp == 0x42
    assert wc.slid == 0 and wc.dlid_path_bits == 0  # no SLID, no DLID path bits
    assert wc.wc_flags & e.IBV_WC_GRH  # the source is in the GRH instead
    grh = node.mr.read(40, 0)
    if node.v1:  # the packet's own GRH: SGID at bytes 8-23 (IBA 8.3.1)
        assert grh[8:24] == v.GID(PEER_GID).raw and grh[0] >> 4 == 6
    else:
        assert grh[20 + 12:20 + 16] == RAW_RAW  # IPv4 source in the GRH area (rxe layout)
