"""pyverbs's attribute structs over softrdma's (issue 23: one source per fact): the
pyverbs GID and GlobalRoute are softrdma's with pyverbs's text, struct members are copied
in and out as C assigns them, and enum texts come from the enums. No device needed."""

from __future__ import annotations

import pytest

from softrdma import verbs as v
from softrdma.compat.pyverbs import cq as pcq
from softrdma.compat.pyverbs import enums as e
from softrdma.compat.pyverbs import utils as pu
from softrdma.compat.pyverbs import wr as pwr
from softrdma.compat.pyverbs._device_attrs import GIDEntry
from softrdma.compat.pyverbs.addr import GID, AHAttr, GlobalRoute
from softrdma.compat.pyverbs.pyverbs_error import PyverbsUserError
from softrdma.compat.pyverbs.qp import QPAttr, QPCap, QPInitAttr
from softrdma.errors import InvalidArgument

GROUPS = "fe80:0000:0000:0000:0000:0000:0000:0001"


def test_gid_is_softrdma_gid_with_pyverbs_text() -> None:
    g = GID("fe80::1")
    assert isinstance(g, v.GID)
    assert g.gid == str(g) == GROUPS and g.raw == v.GID("fe80::1").raw
    assert GID(GROUPS) == g and GID(v.GID("fe80::1")) == g and GID("10.0.0.1") == v.GID("10.0.0.1")
    assert v.GID(g).gid == "fe80::1"  # softrdma's text of the same GID
    g.gid = "::ffff:10.0.0.2"
    assert g.raw == v.GID("10.0.0.2").raw
    for bad in ("not-a-gid", "fe80:zz00:0000:0000:0000:0000:0000:0001", b"\x01" * 4, 5):
        with pytest.raises(PyverbsUserError, match="Invalid GID value"):
            GID(bad)
    entry = GIDEntry(GID("fe80::1").raw, 1, 1, 2, 7)
    assert entry.gid_str() == GROUPS


def test_global_route_holds_a_pyverbs_gid() -> None:
    gr = GlobalRoute("fe80::1", flow_label=5, sgid_index=1, hop_limit=64, traffic_class=3)
    assert isinstance(gr, v.GlobalRoute) and type(gr.dgid) is GID
    assert type(GlobalRoute().dgid) is GID and GlobalRoute().dgid.raw == bytes(16)
    assert str(gr) == (f"dgid {GROUPS}, flow label 5, sgid index 1, hop limit 64, "
                       "traffic class 3")
    assert type(v.GlobalRoute("fe80::1").dgid) is v.GID


def test_ah_attr_copies_its_global_route() -> None:
    gr = GlobalRoute("fe80::1", flow_label=5)
    ah = AHAttr(is_global=1, gr=gr)
    assert ah.gr is not gr and ah.flow_label == 5 and ah.dgid == GROUPS
    gr.flow_label = 9
    assert ah.flow_label == 5
    assert AHAttr(gr=None).gr.dgid.raw == bytes(16)
    copy = ah.copy()
    assert copy.gr is not ah.gr and copy.gr.dgid == ah.gr.dgid and copy.flow_label == 5
    va = ah.to_verbs()
    assert va.gr is not None and va.gr.dgid.raw == gr.dgid.raw and va.gr.flow_label == 5


def test_qp_attr_members_are_copied_in_and_out() -> None:
    attr = QPAttr()
    cap = QPCap(4, 5, 1, 1, 0)
    attr.cap = cap
    cap.max_send_wr = 99
    got = attr.cap
    assert got is not attr.cap and (got.max_send_wr, got.max_recv_wr) == (4, 5)
    got.max_recv_wr = 77
    assert attr.cap.max_recv_wr == 5
    attr.cap = None  # pyverbs: None leaves the member as it is
    assert attr.cap.max_send_wr == 4
    ah = AHAttr(is_global=1, gr=GlobalRoute("fe80::1"), port_num=1)
    attr.ah_attr = ah
    attr.alt_ah_attr = None
    assert attr.ah_attr is not ah and attr.ah_attr.dgid == GROUPS
    assert attr.alt_ah_attr.port_num == 0
    vattr = attr.to_verbs(int(e.IBV_QP_AV))
    assert vattr.ah_attr is not None and vattr.alt_ah_attr is None
    assert (vattr.cap.max_send_wr, vattr.cap.max_recv_wr) == (4, 5)
    init = QPInitAttr(cap=cap)
    assert init.cap is not cap and init.max_send_wr == 99
    init.max_send_wr = 3
    assert init.cap.max_send_wr == 3 and cap.max_send_wr == 99
    assert init.send_cq is None and init.recv_cq is None
    with pytest.raises(PyverbsUserError, match="Expected CQ"):
        init.send_cq = object()
    with pytest.raises(PyverbsUserError, match="Expected CQ"):
        QPInitAttr(rcq=object())
    init.recv_cq = None
    assert init.rcq is None


def test_enum_texts() -> None:
    assert pcq.cqe_opcode_to_str(int(e.IBV_WC_RECV)) == "IBV_WC_RECV"
    assert pcq.cqe_opcode_to_str(999) == "Unknown opcode (999)"
    assert pu.rereg_error_to_str(99) == "Unknown error (99)"
    flags = int(e.IBV_SEND_SIGNALED | e.IBV_SEND_SOLICITED)
    assert pwr.send_flags_to_str(flags) == "IBV_SEND_SIGNALED IBV_SEND_SOLICITED "
    assert pcq.cqe_flags_to_str(0) == ""


def test_verbs_structs() -> None:
    attr = v.QPAttr(qkey=0x11111111, rq_psn=5)
    assert (attr.qp_state, attr.cur_qp_state, attr.port_num, attr.path_mtu) == (
        int(e.IBV_QPS_INIT), int(e.IBV_QPS_RESET), 1, int(e.IBV_MTU_1024))
    assert attr.qkey == 0x11111111 and attr.sq_psn == 0 and attr.ah_attr is None
    assert attr.cap is not v.QPAttr().cap and attr.cap.max_send_wr == 0
    assert repr(attr).startswith("QPAttr(qp_state=1, path_mtu=3, qkey=286331153, rq_psn=5")
    with pytest.raises(InvalidArgument, match="qp_attr.qpkey"):
        v.QPAttr(qpkey=1)
    assert repr(v.QPCap()) == ("QPCap(max_send_wr=1, max_recv_wr=10, max_send_sge=1, "
                               "max_recv_sge=1, max_inline_data=0)")
    init = v.QPInitAttr()
    assert init.cap is not v.QPInitAttr().cap and init.cap.max_recv_wr == 10
