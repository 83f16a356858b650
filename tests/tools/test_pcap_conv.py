"""pcap-check's conversation checks (softrdma.tools.capture.pcap_conv, pcap_oob) and its output.

Every real capture passes (tests/tools/test_pcap_check.py); here each check is shown to fail,
at the expected frame, on captures rewritten from the real ones with softrdma's own
codecs (fields changed, ICRCs recomputed), among them the broken softrdma client of
issue 9 (its first SEND at the REQ's Starting PSN after a REP).
"""

from __future__ import annotations

import io
import os
import random
import re
import struct
import subprocess
import sys
import tracemalloc
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from harness.cm import Pair

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.ibcm import qpctl
from softrdma.ibcm.agent import ConnParams
from softrdma.tools.capture import pcap_check
from softrdma.tools.capture.pcap_conv import psn_delta
from softrdma.tools.ibverbs.pingpong import Dest as PpDest
from softrdma.tools.ibverbs.pingpong import encode_dest
from softrdma.tools.perftest.oob import Dest, encode_key
from softrdma.wire import cm as wcm
from softrdma.wire import ib, roce
from softrdma.wire.opcodes import OPTABLE
from softrdma.wire.pcap import PcapRecord, PcapWriter, read_pcap

CAPTURES = Path("/work/shared/captures")
CLIENT, SERVER = bytes([10, 50, 0, 12]), bytes([10, 50, 0, 11])
REQ_PSN, REP_PSN = 0xFFEF7C, 0xDFB32C  # roce_rping.pcap
Edit = Callable[[PcapRecord, roce.RoceFrame], bytes | None]


def _records(name: str) -> list[PcapRecord]:
    return list(read_pcap(CAPTURES / name))


def rebuild(f: roce.RoceFrame, **changes: object) -> bytes:
    """The frame with its transport fields changed and its ICRC recomputed (IBA 7.8.1, Annex A17; ../shared/specs/roce.md §2)."""
    p = f.packet
    for k, val in changes.items():
        setattr(p, k, val)
    body = ib.encode(p)
    return f.l2 + f.ip + f.udp + body + roce.icrc(f.ip, f.udp, (body,)) + f.trailer


def write(path: Path, recs: Iterable[PcapRecord], edit: Edit | None = None) -> Path:
    """Write ``recs`` (renumbered from 1), each RoCE frame passed through ``edit``
    (returning new bytes, or None to leave it)."""
    with PcapWriter(path) as w:
        for r in recs:
            data = r.data
            f = roce.parse_frame(r.data, r.linktype)
            if edit is not None and f is not None:
                data = edit(r, f) or data
            w.write(data, r.ts)
    return path


def check(path: Path, *, verbose: bool = False) -> tuple[int, list[str], list[str]]:
    out, err = io.StringIO(), io.StringIO()
    rc = pcap_check.run([str(path)], out, err=err, verbose=verbose, max_errors=0)
    strip = f"{path}: "
    return (rc, [x.removeprefix(strip) for x in out.getvalue().splitlines()],
            [x.removeprefix(strip) for x in err.getvalue().splitlines()])


def only(recs: list[PcapRecord], keep: Callable[[int], bool]) -> list[PcapRecord]:
    return [r for r in recs if keep(r.index)]


# ---- the broken client of issue 9 -----------------------------------------------------
def _shift_client(r: PcapRecord, f: roce.RoceFrame) -> bytes | None:
    """The client sends from the REQ's Starting PSN (its own) instead of the REP's; the
    server's ACKs follow it: a self-consistent conversation with the wrong first PSN."""
    p = f.packet
    if p.dqpn == 1:
        return None
    if (f.src_ip == CLIENT and p.info.is_request) or (f.src_ip == SERVER and p.info.is_response):
        return rebuild(f, psn=(p.psn - REP_PSN + REQ_PSN) % (1 << 24))
    return None


def test_broken_client_consistent_capture_fails_at_its_first_send(tmp_path: Path) -> None:
    path = write(tmp_path / "broken.pcap", _records("roce_rping.pcap"), _shift_client)
    rc, out, err = check(path)
    assert rc == 1
    assert err[0] == (
        "frame 4: 10.50.0.12 QP 0x19 -> 10.50.0.11 QP 0x19: first request PSN 0xffef7c is not "
        "the Starting PSN 0xdfb32c announced in the REP (frame 2); RC_ACKNOWLEDGE (frame 5, "
        "MSN 1) counts 0 messages in them, at least 1 needed")
    assert len(err) == 1  # the other direction is fine
    assert out == ["65 packets, 65 ok, 0 failed",
                   "1 connection followed, 1 inconsistent (the first at frame 4)"]


def test_broken_client_as_rxe_answers_fails_at_its_first_send(tmp_path: Path) -> None:
    """What the live run showed: rxe answers the SEND with a duplicate ACK."""
    def edit(r: PcapRecord, f: roce.RoceFrame) -> bytes | None:
        if r.index == 4:
            return rebuild(f, psn=REQ_PSN)
        if r.index == 5:
            return rebuild(f, psn=REP_PSN - 1, msn=0)
        return None
    path = write(tmp_path / "live.pcap", _records("roce_rping.pcap")[:5], edit)
    rc, _, err = check(path)
    assert rc == 1 and len(err) == 1
    assert err[0].startswith("frame 4: 10.50.0.12 QP 0x19 -> 10.50.0.11 QP 0x19: first request "
                             "PSN 0xffef7c is not the Starting PSN 0xdfb32c announced in the REP "
                             "(frame 2); the peer answers with an ACK for PSN 0xdfb32b (frame 5)")


