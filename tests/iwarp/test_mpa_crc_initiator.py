"""The per-device MPA CRC setting (``softrdma link ... mpa_crc on``, ``$SOFTRDMA_MPA_CRC``).

Like Linux siw's ``mpa_crc_required`` module parameter: a device with the setting on sets
C in the MPA Request it sends as initiator and in the Reply it sends as responder (even to
a Request without C), and CRC32c is then used in both directions (RFC 5044 §7.1: "CRC
MUST be used if peer requests it"). Two softrdma iWARP devices on ``lo`` talk over real
TCP with the setting on one side, the other, both or neither; each side's capture
(``Context(pcap=)``) is checked with tshark's MPA dissector, which verifies each FPDU's
CRC32c once it has seen a Request/Reply with C ("Good CRC32"; ../shared/specs/tshark.md;
this tshark has no ``mpa.crc`` preference), and with ``softrdma pcap-check``.
"""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.ports import free_port
from harness.tshark import TSHARK, tshark

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.cm import iwconnect
from softrdma.drivers.host.registry import DeviceRecord, Registry
from softrdma.errors import DeviceError, InvalidArgument
from softrdma.iwarp.mpa_setup import (
    MPA_CRC_ENV,
    MpaConfig,
    device_mpa_crc,
    parse_on_off,
    with_device_crc,
)
from softrdma.tools.admin.link import cmd_link
from softrdma.tools.capture import pcap_check

ALL = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ)
SIZES = (0, 100, 5000, 70000)
ON, OFF = "iwcrc_on", "iwcrc_off"


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    d = tmp_path / "state"
    monkeypatch.setenv("SOFTRDMA_STATE_DIR", str(d))
    monkeypatch.delenv(MPA_CRC_ENV, raising=False)
    monkeypatch.delenv("SOFTRDMA_PCAP", raising=False)
    reg = Registry(d)
    reg.add(ON, "lo", "iwarp", 5301, mpa_crc=True)
    reg.add(OFF, "lo", "iwarp", 5302)
    yield d


def _session(init_dev: str, resp_dev: str, tmp: Path) -> tuple[bool, bool, Path, Path]:
    """Connect a QP of ``init_dev`` (initiator) to one of ``resp_dev`` with the default
    :class:`MpaConfig` on both (no CRC asked by the application), send :data:`SIZES` each
    way; returns both sides' negotiated CRC and their captures."""
    port = free_port()
    caps = (tmp / "init.pcap", tmp / "resp.pcap")
    ctx_i = v.Context(init_dev, pcap=caps[0])
    ctx_r = v.Context(resp_dev, pcap=caps[1])
    try:
        sides = []
        for ctx in (ctx_i, ctx_r):
            pd = v.PD(ctx)
            cq = v.CQ(ctx, 64)
            qp = v.QP(pd, v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq,
                                       cap=v.QPCap(8, 8, 1, 1)))
            sides.append((qp, cq, v.MR(pd, 1 << 18, ALL)))
        lst = iwconnect.listen(ctx_r, port)
        got: list[iwconnect.Connection] = []
        t = threading.Thread(target=lambda: got.append(lst.accept(sides[1][0], b"srv")))
        t.start()
        conn = iwconnect.connect(sides[0][0], "127.0.0.1", port, b"cli")
        t.join(30)
        assert got, "the responder did not accept"
        for src, dst in ((0, 1), (1, 0)):
            for size in SIZES:
                qd, cqd, mrd = sides[dst]
                qs, cqs, mrs = sides[src]
                qd.post_recv(v.RecvWR(1, 1, [v.SGE(mrd.addr, 1 << 17, mrd.lkey)]))
                qs.post_send(v.SendWR(2, None, 1, [v.SGE(mrs.addr + (1 << 17), size,
                                                         mrs.lkey)]))
                for cq in (cqs, cqd):
                    end = time.monotonic() + 30
                    n = 0
                    while not n and time.monotonic() < end:
                        n, wcs = cq.poll(1)
                    assert n == 1 and wcs[0].status == e.IBV_WC_SUCCESS
        crc_i, crc_r = conn.negotiated.crc, got[0].negotiated.crc
        conn.disconnect()
        lst.close()
        time.sleep(0.3)
    finally:
        ctx_i.close()
        ctx_r.close()
    return crc_i, crc_r, caps[0], caps[1]


