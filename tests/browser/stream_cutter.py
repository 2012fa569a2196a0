"""A TCP proxy for a browser that cuts event streams, and only them, in the middle.

A browser sends every request of the page through a few keep-alive connections, so cutting
"connection i" (tests/client/proxy.py) would hit whatever request happened to use it. This one
watches what the browser sends: once a connection carries a request for a job's `/events`, the
next `cut_after` bytes of the answer pass and then the connection is cut, as a proxy timeout or
a network blip would, `cuts` times in all. Everything else passes untouched.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class StreamCutter:
    def __init__(self, target_port: int, cut_after: int, cuts: int) -> None:
        self.target_port = target_port
        self.cut_after = cut_after
        self.cuts = cuts
        self.cut = 0  # streams cut so far
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self._server.accept()
            except OSError:
                return
            up = socket.create_connection(("127.0.0.1", self.target_port))
            streaming = threading.Event()  # this connection now carries an event stream
            threading.Thread(target=self._requests, args=(down, up, streaming), daemon=True).start()
            threading.Thread(target=self._answers, args=(up, down, streaming), daemon=True).start()

    def _requests(self, src: socket.socket, dst: socket.socket, streaming: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while chunk := src.recv(65536):
                if b"/events HTTP/1.1" in chunk:
                    streaming.set()
                dst.sendall(chunk)
        _close(src, dst)

    def _answers(self, src: socket.socket, dst: socket.socket, streaming: threading.Event) -> None:
        sent = 0
        doomed: bool | None = None  # decided at the stream's first bytes: cut it or not
        with contextlib.suppress(OSError):
            while chunk := src.recv(65536):
                if streaming.is_set():
                    if doomed is None:
                        doomed = self._take_cut()
                    if doomed and sent + len(chunk) >= self.cut_after:
                        dst.sendall(chunk[: self.cut_after - sent])
                        break
                    sent += len(chunk)
                dst.sendall(chunk)
        _close(src, dst)

    def _take_cut(self) -> bool:
        with self._lock:
            if self.cut >= self.cuts:
                return False
            self.cut += 1
            return True

    def close(self) -> None:
        self._server.close()


def _close(*socks: socket.socket) -> None:
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
