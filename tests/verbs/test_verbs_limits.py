"""Device limits (issue 21 item 7): each object type's ``ibv_device_attr`` limit is
enforced, with rxe's errno (EINVAL: ``__rxe_add_to_pool`` on a full pool), counted per
process and device (imported contexts share it), given back on close or collection; and
``max_mr_size`` is what this host can back, an MR beyond it failing with ENOMEM naming
the length (not a raw OSError)."""

from __future__ import annotations

import errno
import gc
import itertools
import mmap
import time
from collections.abc import Callable, Iterator

import pytest

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.links.fabric import Fabric
from softrdma.drivers.runtime.clock import VirtualClock
from softrdma.errors import InvalidArgument, ResourceError
from softrdma.verbs import limits
from softrdma.verbs.xrcd import XRCD, XrcSRQ

RC = int(e.IBV_QPT_RC)
LW = int(e.IBV_ACCESS_LOCAL_WRITE)
_names = itertools.count()


@pytest.fixture()
def ctx() -> Iterator[v.Context]:
    fab = Fabric(VirtualClock())
    # a device name of its own: the counts are per device
    c = v.Context(f"limits{next(_names)}", fabric=fab.link("10.3.0.1"))
    yield c
    c.close()


def _ah(pd: v.PD) -> v.AH:
    return v.AH(pd, v.AHAttr(gr=v.GlobalRoute(dgid="10.3.0.2")))


#: limit name -> how to make one more object of it on (ctx, pd, cq)
MAKERS: dict[str, Callable[[v.Context, v.PD, v.CQ], object]] = {
    "max_pd": lambda ctx, pd, cq: v.PD(ctx),
    "max_cq": lambda ctx, pd, cq: v.CQ(ctx, 4),
    "max_qp": lambda ctx, pd, cq: v.QP(pd, v.QPInitAttr(RC, scq=cq, rcq=cq)),
    "max_srq": lambda ctx, pd, cq: v.SRQ(pd, v.SrqInitAttr(v.SrqAttr(max_wr=4))),
    "max_ah": lambda ctx, pd, cq: _ah(pd),
    "max_mw": lambda ctx, pd, cq: v.MW(pd),
    "max_mr": lambda ctx, pd, cq: v.MR(pd, 64, LW),
}


