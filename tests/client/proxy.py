"""A TCP proxy in front of the real API that cuts connections in the middle of a response, and
a gateway whose API is down (`BadGateway`).

This is how a test drops an SSE stream for real: the client sees the same abrupt end of a
chunked body that a proxy timeout or a network blip produces, and must reconnect on its own.
Cuts are counted in bytes sent to the client, not in time, so a test does not depend on how
fast the job runs or how much the client has buffered.
"""

from __future__ import annotations

import http.server
import threading

from tests.support.tcp_proxy import TcpProxy


class DroppingProxy(TcpProxy):
    """Connection i (from 0) is cut after `cut_after[i]` response bytes; later ones live."""

    def __init__(self, target_host: str, target_port: int, cut_after: list[int]) -> None:
        self.cut_after = cut_after
        self.cuts = 0
        super().__init__(target_host, target_port, "dropping proxy")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def forward(self, index: int, to_server: bool, chunk: bytes, sent: int) -> tuple[bytes, bool]:
        limit = self.cut_after[index] if index < len(self.cut_after) else None
        if to_server or limit is None or sent + len(chunk) < limit:
            return chunk, False
        with self._lock:
            self.cuts += 1
        return chunk[: limit - sent], True


class BadGateway:
    """An HTTP server that answers every request 502 with an HTML page, as a reverse proxy does
    when the API behind it is down: a real 5xx over a real connection, for the CLI's tests."""

    PAGE = b"<html><body><h1>502 Bad Gateway</h1>upstream connect error</body></html>"

    def __init__(self) -> None:
        page = self.PAGE

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)  # the whole body: a reset would hide the 502
                self.send_response(502)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _answer

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port: int = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
