"""RoCEv1 (Annex A16) pieces of the device demultiplexer :mod:`softrdma.drivers.devd.daemon`.

A device with ``roce_ver 1`` or ``both`` has its ``devd`` own the raw Ethernet receive
socket (:class:`~softrdma.drivers.links.rawether.RawEtherLink`), as it owns UDP port 4791 for
RoCEv2 (design.md "Devices shared by processes"): one process sees every frame and
forwards it by BTH DestQP, so QP numbers, QP1 and the CM routing stay per device.
Processes send from their own raw socket (``receive=False``).

Data channel (daemon <-> client): a RoCEv1 frame travels as ``_DHDR`` with version
:data:`V1_VERSION`, TClass and HopLmt in the ``tos``/``ttl`` bytes, ports 0, SGID and
DGID as the addresses, followed by the 40-byte GRH and BTH .. ICRC. The same record
sent *by a client* is a self-addressed packet (CA16-22: its DGID is a GID of the device
itself), which the daemon routes as if it had come from the wire: a frame sent to one's
own MAC never comes back from the network.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ...wire.roce import icrc_v1
from ...wire.rocev1 import GRH_SIZE, build_grh
from ..links.link import Datagram

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

    from ..links.rawether import RawEtherLink

__all__ = ["V1_VERSION", "MAD_RESPONSE_HOP_LIMIT", "send_reversible_v1", "v1_datagram"]

V1_VERSION = 1  # _DHDR "ip version" byte of a RoCEv1 frame (4 and 6 are RoCEv2)
MAD_RESPONSE_HOP_LIMIT = 0xFF  # A16.4.4
_DHDR_V1 = struct.Struct("!BBBxHH16s16s")  # devd_proto.DHDR (its segment byte unused here)
_FLOW_LABEL_MASK = 0xFFFFF
_ICRC_SIZE = 4


def v1_datagram(msg: bytes, hdr_size: int) -> Datagram | None:
    """A client's self-addressed RoCEv1 record as a received Datagram (None if malformed)."""
    if len(msg) < hdr_size + GRH_SIZE + 16 or hdr_size != _DHDR_V1.size:
        return None
    ver, tos, ttl, _sp, _dp, src, dst = _DHDR_V1.unpack_from(msg)
    if ver != V1_VERSION:
        return None
    grh = msg[hdr_size:hdr_size + GRH_SIZE]
    if grh[0] >> 4 != 6 or grh[8:24] != src or grh[24:40] != dst:
        return None
    return Datagram(memoryview(msg)[hdr_size + GRH_SIZE:], src, dst, 0, 0, tos, ttl, grh)


def send_reversible_v1(link: RawEtherLink, request: Datagram,
                       parts: Sequence[ReadableBuffer]) -> None:
    """Answer a RoCEv1 MAD by its reversible path (A16.4.4): the request's SGID becomes
    the DGID and its DGID the SGID, FlowLabel and TrafficClass are copied, HopLimit is
    0xFF. ``parts`` are BTH .. MAD (the caller swapped the QPs and set the Q_Key)."""
    grh_in = request.grh
    flow = int.from_bytes(grh_in[1:4], "big") & _FLOW_LABEL_MASK
    length = sum(memoryview(p).nbytes for p in parts)
    grh = build_grh(bytes(request.dst_ip), bytes(request.src_ip), length + _ICRC_SIZE,
                    tclass=request.tos, flow_label=flow, hop_limit=MAD_RESPONSE_HOP_LIMIT)
    body = [memoryview(p) for p in parts]
    link.send_v1(bytes(request.src_ip), [grh, *body, icrc_v1(grh, body)])
