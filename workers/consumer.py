"""The worker's Celery consumer: Celery's own, with the unacknowledged messages handed back before
a lost broker connection is torn down.

Why: with kombu 5.7's Redis transport a worker whose task's ack failed (Redis went away while the
job ran, or just as it ended) exited at its next reconnect with "Unrecoverable error:
AttributeError: 'NoneType' object has no attribute 'hostname'", with exit code 0, so a supervisor
that restarts only on failure left the queue without a worker. Celery's teardown
(`Consumer.on_connection_error_after_connected`) collects the connection, which detaches the
transport from it, then closes it. When the collect fails to close the channel holding the
unacknowledged message (another channel of the same connection, the broadcast one, raised first
and cut the loop short), the close runs that channel's restore of those messages through the
detached transport, which has no address left to connect to.

Handing them back first, while the transport is still attached, leaves the teardown nothing to
restore: with Redis reachable they go back to their queue at once; with Redis gone the attempt
fails here (caught) and they stay in Redis's `unacked` hash, which kombu restores after
`visibility_timeout` and the reaper (`workers.upkeep.reaper`) sooner. Either way the redelivered
task of a job that already ended is skipped by the job's lease and status (`workers.tasks`).
"""

from __future__ import annotations

import logging
from typing import Any

from celery.worker.consumer import Consumer as CeleryConsumer

logger = logging.getLogger(__name__)


def hand_back_unacked(connection: Any) -> int:
    """Restore the unacknowledged messages of every channel of `connection` (a kombu Connection
    on the Redis transport) that still holds some; returns how many channels could not, because
    Redis did not answer. Never raises: it runs on the way to a reconnect."""
    failed = 0
    transport = getattr(connection, "_transport", None)
    for channel in list(getattr(transport, "channels", None) or ()):
        qos = getattr(channel, "_qos", None)  # None: the channel never consumed
        if qos is None or not qos._delivered:
            continue
        try:
            qos.restore_unacked_once()
        except Exception as exc:  # any failure leaves them in Redis, as the docstring says
            failed += 1
            logger.warning(
                "could not hand %d unacknowledged message(s) back (%s: %s); Redis redelivers "
                "them after the visibility timeout",
                len(qos._delivered),
                type(exc).__name__,
                exc,
            )
            # They stay in Redis; kombu holds a QoS marked restored to having none left (its
            # `restore_unacked_once` asserts it at the channel's close).
            qos._delivered.clear()
    return failed


class Consumer(CeleryConsumer):
    def on_connection_error_after_connected(self, exc: Exception) -> None:
        if self.connection is not None:
            hand_back_unacked(self.connection)
        super().on_connection_error_after_connected(exc)
