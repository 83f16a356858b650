"""The interop case matrix and each case's two command lines (pure data and strings).

A :class:`Case` names a Linux tool, the guest's RDMA link (``rxe``, upstream ``siw`` or
the CRC-forcing ``siw-crc``) and its parameters. A case with ``mpa_crc`` runs softrdma with
``SOFTRDMA_MPA_CRC=1`` (siw's ``mpa_crc_required``): as MPA initiator it sets C in its
Request, as responder in its Reply, so CRC32c is used both ways (RFC 5044 §7.1). It runs in both directions:
``softrdma-server`` (softrdma serves, the guest's tool connects) and ``softrdma-client``.
:func:`commands` gives the server and client command lines for one direction: the guest
side is rdma-core's / perftest's tool, the host side the softrdma tool with the same
flags (rdma-core conventions), plus the softrdma device and, where the tool has one,
``--timeout``.

A C case (:attr:`Case.capi`, named ``c/...``) runs the same stock binary on both sides:
in the guest on rxe/siw, on the host under ``softrdma run -d DEVICE --`` (issue 22), with
the host's device, GID index and addresses in place of the guest's.
"""

from __future__ import annotations

import fnmatch
import shlex
from dataclasses import dataclass

from ..errors import InvalidArgument

__all__ = [
    "Case", "Endpoint", "Commands", "DIRECTIONS", "all_cases", "smoke_cases", "select",
    "commands", "PERFTEST_ITERS", "PINGPONG_ITERS", "RPING_COUNT", "CM_COUNT", "MCKEY_COUNT",
    "MCKEY_GROUP", "MPA_CRC_ENV_WORDS", "CM_RETRY_ENV_WORDS", "capi_cases",
]

DIRECTIONS = ("softrdma-server", "softrdma-client")
PINGPONG_ITERS = 20
RPING_COUNT = 5
CM_COUNT = 5
PERFTEST_ITERS = 100
MTU = 1024  # rxe's active MTU: multi-packet messages above it
PINGPONG_SIZES = {"rc": (64, 4096, 8000), "uc": (64, 4096, 8000), "ud": (64, 512, 1024)}
RPING_SIZES = (64, 3000)
PERFTEST_PORT = 18515
PINGPONG_PORT = 18515
RPING_PORT = 7174
UCMATOSE_PORT = 7471
UDADDY_PORT = 7174
RDMA_EXAMPLE_PORT = 7471  # librdmacm examples/rdma_server.c, rdma_client.c
RSTREAM_PORT = 7471  # librdmacm examples/rstream.c
RSTREAM_SIZE = 65536  # 64 packets at rxe's MTU
# Over siw, 8 KiB: rstream's server closes right after its last send, which siw completed
# once TCP took it; if a message of the client's (rsockets' credit update) came in as it
# closed, siw resets the connection, and TCP drops what it had not sent yet: the client,
# short of its last transfer, never finishes. Between two Linux siw guests, with 64 KiB
# transfers 7 of 13 runs hung so (the server's stream cut short, an RST and no FIN), with
# 8 KiB none of 8: the last transfer is then sent at once, within TCP's first window.
RSTREAM_SIW_SIZE = 8192
RSTREAM_COUNT = 10  # transfers each way, every byte checked (rstream -T v)
MCKEY_GROUP = "239.1.2.3"  # an administratively scoped IPv4 group (RFC 2365)
MCKEY_COUNT = 5
SOFTRDMA_TOOL_TIMEOUT = 60  # softrdma's own give-up time (its --timeout) for a case
MPA_CRC_ENV_WORDS = ("env", "SOFTRDMA_MPA_CRC=1")  # iwarp.mpa_setup.MPA_CRC_ENV
#: a C perftest -R client on softrdma sends a REQ that finds no listener again for up to
#: 10 s (cm.rdma_retry.ENV): the guest's server listens again only after the handshake
CM_RETRY_ENV_WORDS = ("env", "SOFTRDMA_CM_RETRY_NO_LISTENER=10")


