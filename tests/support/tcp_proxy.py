"""A TCP proxy for tests that act on the bytes between a client and a real server: the base that
`tests.client.proxy.DroppingProxy` (cuts a response) and `tests.integration.redis_hold`
(holds back one kind of Redis command) build on. Each connection is two threads, one per
direction; a subclass decides what each chunk becomes (`forward`)."""

from __future__ import annotations

import contextlib
import socket
import threading


class TcpProxy:
    def __init__(self, target_host: str, target_port: int, name: str = "tcp proxy") -> None:
        self.target = (target_host, target_port)
        self.accepted = 0  # connections so far; `forward` gets each one's index
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._closed = False
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        threading.Thread(target=self._accept_loop, name=name, daemon=True).start()

    def forward(self, index: int, to_server: bool, chunk: bytes, sent: int) -> tuple[bytes, bool]:
        """What to pass on of `chunk` (connection `index`, `sent` bytes passed this way so far),
        and whether the connection ends after it. The base passes everything on."""
        return chunk, False

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
            for src, dst, to_server in (
                (downstream, upstream, True),
                (upstream, downstream, False),
            ):
                threading.Thread(
                    target=self._pump, args=(src, dst, index, to_server), daemon=True
                ).start()

    def _pump(self, src: socket.socket, dst: socket.socket, index: int, to_server: bool) -> None:
        sent = 0
        try:
            while chunk := src.recv(65536):
                out, end = self.forward(index, to_server, chunk, sent)
                dst.sendall(out)
                sent += len(out)
                if end:
                    break
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
