"""A TCP proxy in front of the real API that cuts connections in the middle of a response, and
a gateway whose API is down (`BadGateway`).

This is how a test drops an SSE stream for real: the client sees the same abrupt end of a
chunked body that a proxy timeout or a network blip produces, and must reconnect on its own.
Cuts are counted in bytes sent to the client, not in time, so a test does not depend on how
fast the job runs or how much the client has buffered.
"""

from __future__ import annotations

import contextlib
import http.server
import socket
import threading


class DroppingProxy:
    """Connection i (from 0) is cut after `cut_after[i]` response bytes; later ones live."""

    def __init__(self, target_host: str, target_port: int, cut_after: list[int]) -> None:
        self.target = (target_host, target_port)
        self.cut_after = cut_after
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self.accepted = 0
        self.cuts = 0
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept_loop, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                downstream, _ = self._server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                downstream.close()
                continue
            with self._lock:
                index = self.accepted
                self.accepted += 1
                self._open += [downstream, upstream]
            limit = self.cut_after[index] if index < len(self.cut_after) else None
            threading.Thread(
                target=self._pump, args=(downstream, upstream, None), daemon=True
            ).start()
            threading.Thread(
                target=self._pump, args=(upstream, downstream, limit), daemon=True
            ).start()

    def _pump(self, src: socket.socket, dst: socket.socket, limit: int | None) -> None:
        sent = 0
        try:
            while chunk := src.recv(65536):
                if limit is not None and sent + len(chunk) >= limit:
                    dst.sendall(chunk[: limit - sent])
                    with self._lock:
                        self.cuts += 1
                    break
                dst.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed = True
        self._server.close()
        with self._lock:
            victims, self._open = self._open, []
        for sock in victims:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


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
