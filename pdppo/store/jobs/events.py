"""A job's event stream and result rows: what SSE, `/metrics`, `/eval` and `/samples` read, and
what workers log.

The entries that change a job's state (status, metrics, eval, samples, checkpoint, done) are
added by the job scripts in `pdppo.store.jobs.transitions`, atomically with the record; their
payloads come from `status_data`/`log_data` here so that every writer formats them alike.
Everything that only reads the stream or the result rows, or appends a plain log line, is here,
one store per side (`AsyncEventStore` for the API, `EventStore` for the workers) over the job
store's client; reads over many jobs at once belong here too.

Event ids are Redis stream ids, `<milliseconds>-<sequence>`, each part an unsigned 64-bit number;
`parse_event_id` is the one place a client's id (`Last-Event-ID`, `since`) is checked, so that no
id Redis would refuse ever reaches it (Redis answers an error, and a stream that has already sent
its headers can only be cut).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, cast

import redis
import redis.asyncio as aredis

from pdppo.store.keys import eval_key, events_key, metrics_key, now_iso, samples_key

EventId = tuple[int, int]
ID_PART_MAX = 2**64 - 1
LAST_POSSIBLE_ID: EventId = (ID_PART_MAX, ID_PART_MAX)
_ID = re.compile(r"^(\d{1,20})(?:-(\d{1,20}))?$")


class EventIdError(ValueError):
    """A client's event id that is not a stream id, or one no stream can hold."""


def parse_event_id(text: str) -> EventId:
    """`1700000000000-3` as (1700000000000, 3); `5` means `5-0`, as in Redis. Raises
    EventIdError for anything else, including parts above 2^64 - 1 (Redis refuses those)."""
    match = _ID.match(text)
    if match is None:
        raise EventIdError(f"{text[:40]!r} is not an event id like 1700000000000-0")
    ms, seq = int(match[1]), int(match[2] or 0)
    if ms > ID_PART_MAX or seq > ID_PART_MAX:
        # all of it: the pattern matches 41 characters at most
        raise EventIdError(f"{text!r} is out of range: both parts of an event id are below 2^64")
    return ms, seq


def format_event_id(event_id: EventId) -> str:
    return f"{event_id[0]}-{event_id[1]}"


# A page of the stream as server-sent events, built in Redis: redis-py's pure-Python parser
# spends 50-150 ms of the API's event loop on a 1000-entry XRANGE reply (~7000 elements), but
# one bulk string costs it nothing. Same bytes as `ServerSentEvent(data, event, id).encode()`:
# newlines dropped from the event name, multi-line data split into `data:` lines; no `type`
# is a log, no `data` is {}. Stops after `done`. Returns {frames, last id, entries read, done}.
_ENCODED_PAGE = r"""
local entries = redis.call('XRANGE', KEYS[1], ARGV[1], '+', 'COUNT', ARGV[2])
local out, last, done = {}, '', 0
for _, entry in ipairs(entries) do
  local kind, data = 'log', '{}'
  local fields = entry[2]
  for j = 1, #fields, 2 do
    if fields[j] == 'type' then kind = fields[j + 1] elseif fields[j] == 'data' then
      data = fields[j + 1]
    end
  end
  kind = (string.gsub(kind, '[\r\n]', ''))
  if string.find(data, '[\r\n]') then
    data = (string.gsub(string.gsub(string.gsub(data, '\r\n', '\n'), '\r', '\n'), '\n',
                        '\r\ndata: '))
  end
  out[#out + 1] = 'id: ' .. entry[1] .. '\r\nevent: ' .. kind .. '\r\ndata: ' .. data .. '\r\n\r\n'
  last = entry[1]
  if kind == 'done' then
    done = 1
    break
  end
end
return {table.concat(out), last, #entries, done}
"""


