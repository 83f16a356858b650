"""The IPoIB process: a TUN device, a softrdma device, and the sans-I/O interface
engine (:mod:`softrdma.ipoib.iface`) between them.

One thread, one ``select`` loop over the TUN device, the device's link (manual
progress: this loop runs the RDMA engine too), the control socket and a signal wake-up
pipe. Resources, as Linux's ipoib driver has them:

* one UD QP (Q_Key :data:`IPOIB_QKEY`, the interface's P_Key), its receive buffers of
  GRH + IB MTU, attached to the broadcast/all-nodes/solicited-node groups;
* connected mode: an SRQ of 64 KiB buffers shared by every RC/UC connection (Linux
  ``ipoib_cm_create_srq``), one QP per connection set up through the IB CM on Service
  ID ``0x1000000000000000 | UD QPN`` (RFC 4755 §3.5, see :mod:`softrdma.ipoib.hwaddr`;
  the connections: :mod:`softrdma.apps.ipoib_conns`);
* a ring of 64 KiB send slots: a packet is read from the TUN device straight into a
  slot behind room for the 4-byte encapsulation header, and posted from there. The UD
  QP's sends are signaled one in :data:`UD_SIGNAL_EVERY` (and whenever free slots run
  low): a send queue completes in order (IBA 10.8.3), so the completion of a signaled
  send frees the slots of the unsignaled ones posted before it (:meth:`_ud_sent`).

Control (``softrdma ipoib show/down``): :mod:`softrdma.drivers.host.ipoib_control`.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import enums as e
from .. import verbs as v
from ..drivers.cm.gsi import CmBinding
from ..drivers.host.ipoib_control import ControlServer, control_path, usable_ipv6, wait_for_ipv6
from ..drivers.links.tun import VNET_HDR_LEN, TunDevice
from ..drivers.runtime.fdwait import readable
from ..drivers.runtime.roce_tx import gso_message_limit
from ..errors import DeviceError, InvalidArgument, SoftRdmaError
from ..ipoib.conn import IPOIB_CM_BUF_SIZE, IPOIB_CM_MTU
from ..ipoib.encap import ENCAP_LEN, encap_header
from ..ipoib.events import (
    ConnAccept,
    ConnClose,
    ConnOpen,
    ConnReject,
    ConnSend,
    McastJoin,
    McastLeave,
    Output,
    TunWrite,
    UdSend,
)
from ..ipoib.hwaddr import service_id
from ..ipoib.iface import Address, IfaceConfig, IpoibInterface, Mode
from ..verbs.device import registered_devices
from ..wire.gid import is_v4_mapped
from .ipoib_conns import SEND_SLOTS, IpoibConnections
from .ipoib_rx import GRH, SLOT, IpoibReceive

__all__ = ["IPOIB_QKEY", "IpoibRuntime", "RuntimeOptions", "default_cm_mtu"]

IPOIB_QKEY = 0x0000000B      # the usual IPoIB broadcast-group Q_Key (RFC 4391; docs/protocols.md §10)
UD_RECVS = 256
SRQ_RECVS = 128
CQ_SIZE = 2048
#: packets read from the TUN device per loop pass (Linux NAPI's weight): in datagram mode
#: a pass posts them as one run of UD sends; 64 against 32: iperf3 +14 %, CPU per byte
#: -13 % at the sender and -10 % at the receiver (design.md, "IP over InfiniBand")
TUN_BATCH = 64
MAX_WAIT_S = 0.5
DRAIN_ROUNDS = 16            # receive batches read before a due timer runs
UD_SIGNAL_EVERY = 16         # one UD send in this many asks for a completion
# A send slot (SLOT bytes) holds the encapsulation header and the IP packet from
# SEND_HEAD on: a TUN read (TunDevice.read_framed) puts the device's header in front of
# the packet, where the encapsulation header then overwrites its last ENCAP_LEN bytes
SEND_HEAD = VNET_HDR_LEN - ENCAP_LEN
_SIGNALED = int(e.IBV_SEND_SIGNALED)
CM_MTU_TRIM = 0.02           # default_cm_mtu gives up at most this part of IPOIB_CM_MTU


def default_cm_mtu(ib_mtu: int, ipv6: bool) -> int:
    """Connected mode's MTU when none is given: :data:`IPOIB_CM_MTU` (65520, Linux's),
    trimmed to the largest MTU whose packet, with its 4-byte encapsulation, is one SEND
    that leaves in one UDP GSO send and reaches the peer in one receive
    (:func:`~softrdma.drivers.runtime.roce_tx.gso_message_limit`), where that gives up
    at most :data:`CM_MTU_TRIM` of it: 65212 at IB MTU 4096 (IPv6 GIDs), 64956 at 2048,
    64460 at 1024; 65520 below. A 65520-byte packet is 16 packets at 4096, 16 x 4112
    bytes, over the 65473 bytes a GRO socket gets whole: two sends and two receives per
    packet. Measured (issue 26, iperf3 between namespaces, 5 alternated pairs on a 2-core
    machine): +13 % throughput, -10 % CPU per byte in each IPoIB process."""
    trimmed = min(IPOIB_CM_MTU, gso_message_limit(ib_mtu, ipv6) - ENCAP_LEN)
    return trimmed if trimmed >= IPOIB_CM_MTU * (1 - CM_MTU_TRIM) else IPOIB_CM_MTU


@dataclass(slots=True)
class RuntimeOptions:
    name: str
    device: str | None
    addresses: tuple[Address, ...]
    mode: Mode = "connected"
    pkey: int = 0xFFFF
    mtu: int | None = None
    transport: str = "RC"
    crossing_rule: bool = True
    gid_index: int | None = None
    idle_s: float = 2 * 256.0


class IpoibRuntime(IpoibConnections, IpoibReceive):
    """``softrdma ipoib up``: build everything, :meth:`run` until stopped, clean up."""

    def __init__(self, opts: RuntimeOptions) -> None:
        self.opts = opts
        self._closers: list[Any] = []
        self.tun: TunDevice | None = None
        self._ctl: ControlServer | None = None
        self._stop = False
        self._init_connections()
        self._init_receive()
        self._ahs: dict[bytes, v.AH] = {}
        self._sends: list[tuple[v.QP, v.SendWR, int]] = []
        self._ud_posted: deque[int] = deque()  # slots of UD sends posted, oldest first
        self._ud_quiet = 0  # unsignaled UD sends since the last signaled one
        self._batching = False
        self.srq: v.SRQ | None = None
        self.driver_counters = {"tx_no_slot": 0, "tun_write_errors": 0, "send_errors": 0,
                                "recv_errors": 0}
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    # ---- setup ---------------------------------------------------------------------
    def _open(self) -> None:
        o = self.opts
        if o.gid_index is None:
            self._await_ipv6(o.device)
        ctx = v.Context(o.device, progress="manual")
        self.ctx = ctx
        self._closers.append(ctx)
        gid_i = self._pick_gid(ctx, o.gid_index)
        self.gid = ctx.port.gids[gid_i]
        self.gid_index = gid_i
        ib_mtu = 128 << ctx.active_mtu
        if o.pkey not in ctx.port.pkeys:
            # the device's table is per process: this interface's partition joins it
            ctx.port.pkeys = (*ctx.port.pkeys, o.pkey)
        pkey_index = list(ctx.port.pkeys).index(o.pkey)
        # check the configuration before any QP exists (the UD QPN is filled in below)
        mtu = o.mtu
        if mtu is None and o.mode == "connected":
            mtu = default_cm_mtu(ib_mtu, not is_v4_mapped(self.gid))
        IfaceConfig(gid=self.gid, ud_qpn=0, ud_mtu=ib_mtu - ENCAP_LEN, addresses=o.addresses,
                    mode=o.mode, pkey=o.pkey, mtu=mtu, transport=o.transport)
        self.pd = v.PD(ctx)
        access = int(e.IBV_ACCESS_LOCAL_WRITE)
        self._send_buf = bytearray(SEND_SLOTS * SLOT)
        self.send_mr = v.MR(self.pd, len(self._send_buf), access, buffer=self._send_buf)
        self._send_view = memoryview(self._send_buf)
        self._free_slots = list(range(SEND_SLOTS - 1, -1, -1))
        # one send WR per slot, its length set per packet (the verbs copy what they post)
        self._send_wrs = [v.SendWR(wr_id=i, sg=[v.SGE(self.send_mr.addr + i * SLOT + SEND_HEAD,
                                                      SLOT - SEND_HEAD, self.send_mr.lkey)],
                                   num_sge=1)
                          for i in range(SEND_SLOTS)]
        self._ud_slot = GRH + ib_mtu
        self._ud_buf = bytearray(UD_RECVS * self._ud_slot)
        self.ud_mr = v.MR(self.pd, len(self._ud_buf), access, buffer=self._ud_buf)
        self._ud_view = memoryview(self._ud_buf)
        self._ud_rwrs = self._make_recv_wrs(self.ud_mr, UD_RECVS, self._ud_slot)
        self.cq = v.CQ(ctx, CQ_SIZE)
        self.rc_rcq = v.CQ(ctx, CQ_SIZE)
        cap = v.QPCap(max_send_wr=SEND_SLOTS, max_recv_wr=UD_RECVS, max_send_sge=1,
                      max_recv_sge=1)
        self.ud_qp = v.QP(self.pd, v.QPInitAttr(qp_type=e.IBV_QPT_UD, scq=self.cq,
                                                rcq=self.cq, cap=cap))
        self.ud_qp.modify(v.QPAttr(qp_state=e.IBV_QPS_INIT, pkey_index=pkey_index, port_num=1,
                                   qkey=IPOIB_QKEY),
                          int(e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT
                              | e.IBV_QP_QKEY))
        self.ud_qp.modify(v.QPAttr(qp_state=e.IBV_QPS_RTR), int(e.IBV_QP_STATE))
        self.ud_qp.modify(v.QPAttr(qp_state=e.IBV_QPS_RTS, sq_psn=0),
                          int(e.IBV_QP_STATE | e.IBV_QP_SQ_PSN))
        self._post_ud_recvs(list(range(UD_RECVS)))
        if o.mode == "connected":
            self.srq = v.SRQ(self.pd, v.SrqInitAttr(v.SrqAttr(max_wr=SRQ_RECVS, max_sge=1)))
            self._srq_buf = bytearray(SRQ_RECVS * SLOT)
            self.srq_mr = v.MR(self.pd, len(self._srq_buf), access, buffer=self._srq_buf)
            self._srq_view = memoryview(self._srq_buf)
            self._srq_rwrs = self._make_recv_wrs(self.srq_mr, SRQ_RECVS, SLOT)
            self._post_srq_recvs(list(range(SRQ_RECVS)))
        cfg = IfaceConfig(gid=self.gid, ud_qpn=self.ud_qp.qp_num, ud_mtu=ib_mtu - ENCAP_LEN,
                          addresses=o.addresses, mode=o.mode, pkey=o.pkey, mtu=mtu,
                          transport=o.transport, crossing_rule=o.crossing_rule,
                          receive_mtu=IPOIB_CM_BUF_SIZE, idle_s=o.idle_s)
        self.engine = IpoibInterface(cfg)
        if o.mode == "connected":
            self.cm = CmBinding.attach(ctx)
            self.listener = self.cm.agent.create_id(self._cm_event)
            self.listener.listen(service_id(self.ud_qp.qp_num))
        self.tun = TunDevice(o.name)
        assert cfg.mtu is not None
        self.tun.configure(cfg.mtu, self.engine.addresses)
        self._ctl = ControlServer(control_path(o.name))
        self.engine.start(time.monotonic())
        self._execute(self.engine.take_output())

    @staticmethod
    def _await_ipv6(device: str | None) -> None:
        """Give the device's netdev a few seconds to get a usable IPv6 address (started
        right after the interface came up, duplicate address detection may still run),
        saying so on stderr; :meth:`_pick_gid` then fails clearly if there is none."""
        devs = registered_devices()
        info = next((d for d in devs if device is None or d.name == device), None)
        if info is None or not info.netdev or info.type != "roce":
            return  # Context reports the missing device itself
        wait_for_ipv6(info.netdev, note=lambda msg: print(f"softrdma ipoib: {msg}",
                                                          file=sys.stderr, flush=True))

    @staticmethod
    def _pick_gid(ctx: v.Context, index: int | None) -> int:
        """IPoIB groups are IPv6 multicast addresses on RoCEv2 (an MGID is its IP
        group, Annex A17; docs/protocols.md), so the interface uses an IPv6 GID: the first global one,
        else the link-local one."""
        gids = ctx.port.gids
        if index is not None:
            if not 0 <= index < len(gids):
                raise InvalidArgument("gid_index", f"{index} is not in 0..{len(gids) - 1}")
            return index
        v6 = [i for i, g in enumerate(gids) if not is_v4_mapped(g)]
        glob = [i for i in v6 if gids[i][:2] != b"\xfe\x80"]
        if glob or v6:
            return (glob or v6)[0]
        why = "give its netdev an IPv6 address"
        late = usable_ipv6(ctx.netdev) if ctx.netdev else []
        if late:  # a shared device's devd took the addresses before this one was usable
            why = (f"{ctx.netdev} has {late[0]} now, but the device's GID table was made "
                   "before it was usable (duplicate address detection); stop the programs "
                   "using the device so that its devd restarts, then try again")
        raise DeviceError(f"device {ctx.name!r} has no IPv6 GID: IPoIB's multicast groups are "
                          f"IPv6 groups on RoCEv2, {why}")

    # ---- buffers -------------------------------------------------------------------
    def _slot_for(self, etype: int, payload: bytes | memoryview) -> tuple[int, int] | None:
        """A send slot holding encap + payload (copied unless it is already there)."""
        n = len(payload)
        if type(payload) is memoryview and payload.obj is self._send_buf:
            slot = self._read_slot
            self._read_slot = -1
            if slot < 0:
                return None
        else:
            if not self._free_slots:
                self.driver_counters["tx_no_slot"] += 1
                return None
            slot = self._free_slots.pop()
            off = slot * SLOT + SEND_HEAD
            self._send_view[off + ENCAP_LEN:off + ENCAP_LEN + n] = payload
        off = slot * SLOT + SEND_HEAD
        self._send_view[off:off + ENCAP_LEN] = encap_header(etype)
        return slot, ENCAP_LEN + n

    def _ud_sent(self, slot: int) -> None:
        """The UD send in ``slot`` completed (signaled, in error or flushed): it and every
        UD send posted before it are done (a send queue completes in order, IBA 10.8.3),
        so their slots are free."""
        posted = self._ud_posted
        free = self._free_slots
        if slot in posted:
            while True:
                s = posted.popleft()
                free.append(s)
                if s == slot:
                    return
        free.append(slot)

    def _ah(self, gid: bytes) -> v.AH:
        ah = self._ahs.get(gid)
        if ah is None:
            gr = v.GlobalRoute(dgid=v.GID(gid), sgid_index=self.gid_index, hop_limit=64)
            ah = v.AH(self.pd, v.AHAttr(port_num=1, is_global=1, gr=gr))
            if len(self._ahs) > 4096:
                self._ahs.clear()
            self._ahs[gid] = ah
        return ah

    # ---- outputs -------------------------------------------------------------------
    def _execute(self, outputs: Sequence[Output]) -> None:
        gro = self._gro
        for o in outputs:
            if type(o) is TunWrite and self._coalescing:  # a received packet: the bulk case
                gro.push(o.packet)
                continue
            try:
                self._do(o)
            except SoftRdmaError as exc:
                self.driver_counters["send_errors"] += 1
                self._last_error = str(exc)

    def _do(self, o: Output) -> None:
        if type(o) is UdSend:  # a packet from the host, in datagram mode: the bulk case first
            got = self._slot_for(o.ethertype, o.payload)
            if got is None:
                return
            slot, n = got
            wr = self._send_wrs[slot]
            wr.sg[0].length = n
            wr.set_wr_ud(self._ah(o.dest.gid), o.dest.qpn, IPOIB_QKEY)
            self._ud_quiet += 1
            if self._ud_quiet >= UD_SIGNAL_EVERY or len(self._free_slots) < UD_SIGNAL_EVERY:
                wr.send_flags = _SIGNALED
                self._ud_quiet = 0
            else:
                wr.send_flags = 0
            self._queue(self.ud_qp, wr, slot)
        elif isinstance(o, TunWrite):
            if self._coalescing:
                self._gro.push(o.packet)
            elif self.tun is not None and not self.tun.write(o.packet):
                self.driver_counters["tun_write_errors"] += 1
        elif isinstance(o, ConnSend):
            c = self._conns.get(o.conn_id)
            got = self._slot_for(o.ethertype, o.payload) if c is not None else None
            if c is None or got is None:
                return
            slot, n = got
            wr = self._send_wrs[slot]
            wr.sg[0].length = n
            wr.send_flags = _SIGNALED
            self._queue(c.qp, wr, slot)
        elif isinstance(o, ConnOpen):
            self._open_conn(o)
        elif isinstance(o, ConnAccept):
            self._accept(o)
        elif isinstance(o, ConnReject):
            cid = self._requests.pop(o.token, None)
            if cid is not None:
                cid.reject(o.private_data, reason=o.reason)
        elif isinstance(o, ConnClose):
            self._drop_conn(o.conn_id, disconnect=True)
        elif isinstance(o, McastJoin):
            self.ud_qp.attach_mcast(v.GID(o.mgid))
        elif isinstance(o, McastLeave):
            self.ud_qp.detach_mcast(v.GID(o.mgid))

    def _queue(self, qp: v.QP, wr: v.SendWR, slot: int) -> None:
        """Queue a send for :meth:`_post_queued`; at once unless a TUN batch is being read."""
        self._sends.append((qp, wr, slot))
        if not self._batching:
            self._post_queued()

    def _post_queued(self) -> None:
        """Post the queued sends, one ``post_send`` per run of one QP: the runtime then
        transmits a run's packets together (UDP GSO, see ``drivers/runtime/roce.py``), not one
        ``sendmsg`` per packet. A refused run (its QP is not, or no longer, ready: the
        engine refuses the first WR then, so none of the run was posted) frees its slots
        and counts a send error."""
        sends = self._sends
        i, n = 0, len(sends)
        while i < n:
            qp = sends[i][0]
            j = i + 1
            while j < n and sends[j][0] is qp:
                j += 1
            run = sends[i:j]
            try:
                qp.post_send(run[0][1] if j - i == 1 else [w for _, w, _ in run])
            except SoftRdmaError as exc:
                self._free_slots.extend(slot for _, _, slot in run)
                self.driver_counters["send_errors"] += 1
                self._last_error = str(exc)
            else:
                if qp is self.ud_qp:
                    self._ud_posted.extend(slot for _, _, slot in run)
            i = j
        sends.clear()

    # ---- the loop ------------------------------------------------------------------
    _read_slot = -1
    _closing = False
    _last_error = ""

    def run(self) -> None:
        """Serve until SIGINT/SIGTERM or ``down``."""
        rfd, wfd = os.pipe()
        os.set_blocking(rfd, False)
        os.set_blocking(wfd, False)
        old_wakeup = signal.set_wakeup_fd(wfd)
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self._loop(rfd)
        finally:
            signal.set_wakeup_fd(old_wakeup)
            for s, h in old.items():
                signal.signal(s, h)
            os.close(rfd)
            os.close(wfd)

    def _on_signal(self, signum: int, frame: object) -> None:
        self._stop = True

    def _loop(self, wake_fd: int) -> None:
        assert self.tun is not None and self._ctl is not None
        link = self.ctx.runtime.link
        assert link is not None  # IPoIB runs on a RoCE device, whose runtime has a link
        link_fd = link.fileno()
        tun_fd, ctl_fd = self.tun.fileno(), self._ctl.fileno()
        eng = self.engine
        port = self.ctx.port
        due = eng.next_deadline()  # the engine's next deadline, as of the end of the last pass
        while not self._stop:
            now = time.monotonic()
            waits = [d for d in (due, port.next_deadline()) if d is not None]
            timeout = max(0.0, min([MAX_WAIT_S, *(d - now for d in waits)]))
            fds = [wake_fd, ctl_fd] + ([link_fd] if link_fd is not None else [])
            if self._free_slots:
                fds.append(tun_fd)
            try:
                ready = readable(fds, timeout)
            except InterruptedError:
                continue
            now = time.monotonic()
            self.ctx.progress(0)
            if self.cm is not None:
                self.cm.deliver(wait=True)  # the CM's events, for _handle_cm below
            self._poll(now)
            self._handle_cm(now)
            if tun_fd in ready:
                self._read_tun(now)
            due = eng.next_deadline()
            if due is not None and due <= now:
                self._drain(now)
                eng.on_timer(now)
                self._execute(eng.take_output())
                due = eng.next_deadline()
            if ctl_fd in ready:
                self._ctl.serve(functools.partial(self._control, now=now))
            if wake_fd in ready:
                try:
                    os.read(wake_fd, 64)
                except BlockingIOError:
                    pass
            if self._graveyard:
                for qp in self._graveyard:
                    try:
                        qp.close()
                    except SoftRdmaError:
                        pass
                self._graveyard.clear()

    def _drain(self, now: float) -> None:
        """Before a timer counts against a peer, read what already arrived: an answer
        waiting in our own socket is not a missing answer (a loop iteration reads one
        receive batch; under load more may be queued)."""
        for _ in range(DRAIN_ROUNDS):
            if not self.ctx.progress(0):
                break
            self._poll(now)
            if self.cm is not None:
                self.cm.deliver(wait=True)
            self._handle_cm(now)

    def _read_tun(self, now: float) -> None:
        assert self.tun is not None
        eng = self.engine
        tun = self.tun
        view = self._send_view
        free = self._free_slots
        self._batching = True
        try:
            for _ in range(TUN_BATCH):
                if not free:
                    break
                slot = free.pop()
                off = slot * SLOT  # the TUN header, then the packet, at SEND_HEAD + ENCAP_LEN
                n = tun.read_framed(view[off:off + SLOT])
                if n <= 0:
                    free.append(slot)
                    break
                self._read_slot = slot
                eng.send_ip(view[off + VNET_HDR_LEN:off + VNET_HDR_LEN + n], now)
                self._execute(eng.take_output())
                if self._read_slot >= 0:  # held, dropped or answered with ICMP: not posted
                    free.append(slot)
                    self._read_slot = -1
        finally:
            self._batching = False
            self._post_queued()

    # ---- control -------------------------------------------------------------------
    def _control(self, cmd: str, now: float) -> dict[str, Any]:
        if cmd == "show":
            return self.show(now)
        if cmd == "down":
            self._stop = True
            return {"down": self.opts.name}
        return {"error": "unknown command (show, down)"}

    def show(self, now: float) -> dict[str, Any]:
        snap = self.engine.snapshot(now)
        snap["name"] = self.opts.name
        snap["device"] = self.ctx.name
        snap["gid"] = str(ipaddress.IPv6Address(self.gid))
        snap["ud_qpn"] = self.ud_qp.qp_num
        counters = dict(snap["counters"])  # type: ignore[call-overload]
        counters.update(self.driver_counters)
        counters["rx_gro_packets"] = self._gro.merged_packets
        counters["rx_gro_segments"] = self._gro.merged_segments
        snap["counters"] = counters
        # send slots free, and UD sends whose slots await a signaled completion
        snap["send_slots"] = {"total": SEND_SLOTS, "free": len(self._free_slots),
                              "ud_unreaped": len(self._ud_posted)}
        if self._last_error:
            snap["last_error"] = self._last_error
        return snap

    # ---- teardown ------------------------------------------------------------------
    def close(self) -> None:
        """Tear connections down (RFC 4755 §3.4), leave the groups, free everything."""
        self._closing = True
        if getattr(self, "engine", None) is not None:
            try:
                self.engine.stop(time.monotonic())
                self._execute(self.engine.take_output())
                deadline = time.monotonic() + 1.0
                while time.monotonic() < deadline and self.cm is not None and any(
                        c.state.name not in ("IDLE", "TIMEWAIT")
                        for c in list(self.cm.agent.ids.values())):
                    self.ctx.progress(0.05)
            except (SoftRdmaError, OSError):
                pass
        if self._ctl is not None:
            self._ctl.close()
            self._ctl = None
        if self.tun is not None:
            self.tun.close()
            self.tun = None
        if self.cm is not None:
            try:
                self.cm.close()
            except SoftRdmaError:
                pass
            self.cm = None
        for obj in reversed(self._closers):
            try:
                obj.close()
            except SoftRdmaError:
                pass
        self._closers.clear()