@dataclass(frozen=True, slots=True)
class Case:
    """One interop case (run in each of :data:`DIRECTIONS`).

    ``tool``: the Linux program (``ibv_rc_pingpong``, ``rping``, ``ib_write_bw`` ...);
    ``softrdma_tool``: the ``softrdma`` subcommand with the same role; ``fabric``: the
    guest's RDMA link; ``kind``: ``pingpong``, ``rping``, ``cm`` (ucmatose/udaddy), ``bw``
    or ``lat`` (perftest), ``example`` (librdmacm's ``rdma_server`` / ``rdma_client``: the
    server runs ``tool``, the client its ``_client`` twin) or ``mckey`` (the "server" is
    the receiver, the "client" the sender ``-s``, both joined to :data:`MCKEY_GROUP`) or
    ``rsocket`` (librdmacm's ``rstream``: rsockets over an RC connection, data checked);
    ``rdma_cm``: perftest's ``-R``; ``port``: the server's port; ``mpa_crc``: softrdma asks
    for the MPA CRC (iWARP; the tool part of the name ends in ``+mpa_crc``); ``capi``: the
    host runs ``tool`` itself under ``softrdma run`` (the name starts with ``c/``)."""

    tool: str
    softrdma_tool: str
    fabric: str
    kind: str
    size: int = 0
    rdma_cm: bool = False
    port: int = 0
    mpa_crc: bool = False
    capi: bool = False

    @property
    def retries_client(self) -> bool:
        """A C perftest ``-R`` case: its client may meet a server that does not listen yet
        and is then started again (see ``runner.client_retry``). Stock perftest against
        stock perftest has the same race; softrdma's own tools wait for the listener."""
        return self.capi and self.rdma_cm and self.kind in ("bw", "lat")

    @property
    def name(self) -> str:
        base = self.tool.removeprefix("ibv_").removeprefix("ib_")
        if self.rdma_cm and self.kind in ("bw", "lat"):
            base += "-R"
        if self.mpa_crc:
            base += "+mpa_crc"
        parts = [base, self.fabric]
        if self.size and self.kind in ("pingpong", "rping", "bw", "lat", "rsocket"):
            parts.append(f"s{self.size}")
        return "/".join((["c"] if self.capi else []) + parts)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where the two sides are: addresses, devices, the guest's RoCEv2 GID index."""

    guest_ip: str
    host_ip: str
    guest_gid: int = 1
    host_gid: int = 0
    roce_dev: str = "ilab"
    iwarp_dev: str = "iwlab"
    softrdma: str = "softrdma"  # the command that runs softrdma (e.g. "python -m softrdma")


@dataclass(frozen=True, slots=True)
class Commands:
    """One direction of a case: which side serves, and the two command lines."""

    server_on_guest: bool
    server: str
    client: str


def _pingpong(kind: str) -> list[Case]:
    tool = f"ibv_{kind}_pingpong"
    return [Case(tool, f"{kind}-pingpong", "rxe", "pingpong", size, port=PINGPONG_PORT)
            for size in PINGPONG_SIZES[kind]]


_BW = ("write", "read", "send", "atomic")
_LAT = ("write", "send")


def _perftest(fabric: str, rdma_cm: bool) -> list[Case]:
    out: list[Case] = []
    for op in _BW:
        if fabric != "rxe" and op == "atomic":
            continue  # siw has no atomics (IWARP has none: RFC 5040 defines none)
        out.append(Case(f"ib_{op}_bw", f"{op}-bw", fabric, "bw",
                        0 if op == "atomic" else 4096, rdma_cm, PERFTEST_PORT))
    out.extend(Case(f"ib_{op}_lat", f"{op}-lat", fabric, "lat", 64, rdma_cm, PERFTEST_PORT)
               for op in _LAT)
    return out


