"""The ``devd`` wire protocol: message layouts, constants, and the daemon's view of a client.

design.md "Devices shared by processes"; the daemon is :mod:`softrdma.drivers.devd.daemon`, its
client link :mod:`softrdma.drivers.devd.client`, the direct receive path
:mod:`softrdma.drivers.devd.reuseport`.
Protocol (all integers big-endian, every message one SEQPACKET record)
-----------------------------------------------------------------------

On accepting a control connection the daemon creates a SEQPACKET socket pair, sends the
client one end with ``SCM_RIGHTS`` inside the HELLO, and keeps the other: that is the
client's **data channel**. Control requests and replies never mix with data, so a
progress thread can drain data while another thread allocates QPNs.

``HELLO`` (daemon -> client, control, carries the data fd)::

    _HELLO "!4sHHIH": magic b"SRDV", version 1, udp_port, daemon pid, n_ips
    then n_ips x 16 bytes: the addresses the daemon listens on (IPv4 as ::ffff:a.b.c.d)

Requests (client -> daemon, control), one fixed-size record::

    _REQ "!BBxxI16s": op, seq, arg, mgid
      seq: the client's sequence number (1..255, cycling), echoed in the reply, so that
      a client that gave up waiting (its timeout ran out while devd was stalled) knows
      the late answer when it comes and drops it; 0: unsequenced (older clients)
      ALLOC_QPN    1  arg 0: any free QPN: a client on the direct path gets the next free
                         one of its slot's range (:func:`.reuseport.slot_range`), any other
                         client one allocated upwards from 0x11, wrapping, skipping
                         QPNs in use and the ranges of live slots; arg 1: register for QP1 (several clients may; QP1 MADs
                         go to all of them); other arg: that QPN if it is free
      FREE_QPN     2  arg = QPN (for QP1: drop one QP1 registration)
      ATTACH_MCAST 3  mgid = the 16-byte MGID (Annex A17: IPv4 group as ::ffff:a.b.c.d);
                      the first attachment makes the daemon join the IP group on its
                      socket of that family (EINVAL: not a multicast GID; EAFNOSUPPORT: no
                      address of that family; EADDRNOTAVAIL: the kernel refused the join)
      DETACH_MCAST 4  mgid (the last detachment leaves the IP group)
      STATS        5  (no argument)
      CM_SLOT      6  make this client a routed CM client (implies a QP1 registration) and
                      give it a slot byte 1..255, unique on the device, as the value: its
                      CM puts it in the top byte of its communication and SIDR request IDs
      CM_LISTEN    7  mgid = Service ID (8 bytes) + mask (8 bytes): REQs and SIDR_REQs
                      matching it go to this client (EADDRINUSE if another client has
                      the same Service ID and mask)
      CM_UNLISTEN  8  mgid as for CM_LISTEN
      REPORT       9  followed by JSON {name: value}: this client's port counters
                      (cumulative, :class:`softrdma.seam.counters.Counters`; each value
                      0 .. 2**64-1, else EINVAL); the daemon keeps
                      the last report of each client and adds it to the device's retired
                      total when the client leaves
      COUNTERS    10  (no argument): the device's port counters, aggregated
      JOIN        11  ask for the direct receive path (:mod:`.reuseport`): the reply, held
                      back while another client is between its JOIN and JOINED (binds
                      are serialised, so the daemon knows each socket's index in the
                      kernel's reuseport group), carries the client's QPN slot; EOPNOTSUPP:
                      the daemon has no reuseport group (refused by the kernel or disabled).
                      A client that does not send its JOINED within the daemon's
                      ``join_timeout`` loses its turn (its late JOINED is answered 0, a
                      later JOIN EOPNOTSUPP), so one stuck client cannot hold up every
                      other one
      JOINED      12  arg = the number of sockets the client bound with ``SO_REUSEPORT``
                      to the device's first address of each family, in HELLO order, passed
                      with ``SCM_RIGHTS`` (the daemon keeps a copy, so it decides when a
                      dead client's socket leaves the group); 0: the bind failed. The
                      reply's value is the slot, or 0: the client stays on the forwarded
                      path (``direct_refused``; also when the kernel's group holds a
                      socket the daemon does not know of, so its view of the order may
                      be wrong)
      REPORT_RESOURCES 13  followed by JSON: this client's objects on the device (QPs,
                      CQs, MRs, PDs, :func:`softrdma.drivers.host.resources.port_resources`);
                      the daemon keeps the last one while the client lives (EINVAL: not
                      a JSON object of lists of objects)
      RESOURCES   14  arg = i: the i-th live client's last REPORT_RESOURCES, followed by
                      JSON {"pid": P, "comm": NAME, "uid": U, "objects": {...}} (pid
                      and uid from ``SO_PEERCRED``, comm from ``/proc/P/comm``); the
                      value is the number of live clients; ENOENT: no client i
                      (``softrdma res show`` asks for 0, 1, ... one record each, so no
                      answer outgrows a control record)
      XRCD_OPEN   15  passes (``SCM_RIGHTS``) one descriptor of the file an XRC domain is
                      opened on (``ibv_open_xrcd`` with a file, Annex A14): the file's
                      device and inode name the domain across processes, as the kernel's
                      ``ib_uverbs_open_xrcd`` does; the value is the domain's id on this
                      device (the same for every client opening the same file), counted
                      per client (:mod:`.xrc`; EBADF: not a descriptor of a file)
      XRCD_CLOSE  16  arg = domain id: undo one XRCD_OPEN (ENOENT: not open here)
      XRC_SRQ     17  arg = SRQ number (a QPN this client owns), mgid = domain id
                      (4 bytes, then zeros): the client's XRC SRQ of that domain, to which
                      other clients of the domain hand SENDs (ENOENT: not the owner;
                      EACCES: the domain is not open here). Freeing the QPN forgets it
      XRC_LOOKUP  18  arg = SRQ number, mgid = domain id: 0 if another client of the
                      domain registered that SRQ (XRC_SRQ), else ENOENT (EACCES: the
                      domain is not open here)

A malformed control message (descriptors passed with any other request, a JOINED whose
count does not match its descriptors, or whose descriptors are not UDP sockets bound to
the device's port and address of their family, in HELLO order) closes that client's
connection, and the passed descriptors (``ctrl_malformed``); the daemon and its other
clients carry on. A request of the wrong size or an unknown op is answered EINVAL /
EOPNOTSUPP.

Replies (daemon -> client, control)::

    _REP "!BBHI": op and seq (echoed), errno (0 = success), value (the QPN for ALLOC_QPN,
    else 0; for STATS the number of counters, followed by that many "!Q" in the order
    of STAT_NAMES; for COUNTERS followed by JSON {"port": {...}, "devd": {...},
    "clients": N})

Port counters of a shared device (``softrdma stats``, ``Context.query_port_counters``):
each process counts its own packets in its engine and reports them to the daemon at
most every :data:`~softrdma.drivers.runtime.roce.REPORT_INTERVAL` seconds and when it closes;
the daemon's COUNTERS answer is the sum of the retired clients' totals, the live
clients' last reports, and the daemon's own drops (``unknown_qpn`` and ``closed_qpn`` ->
``rcvd_unknown_qp``, ``malformed`` -> ``rcvd_malformed``, ``client_full`` ->
``rcvd_no_buffer``, each also a received packet).

Data (daemon -> client, data channel): ``_DHDR`` followed by the UDP payload as
received (BTH .. ICRC)::

    _DHDR "!BBBBHH16s16s": ip version (4 or 6), tos, ttl, segment, sport, dport, src,
    dst (addresses as 16 bytes, IPv4 as ::ffff:a.b.c.d; segment: 1 + the index of the
    segment in a coalesced UDP GRO receive, whose IPv4 ID the ICRC check tries first,
    ``Datagram.ident``; 0: received alone)

XRC hand-over (data channel, both ways; :mod:`.xrc`): a record whose first byte is
:data:`XRC_RECORD` is ``XHDR`` then the payload of one SEND packet that an XRC TGT QP
took for an SRQ of another client of its domain (IBA 9.8.5, Annex A14)::

    XHDR "!BBHIIIII": XRC_RECORD, flags (``softrdma.ib.xrc.XF_*``: first, last, with
    immediate, with invalidate, solicited, abort, credit), 0, domain id, SRQ number, TGT
    QPN, source QPN (the INI QP), immediate data, the R_Key to invalidate or the credit

devd forwards it unchanged to the SRQ's owner when the sender has the domain open and
the SRQ is registered in it (a credit record: from the SRQ's owner to the TGT QPN's, in
the domain; ``xrc_forwarded``); else drops it (``xrc_refused``). A full channel keeps
records in order until it is writable (:mod:`.xrc`).

Delivery rules: DestQP 1 -> CM MADs are routed (below), other QP1 MADs go to every client
registered for QP1; DestQP 0xFFFFFF (multicast,
IBA 10.5) -> every client that attached the MGID equal to the datagram's destination GID
(Annex A17; as rxe_rcv_mcast_pkt); any other DestQP -> its owner. Datagrams shorter
than a BTH are counted ``malformed``; unknown DestQPs ``unknown_qpn``, or ``closed_qpn``
when the QPN was one of a QP destroyed lately (a peer's packets in flight at the end of a
conversation; ``qpn.CLOSED_KEPT``); a client whose
data channel is full loses the datagram (``client_full``), like a NIC that is out of
receive buffers. When a client disconnects (either channel), its QPNs, QP1
registrations and multicast attachments are freed.

CM MAD routing (QP1, management class 0x07; IBA 12.6, 13.4): a REQ or SIDR_REQ goes
to the client listening on its Service ID (most specific mask), a SIDR_REP to the client
whose slot is the top byte of its Request ID, any other CM message to the client whose
slot is the top byte of its Remote Communication ID. QP1 clients registered without a
slot (``ALLOC_QPN 1``) still receive every CM MAD nobody else claims. A REQ no one can
take (no listener, no unrouted client) is answered by the daemon itself: REJ reason 8,
Invalid Service ID (a SIDR_REQ: SIDR_REP status 1), as a CM without a listener would
(IBA 12.6.7, A11 CA11-8). A REJ whose slot is unknown (a Timeout REJ naming its target
by GUID) goes to every QP1 client.
"""

