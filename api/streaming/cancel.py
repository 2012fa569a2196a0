"""Cancelling a task that may be inside a Redis call, so that it ends.

Python 3.11's `asyncio.wait_for` forgets a cancel that reaches its caller in the same pass of the
event loop as the awaited operation's result (CPython gh-86296; 3.12 rebuilt `wait_for` on
`asyncio.timeout`), and redis-py wraps each command's write in `wait_for` whenever the client has
a socket timeout, as all of ours do. So a task cancelled while it sends a command now and then
carries on as if nothing had been asked: an HGETALL cancelled at a random point did so in 266 of
2000 tries here, an event stream whose client had left then kept its admission place until its
job ended, and a feed ran out its 5 s XREAD BLOCK. The only cure from outside is to ask again.
"""

from __future__ import annotations

import asyncio
from typing import Any

# Long enough that a task which took the first cancel has ended (its clean-up does not wait on
# anything), short enough that a lost one costs little.
CANCEL_AGAIN_SECONDS = 0.1


def cancel_until_done(task: asyncio.Task[Any]) -> None:
    """Cancels `task`, and again every CANCEL_AGAIN_SECONDS while it runs (the last look finds
    it done and stops)."""
    if task.done():
        return
    task.cancel()
    asyncio.get_running_loop().call_later(CANCEL_AGAIN_SECONDS, cancel_until_done, task)