def all_cases() -> list[Case]:
    """Every case, grouped by the guest link they need (rxe first, then siw, siw-crc)."""
    cases: list[Case] = []
    for kind in ("rc", "uc", "ud"):
        cases.extend(_pingpong(kind))
    capi = capi_cases()
    cases.extend(Case("rping", "rping", "rxe", "rping", s, port=RPING_PORT)
                 for s in RPING_SIZES)
    cases.append(Case("ucmatose", "ucmatose", "rxe", "cm", port=UCMATOSE_PORT))
    cases.append(Case("udaddy", "udaddy", "rxe", "cm", port=UDADDY_PORT))
    cases.append(Case("rdma_server", "rdma-server", "rxe", "example", port=RDMA_EXAMPLE_PORT))
    cases.append(Case("mckey", "mckey", "rxe", "mckey"))
    cases.extend(_perftest("rxe", False))
    cases.extend(_perftest("rxe", True))
    cases.extend(c for c in capi if c.fabric == "rxe")
    cases.extend(Case("rping", "rping", "siw", "rping", s, port=RPING_PORT)
                 for s in RPING_SIZES)
    cases.extend(_perftest("siw", True))
    cases.extend(c for c in capi if c.fabric == "siw")
    # softrdma asks for CRC: plain siw (mpa_crc_required off) follows the C bit it is sent
    cases.extend(Case("rping", "rping", "siw", "rping", s, port=RPING_PORT, mpa_crc=True)
                 for s in RPING_SIZES)
    cases.append(Case("ib_write_bw", "write-bw", "siw", "bw", 4096, True, PERFTEST_PORT,
                      mpa_crc=True))
    cases.extend(Case("rping", "rping", "siw-crc", "rping", s, port=RPING_PORT)
                 for s in RPING_SIZES)
    cases.append(Case("rping", "rping", "siw-crc", "rping", RPING_SIZES[0], port=RPING_PORT,
                      mpa_crc=True))
    return cases


def capi_cases() -> list[Case]:
    """The C cases (issue 22): rdma-core's pingpongs, rping, ucmatose, udaddy, rdma_server,
    rdma_xserver (RC), mckey, rstream and perftest's tools (plain and ``-R``) over rxe;
    rping, rstream and ``ib_write_bw -R`` over siw. The host side is the same binary
    under ``softrdma run``."""
    run = "run"
    cases = [Case(f"ibv_{k}_pingpong", run, "rxe", "pingpong", s, port=PINGPONG_PORT,
                  capi=True)
             for k, s in (("rc", 4096), ("uc", 4096), ("ud", 512), ("srq", 4096))]
    cases.append(Case("rping", run, "rxe", "rping", 64, port=RPING_PORT, capi=True))
    cases.append(Case("ucmatose", run, "rxe", "cm", port=UCMATOSE_PORT, capi=True))
    cases.append(Case("udaddy", run, "rxe", "cm", port=UDADDY_PORT, capi=True))
    cases.extend(Case(f"ib_{op}_bw", run, "rxe", "bw", 4096, cm, PERFTEST_PORT, capi=True)
                 for cm in (False, True) for op in ("write", "read", "send"))
    cases.append(Case("rdma_server", run, "rxe", "example", port=RDMA_EXAMPLE_PORT,
                      capi=True))
    # RC mode: the client sends 16 bytes inline on a QP made with max_inline_data 0
    cases.append(Case("rdma_xserver", run, "rxe", "example", port=RDMA_EXAMPLE_PORT,
                      capi=True))
    cases.append(Case("mckey", run, "rxe", "mckey", capi=True))
    cases.append(Case("ib_atomic_bw", run, "rxe", "bw", 0, False, PERFTEST_PORT, capi=True))
    cases.extend(Case(f"ib_{op}_lat", run, "rxe", "lat", 0 if op == "atomic" else 64, False,
                      PERFTEST_PORT, capi=True)
                 for op in ("write", "read", "send", "atomic"))
    cases.append(Case("rstream", run, "rxe", "rsocket", RSTREAM_SIZE, port=RSTREAM_PORT,
                      capi=True))
    cases.append(Case("rping", run, "siw", "rping", 64, port=RPING_PORT, capi=True))
    cases.append(Case("ib_write_bw", run, "siw", "bw", 4096, True, PERFTEST_PORT,
                      capi=True))
    cases.append(Case("rstream", run, "siw", "rsocket", RSTREAM_SIW_SIZE, port=RSTREAM_PORT,
                      capi=True))
    return cases


