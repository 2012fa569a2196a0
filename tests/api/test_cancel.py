"""Cancelling a task that may be inside a Redis call (`api.streaming.cancel`): a cancel that Python
3.11's `asyncio.wait_for` drops must not leave the task running. The real Redis case is in
tests/integration/test_redis_cancel.py; the event streams' and feeds' cases in
test_sse_close.py."""

from __future__ import annotations

import asyncio
import contextlib
import sys

from api.streaming.cancel import CANCEL_AGAIN_SECONDS, cancel_until_done


async def _loses_one_cancel(started: asyncio.Event) -> None:
    """Loses the first cancel as redis-py's write does on 3.11 (explicitly here, so that the
    test does not depend on the Python version), then waits to be cancelled."""
    started.set()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(10)
    await asyncio.sleep(10)


def test_python_3_11_wait_for_loses_a_cancel_that_comes_with_its_result() -> None:
    """The upstream bug (CPython gh-86296): the operation `wait_for` waits on completes in the
    same pass of the loop as a cancel of the caller; 3.11 returns the result and forgets the
    cancel, 3.12 (wait_for rebuilt on asyncio.timeout) raises it."""

    async def scenario() -> bool:
        caller: asyncio.Task[str] | None = None

        async def write() -> str:
            assert caller is not None
            caller.cancel()  # the client leaves just as the command is written
            return "written"

        async def command() -> str:
            nonlocal caller
            caller = asyncio.current_task()
            return await asyncio.wait_for(write(), 5)

        task = asyncio.create_task(command())
        await asyncio.wait([task])
        return not task.cancelled() and task.result() == "written"

    assert asyncio.run(scenario()) == (sys.version_info < (3, 12))


def test_a_task_that_lost_its_cancel_is_cancelled_again_until_it_ends() -> None:
    async def scenario() -> None:
        started = asyncio.Event()
        once = asyncio.create_task(_loses_one_cancel(started))
        await started.wait()
        once.cancel()
        await asyncio.sleep(3 * CANCEL_AGAIN_SECONDS)
        assert not once.done()  # the failure mode: one cancel, and it runs on

        started.clear()
        task = asyncio.create_task(_loses_one_cancel(started))
        await started.wait()
        cancel_until_done(task)
        done, _ = await asyncio.wait([task], timeout=3 * CANCEL_AGAIN_SECONDS)
        assert done == {task} and task.cancelled() and task.cancelling() == 2
        once.cancel()
        await asyncio.wait([once])

    asyncio.run(scenario())


def test_a_task_that_ends_at_the_first_cancel_is_cancelled_once() -> None:
    async def scenario() -> None:
        task = asyncio.create_task(asyncio.sleep(10))
        await asyncio.sleep(0)
        cancel_until_done(task)
        await asyncio.wait([task])
        await asyncio.sleep(3 * CANCEL_AGAIN_SECONDS)
        assert task.cancelled() and task.cancelling() == 1

        finished = asyncio.create_task(asyncio.sleep(0))
        await asyncio.wait([finished])
        cancel_until_done(finished)  # already done: left alone
        assert not finished.cancelled() and finished.cancelling() == 0

    asyncio.run(scenario())