@dataclass(frozen=True, slots=True)
class EncodedPage:
    """Stream entries as SSE frames, joined: what an events request sends as it is."""

    chunk: bytes
    last_id: str | None  # None when there was nothing after the start
    read: int  # entries read; `count` of them means more may follow
    done: bool  # ends with `done` (and nothing after it is included)


def status_data(status: str) -> str:
    return json.dumps({"status": status, "at": now_iso()})


def log_data(message: str) -> str:
    return json.dumps({"message": message, "at": now_iso()})


class AsyncEventStore:
    """What the API reads of a job's events and metrics, over `redis.asyncio`."""

    def __init__(self, client: aredis.Redis) -> None:
        self.redis = client
        self._encoded_page = client.register_script(_ENCODED_PAGE)

    async def metrics_history(self, job_id: str) -> list[dict[str, Any]]:
        rows = cast(list[str], await self.redis.lrange(metrics_key(job_id), 0, -1))
        return [json.loads(row) for row in rows]

    async def eval_history(self, job_id: str) -> list[dict[str, Any]]:
        """Every published evaluation, `{step, metrics}`, in step order."""
        rows = cast(list[str], await self.redis.lrange(eval_key(job_id), 0, -1))
        return [json.loads(row) for row in rows]

    async def samples_history(self, job_id: str, limit: int) -> list[dict[str, Any]]:
        """The newest `limit` samples rows, `{step, samples}`, oldest of them first."""
        rows = cast(list[str], await self.redis.lrange(samples_key(job_id), -limit, -1))
        return [json.loads(row) for row in rows]

    async def encoded_events_after(self, job_id: str, after: EventId, count: int) -> EncodedPage:
        """The stream's entries strictly after `after` ((0, 0) for all), oldest first, at most
        `count`, as the SSE frames an events request sends (see `_ENCODED_PAGE`)."""
        if after == LAST_POSSIBLE_ID:
            # nothing can follow it, and Redis refuses an exclusive range from it
            return EncodedPage(b"", None, 0, False)
        start = f"({format_event_id(after)}" if after != (0, 0) else "-"
        reply = await self._encoded_page(keys=[events_key(job_id)], args=[start, count])
        chunk, last, read, done = cast(list[Any], reply)
        text = chunk if isinstance(chunk, str) else bytes(chunk).decode()
        last_text = last if isinstance(last, str) else bytes(last).decode()
        return EncodedPage(text.encode(), last_text or None, int(read), bool(done))

    async def entries_before(
        self, job_id: str, before: EventId | None, count: int
    ) -> list[tuple[str, dict[str, str]]]:
        """Up to `count` entries, newest first, strictly older than `before` (from the newest
        when None): the pages of OpenAI's event listing, which runs backwards in time."""
        if before == (0, 0):
            return []  # nothing is older, and Redis refuses an exclusive range from it
        end = "+" if before is None else f"({format_event_id(before)}"
        entries = await self.redis.xrevrange(events_key(job_id), end, "-", count=count)
        return cast(list[tuple[str, dict[str, str]]], entries)

    async def last_event_id(self, job_id: str) -> str:
        entries = await self.redis.xrevrange(events_key(job_id), "+", "-", count=1)
        return cast(str, entries[0][0]) if entries else "0-0"

    async def last_event_of_type(
        self, job_id: str, event_type: str, within: int = 100
    ) -> tuple[str, dict[str, str]] | None:
        """The newest entry of `event_type` among the stream's last `within`: the `done` of an
        ended job, which is its last entry but for a stray log line after it."""
        entries = await self.redis.xrevrange(events_key(job_id), "+", "-", count=within)
        for entry in cast(list[tuple[str, dict[str, str]]], entries):
            if entry[1].get("type") == event_type:
                return entry
        return None


class EventStore:
    """What the workers add to a job's event stream outside the job scripts (log lines)."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client

    def publish_log(self, job_id: str, message: str) -> None:
        self.redis.xadd(events_key(job_id), {"type": "log", "data": log_data(message)})
