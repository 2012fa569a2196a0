"""Digit tasks the tiny model can learn on a CPU in minutes, with partial credit per position.

Prompts are short and byte-tokenized one digit per token: `reverse 3142=` -> `2413`. Partial credit
gives GRPO groups a spread of rewards from the very first step, so learning is visible early.
"""

from __future__ import annotations

import random

from core.tasks.base import Example, Task, positional_credit


def _digits(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("0123456789") for _ in range(n))


class DigitStringTask(Task):
    """copy / reverse / sort a random digit string of length in [min_len, max_len]."""

    def __init__(self, name: str, min_len: int, max_len: int) -> None:
        if name not in ("copy", "reverse", "sort"):
            raise ValueError(f"task.name={name!r} is not a digit-string task")
        self.name = name
        self.min_len = min_len
        self.max_len = max_len

    def sample(self, rng: random.Random) -> Example:
        s = _digits(rng, rng.randint(self.min_len, self.max_len))
        answer = {"copy": s, "reverse": s[::-1], "sort": "".join(sorted(s))}[self.name]
        return Example(prompt=f"{self.name} {s}=", answer=answer)

    def score(self, example: Example, completion: str) -> float:
        return positional_credit(completion.strip(), example.answer)

    def warmup_completion(self, example: Example, rng: random.Random) -> str:
        return _digits(rng, len(example.answer))


class ArithmeticTask(Task):
    """a+b with operands of min_len..max_len digits; credit per right-aligned digit."""

    name = "arithmetic"

    def __init__(self, min_len: int, max_len: int) -> None:
        self.min_len = min_len
        self.max_len = max_len

    def _operand(self, rng: random.Random) -> int:
        n = rng.randint(self.min_len, self.max_len)
        return rng.randint(0 if n == 1 else 10 ** (n - 1), 10**n - 1)

    def sample(self, rng: random.Random) -> Example:
        a, b = self._operand(rng), self._operand(rng)
        return Example(prompt=f"{a}+{b}=", answer=str(a + b))

    def score(self, example: Example, completion: str) -> float:
        pred = completion.strip()
        if pred == example.answer:
            return 1.0
        # right-align: the units digit is the first one a learner gets right
        return 0.9 * positional_credit(pred[::-1], example.answer[::-1])

    def warmup_completion(self, example: Example, rng: random.Random) -> str:
        n = len(example.answer)
        return str(rng.randint(0 if n == 1 else 10 ** (n - 1), 10**n - 1))
