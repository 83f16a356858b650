"""The asyncio calls of the awaitable waits (``await cq.wait()``, an rdma_cm event
channel's ``await next()``), with ``asyncio`` imported when a program first awaits: a
process that never does (every tool, devd, a C program under ``softrdma run``) skips its
import, about a tenth of ``softrdma.verbs``'s."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio

__all__ = ["running_loop", "sleep", "wait_for"]


def running_loop() -> asyncio.AbstractEventLoop:
    """``asyncio.get_running_loop()``."""
    import asyncio

    return asyncio.get_running_loop()


async def sleep(seconds: float) -> None:
    """``asyncio.sleep(seconds)``."""
    import asyncio

    await asyncio.sleep(seconds)


async def wait_for(fut: asyncio.Future[None], timeout: float | None) -> None:
    """``asyncio.wait_for(fut, timeout)``: TimeoutError when ``timeout`` passes first."""
    import asyncio

    await asyncio.wait_for(fut, timeout)
