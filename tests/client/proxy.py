"""A TCP proxy in front of the real API that can cut every open connection on demand.

This is how a test drops an SSE stream for real: the client sees the same abrupt end of a
chunked body that a proxy timeout or a network blip produces, and must reconnect on its own.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class DroppingProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self.accepted = 0
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
                self.accepted += 1
                self._open += [downstream, upstream]
            for src, dst in ((downstream, upstream), (upstream, downstream)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def drop_all(self) -> int:
        """Cuts every connection open now (both sides); returns how many pairs were cut."""
        with self._lock:
            victims, self._open = self._open, []
        for sock in victims:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        return len(victims) // 2

    def close(self) -> None:
        self._closed = True
        self._server.close()
        self.drop_all()
