"""Regenerate the chat-math dataset of `examples/chat_math.yaml` (seeded: same files every time).

    python examples/make_chat_math_data.py          # -> examples/data/chat_math{,_val}.jsonl

Every problem `a + b` and `a - b` (a >= b, so answers are never negative) with operands 0 to 15:
392 questions, shuffled with the seed; the first 50 are the validation file, the other 342 the
training file, so no validation question is ever trained on. Each record is a chat (a system turn
and the question) with the reference `answer` the graders and the warm-up read:

    {"messages": [{"role": "system", "content": "..."}, {"role": "user", "content":
    "What is 7 + 12?"}], "answer": "19"}

Small on purpose: a 0.5M-parameter model gets about a quarter of them right after a short
supervised warm-up, which leaves RL something to improve.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

SYSTEM = "You are a calculator. Reply with the number only."
MAX_OPERAND = 15
VALIDATION = 50
DEFAULT_DIR = Path(__file__).resolve().parent / "data"


def problems() -> list[tuple[int, str, int, int]]:
    """(a, op, b, answer) for every question, in a fixed order."""
    out = []
    for a in range(MAX_OPERAND + 1):
        for b in range(MAX_OPERAND + 1):
            out.append((a, "+", b, a + b))
            if a >= b:
                out.append((a, "-", b, a - b))
    return out


def record(a: int, op: str, b: int, answer: int) -> dict[str, Any]:
    return {
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"What is {a} {op} {b}?"},
        ],
        "answer": str(answer),
    }


def split(seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training records, validation records): disjoint, shuffled by `seed`."""
    rows = problems()
    random.Random(seed).shuffle(rows)
    records = [record(*row) for row in rows]
    return records[VALIDATION:], records[:VALIDATION]


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out-dir", type=Path, default=DEFAULT_DIR, help=f"folder (default {DEFAULT_DIR})"
    )
    parser.add_argument("--seed", type=int, default=0, help="shuffle seed")
    args = parser.parse_args(argv)
    train, val = split(args.seed)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    write_jsonl(args.out_dir / "chat_math.jsonl", train)
    write_jsonl(args.out_dir / "chat_math_val.jsonl", val)
    print(f"{len(train)} training and {len(val)} validation records in {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
