"""A real chat-completions server for score_model graders to call (a thread on 127.0.0.1)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Endpoint:
    """A real chat-completions server on 127.0.0.1: answers `reply` (or `status`), and keeps
    every request's headers and body."""

    def __init__(self) -> None:
        self.reply = "7"
        self.status = 200
        self.error = "down"  # the body's `error` when `status` is not 200
        self.requests: list[tuple[dict[str, str], dict[str, Any]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
                if self.path != "/v1/chat/completions":
                    self.send_error(404)
                    return
                answer = {"choices": [{"message": {"role": "assistant", "content": outer.reply}}]}
                data = json.dumps(
                    answer if outer.status == 200 else {"error": outer.error}
                ).encode()
                self.send_response(outer.status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
