"""What `pdppo dev` leaves for its user: the dev.env values, and its log to wait on."""

from __future__ import annotations

import time
from pathlib import Path


def dev_env_file(data: Path) -> tuple[str, str]:
    """PDPPO_URL and PDPPO_API_KEY as a user gets them: `source .pdppo/dev.env`."""
    values = dict(
        line.removeprefix("export ").split("=", 1)
        for line in (data / "dev.env").read_text().splitlines()
    )
    return values["PDPPO_URL"], values["PDPPO_API_KEY"]


def wait_for_log(log: Path, text: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        content = log.read_text(errors="replace")
        if text in content:
            return content
        time.sleep(0.1)
    raise AssertionError(f"no {text!r} in {log}:\n{log.read_text(errors='replace')[-3000:]}")