@pytest.mark.parametrize("limit", sorted(MAKERS))
def test_each_limit_is_enforced(ctx: v.Context, limit: str,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    pd, cq = v.PD(ctx), v.CQ(ctx, 4)
    held = ctx.objects.count(limit)  # the PD and the CQ above count too
    monkeypatch.setitem(limits.LIMITS, limit, held + 3)
    assert getattr(ctx.query_device(), limit) == held + 3  # reported = enforced
    objs = [MAKERS[limit](ctx, pd, cq) for _ in range(3)]
    with pytest.raises(ResourceError) as ei:
        MAKERS[limit](ctx, pd, cq)
    assert ei.value.errno == errno.EINVAL and limit in str(ei.value)
    assert ctx.objects.count(limit) == held + 3  # the failed one is not counted
    objs.pop().close()  # type: ignore[attr-defined]
    objs.append(MAKERS[limit](ctx, pd, cq))  # room again


def test_xrc_srqs_and_tgt_qps_count_as_srqs_and_qps(ctx: v.Context,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    pd, cq = v.PD(ctx), v.CQ(ctx, 4)
    xrcd = XRCD(ctx)
    monkeypatch.setitem(limits.LIMITS, "max_srq", 1)
    monkeypatch.setitem(limits.LIMITS, "max_qp", 1)
    srq = XrcSRQ(pd, xrcd, cq, v.SrqInitAttr(v.SrqAttr(max_wr=4)))
    with pytest.raises(ResourceError):
        v.SRQ(pd, v.SrqInitAttr(v.SrqAttr(max_wr=4)))
    tgt = v.QP(xrcd, v.QPInitAttr(qp_type=int(e.IBV_QPT_XRC_RECV)))
    assert v.QP.open(xrcd, tgt.qp_num).qp_num == tgt.qp_num  # a handle: not a new QP
    assert not srq.closed
    with pytest.raises(ResourceError):
        v.QP(pd, v.QPInitAttr(RC, scq=cq, rcq=cq))


def test_counts_are_per_device_and_shared_by_imported_contexts(
        ctx: v.Context, monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    monkeypatch.setitem(limits.LIMITS, "max_pd", 2)
    other = v.Context(f"limits{next(_names)}", fabric=Fabric(VirtualClock()).link("10.3.0.9"))
    imported = v.Context.import_device(os.dup(ctx.async_fileno()))
    try:
        keep = [v.PD(ctx), v.PD(imported)]
        with pytest.raises(ResourceError):
            v.PD(ctx)
        with pytest.raises(ResourceError):
            v.PD(imported)
        keep += [v.PD(other), v.PD(other)]  # another device: its own count
        assert len(keep) == 4
    finally:
        imported.close()
        other.close()


def test_objects_dropped_without_close_give_their_count_back(
        ctx: v.Context, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(limits.LIMITS, "max_pd", 1)
    pd = v.PD(ctx)
    del pd
    gc.collect()
    v.PD(ctx)


def test_closing_a_parent_gives_its_dependents_counts_back(ctx: v.Context) -> None:
    pd = v.PD(ctx)
    kept = [v.MR(pd, 64, LW), _ah(pd)]
    assert (ctx.objects.count("max_mr"), ctx.objects.count("max_ah")) == (1, 1)
    pd.close()
    assert [ctx.objects.count(k) for k in ("max_pd", "max_mr", "max_ah")] == [0, 0, 0]
    assert all(o.closed for o in kept)


def test_mw_limit_at_the_real_default(ctx: v.Context) -> None:
    """rxe's RXE_MAX_MW (4096): the cheapest limited object, created up to its real limit."""
    assert limits.LIMITS["max_mw"] == ctx.query_device().max_mw == 0x1000
    pd = v.PD(ctx)
    t0 = time.monotonic()
    mws = [v.MW(pd) for _ in range(0x1000)]
    with pytest.raises(ResourceError) as ei:
        v.MW(pd)
    assert ei.value.errno == errno.EINVAL
    assert "max_mw is 4096" in str(ei.value)
    assert time.monotonic() - t0 < 30  # seconds, even on a busy machine
    mws[0].close()
    v.MW(pd)


# ---- max_mr_size -----------------------------------------------------------------------------
def test_max_mr_size_is_what_this_host_can_back(ctx: v.Context) -> None:
    size = ctx.query_device().max_mr_size
    assert 0 < size < 1 << 64 and size % mmap.PAGESIZE == 0
    assert size == limits.max_mr_size()
    pd = v.PD(ctx)
    for length in (size + 1, 1 << 62, (1 << 64) - 1):
        with pytest.raises(InvalidArgument) as ei:
            v.MR(pd, length, LW)
        assert ei.value.errno == errno.ENOMEM and ei.value.argument == "length"
        assert str(length) in str(ei.value)
    with pytest.raises(InvalidArgument) as ei:
        v.MR(pd, 1 << 64, LW)  # not a __u64
    assert ei.value.argument == "length"
    assert ctx.objects.count("max_mr") == 0


def test_mr_allocation_failure_is_enomem_naming_the_length(
        ctx: v.Context, monkeypatch: pytest.MonkeyPatch) -> None:
    """Below max_mr_size the host may still refuse (other processes hold the memory):
    the mmap failure becomes ENOMEM naming the length, and nothing is counted."""
    pd = v.PD(ctx)

    def refuse(*args: object, **kw: object) -> mmap.mmap:
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(mmap, "mmap", refuse)
    with pytest.raises(InvalidArgument) as ei:
        v.MR(pd, 1 << 20, LW)
    assert (ei.value.errno, ei.value.argument) == (errno.ENOMEM, "length")
    assert "1048576" in str(ei.value) and "Cannot allocate memory" in str(ei.value)
    assert ctx.objects.count("max_mr") == 0


def test_count_given_back_by_a_collection_inside_take() -> None:
    """A collection may start inside ``ObjectCounts.take`` (the error it raises at a full
    pool is an allocation) and run the ``__del__`` of a collected object of the same
    device, which gives its count back under the same lock: the lock is re-entrant, so
    the thread does not wait for itself, and the count comes out right."""
    from harness.collect import Cyclic, collector_paused, finishes

    counts = limits.ObjectCounts("gc-inside-take")
    counts.take("max_pd")

    class Freed(Cyclic):
        def __del__(self) -> None:
            counts.give("max_pd")

    real = counts._n

    class Collecting(dict[str, int]):
        def __getitem__(self, key: str) -> int:
            if key == "max_pd" and not done:
                done.append(1)
                gc.collect()  # as an allocation inside take() may start one
            return super().__getitem__(key)

    done: list[int] = []
    counts._n = Collecting(real)
    with collector_paused():
        Freed()
        assert finishes(lambda: counts.take("max_pd")), "take() waited for its own thread"
    assert done and counts.count("max_pd") == 1  # one taken, one given, one taken