@pytest.mark.iba("12.6.8")
def test_broken_server_first_read_at_the_reps_psn(tmp_path: Path) -> None:
    """The old passive side: its first request (rping's READ) at its own REP's PSN."""
    def edit(r: PcapRecord, f: roce.RoceFrame) -> bytes | None:
        return rebuild(f, psn=REP_PSN) if r.index == 6 else None
    path = write(tmp_path / "srv.pcap", _records("roce_rping.pcap")[:7], edit)
    rc, _, err = check(path)
    assert rc == 1
    assert err == ["frame 6: 10.50.0.11 QP 0x19 -> 10.50.0.12 QP 0x19: first request PSN "
                   "0xdfb32c is not the Starting PSN 0xffef7c announced in the REQ (frame 1)"]


def test_the_real_rping_passes_and_shows_its_conversation() -> None:
    rc, out, err = check(CAPTURES / "roce_rping.pcap", verbose=True)
    assert rc == 0 and err == []
    assert out[0] == ("frame 1 0.000000 10.50.0.12 -> 10.50.0.11 UD_SEND_ONLY QPN 0x000001 PSN "
                      "0x000006 len 256 CM REQ comm 0xadf97548 QPN 0x19 Starting PSN 0xffef7c")
    assert "frame 5 0.025403 10.50.0.11 -> 10.50.0.12 RC_ACKNOWLEDGE QPN 0x000019 PSN 0xdfb32c " \
           "len 0 AETH ACK MSN 1" in out
    assert "frame 6 0.026907 10.50.0.11 -> 10.50.0.12 RC_RDMA_READ_REQUEST QPN 0x000019 PSN " \
           "0xffef7c len 0 RETH len 64" in out
    assert ("frame 2: note: 10.50.0.12 QP 0x19 <-> 10.50.0.11 QP 0x19: opened; requests from "
            "10.50.0.12 start at PSN 0xdfb32c (the REP (frame 2)), from 10.50.0.11 at 0xffef7c "
            "(the REQ (frame 1))") in out
    assert out[-3].endswith("closed (DREP)")
    packet_lines = [x for x in out if re.match(r"frame \d+ \d", x)]
    assert [int(x.split()[1]) for x in packet_lines] == list(range(1, 66))
    assert out[-2:] == ["65 packets, 65 ok, 0 failed", "1 connection followed, 0 inconsistent"]


# ---- gaps -----------------------------------------------------------------------------
def test_packets_tcpdump_dropped_are_explained_by_later_acks(tmp_path: Path) -> None:
    """Frames 10/11 (a client SEND and its ACK) missing: the next ACK's MSN counts it."""
    path = write(tmp_path / "drop.pcap", only(_records("roce_rping.pcap"),
                                              lambda i: i not in (10, 11)))
    rc, out, err = check(path, verbose=True)
    assert rc == 0 and err == []
    assert any("RC_ACKNOWLEDGE (MSN 3) accounts for 1 PSNs missing from the capture, from "
               "0xdfb32d (before frame 14)" in x for x in out)


def test_the_real_write_bw_gap_is_explained() -> None:
    rc, out, _ = check(CAPTURES / "roce_write_bw_rdmacm.pcap", verbose=True)
    assert rc == 0
    assert sum("accounts for" in x for x in out) == 10


@pytest.mark.iba("9.7.1", "9.7.2")
def test_a_skipped_psn_is_an_unexplained_gap(tmp_path: Path) -> None:
    """The client skips PSN 0xdfb32d; the server's ACKs follow, but their MSN gives it away."""
    def edit(r: PcapRecord, f: roce.RoceFrame) -> bytes | None:
        p = f.packet
        if r.index >= 10 and p.dqpn != 1 and ((f.src_ip == CLIENT and p.info.is_request) or
                                             (f.src_ip == SERVER and p.info.is_response)):
            return rebuild(f, psn=p.psn + 1)
        return None
    path = write(tmp_path / "skip.pcap", _records("roce_rping.pcap"), edit)
    rc, _, err = check(path)
    assert rc == 1
    assert err == ["frame 10: 10.50.0.12 QP 0x19 -> 10.50.0.11 QP 0x19: PSN 0xdfb32d..0xdfb32d "
                   "(1 PSNs) missing before this request; RC_ACKNOWLEDGE (frame 11, MSN 2) "
                   "counts 0 messages in them, at least 1 needed"]


@pytest.mark.iba("9.7.2")
def test_a_gap_nothing_acknowledges_is_reported_at_the_end(tmp_path: Path) -> None:
    recs = only(_records("roce_rping.pcap"), lambda i: i <= 9 or i == 16)
    path = write(tmp_path / "tail.pcap", recs)
    rc, _, err = check(path)
    assert rc == 1
    assert err == ["frame 10: 10.50.0.12 QP 0x19 -> 10.50.0.11 QP 0x19: PSN 0xdfb32d..0xdfb32d "
                   "(1 PSNs) missing before this request and no response accounts for them"]


