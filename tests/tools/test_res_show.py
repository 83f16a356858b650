"""``softrdma res`` (issue 24 §3): every QP, CQ, MR and PD on a shared device across
processes, as ``rdma resource show`` prints them, and each QP's own counters
(``rdma statistic qp show``); per-QP counters in the engine. Traffic on 127.0.0.1."""

from __future__ import annotations

import errno
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from harness import device as device_harness
from harness.counters_pair import Pair
from harness.wait import wait_until

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.cm import rdma_cm as cm
from softrdma.drivers.devd.client import DevdLink
from softrdma.drivers.devd.daemon import Devd
from softrdma.drivers.devd.proto import OP_REPORT_RESOURCES, REP, REQ
from softrdma.drivers.host.registry import DeviceRecord
from softrdma.errors import InvalidArgument
from softrdma.ib.port import Port
from softrdma.ib.qp import EngineQP
from softrdma.tools.admin.res import format_lines
from softrdma.tools.cli import main

RC = int(e.IBV_QPT_RC)
ALL = int(e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_LOCAL_WRITE)


@pytest.fixture()
def shared_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    yield from device_harness.shared_device("restest", tmp_path, monkeypatch)


def _res_json(capsys: pytest.CaptureFixture[str], *words: str) -> list[dict[str, Any]]:
    assert main(["res", "-j", *words]) == 0
    got = json.loads(capsys.readouterr().out)
    assert isinstance(got, list)
    return got


