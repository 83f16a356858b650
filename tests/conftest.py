"""Test configuration: under CI (``CI`` set), hypothesis runs derandomized, so every CI
run explores the same examples (deterministic, as the engines' tests are meant to be);
locally it explores new examples each run.

``HYPOTHESIS_PROFILE=slow`` (the slow job, ``.ci/slow``) selects the ``slow`` profile: never
derandomized, even under CI, with every property test's budget scaled up
(``tests/harness/property_budget.py``).

Tests marked ``slow`` (matrix repeats, long soaks: one representative of each behaviour
stays in the default suite) are left out of the README's test command and run by the
slow job: ``--slow`` (or a ``-m`` expression naming ``slow``) selects them again, and a
test named by its node id on the command line always runs.

A failed test whose hosts started ``softrdma ipoib up`` (tests/ipoib) reports those
processes: see :func:`pytest_runtest_makereport`."""

from __future__ import annotations

import compileall
import os
import signal
import sys
from collections import Counter
from collections.abc import Generator
from pathlib import Path

import pytest
from harness.ipoib_netns import forget_torn_down, report
from hypothesis import settings

# The tests start a server and its client together: a client refused because its server
# is not listening yet retries for this long (softrdma.tools.waiting; users get a refusal
# at once). Generous: a server's process start takes long on a loaded machine (.ci/stress).
os.environ.setdefault("SOFTRDMA_CONNECT_RETRY", "120")

# A suite started in the background by a non-interactive shell (`cmd &`, nohup, some CI
# runners) inherits SIGINT ignored, and so would every server a test starts and then stops
# with Ctrl-C (SIGINT): they would never stop. A handler here (reset to the default in
# every child at exec) gives the children their usual Ctrl-C.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Bytecode. The tests start about 1,100 Python processes (daemons, tools, helpers), most
# of them running this tree's src (PYTHONPATH). Where PYTHONDONTWRITEBYTECODE is set (as
# on some CI machines), none of them writes the bytecode it compiles, so each compiled
# every module it imported again: about 0.2 s of CPU per process on a slow machine. The
# controller compiles src and tests/harness once before the workers start
# (:func:`pytest_configure`; instant when up to date), and the pytest processes keep their
# rewritten test modules (pytest caches them only when bytecode may be written), which
# the workers would otherwise rewrite and compile on every run. The test modules
# themselves are left to that rewriting: plain bytecode of them would never be read.
ROOT = Path(__file__).resolve().parents[1]
sys.dont_write_bytecode = False

# No per-example deadline in any profile: hypothesis's deadline is wall time, and on a busy
# machine (.ci/stress) one example of a CRC or codec test can take a second without anything
# being wrong; the engines' own budgets (virtual time, packet counts) bound the runs.
settings.register_profile("ci", derandomize=True, print_blob=True, deadline=None)
settings.register_profile("slow", derandomize=False, print_blob=True, deadline=None)
settings.register_profile("local", deadline=None)
if os.environ.get("HYPOTHESIS_PROFILE") == "slow":
    settings.load_profile("slow")
elif os.environ.get("CI"):
    settings.load_profile("ci")
else:
    settings.load_profile("local")


#: The files that take longest (measured file by file with ``-n 0 --durations=0`` on the
#: shared 2-core machine at load 18), longest first. They start first: ``--dist loadfile``
#: gives each worker whole files in collection order (:func:`pytest_configure` turns off
#: xdist >= 3.6's reordering by number of tests, which put these few-test files last, where
#: one of them alone kept a worker busy for minutes after the other had finished).
LONGEST_FIRST = (
    "test_interop_lab.py",  # boots a Linux guest (when the lab is there)
    "test_rocev1_netns.py",  # about 5 minutes at load 18 (with the slow cases left out)
    "test_perftest_tools.py",  # about 4 minutes
    "test_pyverbs_tools.py",  # rdma-core's whole suite: 3 minutes before 40e0483, now 20 s
    "test_perftest_flags.py",  # about 3 minutes
    "test_capi_perftest.py",
    "test_capi_pyverbs.py",
)


def _longest_first(items: list[pytest.Item]) -> None:
    """Order the files: :data:`LONGEST_FIRST`, then the others by their number of tests
    (most first, as xdist would); each file's tests keep their order."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    count = Counter(item.path for item in items)
    items.sort(key=lambda item: (rank.get(item.path.name, len(rank)), -count[item.path]))


def pytest_configure(config: pytest.Config) -> None:
    """Files start in this conftest's order (``--no-loadscope-reorder``, set here rather
    than in addopts: xdist before 3.6 has no such option and keeps the order anyway);
    the controller byte-compiles what the processes import (see "Bytecode" above)."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    if not hasattr(config, "workerinput"):  # the controller (or -n 0), before any worker
        for tree in (ROOT / "src", ROOT / "tests" / "harness"):
            compileall.compile_dir(tree, quiet=1, workers=0)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slow", action="store_true", default=False,
                     help="also run the tests marked slow (the slow job, .ci/slow)")


def _named(item: pytest.Item, config: pytest.Config) -> bool:
    """``item`` was named on the command line by its node id (``FILE::TEST``, with or
    without its parameters, or ``FILE::CLASS``)."""
    here = config.invocation_params.dir
    own = item.nodeid.split("::", 1)[1]
    for arg in config.args:
        path, sep, name = arg.partition("::")
        if sep and (here / path).resolve() == item.path.resolve() and (
                own == name or own.startswith((name + "[", name + "::"))):
            return True
    return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave the tests marked ``slow`` out unless ``--slow``, a ``-m`` naming ``slow`` or
    their node id asks for them; then put the longest files first (:func:`_longest_first`)."""
    _longest_first(items)
    if config.getoption("--slow") or "slow" in (config.getoption("markexpr") or ""):
        return
    keep: list[pytest.Item] = []
    slow: list[pytest.Item] = []
    for item in items:
        if item.get_closest_marker("slow") is None or _named(item, config):
            keep.append(item)
        else:
            slow.append(item)
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = keep


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed phase (set-up, call or teardown) of a test whose hosts started ``softrdma
    ipoib up`` gets a section "ipoib up processes": whether each still runs or how it ended,
    and the tail of its stdout and stderr (:func:`harness.ipoib_netns.report`), so an
    interface process that died shows its traceback, not only the stalled transfer or
    failed ping it caused. After each report, the processes of hosts torn down are
    forgotten."""
    rep = yield
    if rep.failed and (text := report()):
        rep.sections.append(("ipoib up processes", text))
    forget_torn_down()
    return rep