def _check_capture(path: Path, crc: bool) -> None:
    out = io.StringIO()
    assert pcap_check.run([str(path)], out) == 0, out.getvalue()
    assert ", 0 failed" in out.getvalue().splitlines()[-1]
    if TSHARK is None:
        return
    flags = tshark(path, "-Y", "iwarp_mpa.req || iwarp_mpa.rep", "-T", "fields",
                    "-e", "iwarp_mpa.key.req", "-e", "iwarp_mpa.key.rep",
                    "-e", "iwarp_mpa.crc_flag").split("\n")
    frames = [ln.split("\t") for ln in flags if ln.strip()]
    assert len(frames) == 2, frames
    text = tshark(path, "-V")
    assert "Malformed" not in text and "Bad CRC" not in text
    # each FPDU's CRC check, by the TCP port that sent it: both directions carry it
    per_port = tshark(path, "-Y", "iwarp_mpa.fpdu", "-T", "fields", "-e", "tcp.srcport",
                       "-e", "iwarp_mpa.crc_check")
    rows = [ln.split("\t") for ln in per_port.splitlines() if ln.strip()]
    ports = {r[0] for r in rows}
    if len(ports) != 2:  # FPDUs went both ways; else say what the capture holds
        listing = tshark(path, "-T", "fields", "-e", "frame.number", "-e", "tcp.srcport",
                         "-e", "tcp.seq", "-e", "tcp.len", "-e", "_ws.col.Protocol",
                         "-e", "_ws.col.Info")
        pytest.fail(f"FPDUs by TCP port: {rows}; the frames of {path.name}:\n{listing}")
    if crc:
        assert text.count("(Good CRC32)") >= 2 * len(SIZES)
        for p in ports:
            assert all(r[1] for r in rows if r[0] == p), f"port {p} sent FPDUs without CRC"
    else:
        assert "CRC32" not in text
        assert not any(r[1] for r in rows)


@pytest.mark.parametrize(("init_dev", "resp_dev", "init_c", "crc"), [
    (ON, OFF, True, True),   # softrdma asks as the MPA initiator
    (OFF, ON, False, True),  # the responder's Reply sets C anyway (mpa_crc_required)
    (ON, ON, True, True),
    (OFF, OFF, False, False),
])
def test_device_setting_negotiates_crc_on_the_wire(tmp_path: Path, init_dev: str,
                                                   resp_dev: str, init_c: bool,
                                                   crc: bool) -> None:
    """The Request's C is the initiator's setting; the Reply's C says whether CRC is in
    use (RFC 5044 §7.1: set if either side asked), and the FPDUs follow it both ways."""
    crc_i, crc_r, cap_i, cap_r = _session(init_dev, resp_dev, tmp_path)
    assert (crc_i, crc_r) == (crc, crc)
    for cap in (cap_i, cap_r):
        _check_capture(cap, crc)
        if TSHARK is not None:
            rows = tshark(cap, "-Y", "iwarp_mpa.req || iwarp_mpa.rep", "-T", "fields",
                           "-e", "iwarp_mpa.crc_flag").split()
            assert [r in ("1", "True") for r in rows] == [init_c, crc], rows


def test_environment_overrides_the_device(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MPA_CRC_ENV, "1")  # Context(transport="iwarp") honours it
    crc_i, crc_r, cap_i, _ = _session(OFF, OFF, tmp_path)
    assert crc_i and crc_r
    _check_capture(cap_i, True)
    ctx = v.Context(transport="iwarp")
    try:
        assert ctx.mpa_crc is True
    finally:
        ctx.close()
    monkeypatch.setenv(MPA_CRC_ENV, "off")  # and turns an "on" device off
    ctx = v.Context(ON)
    try:
        assert ctx.mpa_crc is False
    finally:
        ctx.close()


