"""The seam between the transports (softrdma.seam): typed events, the shared queues, the
device tables, and the structure the Protocols promise (IB and iWARP side by side)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.links.fabric import Fabric
from softrdma.drivers.runtime.clock import VirtualClock
from softrdma.errors import ClosedError, ResourceError, StateError
from softrdma.ib.port import Port
from softrdma.ib.qp import EngineQP
from softrdma.iwarp.qp import IwarpDevice, IwarpQP
from softrdma.seam import protocols
from softrdma.seam.events import AsyncEventType, EngineEvent, EventQueue
from softrdma.seam.queues import EngineSRQ, QPInit, ReceiveQueue, check_post_send
from softrdma.seam.states import ERR, INIT, QPT_RC, QPT_UD, RESET, RTS
from softrdma.seam.tables import FIRST_QPN, MemoryTable, QpnAllocator
from softrdma.seam.types import SGE, RecvWQE, SendWQE, WorkCompletion
from softrdma.verbs import device as verbs_device

SRC = Path(__file__).resolve().parents[2] / "src" / "softrdma"
GID = bytes(10) + b"\xff\xff" + bytes([127, 0, 0, 1])


def _init(qp_type: int = QPT_RC, srq: EngineSRQ | None = None, max_wr: int = 2,
          scq: list[WorkCompletion] | None = None,
          rcq: list[WorkCompletion] | None = None) -> QPInit:
    s = scq if scq is not None else []
    r = rcq if rcq is not None else []
    return QPInit(qp_type, object(), s.append, r.append, srq, max_wr, max_wr, 1, 1, 0, False)


# ---- events ---------------------------------------------------------------------------------
@pytest.mark.iba("11.6.3")
def test_event_types_are_ibv_event_types() -> None:
    for t in AsyncEventType:
        assert int(t) == int(getattr(e, f"IBV_EVENT_{t.name}"))


@pytest.mark.iba("11.6.3")
def test_event_queue_delivers_in_order_and_unsubscribes() -> None:
    q = EventQueue()
    a: list[EngineEvent] = []
    b: list[EngineEvent] = []
    q.subscribe(a.append)
    q.subscribe(b.append)
    q.raise_event(AsyncEventType.COMM_EST, "qp")
    q.unsubscribe(b.append)
    q.unsubscribe(lambda ev: None)  # unknown: no-op
    q.emit(EngineEvent(AsyncEventType.DEVICE_FATAL))
    assert a == [EngineEvent(AsyncEventType.COMM_EST, "qp"),
                 EngineEvent(AsyncEventType.DEVICE_FATAL, None)]
    assert b == [EngineEvent(AsyncEventType.COMM_EST, "qp")]
    with pytest.raises(AttributeError):
        a[0].type = AsyncEventType.QP_FATAL  # type: ignore[misc]  # frozen


# ---- the shared queues --------------------------------------------------------------------
@pytest.mark.iba("11.4.1.2", "10.3.1.7")
def test_receive_queue_post_rules_and_flush() -> None:
    rcq: list[WorkCompletion] = []
    rq = ReceiveQueue(0x42, _init(rcq=rcq))
    with pytest.raises(StateError, match="RESET"):
        rq.post(RecvWQE(1), RESET, False)
    with pytest.raises(ClosedError):
        rq.post(RecvWQE(1), INIT, True)
    rq.post(RecvWQE(1), INIT, False)
    rq.post(RecvWQE(2), RTS, False)
    with pytest.raises(ResourceError):
        rq.post(RecvWQE(3), RTS, False)
    first = rq.take()
    assert first is not None and first.wr_id == 1
    rq.give_back(first)
    rq.flush()
    assert [(w.wr_id, w.status, w.opcode, w.qp_num) for w in rcq] == [
        (1, int(e.IBV_WC_WR_FLUSH_ERR), int(e.IBV_WC_RECV), 0x42),
        (2, int(e.IBV_WC_WR_FLUSH_ERR), int(e.IBV_WC_RECV), 0x42)]
    rq.post(RecvWQE(4), ERR, False)  # in ERR: completed at once with a flush error
    assert rcq[-1].wr_id == 4 and len(rq) == 0


class _Feed:
    """A RecvFeed that records what it is told (``reopen``) and holds nothing."""

    def __init__(self) -> None:
        self.told: list[int] = []

    def drain(self, qlen: int, most: int, close: bool) -> list[tuple[int, int, int, int]]:
        return []

    def reopen(self, qlen: int) -> None:
        self.told.append(qlen)


def _post_outcome(batch: bool, state: int, destroyed: bool, n: int, before: int = 0,
                  feed: bool = False, srq: bool = False) -> tuple[Any, ...]:
    """Post ``n`` receives to a queue of 4 holding ``before``: in one ``post_many`` call
    or one ``post`` at a time; what the queue, the CQ and the feed end with."""
    rcq: list[WorkCompletion] = []
    engine_srq = EngineSRQ(EventQueue(), object(), 4, 1) if srq else None
    rq = ReceiveQueue(0x42, _init(max_wr=4, rcq=rcq, srq=engine_srq))
    f = _Feed()
    if feed:
        rq.set_feed(f)
    for i in range(before):
        rq.post(RecvWQE(100 + i), INIT, False)
    wqes = [RecvWQE(i) for i in range(n)]
    err: str | None = None
    try:
        if batch:
            rq.post_many(wqes, state, destroyed)
        else:
            for w in wqes:
                rq.post(w, state, destroyed)
    except (StateError, ClosedError, ResourceError) as exc:
        err = f"{type(exc).__name__}: {exc}"
    return (err, [w.wr_id for w in rq.q], [(w.wr_id, w.status) for w in rcq], f.told, rq.fed)


@pytest.mark.iba("11.4.1.2", "10.3.1.7")
@pytest.mark.parametrize("state,destroyed,n,before,feed,srq", [
    (RTS, False, 3, 0, False, False), (RTS, False, 3, 1, True, False),   # all fit
    (INIT, False, 4, 0, True, False),                                   # exactly full
    (RTS, False, 3, 2, False, False), (RTS, False, 5, 0, True, False),  # the queue fills
    (RESET, False, 2, 0, False, False), (RTS, True, 2, 0, False, False),
    (ERR, False, 3, 0, False, False), (RTS, False, 2, 0, False, True),
    (RTS, False, 0, 1, True, False)])
def test_receive_queue_post_many_is_post_of_each(state: int, destroyed: bool, n: int,
                                                 before: int, feed: bool, srq: bool) -> None:
    """post_many (a list of receives, one call: appended at once when every one fits)
    ends as posting them one by one: the same queue, flush completions, feed reopenings'
    final length, refusal (the ones before a refused one stay posted)."""
    one = _post_outcome(False, state, destroyed, n, before, feed, srq)
    many = _post_outcome(True, state, destroyed, n, before, feed, srq)
    assert many[:3] == one[:3] and many[4] == one[4]
    assert many[3][-1:] == one[3][-1:]  # the feed last told the queue's final length


@pytest.mark.iba("10.2.9")
def test_srq_post_recvs_is_post_recv_of_each() -> None:
    """EngineSRQ.post_recvs: appended at once when all fit; past its room the ones that
    fit stay and the first that does not is refused, as post_recv one by one."""
    for n in (3, 4, 6):
        srqs = [EngineSRQ(EventQueue(), object(), 4, 1) for _ in range(2)]
        errs: list[str | None] = []
        for k, srq in enumerate(srqs):
            try:
                if k:
                    srq.post_recvs([RecvWQE(i) for i in range(n)])
                else:
                    for i in range(n):
                        srq.post_recv(RecvWQE(i))
                errs.append(None)
            except ResourceError as exc:
                errs.append(str(exc))
        assert errs[0] == errs[1] and (errs[0] is None) == (n <= 4)
        assert [w.wr_id for w in srqs[0].q] == [w.wr_id for w in srqs[1].q] == list(range(min(n, 4)))
    closed = EngineSRQ(EventQueue(), object(), 4, 1)
    closed.closed = True
    with pytest.raises(ClosedError):
        closed.post_recvs([RecvWQE(1)])


@pytest.mark.iba("10.2.9")
def test_receive_queue_on_srq_refuses_posts_and_takes_from_the_srq() -> None:
    events = EventQueue()
    seen: list[EngineEvent] = []
    events.subscribe(seen.append)
    srq = EngineSRQ(events, object(), 4, 1, srq_limit=2)
    for i in range(3):
        srq.post_recv(RecvWQE(i))
    rq = ReceiveQueue(7, _init(srq=srq))
    with pytest.raises(StateError, match="SRQ"):
        rq.post(RecvWQE(9), RTS, False)
    got = rq.take()
    assert got is not None and got.wr_id == 0 and seen == []
    rq.take()  # one left: below the limit -> SRQ_LIMIT_REACHED once, then disarmed
    rq.take()
    assert seen == [EngineEvent(AsyncEventType.SRQ_LIMIT_REACHED, srq)]


@pytest.mark.iba("11.4.1.1")
def test_check_post_send() -> None:
    with pytest.raises(StateError, match="IBV_QPS_INIT: needs"):
        check_post_send(INIT, False, 0, 1, "needs")
    with pytest.raises(ClosedError):
        check_post_send(RTS, True, 0, 1, "needs")
    with pytest.raises(ResourceError):
        check_post_send(RTS, False, 1, 1, "needs")
    check_post_send(ERR, False, 0, 1, "needs")  # posting in ERR is allowed (it flushes)


# ---- the device tables ----------------------------------------------------------------------
@pytest.mark.iba("10.2.4")
def test_qpn_allocator_skips_used_numbers() -> None:
    used = {FIRST_QPN, FIRST_QPN + 1}
    alloc = QpnAllocator(used)
    assert alloc.alloc() == FIRST_QPN + 2


@pytest.mark.iba("10.6")
def test_memory_table_frees_keys_it_took() -> None:
    freed: list[int] = []
    keys = iter([0x1234_5601, 0x1234_5701])
    table = MemoryTable(lambda: next(keys), freed.append)
    mr = table.register(memoryview(bytearray(16)), 0x1000, 0, None)
    assert table.mrs == {0x1234_5601: mr}
    table.deregister(mr)
    assert not mr.valid and table.mrs == {} and freed == [0x1234_5601]


@pytest.mark.parametrize("make", [lambda: Port([GID]), lambda: IwarpDevice([GID])],
                         ids=["ib", "iwarp"])
@pytest.mark.iba("11.6.3.2", "10.3.1.7")
def test_both_devices_flush_on_device_fatal(make: object) -> None:
    dev = make()  # type: ignore[operator]
    seen: list[EngineEvent] = []
    dev.events.subscribe(seen.append)
    scq: list[WorkCompletion] = []
    rcq: list[WorkCompletion] = []
    qp = dev.create_qp(_init(scq=scq, rcq=rcq))
    qp.modify({"qp_state": INIT}, 0.0)
    qp.post_recv(RecvWQE(5))
    dev.device_fatal()
    assert qp.state == ERR
    assert [(w.wr_id, w.status) for w in rcq] == [(5, int(e.IBV_WC_WR_FLUSH_ERR))]
    assert seen[-1] == EngineEvent(AsyncEventType.DEVICE_FATAL, None)
    qp.post_send(SendWQE(6, int(e.IBV_WR_SEND), int(e.IBV_SEND_SIGNALED)), 0.0)
    assert [(w.wr_id, w.status) for w in scq] == [(6, int(e.IBV_WC_WR_FLUSH_ERR))]


# ---- structure: side by side, no inheritance between the transports ------------------------
def _members(proto: type) -> set[str]:
    names = set(getattr(proto, "__annotations__", {}))
    names |= {n for n, v in vars(proto).items() if callable(v) or isinstance(v, property)}
    return {n for n in names if not n.startswith("_")}


@pytest.mark.parametrize("impl, proto", [
    (Port([GID]), protocols.DeviceEngine),
    (IwarpDevice([GID]), protocols.DeviceEngine),
])
def test_devices_have_every_protocol_member(impl: object, proto: type) -> None:
    missing = {n for n in _members(proto) if not hasattr(impl, n)}
    assert not missing


@pytest.mark.parametrize("make", [
    lambda: Port([GID]).create_qp(_init(QPT_UD)),
    lambda: IwarpDevice([GID]).create_qp(_init()),
])
def test_qps_have_every_protocol_member(make: object) -> None:
    qp = make()  # type: ignore[operator]
    assert not {n for n in _members(protocols.QPEngine) if not hasattr(qp, n)}


def test_no_inheritance_between_the_transports() -> None:
    assert not issubclass(IwarpDevice, Port) and not issubclass(Port, IwarpDevice)
    assert not issubclass(IwarpQP, EngineQP) and not issubclass(EngineQP, IwarpQP)
    dev = IwarpDevice([GID])
    assert not hasattr(dev, "iw_qps") and not hasattr(dev, "receive")
    qp = dev.create_qp(_init())
    assert dev.qps == {qp.qpn: qp}


def test_engines_emit_no_string_events() -> None:
    """Async events are AsyncEventType members: no event name is passed as a string."""
    names = {t.name for t in AsyncEventType}
    for path in [*(SRC / "ib").glob("*.py"), *(SRC / "iwarp").glob("*.py"),
                 *(SRC / "seam").glob("*.py"), SRC / "verbs" / "device.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert node.value not in names, f"{path.name}: string event {node.value!r}"


def test_requester_and_responder_name_qp_states_and_types() -> None:
    """``qp.state == 6`` and ``qp.qp_type == 2`` are written with the names of
    softrdma.seam.states (compared to a bare number, neither attribute may appear)."""
    for name in ("requester.py", "responder.py", "qp.py"):
        tree = ast.parse((SRC / "ib" / name).read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            attrs = {s.attr for s in sides if isinstance(s, ast.Attribute)}
            attrs |= {s.id for s in sides if isinstance(s, ast.Name)}
            if attrs & {"state", "qp_type", "st", "qtype", "t"}:
                nums = [s for s in sides if isinstance(s, ast.Constant)
                        and isinstance(s.value, int)]
                tuples = [c for s in sides if isinstance(s, ast.Tuple) for c in s.elts
                          if isinstance(c, ast.Constant)]
                assert not nums and not tuples, f"{name}:{node.lineno}: {ast.unparse(node)}"


def test_verbs_has_no_function_local_imports() -> None:
    for path in (SRC / "verbs").glob("*.py"):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                local = [n for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))]
                assert not local, f"{path.name}:{fn.name} imports inside a function"


def test_verbs_context_turns_engine_events_into_verbs_events() -> None:
    """The engine's typed event is only recorded as it is emitted (under the engine
    lock); get_async_event, in the application's thread, makes it a verbs AsyncEvent
    whose element is the verbs QP that owns the engine QP."""
    fab = Fabric(VirtualClock())
    ctx = v.Context(fabric=fab.link("10.2.0.77"))
    try:
        pd = v.PD(ctx)
        cq = v.CQ(ctx, 4)
        qp = v.QP(pd, v.QPInitAttr(qp_type=QPT_RC, scq=cq, rcq=cq))
        ctx.runtime.call(ctx.port.events.raise_event, AsyncEventType.QP_FATAL, qp.engine)
        assert list(ctx._events) == [EngineEvent(AsyncEventType.QP_FATAL, qp.engine)]
        ev = ctx.get_async_event(timeout=1)
        assert ev.event_type == e.IBV_EVENT_QP_FATAL and ev.element is qp
        ctx.runtime.call(ctx.port.device_fatal)
        ev = ctx.get_async_event(timeout=1)
        assert ev.event_type == e.IBV_EVENT_DEVICE_FATAL and ev.element is None
        assert set(verbs_device._ENGINE_EVENTS) == set(AsyncEventType)
    finally:
        ctx.close()


# ---- an SRQ fed by a receive ring (softrdma.capi's ibv_post_srq_recv) -----------------------
class _Ring:
    """A :class:`RecvFeed` kept as shim.c keeps an SRQ's ring: a receive is stored only while
    the ring is open and its entries plus the queue's length (as last told) stay below
    ``cap``; otherwise the producer posts through ``EngineSRQ.post_recv``."""

    def __init__(self, cap: int) -> None:
        self.cap, self.qlen, self.open = cap, 0, False
        self.entries: list[tuple[int, int, int, int]] = []

    def store(self, wr_id: int) -> bool:
        if not self.open or len(self.entries) + self.qlen >= self.cap:
            return False
        self.entries.append((wr_id, 0x1000, 64, 7))
        return True

    def drain(self, qlen: int, most: int, close: bool) -> list[tuple[int, int, int, int]]:
        n = len(self.entries) if most == 0 else min(most, len(self.entries))
        out, self.entries = self.entries[:n], self.entries[n:]
        self.qlen = qlen + n
        if close:
            self.open = False
        return out

    def reopen(self, qlen: int) -> None:
        self.qlen, self.open = qlen, True


_SRQ_OPS = st.lists(st.one_of(
    st.tuples(st.just("post"), st.integers(1, 3)),      # that many receives, one call each
    st.tuples(st.just("take"), st.integers(1, 4)),
    st.tuples(st.just("limit"), st.integers(0, 6)),
    st.tuples(st.just("resize"), st.integers(1, 12)),
    st.tuples(st.just("level"), st.just(0)),
), max_size=40)


@pytest.mark.iba("10.2.9", "10.2.9.6", "11.4.1.2")
@given(ops=_SRQ_OPS)
@settings(max_examples=300, deadline=None)
def test_srq_with_a_ring_is_the_srq_without(ops: list[tuple[str, int]]) -> None:
    """An SRQ fed by a ring (posts stored in it when it may, through post_recv otherwise)
    against one without (every post through post_recv), op by op: the same posts refused
    (full), the same WQEs taken in the same order, SRQ_LIMIT_REACHED at the same take,
    the same level; a limit armed, or a resize below the ring's capacity, keeps the ring
    closed (the level the limit checks must be exact; the ring checks a fixed capacity)."""
    seen: list[list[EngineEvent]] = [[], []]
    srqs = []
    for k in range(2):
        events = EventQueue()
        events.subscribe(seen[k].append)
        srqs.append(EngineSRQ(events, object(), 8, 1))
    fed, plain = srqs
    ring = _Ring(8)
    fed.set_feed(ring, 8)
    log: list[list[object]] = [[], []]
    wr_id = 0
    for op, arg in ops:
        if op == "post":
            for _ in range(arg):
                wr_id += 1
                for k, srq in enumerate(srqs):
                    if k == 0 and ring.store(wr_id):
                        log[0].append(("posted", wr_id))
                        continue
                    try:
                        srq.post_recv(RecvWQE(wr_id, [SGE(0x1000, 64, 7)]))
                        log[k].append(("posted", wr_id))
                    except ResourceError:
                        log[k].append(("full", wr_id))
        elif op == "take":
            for _ in range(arg):
                for k, srq in enumerate(srqs):
                    w = srq.take()
                    log[k].append(("took", None if w is None else w.wr_id, len(seen[k])))
        elif op == "limit":
            if arg <= plain.max_wr:
                for srq in srqs:
                    srq.modify(srq_limit=arg)
        elif op == "resize":
            if arg >= plain.level():  # verbs: not below the WQEs queued (EINVAL)
                assert fed.level() == plain.level()
                for srq in srqs:
                    srq.modify(max_wr=arg)
        else:
            log[0].append(("level", fed.level()))
            log[1].append(("level", plain.level()))
        assert log[0] == log[1]
        if fed.srq_limit or fed.max_wr < 8:
            assert not ring.entries and not ring.open
    assert seen[0] == [EngineEvent(ev.type, fed) for ev in seen[1]]
    assert all(ev.element is plain for ev in seen[1])
    fed.set_feed(None)  # detached: the ring's receives are taken first
    assert [w.wr_id for w in fed.q] == [w.wr_id for w in plain.q]