def test_uc_gap_at_a_message_start_is_reported(tmp_path: Path) -> None:
    recs = _records("roce_uc_pingpong.pcap")
    first_uc = next(r.index for r in recs if (f := roce.parse_frame(r.data, r.linktype))
                    and f.packet.info.name == "UC_SEND_FIRST")
    path = write(tmp_path / "uc.pcap", only(recs, lambda i: i != first_uc))
    rc, _, err = check(path)
    assert rc == 0 and err == []  # a missing FIRST: the MIDDLE after it continues the message
    path = write(tmp_path / "uc2.pcap", only(recs, lambda i: not first_uc <= i < first_uc + 4))
    rc, _, err = check(path)
    assert rc == 1 and len(err) == 1
    # the client's next message (renumbered: 4 frames earlier) starts past the gap
    assert err[0].startswith(f"frame {first_uc + 4}: 10.50.0.12 QP 0x11 -> 10.50.0.11 QP 0x11: first "
                             "request PSN 0x51dfb7 is not the Starting PSN 0x51dfb3 announced in "
                             "its pingpong message (frame 6) (UC has no responses")


# ---- responses ------------------------------------------------------------------------
def test_ack_for_a_psn_never_sent(tmp_path: Path) -> None:
    def edit(r: PcapRecord, f: roce.RoceFrame) -> bytes | None:
        return rebuild(f, psn=REP_PSN + 5) if r.index == 5 else None
    path = write(tmp_path / "ack.pcap", _records("roce_rping.pcap"), edit)
    rc, _, err = check(path)
    assert rc == 1
    assert err == ["frame 5: 10.50.0.12 QP 0x19 -> 10.50.0.11 QP 0x19: ACK (RC_ACKNOWLEDGE) for "
                   "PSN 0xdfb331, which was never sent (sent: 0xdfb32c..0xdfb32c); the "
                   "requester sends PSN 0xdfb32d after it (frame 10)"]


def test_nak_for_a_psn_never_sent(tmp_path: Path) -> None:
    def edit(r: PcapRecord, f: roce.RoceFrame) -> bytes | None:
        if r.index == 11:
            return rebuild(f, psn=REP_PSN + 2, syndrome=ib.NAK_PSN_SEQ_ERR)
        return None
    path = write(tmp_path / "nak.pcap", _records("roce_rping.pcap"), edit)
    rc, _, err = check(path)
    assert rc == 1 and len(err) == 1
    assert err[0].startswith("frame 11: 10.50.0.12 QP 0x19 -> 10.50.0.11 QP 0x19: NAK "
                             "(RC_ACKNOWLEDGE) for PSN 0xdfb32e, which was never sent")


@pytest.mark.iba("9.7", "9.3.5")
def test_wrong_msn_without_a_gap(tmp_path: Path) -> None:
    def edit(r: PcapRecord, f: roce.RoceFrame) -> bytes | None:
        return rebuild(f, msn=7) if r.index == 9 else None
    path = write(tmp_path / "msn.pcap", _records("roce_rping.pcap"), edit)
    rc, _, err = check(path)
    assert rc == 1
    assert err == ["frame 9: 10.50.0.11 QP 0x19 -> 10.50.0.12 QP 0x19: RC_ACKNOWLEDGE MSN 7 for "
                   "PSN 0xffef7d: only 2 messages were sent"]


def test_read_response_without_a_read(tmp_path: Path) -> None:
    def edit(r: PcapRecord, f: roce.RoceFrame) -> bytes | None:
        return rebuild(f, psn=REQ_PSN + 1) if r.index == 7 else None
    path = write(tmp_path / "rr.pcap", _records("roce_rping.pcap")[:8], edit)
    rc, _, err = check(path)
    assert rc == 1
    assert err == ["frame 7: 10.50.0.11 QP 0x19 -> 10.50.0.12 QP 0x19: "
                   "RC_RDMA_READ_RESPONSE_ONLY PSN 0xffef7d answers no RDMA READ request; "
                   "the requester sends PSN 0xffef7d after it (frame 8)"]


@pytest.mark.iba("9.7.4.1.3")
def test_read_response_in_the_wrong_position(tmp_path: Path) -> None:
    recs = _records("roce_read_bw.pcap")
    def edit(r: PcapRecord, f: roce.RoceFrame) -> bytes | None:
        return rebuild(f, opcode=0x10, info=OPTABLE[0x10]) if r.index == 24 else None
    path = write(tmp_path / "pos.pcap", recs, edit)
    rc, _, err = check(path)
    assert rc == 1
    assert err == ["frame 24: 10.50.0.12 QP 0x14 -> 10.50.0.11 QP 0x14: "
                   "RC_RDMA_READ_RESPONSE_ONLY at offset 0 of the RDMA READ at 0xbe0d36 "
                   "(frame 20) of 4 packets"]


@pytest.mark.iba("9.7.4.1.3")
def test_request_inside_a_read(tmp_path: Path) -> None:
    def edit(r: PcapRecord, f: roce.RoceFrame) -> bytes | None:
        # 3 PSNs on: no PMTU makes 4096 bytes take 3 (2 would have meant a PMTU of 2048)
        return rebuild(f, psn=0xBE0D39) if r.index == 21 else None
    path = write(tmp_path / "in.pcap", _records("roce_read_bw.pcap"), edit)
    rc, _, err = check(path)
    assert rc == 1
    assert err[0] == ("frame 21: 10.50.0.12 QP 0x14 -> 10.50.0.11 QP 0x14: PSN 0xbe0d39 lies "
                      "inside the RDMA READ at 0xbe0d36 (frame 20: 4096 bytes take 1/2/4/8/16 PSNs)")


