"""The RDMA IP CM Service (IBA Annex A11) on top of the CM: server and client.

Server (:class:`IpCmDialect`, the dialect of a listener on an A11 Service ID):

* every REQ (and SIDR_REQ) whose Service ID is in the A11 range is read as Table 1
  private data (A11.4, CA11-7; :meth:`IbCmId.listen` installs this dialect by itself
  on such a Service ID), the consumer receiving bytes 36-91 (56 bytes; 180 in a
  SIDR_REQ) intact;
* the checks run in the order CA11-11 requires, versions first (``wire.ipcm.check_req``):
  MajV (CA11-2), MinV higher than ours (CA11-3.1.1; equal or lower accepted,
  CA11-3.1.2), IPV (CA11-4), the IPv4 address format (CA11-5), then the destination
  against the server's addresses ("Unknown IP Address"). A refusal (A11.6) is REJ
  reason 28 (Consumer Reject, oA11-1) with the Table 4 ARI (A11.7): layer 0x00, the
  Table 5 code in byte 1 (CA11-9, CA11-10) and a suggested value (oA11-2: the
  supported major/minor version, the supported IP versions);
* no listener on an A11 Service ID, or IP CM not supported, is REJ 8 Invalid Service ID
  (CA11-8; agent-level, :meth:`CmAgent.find_listener`).

Client (:class:`IpCmClient`): Service ID ``0x0000000001 <protocol> <port>`` (A11.5
Table 2, CA11-6), Table 1 private data with IPv4 addresses in bits 31-0 and the rest zero
(CA11-1, CA11-5), and minor-version downward compatibility (CA11-3): a REJ "Minor
Version" whose suggested value is lower than the client's minor version makes the client
retry at once with that version. Every rejection reaches the consumer as a REJECTED (or
UNREACHABLE) event with its own text (``events.describe_rej``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Collection
from functools import partial
from typing import TYPE_CHECKING, Any

from ..errors import DecodeError, InvalidArgument
from ..wire.cm import RejReason
from ..wire.gid import gid_to_ip, ip_to_gid
from ..wire.ipcm import (
    IPCM_MAJOR_VERSION,
    IPCM_MINOR_VERSION,
    IPCM_REQ_CONSUMER_MAX,
    IPCM_SIDR_CONSUMER_MAX,
    IPPROTO_TCP,
    IpAddress,
    IpCmAri,
    IpCmHeader,
    IpCmReject,
    check_req,
    ip_cm_service_id,
    is_ip_cm_service_id,
    pack_ip_field,
)
from . import qpctl
from .events import CmEvent, CmEventType, is_lock_free, lock_free
from .params import ConnParams, DialectId, DialectReject, ReqVerdict, SidrParams
from .userqp import UserQp

if TYPE_CHECKING:
    from .cmid import IbCmId

__all__ = ["IpCmDialect", "IpCmClient", "ip_listen", "gid_addresses"]


def _ip(addr: IpAddress | str) -> IpAddress:
    """``addr`` as an address object (one given as such is taken as it is: parsing its
    text again cost ~20 us a connect)."""
    if isinstance(addr, (ipaddress.IPv4Address, ipaddress.IPv6Address)):
        return addr
    return ipaddress.ip_address(addr)


def gid_addresses(gids: Collection[bytes]) -> set[IpAddress]:
    """The IP addresses of a RoCE v2 GID table (``::ffff:a.b.c.d`` -> IPv4)."""
    return {ipaddress.ip_address(gid_to_ip(bytes(g))) for g in gids}


class IpCmDialect:
    """A11 server-side processing for one listener (see the module docstring).

    ``bind`` is the address the listener is bound to (None: any address of the port,
    both IP versions). ``major``/``minor`` the IP CM versions served (0.0 is the only
    one A11 defines; a higher minor serves lower ones too, CA11-3.1.2).
    """

    name = "ip_cm"

    def __init__(self, bind: IpAddress | str | None = None, *,
                 major: int = IPCM_MAJOR_VERSION, minor: int = IPCM_MINOR_VERSION,
                 ip_versions: Collection[int] | None = None) -> None:
        self.bind = ipaddress.ip_address(bind) if bind is not None else None
        if self.bind is not None and self.bind.is_unspecified:
            self.bind = None
        self.major = major
        self.minor = minor
        if ip_versions is None:
            ip_versions = (4, 6) if self.bind is None else (self.bind.version,)
        self.ip_versions = tuple(sorted(set(ip_versions)))

    def check_req(self, listener: DialectId, service_id: int, private_data: bytes,
                  sidr: bool) -> ReqVerdict | DialectReject:
        if not is_ip_cm_service_id(service_id):
            return ReqVerdict(private_data)  # CA11-7 applies to the A11 range only
        try:
            hdr, consumer = IpCmHeader.decode_private_data(private_data)
        except DecodeError:  # pragma: no cover - the CM private data is always 92+ bytes
            return DialectReject(RejReason.CONSUMER_DEFINED, IpCmReject().encode())
        local = {self.bind} if self.bind is not None else gid_addresses(listener.agent.gids)
        ari = check_req(hdr, major=self.major, minor=self.minor, ip_versions=self.ip_versions,
                        local_addrs=local)
        if ari is not None:
            return DialectReject(RejReason.CONSUMER_DEFINED, ari.encode())
        limit = IPCM_SIDR_CONSUMER_MAX if sidr else IPCM_REQ_CONSUMER_MAX
        return ReqVerdict(consumer[:limit], remote_ip=hdr.src_addr, remote_port=hdr.src_port,
                          local_ip=hdr.dst_addr, local_port=service_id & 0xFFFF,
                          info={"ip_cm": hdr, "protocol": (service_id >> 16) & 0xFF})

    def rep_private_data(self, cm_id: DialectId, private_data: bytes) -> bytes:
        return private_data  # A11 formats only the REQ

    def parse_rep(self, cm_id: DialectId, private_data: bytes) -> tuple[bytes, dict[str, Any]]:
        return private_data, {}


def ip_listen(cm_id: IbCmId, port: int, *, proto: int = IPPROTO_TCP,
              bind: IpAddress | str | None = None, backlog: int | None = None,
              minor: int = IPCM_MINOR_VERSION, now: float | None = None) -> IpCmDialect:
    """Listen on the A11 Service ID of ``proto``/``port`` (Table 2) with the A11 checks."""
    dialect = IpCmDialect(bind, minor=minor)
    cm_id.listen(ip_cm_service_id(proto, port), backlog=backlog, dialect=dialect, now=now)
    return dialect


class IpCmClient:
    """The active side of an A11 connection (or SIDR resolution) on ``cm_id``.

    Events reach ``handler`` (default: the id's previous handler); a REJ "Minor
    Version" with a lower suggested version is handled here (CA11-3): the QP is reset
    and the REQ sent again at that version, and the consumer only sees the outcome.
    """

    def __init__(self, cm_id: IbCmId, *, handler: Callable[[CmEvent], None] | None = None,
                 minor: int = IPCM_MINOR_VERSION) -> None:
        self.cm_id = cm_id
        self.minor = minor
        self.downgrades: list[int] = []
        self._handler = handler if handler is not None else cm_id.handler
        self._qp: Any = None
        self._args: dict[str, Any] = {}
        inner = self._handler if self._handler is not None else cm_id.agent.on_event
        if inner is None or is_lock_free(inner):  # the minor-version retry is a CM call
            cm_id.handler = lock_free(partial(IpCmClient._on_event, self))
        else:
            cm_id.handler = self._on_event

    def _forward(self, ev: CmEvent) -> None:
        if self._handler is not None:
            self._handler(ev)
        else:
            agent = self.cm_id.agent
            if agent.on_event is not None:
                agent.on_event(ev)
            else:
                agent.events.append(ev)

    def _on_event(self, ev: CmEvent) -> None:
        rej = ev.reject
        if (ev.type == CmEventType.REJECTED and rej is not None and rej.ip_cm is not None
                and rej.ip_cm.code == IpCmAri.MINOR_VERSION and rej.ip_cm.suggested
                and rej.ip_cm.suggested[0] < self.minor and self._qp is not None):
            self.minor = rej.ip_cm.suggested[0]
            self.downgrades.append(self.minor)
            self.cm_id.agent.api(self._retry, None)
            return
        self._forward(ev)

    def again(self, now: float | None = None) -> None:
        """The REQ once more on the same id after a REJ, the QP reset first (as after a
        REJ "Minor Version"): for a consumer that retries a rejected connect."""
        self.cm_id.agent.api(self._retry, now)

    def _retry(self, now: float) -> None:
        """The REQ again at the lower minor version (CA11-3), the QP reset first."""
        if not isinstance(self._qp, UserQp):  # the application resets its own QP
            eq = qpctl.engine_of(self._qp)
            if eq.state != qpctl.RESET:
                eq.modify({"qp_state": qpctl.RESET}, now)
        self._send(now)

    def _header(self) -> tuple[IpCmHeader, int]:
        a = self._args
        src, dst = a["src"], a["dst"]
        hdr = IpCmHeader(majv=IPCM_MAJOR_VERSION, minv=self.minor, ipv=src.version,
                         src_port=a["src_port"], src_ip=pack_ip_field(src),
                         dst_ip=pack_ip_field(dst))
        return hdr, ip_cm_service_id(a["proto"], a["dst_port"])

    def connect(self, qp: Any, src: IpAddress | str, dst: IpAddress | str, dst_port: int, *,
                src_port: int = 0, proto: int = IPPROTO_TCP, private_data: bytes = b"",
                now: float | None = None, **conn: Any) -> None:
        """REQ from ``src:src_port`` to ``dst:dst_port`` (``conn``: more ConnParams)."""
        s, d = _ip(src), _ip(dst)
        if s.version != d.version:
            raise InvalidArgument("dst", f"IPv{s.version} source with IPv{d.version} destination")
        if len(private_data) > IPCM_REQ_CONSUMER_MAX:
            raise InvalidArgument("private_data", f"at most {IPCM_REQ_CONSUMER_MAX} bytes of "
                                                  f"consumer private data, got {len(private_data)}")
        if not 0 <= src_port <= 0xFFFF:
            raise InvalidArgument("src_port", "must be 0..65535")
        self._qp = qp
        self._args = dict(src=s, dst=d, dst_port=dst_port, src_port=src_port, proto=proto,
                          private_data=bytes(private_data), conn=conn)
        self.cm_id.agent.api(self._send, now)

    def _send(self, now: float) -> None:
        a = self._args
        hdr, sid = self._header()
        pd = hdr.private_data(a["private_data"])
        params = ConnParams(sid, ip_to_gid(a["dst"].packed), ip_to_gid(a["src"].packed),
                            private_data=pd, **a["conn"])
        self.cm_id.connect(self._qp, params, now=now)

    def resolve(self, src: IpAddress | str, dst: IpAddress | str, dst_port: int, *,
                src_port: int = 0, proto: int = 17, private_data: bytes = b"",
                dgid: bytes | None = None, now: float | None = None) -> None:
        """SIDR_REQ for a UD service at ``dst:dst_port`` (the UDP port space, A11 header
        then up to 180 bytes of consumer data, as Linux). ``dgid`` overrides the GID the
        SIDR_REQ goes to (default: the RoCE v2 GID of ``dst``)."""
        s, d = _ip(src), _ip(dst)
        hdr = IpCmHeader.make(s, d, src_port)
        hdr.minv = self.minor
        pd = hdr.private_data(private_data, limit=IPCM_SIDR_CONSUMER_MAX)
        params = SidrParams(ip_cm_service_id(proto, dst_port),
                            dgid if dgid is not None else ip_to_gid(d.packed),
                            ip_to_gid(s.packed), private_data=pd)
        self.cm_id.sidr_resolve(params, now=now)
