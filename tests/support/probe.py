"""A health probe in a process of its own, as a load balancer's or a kubelet's is: in the
measuring process it would time that process's own event loop (busy reading hundreds of event
streams) as much as the server. Shared by `tests/integration/test_sse_load.py` and
`bench/api_load.py`."""

from __future__ import annotations

import subprocess
import sys

# One fresh connection per probe; prints "<ms> <status>" per probe, status 0 when the connection
# failed or took longer than the timeout.
PROBE = """
import socket, sys, time
host, port, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
interval, timeout = float(sys.argv[4]), float(sys.argv[5])
request = f"GET {path} HTTP/1.1\\r\\nHost: {host}\\r\\nConnection: close\\r\\n\\r\\n".encode()
while True:
    began = time.perf_counter()
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(request)
            reply = b""
            while chunk := sock.recv(65536):
                reply += chunk
        status = int(reply.split(b" ", 2)[1])
    except (OSError, IndexError, ValueError):
        status = 0
    print(f"{(time.perf_counter() - began) * 1000:.1f} {status}", flush=True)
    time.sleep(interval)
"""


# A server that answers every connection at once with an empty 200, doing nothing else: probed
# beside a real server, its times are what the machine alone (its load, the scheduler) adds to a
# probe's. Prints its port.
CONTROL = """
import socket
server = socket.create_server(("127.0.0.1", 0))
print(server.getsockname()[1], flush=True)
while True:
    conn, _ = server.accept()
    with conn:
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Length: 0\\r\\nConnection: close\\r\\n\\r\\n")
"""


def start_control() -> tuple[subprocess.Popen[str], str]:
    """The control server (`CONTROL`) and its base URL."""
    proc = subprocess.Popen([sys.executable, "-c", CONTROL], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, f"http://127.0.0.1:{int(proc.stdout.readline())}"


def start_probe(
    base_url: str, path: str, interval: float, timeout: float = 10.0
) -> subprocess.Popen[str]:
    host, port = base_url.removeprefix("http://").split(":")
    return subprocess.Popen(
        [sys.executable, "-c", PROBE, host, port, path, str(interval), str(timeout)],
        stdout=subprocess.PIPE,
        text=True,
    )


def stop_probe(probe: subprocess.Popen[str]) -> list[tuple[float, int]]:
    """(milliseconds, HTTP status or 0) of each probe that finished."""
    probe.terminate()
    out, _ = probe.communicate(timeout=30)
    rows = [line.split() for line in out.splitlines() if line.strip()]
    return [(float(ms), int(status)) for ms, status in rows]