# ---- CM -------------------------------------------------------------------------------
@pytest.mark.parametrize("drop, frame, reason", [
    ({1, 2, 3}, 61, "CM: DREQ (comm IDs 0xadf97548/0x8de44cba) for no connection the capture "
                    "opened"),
    ({64}, 64, "CM: DREP on 10.50.0.12 QP 0x19 <-> 10.50.0.11 QP 0x19 without a DREQ from "
               "the peer"),
    ({1}, 1, "CM: REP (comm ID 0x8de44cba) answers no REQ (remote comm ID 0xadf97548)"),
])
def test_cm_inconsistencies(tmp_path: Path, drop: set[int], frame: int, reason: str) -> None:
    path = write(tmp_path / "cm.pcap", only(_records("roce_rping.pcap"), lambda i: i not in drop))
    rc, _, err = check(path)
    assert rc == 1
    assert err[0] == f"frame {frame}: {reason}"


@pytest.mark.iba("12.6.10")
def test_dreq_naming_the_wrong_qpn(tmp_path: Path) -> None:
    def edit(r: PcapRecord, f: roce.RoceFrame) -> bytes | None:
        if r.index != 64:
            return None
        mad = wcm.decode(f.packet.payload)
        msg = mad.msg
        assert isinstance(msg, wcm.Dreq)
        msg.remote_qpn_eecn = 0x77
        return rebuild(f, payload=memoryview(wcm.encode(msg, hdr=mad.hdr)))
    path = write(tmp_path / "dreq.pcap", _records("roce_rping.pcap"), edit)
    rc, _, err = check(path)
    assert rc == 1
    assert err[0] == ("frame 64: CM: DREQ names QPN 0x77; 10.50.0.12 QP 0x19 <-> 10.50.0.11 "
                      "QP 0x19 has 0x19 there")


@pytest.mark.iba("12.9.8.3")
def test_simultaneous_dreqs_each_answered(tmp_path: Path) -> None:
    """Both ends disconnect at once (rdma_server and rdma_client against rxe in the lab):
    DREQ each way, then each side answers the other's DREQ with a DREP (IBA 12.9.8.3;
    Linux cm.c: a DREQ in IB_CM_DREQ_SENT gets a DREP). The connection closes cleanly."""
    recs = _records("roce_rping.pcap")
    by_index = {r.index: r for r in recs}

    def frame(index: int) -> roce.RoceFrame:
        r = by_index[index]
        f = roce.parse_frame(r.data, r.linktype)
        assert f is not None
        return f

    def with_msg(f: roce.RoceFrame, msg: wcm.CmMessage) -> bytes:
        return rebuild(f, payload=memoryview(wcm.encode(msg)))

    dreq_f, drep_f = frame(64), frame(65)  # DREQ A->B, DREP B->A
    dreq = wcm.decode(dreq_f.packet.payload).msg
    drep = wcm.decode(drep_f.packet.payload).msg
    assert isinstance(dreq, wcm.Dreq) and isinstance(drep, wcm.Drep)
    dreq_b = with_msg(drep_f, wcm.Dreq(local_comm_id=drep.local_comm_id,
                                       remote_comm_id=drep.remote_comm_id,
                                       remote_qpn_eecn=0x19))  # B's DREQ, to A's QP
    drep_a = with_msg(dreq_f, wcm.Drep(local_comm_id=dreq.local_comm_id,
                                       remote_comm_id=dreq.remote_comm_id))  # A answers it
    path = tmp_path / "dreqs.pcap"
    with PcapWriter(path) as w:
        for r in recs:
            if r.index == 65:  # DREQ A->B, DREQ B->A, DREP A->B, DREP B->A
                w.write(dreq_b, r.ts)
                w.write(drep_a, r.ts)
            w.write(r.data, r.ts)
    rc, out, err = check(path)
    assert rc == 0 and err == [], err
    assert out[-1] == "1 connection followed, 0 inconsistent"


# ---- the 18515 exchange -----------------------------------------------------------------
def test_pingpong_announcement_is_checked(tmp_path: Path) -> None:
    """The client announces PSN b5fb79 but sends from b5fb78 (TCP bytes edited in place:
    parse_tcp does not check TCP checksums)."""
    recs = _records("roce_rc_pingpong.pcap")
    out = []
    for r in recs:
        data = r.data.replace(b"0000:000011:b5fb78:", b"0000:000011:b5fb79:")
        out.append(PcapRecord(r.ts, r.linktype, data, r.orig_len, r.index))
    path = write(tmp_path / "pp.pcap", out)
    rc, _, err = check(path)
    assert rc == 1
    assert err == ["frame 13: 10.50.0.12 QP 0x11 -> 10.50.0.11 QP 0x11: first request PSN "
                   "0xb5fb78 is not the Starting PSN 0xb5fb79 announced in its pingpong message "
                   "(frame 4)"]


def test_perftest_and_pingpong_messages_are_followed() -> None:
    for name, n in (("roce_read_bw.pcap", 1), ("roce_send_bw.pcap", 1),
                    ("roce_rc_pingpong.pcap", 1), ("roce_ipv6_rc_pingpong.pcap", 1),
                    ("roce_uc_pingpong.pcap", 1), ("roce_ud_pingpong.pcap", 0)):
        rc, out, _ = check(CAPTURES / name)
        assert rc == 0
        assert (f"{n} connection followed, 0 inconsistent" in out) == (n == 1), name


@pytest.mark.iba("9.7.2")
def test_psn_delta_wraps() -> None:
    assert psn_delta(0, 0xFFFFFF) == 1 and psn_delta(0xFFFFFF, 0) == -1
    assert psn_delta(5, 5) == 0 and psn_delta(0x800000, 0) == -0x800000


