"""A rank process that does not train: `play` stands in for `workers.job.ranks.rank_main` in
tests/workers/test_ranks_watch.py, so the watch is tried on real processes and pipes in seconds.
What each rank does is read from the job's `config_json` (rank -> act); each says it is up by
a file `rank<N>.up` in the job's `out_dir`."""

from __future__ import annotations

import json
import os
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ERROR = (
    "invalid_input",
    "ValueError: rank {rank} has bad data",
    "Traceback (most recent call last): ...",
)


GRADED = {"completions": 8, "errors": 3, "timeouts": 1}  # one step's share, as a rank counts it


def play(job: Any, rank: int, parent: int, conn: Connection, threads: Any = None) -> None:
    act = json.loads(job.config_json)[str(rank)]
    Path(job.out_dir, f"rank{rank}.up").touch()
    if act == "grade":  # two steps graded, each told as `RankCallback.on_step` tells it; then done
        for _ in range(2):
            conn.send(("grading", GRADED))
        time.sleep(0.5)
        return
    if act == "error":  # what rank_main does on an error: say it, leave with status 1
        code, message, text = ERROR
        conn.send((code, message.format(rank=rank), text))
        os._exit(1)
    if act == "crash":  # dies without a word (the interpreter, a C extension)
        os._exit(3)
    if act == "train":  # a long step, or a wait in a collective: it leaves only when killed
        time.sleep(120)
    # "finish": trains its share for a second; its pipe closes without a word and it exits 0
    time.sleep(1.0)
