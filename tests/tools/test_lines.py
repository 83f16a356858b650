"""softrdma.tools.lines.say: whole lines from threads writing at the same time (the
persistent rping server prints each client's pings from that client's thread)."""

from __future__ import annotations

import threading
import time

from softrdma.tools.lines import say


class _SlowFile:
    """A text file whose every write lets the other threads run before it returns, as a
    pipe's write may: the window in which ``print``'s second write (the newline) lost
    its place to another thread's line."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.flushes = 0

    def write(self, s: str) -> int:
        self.parts.append(s)
        time.sleep(0.0002)
        return len(s)

    def flush(self) -> None:
        self.flushes += 1


def _write_from_threads(write: object, threads: int = 4, lines: int = 40) -> list[str]:
    out = _SlowFile()
    start = threading.Barrier(threads)

    def worker(n: int) -> None:
        start.wait()
        for i in range(lines):
            write(f"server ping data: rdma-ping-{n}-{i}", out)  # type: ignore[operator]

    ts = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return "".join(out.parts).splitlines()


def test_say_keeps_each_line_whole_across_threads() -> None:
    got = _write_from_threads(lambda text, f: say(text, file=f))
    assert len(got) == 4 * 40
    assert sorted(got) == sorted(f"server ping data: rdma-ping-{n}-{i}"
                                 for n in range(4) for i in range(40))


def test_print_would_split_them() -> None:
    """The check above can fail: print's two writes interleave on the same file."""
    got = _write_from_threads(lambda text, f: print(text, file=f))
    assert len(got) != 4 * 40 or any(not x.startswith("server ping data: rdma-ping-")
                                     for x in got)


def test_say_flushes_and_defaults_to_stdout(capsys: object) -> None:
    f = _SlowFile()
    say("one", file=f)
    assert f.parts == ["one\n"] and f.flushes == 1
    say("two")
    assert capsys.readouterr().out == "two\n"  # type: ignore[attr-defined]