from __future__ import annotations

import array
import contextlib
import os
import socket
import struct
from dataclasses import dataclass, field
from pathlib import Path

from softrdma.drivers.host import netdev as _netdev
from softrdma.drivers.host.registry import state_dir as default_state_dir
from softrdma.drivers.links.link import ip_text

DEFAULT_IDLE_TIMEOUT = 5.0
PROTOCOL_VERSION = 1
MAGIC = b"SRDV"

OP_ALLOC_QPN = 1
OP_FREE_QPN = 2
OP_ATTACH_MCAST = 3
OP_DETACH_MCAST = 4
OP_STATS = 5
OP_CM_SLOT = 6
OP_CM_LISTEN = 7
OP_CM_UNLISTEN = 8
OP_REPORT = 9
OP_COUNTERS = 10
OP_JOIN = 11
OP_JOINED = 12
OP_REPORT_RESOURCES = 13
OP_RESOURCES = 14
OP_XRCD_OPEN = 15
OP_XRCD_CLOSE = 16
OP_XRC_SRQ = 17
OP_XRC_LOOKUP = 18

HELLO = struct.Struct("!4sHHIH")
REQ = struct.Struct("!BxxxI16s")  # byte 1: seq (with_seq)
REP = struct.Struct("!BxHI")  # byte 1: seq (with_seq)
SEQ_OFFSET = 1
DHDR = struct.Struct("!BBBBHH16s16s")
XHDR = struct.Struct("!BBHIIIII")  # an XRC hand-over record (above)
XRC_RECORD = 0x58  # XHDR's first byte: never a DHDR IP version (4, 6) nor RoCEv1's 1
MAX_SEGMENT_HINT = 0xFE  # the largest GRO segment index the DHDR carries
U64 = struct.Struct("!Q")