def smoke_cases() -> list[Case]:
    """The CI subset (issue: rc_pingpong, rping over rxe and over siw, both directions),
    plus rping over the CRC-forcing siw."""
    return [Case("ibv_rc_pingpong", "rc-pingpong", "rxe", "pingpong", 4096,
                 port=PINGPONG_PORT),
            Case("rping", "rping", "rxe", "rping", 64, port=RPING_PORT),
            Case("rping", "rping", "siw", "rping", 64, port=RPING_PORT),
            Case("rping", "rping", "siw-crc", "rping", 64, port=RPING_PORT)]


def select(cases: list[Case], pattern: str | None) -> list[Case]:
    """The cases whose name matches any comma-separated shell pattern (a bare word that
    is a case's whole name selects that case alone, as ``rc_pingpong/rxe/s4096`` does not
    also select ``c/rc_pingpong/rxe/s4096``; another bare word matches as ``*word*``)."""
    if not pattern:
        return list(cases)
    names = {c.name for c in cases}
    pats = [p.strip() for p in pattern.split(",") if p.strip()]
    pats = [p if any(ch in p for ch in "*?[") or p in names else f"*{p}*" for p in pats]
    return [c for c in cases if any(fnmatch.fnmatchcase(c.name, p) for p in pats)]


def _join(words: list[str]) -> str:
    return " ".join(shlex.quote(w) for w in words)


def _guest_words(case: Case, ep: Endpoint, server: bool) -> list[str]:
    dev = "rxe0" if case.fabric == "rxe" else "siw0"
    return _tool_words(case, dev, ep.guest_gid, ep.guest_ip, ep.host_ip, server)


def _tool_words(case: Case, dev: str, gid: int, own_ip: str, peer_ip: str,
                server: bool) -> list[str]:
    """The Linux tool's command line on the side with device ``dev`` (GID index ``gid``)
    and address ``own_ip``, its peer at ``peer_ip``."""
    peer = [] if server else [peer_ip]
    if case.kind == "pingpong":
        w = [case.tool, "-d", dev, "-g", str(gid), "-n", str(PINGPONG_ITERS),
             "-s", str(case.size), "-c"]
        if case.tool != "ibv_ud_pingpong":
            w += ["-m", str(MTU)]
        return w + peer
    if case.kind == "rping":
        return ["rping", "-s" if server else "-c", "-a", own_ip if server else peer_ip,
                "-v", "-V", "-C", str(RPING_COUNT), "-S", str(case.size)]
    if case.kind == "cm":
        side = ["-b", own_ip] if server else ["-s", peer_ip]
        return [case.tool, *side, "-C", str(CM_COUNT)]
    if case.kind == "example":
        tool = case.tool if server else case.tool.replace("server", "client")
        if server and tool == "rdma_xserver":  # it listens on every address, no -s
            return [tool, "-p", str(case.port)]
        return [tool, "-s", own_ip if server else peer_ip, "-p", str(case.port)]
    if case.kind == "mckey":
        return ["mckey", "-m", MCKEY_GROUP, "-b", own_ip, "-C", str(MCKEY_COUNT),
                *([] if server else ["-s"])]
    if case.kind == "rsocket":
        side = ["-b", own_ip] if server else ["-s", peer_ip]
        return [case.tool, *side, "-p", str(case.port), "-T", "v", "-S", str(case.size),
                "-C", str(RSTREAM_COUNT)]
    return _perftest_words(case, case.tool, dev, gid, PERFTEST_ITERS) + peer


