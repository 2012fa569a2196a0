"""A screenshot of TensorBoard's Scalars page for a `pdppo train` run reported to it: trains
examples/smoke.yaml (`report_to: [tensorboard]`, 40 steps) into a temporary folder, serves its
event files with `tensorboard` on this machine, and opens the page in headless Chromium
(Playwright with the system's Chromium, as tests/browser does). Writes docs/tensorboard-scalars.png.

    python bench/tensorboard_screenshot.py [--out docs/tensorboard-scalars.png]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "tensorboard-scalars.png")
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tb-shot-"))
    spec = yaml.safe_load((REPO / "examples" / "smoke.yaml").read_text())
    spec["train"].update(steps=args.steps, report_to=["tensorboard"], checkpoint_every=10)
    (root / "spec.yaml").write_text(yaml.safe_dump(spec))
    pdppo = [sys.executable, "-c", "from pdppo.cli import main; main()"]
    run = root / "smoke"
    subprocess.run(
        [*pdppo, "train", str(root / "spec.yaml"), "--out", str(run), "--quiet"], check=True
    )
    port = free_port()
    board = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "tensorboard"),
            "--logdir",
            str(run / "tensorboard"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("tensorboard did not start")
            time.sleep(0.3)
        from playwright.sync_api import sync_playwright

        chromium = os.environ.get("PDPPO_CHROMIUM") or shutil.which("chromium")
        with sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=chromium, args=["--no-sandbox", "--disable-gpu"]
            )
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            # the metrics that move on this task (its rewards are all 0: smoke.yaml)
            shown = "entropy|response_len|divergence_mean|tokens_per_s"
            page.goto(f"{url}/#scalars&tagFilter={shown}", wait_until="networkidle")
            page.wait_for_selector("text=train/entropy", timeout=60_000)
            time.sleep(3)  # the charts draw after their data arrives
            args.out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(args.out))
            browser.close()
        print(f"wrote {args.out}")
    finally:
        os.killpg(board.pid, signal.SIGKILL)
        board.wait(10)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