def test_res_show_lists_every_object(shared_device: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    with v.Context(shared_device) as ctx:
        pd = v.PD(ctx)
        cq = v.CQ(ctx, 16)
        mr = v.MR(pd, 4096, ALL)
        qps = [v.QP(pd, v.QPInitAttr(RC, scq=cq, rcq=cq, cap=v.QPCap(4, 4, 1, 1)))
               for _ in range(2)]
        gid = ctx.query_gid(1, 0)
        for qp, peer in ((qps[0], qps[1]), (qps[1], qps[0])):
            at = v.QPAttr(path_mtu=e.IBV_MTU_1024, dest_qp_num=peer.qp_num, max_rd_atomic=1,
                          max_dest_rd_atomic=1, min_rnr_timer=1, timeout=14, retry_cnt=7,
                          rnr_retry=7, rq_psn=100, sq_psn=100)
            at.qp_access_flags = ALL
            at.ah_attr = v.AHAttr(gr=v.GlobalRoute(dgid=gid, hop_limit=64))
            qp.to_rts(at)
        qps[1].post_recv(v.RecvWR(1, 1, [v.SGE(mr.addr, 4096, mr.lkey)]))
        qps[0].post_send(v.SendWR(2, sg=[v.SGE(mr.addr, 64, mr.lkey)]))
        wcs: list[v.WC] = []

        def polled() -> bool:
            wcs.extend(cq.poll(4)[1])
            return len(wcs) >= 2

        wait_until(polled, 20.0, "both completions")
        assert all(w.status == e.IBV_WC_SUCCESS for w in wcs)
        a, b = qps[0].qp_num, qps[1].qp_num

        def listed() -> list[dict[str, Any]]:
            rows = _res_json(capsys, "show", "qp", "-d", shared_device)
            mine = {r["lqpn"]: r for r in rows if r["pid"] == os.getpid()}
            ok = (a in mine and mine[a].get("sq-psn") == 101 and b in mine
                  and mine[b].get("rq-psn") == 101)
            return rows if ok else []

        rows = wait_until(listed, 20.0, "both QPs in res show qp")
        by = {r["lqpn"]: r for r in rows}
        assert by[a]["rqpn"] == b and by[b]["rqpn"] == a
        assert by[a]["type"] == "RC" and by[a]["state"] == "RTS"
        assert by[b]["rq-psn"] == 101 and by[a]["path-mig-state"] == "MIGRATED"
        assert by[a]["ifname"] == shared_device and by[a]["port"] == 1
        assert by[a]["comm"] and by[a]["pdn"] == by[b]["pdn"]
        assert main(["res", "show", "qp", "-d", shared_device]) == 0
        text = capsys.readouterr().out
        assert (f"link {shared_device}/1 lqpn {a} rqpn {b} type RC state RTS rq-psn 100 "
                f"sq-psn 101 path-mig-state MIGRATED pdn {by[a]['pdn']} pid {os.getpid()} "
                "comm ") in text  # PD numbers count this process's PDs (earlier tests too)
        assert f"lqpn {b} rqpn {a} type RC state RTS rq-psn 101 sq-psn 100 " in text
        assert " dgid ::ffff:7f00:1\n" in text
        # the other kinds
        cqs = _res_json(capsys, "show", "cq", "-d", shared_device)
        # users as the kernel counts them: each QP uses the CQ as send and as receive CQ
        assert [c["users"] for c in cqs if c["pid"] == os.getpid()] == [4]
        assert any(c["cqe"] >= 16 for c in cqs)
        mrs = _res_json(capsys, "show", "mr", "-d", shared_device)
        assert [(m["lkey"], m["mrlen"]) for m in mrs] == [(mr.lkey, 4096)]
        pds = _res_json(capsys, "show", "pd", "-d", shared_device)
        assert len(pds) == 1 and pds[0]["users"] == 3  # two QPs and one MR
        summary = _res_json(capsys, "-d", shared_device)
        assert summary == [{"ifname": shared_device, "qp": 2, "cq": 1, "mr": 1, "pd": 1,
                            "cm_id": 0, "pids": 1}]
        # each QP's own counters: the SEND and its ACK
        stats = _res_json(capsys, "statistic", "qp", "-d", shared_device)
        sb = {r["lqpn"]: r for r in stats}
        assert sb[a]["qp-type"] == "RC" and sb[a]["sent_pkts"] >= 1
        assert sb[a]["retransmitted_pkts"] == 0 and sb[b]["sent_nak"] == 0
        # a destroyed QP leaves the list
        qps[0].close()
        wait_until(lambda: [
            r for r in _res_json(capsys, "show", "qp", "-d", shared_device)
            if r["lqpn"] != a] and not [
            r for r in _res_json(capsys, "show", "qp", "-d", shared_device)
            if r["lqpn"] == a], 20.0, "the destroyed QP gone")


def test_res_bad_arguments(shared_device: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["res", "show", "frob"]) == 1
    assert "error: object:" in capsys.readouterr().err
    assert main(["res", "show", "qp", "extra"]) == 1
    assert main(["res", "statistic", "mr"]) == 1
    assert main(["res", "-d", "nosuchdev"]) == 1
    err = capsys.readouterr().err
    assert err.count("softrdma res: error:") == 3 and "Traceback" not in err
    assert main(["res", "show", "qp", "-d", shared_device]) == 0  # no devd: nothing
    assert capsys.readouterr().out == ""


def test_devd_refuses_malformed_resource_reports(tmp_path: Path) -> None:
    d = Devd(DeviceRecord("res0", "lo", "roce", 0), tmp_path, idle_timeout=30.0,
             ips=["127.0.0.1"])
    d.start()
    t = threading.Thread(target=d.serve_forever, daemon=True)
    t.start()
    try:
        record = DeviceRecord("res0", "lo", "roce", d.udp_port)
        with DevdLink(record, state_dir=tmp_path, spawn=False, direct=False) as link:
            for bad in (b"{", b"[1]", b'{"qp": [1]}', b'{"qp": "x"}'):
                link._ctrl.send(REQ.pack(OP_REPORT_RESOURCES, 0, bytes(16)) + bad)
                assert REP.unpack_from(link._ctrl.recv(64))[1] == errno.EINVAL
            link.report_resources({"qp": [{"lqpn": 17}], "truncated": 0})
            got = link.resources()
            assert got == [{"pid": os.getpid(), "comm": got[0]["comm"], "uid": os.getuid(),
                            "objects": {"qp": [{"lqpn": 17}], "truncated": 0}}]
            with pytest.raises(InvalidArgument):
                link.report_resources({"qp": [{"x": "y" * 70000}]})
            # a forged report cannot add lines to `softrdma res show`
            link.report_resources({"qp": [{"lqpn": 5, "type": "RC\nlink x/1 lqpn 6"}]})
            lines = format_lines("res0", link.resources(), "qp")
            assert len(lines) == 1 and 'type "RC\\nlink x/1 lqpn 6"' in lines[0]
    finally:
        d.shutdown()
        t.join(10)
        assert not t.is_alive()


def test_qps_count_their_own_retransmissions_and_naks() -> None:
    p = Pair()
    try:
        p.fab.add_rule(lambda dg: dg.data[0] == 0x01, "drop", count=1)  # a SEND_MIDDLE
        p.send(3000)
        p.clock.run()
        qa, qb = (cast(EngineQP, side[1].engine) for side in p.sides)
        ca, cb = qa.counters.as_dict(), qb.counters.as_dict()
        assert ca["retransmitted_pkts"] == 2 and ca["rcvd_nak"] == 1
        assert ca["completer_retry"] == 1 and ca["sent_pkts"] == 5
        assert cb["out_of_seq_request"] == 1 and cb["sent_nak"] == 1
        assert cb["retransmitted_pkts"] == 0 and ca["sent_nak"] == 0
    finally:
        p.close()


def test_the_largest_snapshot_fits_a_report() -> None:
    """More objects than a report carries: the snapshot is cut at MAX_OBJECTS each, with
    the rest counted, and still fits one control record (else devd would get none)."""
    from softrdma.drivers.devd.proto import MAX_CTRL
    from softrdma.drivers.host.resources import MAX_OBJECTS, port_resources
    from softrdma.drivers.links.fabric import Fabric
    from softrdma.drivers.runtime.clock import VirtualClock

    fab = Fabric(VirtualClock())
    with v.Context(fabric=fab.link("10.5.0.1")) as ctx:
        pds = [v.PD(ctx) for _ in range(MAX_OBJECTS + 3)]
        cqs = [v.CQ(ctx, 4) for _ in range(MAX_OBJECTS + 3)]
        kept: list[object] = []
        for pd, cq in zip(pds, cqs, strict=True):
            kept.append(v.QP(pd, v.QPInitAttr(RC, scq=cq, rcq=cq, cap=v.QPCap(1, 1, 1, 1))))
            kept.append(v.MR(pd, 64, ALL))
        snap = port_resources(cast(Port, ctx.port))
        assert [len(snap[k]) for k in ("qp", "cq", "mr", "pd")] == [MAX_OBJECTS] * 4
        assert snap["truncated"] == 6
        for qp in snap["qp"]:  # the largest values each field can take
            qp.update({"lqpn": 0xFFFFFF, "rqpn": 0xFFFFFF, "rq-psn": 0xFFFFFF,
                       "sq-psn": 0xFFFFFF, "pdn": 1 << 32, "state": "UNKNOWN",
                       "dgid": "ffff:" * 7 + "ffff", "path-mig-state": "MIGRATED"})
            qp["counters"] = dict.fromkeys(qp["counters"], 1 << 40)
        assert REQ.size + len(json.dumps(snap, separators=(",", ":"))) <= MAX_CTRL


def test_xrc_qps_and_ib_port_space_ids_as_iproute2_names_them() -> None:
    """``res show qp`` names XRC QPs as iproute2's ``qp_types_to_str`` does (XRC_INI,
    XRC_TGT: the kernel's IB_QPT_* numbers), and ``res show cm_id`` an RDMA_PS_IB id's port
    space as its ``cm_id_ps_to_str`` does ("IPoIB", as for RDMA_PS_IPOIB)."""
    from softrdma import enums as e
    from softrdma.cm.rdma_res import _row
    from softrdma.drivers.host.resources import port_resources
    from softrdma.drivers.links.fabric import Fabric
    from softrdma.drivers.runtime.clock import VirtualClock

    fab = Fabric(VirtualClock())
    with v.Context(fabric=fab.link("10.5.0.1")) as ctx:
        pd, cq = v.PD(ctx), v.CQ(ctx, 4)
        ini = v.QP(pd, v.QPInitAttr(int(e.IBV_QPT_XRC_SEND), scq=cq, rcq=cq,
                                    cap=v.QPCap(1, 0, 1, 0)))
        tgt = v.QP(v.XRCD(ctx), v.QPInitAttr(int(e.IBV_QPT_XRC_RECV)))
        rc_qp = v.QP(pd, v.QPInitAttr(RC, scq=cq, rcq=cq, cap=v.QPCap(1, 1, 1, 1)))
        types = {q["lqpn"]: q["type"] for q in port_resources(cast(Port, ctx.port))["qp"]}
        assert types[ini.qp_num] == "XRC_INI" and types[tgt.qp_num] == "XRC_TGT"
        assert types[rc_qp.qp_num] == "RC"
        cid = cm.CmId(cm.EventChannel(), cm.RDMA_PS_IB, qp_type=int(e.IBV_QPT_XRC_SEND))
        cid.qp = ini
        row = _row(cid)
        assert (row["ps"], row["qp-type"], row["lqpn"]) == ("IPoIB", "XRC_INI", ini.qp_num)
        cid.qp = None
        cid.destroy()


def _cm_event(ch: cm.EventChannel, want: cm.RdmaCmEventType) -> cm.RdmaCmEvent:
    ev = ch.get_cm_event(timeout=30.0)
    assert ev is not None and ev.event == want, (ev, want)
    return ev


def test_res_show_cm_id(shared_device: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``res show cm_id`` (issue 24 §3): the listener, the client and the accepted id, with
    state, port space, QP and addresses, as ``rdma resource show cm_id``."""
    T = cm.RdmaCmEventType
    ch = cm.EventChannel()
    lst = cm.CmId(ch)
    lst.bind_addr(("127.0.0.1", 0), device=shared_device)
    lst.listen(4)
    assert lst.local_addr is not None
    port = lst.local_addr[1]
    cli_ch = cm.EventChannel()
    cli = cm.CmId(cli_ch)
    ids = [lst, cli]
    try:
        cli.resolve_addr(None, ("127.0.0.1", port), 2000, device=shared_device)
        _cm_event(cli_ch, T.ADDR_RESOLVED)
        cli.resolve_route(2000)
        _cm_event(cli_ch, T.ROUTE_RESOLVED)
        ccq = v.CQ(cli.verbs, 8)
        cli.create_qp(None, v.QPInitAttr(RC, scq=ccq, rcq=ccq, cap=v.QPCap(4, 4, 1, 1)))
        cli.connect(cm.ConnParam())
        req = _cm_event(ch, T.CONNECT_REQUEST)
        srv = req.id
        ids.append(srv)
        scq = v.CQ(srv.verbs, 8)
        srv.create_qp(None, v.QPInitAttr(RC, scq=scq, rcq=scq, cap=v.QPCap(4, 4, 1, 1)))
        srv.accept(cm.ConnParam())
        _cm_event(cli_ch, T.ESTABLISHED)
        _cm_event(ch, T.ESTABLISHED)
        me = os.getpid()

        def listed() -> list[dict[str, Any]]:
            # the process reports a snapshot now and then: one taken between the
            # CONNECT_REQUEST and the accepted id's create_qp shows that id in CONNECT
            # without a QP until the next report (seen beside 4 busy loops)
            rows = [r for r in _res_json(capsys, "show", "cm_id", "-d", shared_device)
                    if r["pid"] == me]
            states = sorted(r["state"] for r in rows)
            connected = [r for r in rows if r["state"] == "CONNECT"]
            whole = states == ["CONNECT", "CONNECT", "LISTEN"] and all(
                "lqpn" in r for r in connected)
            return rows if whole else []

        rows = wait_until(listed, 20.0, "the three ids in res show cm_id")
        by = {r["state"]: r for r in rows if r["state"] == "LISTEN"}
        listener = by["LISTEN"]
        assert listener["ifname"] == shared_device and listener["port"] == 1
        assert listener["ps"] == "TCP" and listener["src-addr"] == "127.0.0.1"
        assert listener["src-port"] == port and "dst-addr" not in listener
        assert "lqpn" not in listener and listener["comm"]
        conns = {r["lqpn"]: r for r in rows if r["state"] == "CONNECT"}
        assert set(conns) == {cli.qp.qp_num, srv.qp.qp_num}
        c, s_ = conns[cli.qp.qp_num], conns[srv.qp.qp_num]
        assert c["qp-type"] == "RC" and c["dst-addr"] == "127.0.0.1" and c["dst-port"] == port
        assert s_["src-port"] == port and s_["dst-port"] == c["src-port"]
        assert len({r["cm-idn"] for r in rows}) == 3
        assert main(["res", "show", "cm_id", "-d", shared_device]) == 0
        text = capsys.readouterr().out
        assert (f"link {shared_device}/1 lqpn {cli.qp.qp_num} qp-type RC state CONNECT "
                f"ps TCP pid {me} comm ") in text
        assert (f" src-addr 127.0.0.1:{c['src-port']} dst-addr 127.0.0.1:{port} "
                f"cm-idn {c['cm-idn']}\n") in text
        assert f"link {shared_device}/1 state LISTEN ps TCP pid {me} comm " in text
        summary = _res_json(capsys, "-d", shared_device)
        assert summary[0]["cm_id"] == 3
        # a disconnect shows, and destroyed ids leave the list
        cli.disconnect()
        wait_until(lambda: [r for r in _res_json(capsys, "show", "cm_id", "-d", shared_device)
                            if r["pid"] == me and r["state"] == "DISCONNECT"
                            and r.get("lqpn") == cli.qp.qp_num], 20.0, "DISCONNECT")
        for x in ids:
            x.destroy()
        wait_until(lambda: not [r for r in _res_json(capsys, "show", "cm_id", "-d",
                                                     shared_device) if r["pid"] == me],
                   20.0, "the destroyed ids gone")
    finally:
        for x in ids:
            x.destroy()
        cm.release_devices()
