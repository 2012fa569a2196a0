"""A local webhook receiver for the tests: a threaded HTTP server that records every request it
gets, per path, and answers as the path says:

- `/ok`: 200 at once;
- `/flaky`: 500 to its first `failures` requests, then 200;
- `/hang`: never answers within the senders' timeout (holds the request `hang_seconds`);
- `/stall-once`: holds its first request until `release` is set (a worker is killed meanwhile),
  then answers 200 to every later one.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.time() when it arrived
    status: int  # what the receiver answered (0: it did not)


@dataclass
class Receiver:
    failures: int = 2
    hang_seconds: float = 30.0
    received: list[Received] = field(default_factory=list)
    arrived: threading.Event = field(default_factory=threading.Event)  # a /stall-once request
    release: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None
    url: str = ""
    stalled: bool = False

    def start(self, host: str = "127.0.0.1") -> str:
        """Listen on `host` (0.0.0.0: reachable from containers too); returns the loopback URL."""
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                status = receiver.answer(self.path)
                receiver.note(self.path, dict(self.headers.items()), body, status)
                if status:
                    self.send_response(status)
                    self.send_header("content-length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok" if status == 200 else b"no")

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        return self.url

    def answer(self, path: str) -> int:
        """The status to answer `path` (with its query: tests tell their requests apart by it)."""
        kind = path.split("?")[0]
        if kind == "/flaky":
            with self.lock:
                earlier = sum(1 for r in self.received if r.path == path)
            return 500 if earlier < self.failures else 200
        if kind == "/hang":
            time.sleep(self.hang_seconds)
            return 0
        if kind == "/stall-once":
            with self.lock:
                first, self.stalled = not self.stalled, True
            if first:
                self.arrived.set()
                self.release.wait(60)
                return 0
        return 200

    def note(self, path: str, headers: dict[str, str], body: bytes, status: int) -> None:
        with self.lock:
            self.received.append(Received(path, headers, body, time.time(), status))

    def at(self, path: str) -> list[Received]:
        with self.lock:
            return [r for r in self.received if r.path == path]

    def stop(self) -> None:
        self.release.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