QPN_GSI = 1  # IBA 3.5.8
QPN_MULTICAST = 0xFFFFFF  # IBA 10.5
QPN_FIRST = 0x11
QPN_LAST = 0xFFFFFE
BTH_SIZE = 12

STAT_NAMES = ("rx", "forwarded", "unknown_qpn", "malformed", "client_full", "clients",
              "cm_routed", "cm_rejected", "clients_refused", "cm_bad_req", "cm_rej_limited",
              "direct_clients", "direct_refused", "bpf_attached", "bpf_failed",
              "ctrl_malformed", "join_timeouts", "closed_qpn", "xrc_forwarded",
              "xrc_refused")

# CM MADs on QP1: BTH (12) + DETH (8), then the 256-byte MAD (IBA 13.4)
MAD_OFF = BTH_SIZE + 8
MAD_SIZE = 256
CM_CLASS = 0x07
ATTR_REQ, ATTR_REJ, ATTR_SIDR_REQ, ATTR_SIDR_REP = 0x0010, 0x0012, 0x0017, 0x0018
ATTR_DREQ = 0x0015

MAX_DATAGRAM = 16384  # the largest UDP payload the daemon receives and forwards
MAX_CTRL = 65536  # the largest control record (a REPORT carries JSON)
MAX_COUNTER = (1 << 64) - 1  # a reported counter is a u64, as the kernel's
DATA_SNDBUF = 4 << 20
RECV_BATCH = 64