def _perftest_words(case: Case, prog: str, dev: str, gid: int, iters: int) -> list[str]:
    w = [prog, "-d", dev]
    if case.fabric == "rxe":
        w += ["-x", str(gid)]
    if case.rdma_cm:
        w.append("-R")
    w += ["-F", "-n", str(iters)]
    if case.size and case.kind == "bw":
        w += ["-s", str(case.size)]
    elif case.kind == "lat" and case.size:  # atomics: 8 bytes, perftest's own choice
        w += ["-s", str(case.size)]
    return w


def _softrdma_words(case: Case, ep: Endpoint, server: bool) -> list[str]:
    base = (list(MPA_CRC_ENV_WORDS) if case.mpa_crc else []) + shlex.split(ep.softrdma)
    if case.retries_client and not server:
        base = list(CM_RETRY_ENV_WORDS) + base
    iwarp = case.fabric != "rxe"
    dev = ep.iwarp_dev if iwarp else ep.roce_dev
    if case.capi:  # the stock binary itself, on softrdma's device (issue 22)
        return base + ["run", "-d", dev, "--"] + _tool_words(
            case, dev, ep.host_gid, ep.host_ip, ep.guest_ip, server)
    peer = [] if server else [ep.guest_ip]
    if case.kind == "pingpong":
        w = [case.softrdma_tool, "-d", dev, "-g", str(ep.host_gid), "-n", str(PINGPONG_ITERS),
             "-s", str(case.size), "-c", "--timeout", str(SOFTRDMA_TOOL_TIMEOUT)]
        if case.softrdma_tool != "ud-pingpong":
            w += ["-m", str(MTU)]
        return base + w + peer
    if case.kind == "rping":
        return base + ["rping", "-s" if server else "-c",
                       "-a", ep.host_ip if server else ep.guest_ip,
                       "-v", "-V", "-C", str(RPING_COUNT), "-S", str(case.size),
                       "--transport", "iwarp" if iwarp else "roce", "--device", dev,
                       "--timeout", str(SOFTRDMA_TOOL_TIMEOUT)]
    if case.kind == "cm":
        side = ["-b", ep.host_ip] if server else ["-s", ep.guest_ip]
        return base + [case.softrdma_tool, *side, "-C", str(CM_COUNT), "--device", dev,
                       "--timeout", str(SOFTRDMA_TOOL_TIMEOUT)]
    if case.kind == "example":
        tool = case.softrdma_tool if server else case.softrdma_tool.replace("server", "client")
        return base + [tool, "-s", ep.host_ip if server else ep.guest_ip, "-p", str(case.port),
                       "--device", dev, "--timeout", str(SOFTRDMA_TOOL_TIMEOUT)]
    if case.kind == "mckey":
        return base + ["mckey", "-m", MCKEY_GROUP, "-b", ep.host_ip, "-C", str(MCKEY_COUNT),
                       *([] if server else ["-s"]), "--device", dev,
                       "--timeout", str(SOFTRDMA_TOOL_TIMEOUT)]
    w = _perftest_words(case, case.softrdma_tool, dev, ep.host_gid, PERFTEST_ITERS)
    if iwarp:
        w += ["--transport", "iwarp"]
    return base + w + ["--timeout", str(SOFTRDMA_TOOL_TIMEOUT)] + peer


def commands(case: Case, direction: str, ep: Endpoint) -> Commands:
    """The server and client command lines of ``case`` in ``direction``."""
    if direction not in DIRECTIONS:
        raise InvalidArgument("direction", f"must be one of {DIRECTIONS}, not {direction!r}")
    if direction == "softrdma-client":
        return Commands(True, _join(_guest_words(case, ep, True)),
                        _join(_softrdma_words(case, ep, False)))
    return Commands(False, _join(_softrdma_words(case, ep, True)),
                    _join(_guest_words(case, ep, False)))
