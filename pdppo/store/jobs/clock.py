"""Whether Redis has just been away: a gap in its own clock between our scripts.

A lease expires in Redis's time, which runs on through a stall (an fsync pause, a `SIGSTOP`, a
failover) in which nobody could renew it. Its holder is alive and hands the job back itself once
Redis answers (`workers.job.runner`), saying why; but a reaper whose request was sent during the
stall, or came first after it, found the lease gone and requeued the job as a lost worker
(counted towards `PDPPO_MAX_WORKER_LOSSES`), and the hand-back then found it no longer running.
A reaper that noticed the outage itself held off (`workers.upkeep.reaper`), but one whose own
calls happened to miss it did not.

So the store notices instead, whoever's request comes first: every lease renewal, every reaper
pass and every requeue stamps Redis's own time (`TIME`) in `STORE_CLOCK`, and one that finds
the last stamp older than `gap_ms` (longer than any pause between stamps while Redis answers:
holders renew six times per lease, reapers pass every second) sets `STALL_SEEN` for `hold_ms`.
While it lives, a reaper's requeue of a job whose lease expired answers `held` and changes
nothing: the holder has that long to hand the job back. One that does not was lost indeed, and
the next pass after the hold counts it. The stamps are Redis's, not the callers', so a request
sent before the stall and run after it still sees the gap.
"""

from __future__ import annotations

from typing import cast

import redis

from pdppo.store.keys import STALL_SEEN, STORE_CLOCK

MIN_GAP_SECONDS = 2.0  # a pause in the stamps shorter than this is load, not Redis away
HOLD_EXTRA_SECONDS = 3.0  # beyond a lease: a holder's hand-back retries back off up to 2 s

# store_tick(clock key, stall key, gap ms, hold ms): stamps the clock; the gap's length in ms while
# a stall is held, else false.
STORE_TICK = """
local function store_tick(clock, stall, gap_ms, hold_ms)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local last = tonumber(redis.call('GET', clock) or '0')
  redis.call('SET', clock, now)
  if last > 0 and now - last > tonumber(gap_ms) then
    redis.call('SET', stall, now - last, 'PX', hold_ms)
  end
  return redis.call('GET', stall)
end
"""

_TICK = STORE_TICK + "return store_tick(KEYS[1], KEYS[2], ARGV[1], ARGV[2])\n"


def gap_and_hold_ms(lease_seconds: float) -> tuple[int, int]:
    """A gap that means Redis was away for leases of `lease_seconds` (half a lease: a stall that
    expires a lease lasts five sixths of one), and how long its holders then have."""
    gap = max(lease_seconds / 2, MIN_GAP_SECONDS)
    return int(gap * 1000), int((lease_seconds + HOLD_EXTRA_SECONDS) * 1000)


def tick(client: redis.Redis, lease_seconds: float) -> int | None:
    """Stamp the store's clock (a reaper's pass); the gap in ms while a stall is held."""
    gap, hold = gap_and_hold_ms(lease_seconds)
    held = client.register_script(_TICK)(keys=[STORE_CLOCK, STALL_SEEN], args=[gap, hold])
    return int(cast(str, held)) if held else None