def with_seq(record: bytes, seq: int) -> bytes:
    """A REQ or REP record carrying sequence number ``seq`` (byte :data:`SEQ_OFFSET`)."""
    return record[:SEQ_OFFSET] + bytes((seq,)) + record[SEQ_OFFSET + 1 :]


def socket_path(name: str, directory: Path | str | None = None) -> Path:
    """``<state_dir>/<name>.sock``."""
    return Path(directory if directory is not None else default_state_dir()) / f"{name}.sock"


def device_addresses(netdev: str) -> list[bytes]:
    """The netdev's usable addresses: IPv4, then IPv6 global, then IPv6 link-local."""
    nd = _netdev.get(netdev)
    v6 = [a for a in nd.ipv6 if a.usable]
    v6.sort(key=lambda a: a.scope == _netdev.IPV6_SCOPE_LINK)
    return list(nd.ipv4) + [a.address for a in v6]


def bind_text(ip: bytes, netdev: str) -> str:
    """An address as UdpLink wants it; IPv6 link-local ones carry ``%netdev`` (scope)."""
    text = ip_text(ip)
    if len(ip) == 16 and ip[0] == 0xFE and ip[1] & 0xC0 == 0x80:
        text += f"%{netdev}"
    return text



@dataclass(eq=False)
class Client:
    ctrl: socket.socket
    data: socket.socket
    qpns: set[int] = field(default_factory=set)
    qp1_refs: int = 0
    mcast: dict[bytes, int] = field(default_factory=dict)
    dead: bool = False
    cm_slot: int = 0
    cm_listens: set[tuple[int, int]] = field(default_factory=set)
    port_counters: dict[str, int] = field(default_factory=dict)
    uid: int = -1
    slot: int = 0  # QPN slot on the direct path (reuseport), 0: forwarded by devd
    next_qpn: int = 0  # the next QPN tried in the slot's range
    join_seq: int = 0  # the seq of its JOIN, for the held-back reply
    join_expired: bool = False  # it held the JOIN turn past join_timeout
    pid: int = 0  # SO_PEERCRED at accept (0: unknown)
    resources: dict[str, object] = field(default_factory=dict)  # last REPORT_RESOURCES
    xrcds: dict[int, int] = field(default_factory=dict)  # XRC domain id -> XRCD_OPENs


def recv_fds(sock: socket.socket, size: int, maxfds: int) -> tuple[bytes, list[int], int]:
    """One record of at most ``size`` bytes and the descriptors that came with it
    (``SCM_RIGHTS``, at most ``maxfds``; those beyond are closed by the kernel), and the
    record's flags. The descriptors are close-on-exec (``MSG_CMSG_CLOEXEC``), as every
    other of ours (PEP 446); inheritable, they reached every program the process ran.
    (``socket.recv_fds`` takes flags but does not pass them: Python 3.11 to 3.13.)"""
    fds = array.array("i")
    msg, anc, flags, _ = sock.recvmsg(size, socket.CMSG_SPACE(maxfds * fds.itemsize),
                                      socket.MSG_CMSG_CLOEXEC)
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    return msg, list(fds), flags


def close_fds(fds: list[int]) -> None:
    """Close descriptors received with ``SCM_RIGHTS`` that will not be used."""
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def client_recv(c: Client, sock: socket.socket, size: int) -> bytes | None:
    """The next message on one of ``c``'s sockets; None when none is waiting, or when the
    client is gone (then ``c`` is marked dead)."""
    try:
        msg = sock.recv(size)
    except BlockingIOError:
        return None
    except OSError:
        c.dead = True
        return None
    if not msg:
        c.dead = True
        return None
    return msg
