"""The tenant the client tests submit as, and the type of the `finished_job` fixture."""

from __future__ import annotations

from dataclasses import dataclass

from pdppo.client import Event

TENANT = "carol"


@dataclass(frozen=True)
class FinishedJob:
    """A job that ran to success, with its whole event stream as read once, uninterrupted."""

    id: str
    events: list[Event]