def test_tool_honours_environment(tmp_path: Path) -> None:
    """``softrdma rping`` as the MPA initiator with ``SOFTRDMA_MPA_CRC=1`` against an
    rping server without it: CRC in both directions ($SOFTRDMA_PCAP captures the client)."""
    port = free_port()
    base = [sys.executable, "-m", "softrdma", "rping", "-a", "127.0.0.1", "-p", str(port),
            "-C", "3", "-S", "100", "--transport", "iwarp", "--timeout", "60"]
    env = dict(os.environ)
    srv = subprocess.Popen([*base, "-s"], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        cap = tmp_path / "rping.pcap"
        end = time.monotonic() + 60
        while time.monotonic() < end:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        cli = subprocess.run([*base, "-c", "-v"], env={**env, MPA_CRC_ENV: "1",
                                                       "SOFTRDMA_PCAP": str(cap)},
                             capture_output=True, text=True, timeout=120)
        assert cli.returncode == 0, cli.stdout + cli.stderr
        assert srv.wait(60) == 0
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait(10)
    _check_capture(cap, True)


def _link(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = cmd_link(list(args), stdout=out, stderr=err)
    return rc, out.getvalue(), err.getvalue()


def test_link_add_set_show(state: Path) -> None:
    assert _link("add", "s2", "type", "siw", "netdev", "lo", "port", "5303",
                 "mpa_crc", "on") == (0, "", "")
    rc, out, _ = _link("show", "s2", "-d")
    assert rc == 0 and out.rstrip().endswith("udp_port 5303 mpa_crc on")
    assert _link("set", "s2", "mpa_crc", "off") == (0, "", "")
    assert Registry(state).get("s2").mpa_crc is False
    assert _link("set", OFF, "mpa_crc", "on") == (0, "", "")
    assert Registry(state).get(OFF).mpa_crc is True
    rc, out, _ = _link("-d")
    assert "link softrdma_iw_lo/1" in out and out.count("mpa_crc") == 4  # iWARP lines only


@pytest.mark.parametrize(("args", "rc", "msg"), [
    (("add", "x", "netdev", "lo", "type", "siw", "port", "5304", "mpa_crc", "yes"), 2,
     "mpa_crc 'yes' is not on or off"),
    (("add", "x", "netdev", "lo", "mpa_crc", "on"), 2, "mpa_crc applies to an iwarp"),
    (("add", "x", "netdev", "lo", "type", "siw", "mpa_crc"), 2, "missing value"),
    (("set", ON, "mpa_crc", "2"), 2, "mpa_crc '2' is not on or off"),
    (("set", ON, "crc", "on"), 2, "set takes a device NAME and 'mpa_crc on|off'"),
    (("set", "nosuch", "mpa_crc", "on"), 1, "no such device"),
    (("set", "softrdma_lo", "mpa_crc", "on"), 1, "only an iwarp device"),
    (("set", "softrdma_iw_lo", "mpa_crc", "on"), 1, "SOFTRDMA_MPA_CRC=1"),
])
def test_link_bad_values(args: tuple[str, ...], rc: int, msg: str) -> None:
    got_rc, out, err = _link(*args)
    assert got_rc == rc and out == ""
    assert err.startswith("softrdma link: error: ") and msg in err and err.count("\n") == 1


def test_bad_environment_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MPA_CRC_ENV, "maybe")
    with pytest.raises(InvalidArgument) as exc:
        v.Context(transport="iwarp")
    assert exc.value.argument == MPA_CRC_ENV
    cp = subprocess.run([sys.executable, "-m", "softrdma", "devinfo", "-d", "softrdma_iw_lo"],
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode != 0 and "Traceback" not in cp.stderr
    assert cp.stderr.strip() == ("softrdma devinfo: error: SOFTRDMA_MPA_CRC: must be on or "
                                 "off (1 or 0), not 'maybe'")


def test_devinfo_shows_the_effective_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    def shown(dev: str) -> list[str]:
        cp = subprocess.run([sys.executable, "-m", "softrdma", "devinfo", "-d", dev, "-v"],
                            capture_output=True, text=True, timeout=60, check=True)
        return [ln.strip() for ln in cp.stdout.splitlines() if ln.strip().startswith("mpa_crc")]
    assert shown(ON) == ["mpa_crc:\t\t\ton"] and shown(OFF) == ["mpa_crc:\t\t\toff"]
    monkeypatch.setenv(MPA_CRC_ENV, "1")
    assert shown("softrdma_iw_lo") == ["mpa_crc:\t\t\ton"]


def test_registry_record_and_api_errors(state: Path) -> None:
    reg = Registry(state)
    assert reg.get(ON).to_json()["mpa_crc"] is True and "mpa_crc" not in reg.get(OFF).to_json()
    assert DeviceRecord.from_json(reg.get(ON).to_json()) == reg.get(ON)
    with pytest.raises(DeviceError):
        DeviceRecord.from_json({**reg.get(ON).to_json(), "mpa_crc": "on"})
    with pytest.raises(DeviceError):
        DeviceRecord.from_json({**reg.get(ON).to_json(), "type": "roce"})
    with pytest.raises(InvalidArgument) as exc:
        reg.add("r2", "lo", "roce", 4799, mpa_crc=True)
    assert exc.value.argument == "mpa_crc"
    with pytest.raises(InvalidArgument):
        reg.add("i2", "lo", "iwarp", 4799, mpa_crc=1)  # type: ignore[arg-type]


def test_config_plumbing() -> None:
    assert parse_on_off(" ON ", "x") and not parse_on_off("0", "x")
    with pytest.raises(InvalidArgument):
        parse_on_off("2", "x")
    assert device_mpa_crc(True, None) and device_mpa_crc(True, " ")
    assert not device_mpa_crc(True, "off") and device_mpa_crc(False, "yes")
    cfg = MpaConfig(ird=3)
    assert with_device_crc(cfg, False) is cfg
    assert with_device_crc(cfg, True) == MpaConfig(ird=3, crc=True)