# ---- output: stderr, --max-errors, memory ---------------------------------------------
def _bad_capture(path: Path, n: int) -> Path:
    good = next(r.data for r in _records("roce_rping.pcap") if r.index == 4)
    with PcapWriter(path) as w:
        for i in range(n):
            w.write(good[:40 + i % 20], ts=float(i))
    return path


def test_failures_on_stderr_summary_on_stdout(tmp_path: Path) -> None:
    path = _bad_capture(tmp_path / "bad.pcap", 30)
    env = dict(os.environ)
    res = subprocess.run([sys.executable, "-m", "softrdma", "pcap-check", "--max-errors", "5",
                          str(path)], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 1
    assert res.stdout.splitlines() == [f"{path}: 30 packets, 0 ok, 30 failed"]
    err = res.stderr.splitlines()
    assert len(err) == 6 and all(x.startswith(f"{path}: frame ") for x in err[:5])
    assert err[5] == f"{path}: 25 more failure lines not shown (--max-errors 5)"
    assert "Traceback" not in res.stderr


def test_memory_stays_flat_on_huge_bad_input(tmp_path: Path) -> None:
    small = _bad_capture(tmp_path / "small.pcap", 2_000)
    big = _bad_capture(tmp_path / "big.pcap", 40_000)
    peaks = []
    with open(os.devnull, "w") as sink:
        for path in (small, big):
            tracemalloc.start()
            rc = pcap_check.run([str(path)], sink, err=sink, max_errors=0)
            peaks.append(tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
            assert rc == 1
    assert peaks[1] < 1.5 * peaks[0] + 64 * 1024, peaks


# ---- softrdma's own traffic, with losses ---------------------------------------------
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_softrdma_cm_traffic_over_a_lossy_fabric_passes(tmp_path: Path, seed: int) -> None:
    """What the fabric delivers under loss, duplication and reordering (a capture with
    holes, retransmissions and duplicate ACKs, like a real one) is consistent."""
    acc = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_WRITE)
    p = Pair(seed=seed, drop=0.05, duplicate=0.05, reorder=0.05)
    path = tmp_path / "own.pcap"
    p.fab.capture(path)
    qb, cqb = p.b.qp()
    p.listen_accepting(0x4242, qb)
    qa, cqa = p.a.qp()
    cid = p.a.new_id()
    cid.connect(qa, ConnParams(0x4242, p.b.gid))
    p.run(5)
    assert qa.qp_state == qb.qp_state == int(e.IBV_QPS_RTS)
    ma, mb = v.MR(p.a.pd, 1 << 16, acc), v.MR(p.b.pd, 1 << 16, acc)
    done = 0
    for i in range(6):
        size = 700 + 1500 * i
        qb.post_recv(v.RecvWR(100 + i, 1, [v.SGE(mb.addr, 1 << 15, mb.lkey)]))
        qa.post_send(v.SendWR(i, None, 1, [v.SGE(ma.addr, size, ma.lkey)]))
        for j, op in enumerate((e.IBV_WR_RDMA_READ, e.IBV_WR_RDMA_WRITE)):
            wr = v.SendWR(10 * (j + 1) + i, None, 1, [v.SGE(ma.addr + (1 << 15), size, ma.lkey)],
                          opcode=int(op))
            wr.set_wr_rdma(mb.rkey, mb.addr + (1 << 15))
            qa.post_send(wr)
        p.run(20)
        for cq in (cqa, cqb):
            n, wcs = cq.poll(16)
            assert all(w.status == e.IBV_WC_SUCCESS for w in wcs), wcs
            done += n
    assert done == 6 * 4
    cid.disconnect()
    p.run(20)
    p.fab.stop_capture()
    rc, out, err = check(path)
    assert rc == 0, err
    assert out[-1] == "1 connection followed, 0 inconsistent"
    assert p.fab.stats.dropped > 0


# ---- a synthetic perftest exchange (KEY_PRINT_FMT, no GID) split across segments -----
def _eth(ip_packet: bytes) -> bytes:
    return bytes(6) + bytes(5) + b"\x01" + b"\x08\x00" + ip_packet


def _tcp(src: bytes, dst: bytes, sport: int, dport: int, seq: int, data: bytes,
         flags: int = 0x18) -> bytes:
    hdr = struct.pack("!HHIIBBHHH", sport, dport, seq, 0, 5 << 4, flags, 65535, 0, 0)
    return _eth(roce.ipv4_header(src, dst, len(hdr) + len(data), proto=6) + hdr + data)


def _roce(src: bytes, dst: bytes, p: ib.IBPacket) -> bytes:
    body = ib.encode(p)
    ulen = 8 + len(body) + 4
    icrc = roce.udp_send_icrc(src, dst, 0xC000, 4791, [body])
    return _eth(roce.ipv4_header(src, dst, ulen) + roce.udp_header(0xC000, 4791, ulen)
                + body + icrc)


def _perftest_capture(path: Path, first_psn: int) -> Path:
    a, b = bytes([10, 1, 0, 1]), bytes([10, 1, 0, 2])
    ka = encode_key(Dest(0, 1, 0x21, 0x1000, 0x99, 0x5000), with_gid=False)
    kb = encode_key(Dest(0, 1, 0x22, 0x2000, 0x98, 0x6000), with_gid=False)
    assert len(ka) == 59
    frames = [
        _tcp(a, b, 40000, 18515, 1, ka[:30]),          # the client's message, in two pieces
        _tcp(a, b, 40000, 18515, 31, ka[30:] + ka),    # ... and again (perftest repeats it)
        _tcp(b, a, 18515, 40000, 1, kb),
    ]
    w = ib.IBPacket(0x0A, psn=first_psn, dqpn=0x22, payload=b"x" * 64)
    w.dma_len, w.ackreq = 64, True
    ack = ib.IBPacket(0x11, psn=first_psn, dqpn=0x21)
    ack.syndrome, ack.msn = ib.AETH_CREDIT_INVALID, 1
    frames += [_roce(a, b, w), _roce(b, a, ack)]
    with PcapWriter(path) as wr:
        for i, fr in enumerate(frames):
            wr.write(fr, ts=float(i))
    return path


def test_perftest_exchange_without_gid(tmp_path: Path) -> None:
    rc, out, err = check(_perftest_capture(tmp_path / "ok.pcap", 0x1000), verbose=True)
    assert rc == 0 and err == []
    assert ("frame 3: note: 10.1.0.1 QP 0x21 <-> 10.1.0.2 QP 0x22: opened; requests from "
            "10.1.0.1 start at PSN 0x001000 (its perftest message (frame 2)), from 10.1.0.2 at "
            "0x002000 (its perftest message (frame 3))") in out
    assert out[-1] == "1 connection followed, 0 inconsistent"
    rc, _, err = check(_perftest_capture(tmp_path / "bad.pcap", 0x2000))
    assert rc == 1
    assert err == ["frame 4: 10.1.0.1 QP 0x21 -> 10.1.0.2 QP 0x22: first request PSN 0x002000 "
                   "is not the Starting PSN 0x001000 announced in its perftest message (frame 2); "
                   "RC_ACKNOWLEDGE (frame 5, MSN 1) counts 0 messages in them, at least 1 needed"]


# ---- softrdma with the old Starting PSN convention, on both sides -----------------------
def _softrdma_pair_capture(path: Path) -> tuple[int, int]:
    """A CM connection between two softrdma nodes and one SEND each way, captured; returns
    (REQ Starting PSN, REP Starting PSN)."""
    p = Pair(seed=11)
    p.fab.capture(path)
    qb, _ = p.b.qp()
    p.listen_accepting(0x4242, qb)
    qa, cqa = p.a.qp()
    cid = p.a.new_id()
    cid.connect(qa, ConnParams(0x4242, p.b.gid))
    p.run(1)
    ma, mb = (v.MR(n.pd, 4096, int(e.IBV_ACCESS_LOCAL_WRITE)) for n in (p.a, p.b))
    qb.post_recv(v.RecvWR(1, 1, [v.SGE(mb.addr, 4096, mb.lkey)]))
    qa.post_recv(v.RecvWR(2, 1, [v.SGE(ma.addr, 4096, ma.lkey)]))
    qa.post_send(v.SendWR(3, None, 1, [v.SGE(ma.addr, 16, ma.lkey)]))
    p.run(0.1)
    qb.post_send(v.SendWR(4, None, 1, [v.SGE(mb.addr, 16, mb.lkey)]))
    p.run(0.1)
    n, wcs = cqa.poll(4)
    assert n == 2 and all(w.status == e.IBV_WC_SUCCESS for w in wcs)  # the data went through
    cid.disconnect()
    p.run(1)
    p.fab.stop_capture()
    (req,), (rep,) = p.sent(wcm.CmAttr.REQ), p.sent(wcm.CmAttr.REP)
    return req.starting_psn, rep.starting_psn


def test_softrdma_pair_passes(tmp_path: Path) -> None:
    path = tmp_path / "pair.pcap"
    _softrdma_pair_capture(path)
    rc, out, err = check(path)
    assert rc == 0 and err == [] and out[-1] == "1 connection followed, 0 inconsistent"


@pytest.mark.iba("12.6.5", "12.6.8")
def test_softrdma_pair_with_the_old_convention_is_caught(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 9: softrdma-to-softrdma runs worked with the old convention because both
    sides shared the mistake (each received at the peer's Starting PSN and sent from its
    own). Swap rq_psn and sq_psn in the CM's QP transitions back to that: the session
    still works, and pcap-check flags the active side's first SEND."""
    stash: dict[int, tuple[float, dict[str, object]]] = {}
    to_rtr, to_rts = qpctl.to_rtr, qpctl.to_rts

    def old_rtr(qp: object, now: float, **kw: object) -> None:
        stash[id(qp)] = (now, kw)  # done in old_rts, once the other PSN is known

    def old_rts(qp: object, now: float, **kw: object) -> None:
        rnow, rkw = stash.pop(id(qp))
        sq, rq = kw["sq_psn"], rkw["rq_psn"]
        to_rtr(qp, rnow, **{**rkw, "rq_psn": sq})  # type: ignore[arg-type]
        to_rts(qp, now, **{**kw, "sq_psn": rq})  # type: ignore[arg-type]

    monkeypatch.setattr(qpctl, "to_rtr", old_rtr)
    monkeypatch.setattr(qpctl, "to_rts", old_rts)
    path = tmp_path / "old.pcap"
    req_psn, rep_psn = _softrdma_pair_capture(path)
    rc, out, err = check(path)
    assert rc == 1
    first_send = next(r.index for r in read_pcap(path)
                      if (f := roce.parse_frame(r.data, r.linktype)) is not None
                      and f.packet.info.name == "RC_SEND_ONLY")
    assert len(err) == 2  # both directions
    assert err[0].startswith(f"frame {first_send}: 10.9.0.1 QP ") and (
        f"first request PSN {req_psn:#08x} is not the Starting PSN {rep_psn:#08x} announced "
        f"in the REP (frame 2)") in err[0]
    assert f"first request PSN {rep_psn:#08x} is not the Starting PSN {req_psn:#08x} " \
           f"announced in the REQ (frame 1)" in err[1]


@pytest.mark.parametrize("name", ["roce_read_bw.pcap", "roce_ud_pingpong.pcap",
                                  "roce_write_bw_rdmacm.pcap", "host_peer_roce.pcap"])
def test_verbose_prints_one_line_per_roce_packet(name: str) -> None:
    _, out, _ = check(CAPTURES / name, verbose=True)
    lines = [x for x in out if re.match(r"frame \d+ \d+\.\d{6} ", x)]
    want = [r.index for r in _records(name) if roce.parse_frame(r.data, r.linktype) is not None]
    assert [int(x.split()[1]) for x in lines] == want
    if name == "host_peer_roce.pcap":  # a PerfMgmt ClassPortInfo Get and its GetResp
        assert lines[0].endswith("UD_SEND_ONLY QPN 0x000001 PSN 0x000000 len 256 MAD class "
                                 "0x04 method 0x01 attr 0x0001")
        assert lines[-1].endswith("MAD class 0x04 method 0x81 attr 0x0001")
    if name == "roce_read_bw.pcap":
        assert any(x.endswith("RC_RDMA_READ_RESPONSE_FIRST QPN 0x000014 PSN 0xbe0d36 len 1024 "
                              "AETH ACK MSN 1") for x in lines)


def test_mutated_captures_never_crash(tmp_path: Path) -> None:
    """Dropped frames and random BTH/AETH/RETH/CM changes (ICRCs recomputed): pcap-check
    answers 0 or 1 with one line per finding, never a traceback."""
    rng = random.Random(9)
    names = ["roce_rping.pcap", "roce_read_bw.pcap", "roce_write_bw_rdmacm.pcap",
             "roce_uc_pingpong.pcap", "roce_ucmatose.pcap"]
    recs = {n: _records(n) for n in names}
    failed = 0

    def edit(r: PcapRecord, f: roce.RoceFrame) -> bytes | None:
        if rng.random() >= 0.05:
            return None
        p = f.packet
        field = rng.choice(["psn", "msn", "syndrome", "dqpn", "dma_len", "payload"])
        if field == "psn":
            return rebuild(f, psn=(p.psn + rng.randint(-5, 5)) % (1 << 24))
        if field == "payload" and p.dqpn == 1:
            b = bytearray(p.payload)
            b[rng.randrange(24, len(b))] ^= 1 << rng.randrange(8)
            return rebuild(f, payload=memoryview(bytes(b)))
        if field in ("msn", "syndrome", "dqpn", "dma_len"):
            return rebuild(f, **{field: rng.randrange(1 << (8 if field == "syndrome" else 24))})
        return None

    for i in range(30):
        name = names[i % len(names)]
        path = write(tmp_path / f"m{i}.pcap", [r for r in recs[name] if rng.random() > 0.03],
                     edit)
        rc, out, err = check(path, verbose=i % 3 == 0)
        assert rc in (0, 1) and not any("Traceback" in x for x in out + err)
        assert all(re.match(r"frame \d+: ", x) for x in err), err
        failed += rc
    assert 0 < failed < 30  # the mutations are seen, and not every one breaks a capture


def test_rocev1_pingpong_is_followed(tmp_path: Path) -> None:
    """RoCEv1 (EtherType 0x8915, a GRH with IPv4-mapped GIDs) after a pingpong exchange
    over TCP/IPv4: one node, one key, whichever header names it."""
    a, b = bytes([10, 1, 0, 1]), bytes([10, 1, 0, 2])
    ga, gb = bytes(10) + b"\xff\xff" + a, bytes(10) + b"\xff\xff" + b

    def v1(sgid: bytes, dgid: bytes, p: ib.IBPacket) -> bytes:
        body = ib.encode(p)
        grh = struct.pack("!IHBB", 6 << 28, len(body) + 4, 0x1B, 64) + sgid + dgid
        return bytes(12) + b"\x89\x15" + grh + body + roce.icrc_v1(grh, (body,))

    def capture(path: Path, psn: int) -> Path:
        s = ib.IBPacket(0x04, psn=psn, dqpn=0x32, payload=b"y" * 32)
        s.ackreq = True
        ack = ib.IBPacket(0x11, psn=psn, dqpn=0x31)
        ack.syndrome, ack.msn = ib.AETH_CREDIT_INVALID, 1
        frames = [_tcp(a, b, 40001, 18515, 1, encode_dest(PpDest(0, 0x31, 0x500, ga))),
                  _tcp(b, a, 18515, 40001, 1, encode_dest(PpDest(0, 0x32, 0x600, gb))),
                  v1(ga, gb, s), v1(gb, ga, ack)]
        with PcapWriter(path) as wr:
            for i, fr in enumerate(frames):
                wr.write(fr, ts=float(i))
        return path

    rc, out, err = check(capture(tmp_path / "v1.pcap", 0x500))
    assert rc == 0 and err == [] and out[-1] == "1 connection followed, 0 inconsistent"
    rc, _, err = check(capture(tmp_path / "v1bad.pcap", 0x501))
    assert rc == 1 and err[0].startswith("frame 3: 10.1.0.1 QP 0x31 -> 10.1.0.2 QP 0x32: first "
                                         "request PSN 0x000501 is not the Starting PSN "
                                         "0x000500 announced in its pingpong message (frame 1)")


# ---- capture loss at the end (issue 25) ----------------------------------------------------
#: Cut from roce_write_bw_rdmacm.pcap (Linux rxe, ib_write_bw over rdma_cm): frames 1-46,
#: 49, 54 and 286-289 of it. The second connection's first RDMA WRITE (PSN 0xd1e5f7..fa)
#: and its ACK are there; the second WRITE (0xd1e5fb..fe, frames 47/48/50/51) is not, but its
#: ACK (MSN 2, frame 48 here) is: what tcpdump does when it misses the last requests.
TAIL_LOSS = Path(__file__).parents[1] / "data" / "rxe_write_bw_tail_loss.pcap"
TAIL_ACK = 48


def test_requests_lost_at_the_end_of_the_capture_are_a_gap() -> None:
    rc, out, err = check(TAIL_LOSS, verbose=True)
    assert (rc, err) == (0, [])
    assert out[-2:] == ["52 packets, 52 ok, 0 failed", "2 connections followed, 0 inconsistent"]
    assert (f"frame {TAIL_ACK}: note: 10.50.0.12 QP 0x18 -> 10.50.0.11 QP 0x18: RC_ACKNOWLEDGE "
            "(MSN 2) accounts for 4 PSNs missing from the capture, from 0xd1e5fb (before "
            f"frame {TAIL_ACK})") in out


def _tail_edit(tmp_path: Path, edit: Edit, extra: Callable[[PcapRecord, roce.RoceFrame],
               bytes] | None = None) -> Path:
    """The tail-loss capture with ``edit`` applied, and ``extra(ack record, its frame)``
    written right after the ACK ahead."""
    path = tmp_path / "tail.pcap"
    with PcapWriter(path) as w:
        for r in read_pcap(TAIL_LOSS):
            f = roce.parse_frame(r.data, r.linktype)
            assert f is not None
            w.write(edit(r, f) or r.data, r.ts)
            if extra is not None and r.index == TAIL_ACK:
                w.write(extra(r, f), r.ts)
    return path


def test_an_ack_ahead_with_a_wrong_msn_is_still_reported(tmp_path: Path) -> None:
    path = _tail_edit(tmp_path, lambda r, f: rebuild(f, msn=9) if r.index == TAIL_ACK else None)
    rc, _, err = check(path)
    assert rc == 1
    assert err == [f"frame {TAIL_ACK}: 10.50.0.12 QP 0x18 -> 10.50.0.11 QP 0x18: RC_ACKNOWLEDGE "
                   "MSN 9 for PSN 0xd1e5fe: only 5 messages were sent"]


def test_a_request_after_the_ack_ahead_shows_it_acknowledged_a_psn_never_sent(
        tmp_path: Path) -> None:
    """The requester's next request is at the first PSN the ACK claimed: the ACK came
    before the requests, so it acknowledged what was never sent (no capture loss)."""
    first = next(r for r in read_pcap(TAIL_LOSS) if r.index == 43)  # WRITE_ONLY-sized FIRST
    ff = roce.parse_frame(first.data, first.linktype)
    assert ff is not None and ff.packet.psn == 0xd1e5f7
    path = _tail_edit(tmp_path, lambda r, f: None,
                      lambda r, f: rebuild(ff, psn=0xd1e5fb))
    rc, _, err = check(path)
    assert rc == 1
    assert err == [f"frame {TAIL_ACK}: 10.50.0.12 QP 0x18 -> 10.50.0.11 QP 0x18: ACK "
                   "(RC_ACKNOWLEDGE) for PSN 0xd1e5fe, which was never sent (sent: "
                   f"0xd1e5f7..0xd1e5fa); the requester sends PSN 0xd1e5fb after it (frame "
                   f"{TAIL_ACK + 1})"]


def test_a_nak_ahead_of_the_requests_is_reported_at_once(tmp_path: Path) -> None:
    path = _tail_edit(tmp_path, lambda r, f: rebuild(f, syndrome=ib.NAK_PSN_SEQ_ERR)
                      if r.index == TAIL_ACK else None)
    rc, _, err = check(path)
    assert rc == 1
    assert err == [f"frame {TAIL_ACK}: 10.50.0.12 QP 0x18 -> 10.50.0.11 QP 0x18: NAK "
                   "(RC_ACKNOWLEDGE) for PSN 0xd1e5fe, which was never sent (sent: "
                   "0xd1e5f7..0xd1e5fa)"]


#: Cut from roce_read_bw.pcap (Linux rxe, ib_read_bw over its TCP exchange): frames 1-20,
#: 24-31 and 202-223 of it: the first RDMA READ (PSN 0xbe0d36, 4 KiB) with its responses,
#: then the responses of the second READ (0xbe0d3a..3d, frames 25-28 here) whose request
#: (frame 21 of the original, and the two after it) the capture lost.
READ_TAIL_LOSS = Path(__file__).parents[1] / "data" / "rxe_read_bw_tail_loss.pcap"


def test_read_responses_of_a_read_lost_at_the_end_are_a_gap() -> None:
    rc, out, err = check(READ_TAIL_LOSS, verbose=True)
    assert (rc, err) == (0, [])
    assert out[-1] == "1 connection followed, 0 inconsistent"
    assert ("frame 25: note: 10.50.0.12 QP 0x14 -> 10.50.0.11 QP 0x14: "
            "RC_RDMA_READ_RESPONSE_FIRST (MSN 2) accounts for 1 PSNs missing from the "
            "capture, from 0xbe0d3a (before frame 25)") in out
