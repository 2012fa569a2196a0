"""A TCP proxy in front of redis-server that holds back one kind of command for a while: the
way a test stalls one write of a request and not the reads and writes before it.

`stack.stall` (DEBUG SLEEP) and CLIENT PAUSE WRITE stall every command, or every write, from the
moment they start; a request that writes several times (an experiment writes its record, then
each child) meets them at its first write. This proxy instead forwards everything until a
command matches `pattern`, and from then on delays every matching command for `seconds`, in
every connection: the API's store timeout fires, its 503 shows what that request had sent by
then, and Redis runs the held command when the hold ends, as it runs a command that reached it
during a stall.
"""

from __future__ import annotations

import re
import time

from tests.support.tcp_proxy import TcpProxy


class HoldingProxy(TcpProxy):
    def __init__(self, target_port: int, pattern: re.Pattern[bytes], seconds: float) -> None:
        self.pattern = pattern
        self.seconds = seconds
        self.held = 0  # commands held back so far
        self._until: float | None = None  # when the hold ends, once the first match came
        super().__init__("127.0.0.1", target_port, "redis hold")

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def wait_released(self) -> None:
        """Returns once the hold has ended (at once if nothing matched yet)."""
        with self._lock:
            until = self._until
        if until is not None:
            time.sleep(max(0.0, until - time.monotonic()) + 0.2)

    def forward(self, index: int, to_server: bool, chunk: bytes, sent: int) -> tuple[bytes, bool]:
        """Sleeps while the hold lasts if `chunk` has a matching command (redis-py sends a
        command in one write, so a chunk holds it whole)."""
        if to_server and self.pattern.search(chunk):
            with self._lock:
                if self._until is None:
                    self._until = time.monotonic() + self.seconds
                until = self._until
                self.held += time.monotonic() < until
            time.sleep(max(0.0, until - time.monotonic()))
        return chunk, False
