"""The calculator environment: an arithmetic question, a `calculator` tool the model may call,
and a reward at the end for the right answer.

An episode: the model's turns may call the tool (`core.environments.tools`, Hermes format); each
call's result comes back as a `tool` message and the model takes another turn. The first turn
without a call is the answer: the number in its last `<answer>...</answer>`, else its last
number, scores 1 when it equals the question's value, else 0. The driver's limits
(`EpisodeLimits`) cut an episode that keeps calling.

Args (`task.environment.args`): `min_value`/`max_value` the operands' range (default 2..99),
`operands` how many (default 2), `ops` the operators drawn from (default "+-*"),
`system_prompt` the turn that tells the model about the tool (default `SYSTEM_PROMPT`).
"""

from __future__ import annotations

import ast
import operator
import random
import re
from collections.abc import Callable, Mapping
from typing import Any

from core.environments.base import Done, Environment, Episode, Observation, Turn
from core.environments.tools import format_tool_call, parse_tool_calls
from core.tasks.base import Example

SYSTEM_PROMPT = (
    "Use the calculator: "
    + format_tool_call("calculator", {"expression": "2*3"})
    + ". Answer: <answer>6</answer>"
)

ARGS = ("min_value", "max_value", "operands", "ops", "system_prompt")

_OPS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
MAX_EXPRESSION = 200
MAX_DIGITS = 60
ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
NUMBER = re.compile(r"-?\d+")


def evaluate(expression: str) -> int:
    """The integer value of `expression` (+ - * // % and parentheses over integers only),
    parsed, never `eval`ed; ValueError for anything else or a result past `MAX_DIGITS`."""
    if len(expression) > MAX_EXPRESSION:
        raise ValueError(f"expression longer than {MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        raise ValueError("not an arithmetic expression") from None
    value = _value(tree.body)
    if len(str(abs(value))) > MAX_DIGITS:
        raise ValueError(f"result longer than {MAX_DIGITS} digits")
    return value


def _value(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_value(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.FloorDiv | ast.Mod) and right == 0:
            raise ValueError("division by zero")
        result: int = _OPS[type(node.op)](left, right)
        if len(str(abs(result))) > MAX_DIGITS:
            raise ValueError(f"result longer than {MAX_DIGITS} digits")
        return result
    raise ValueError(f"{type(node).__name__} is not allowed")


def final_answer(text: str) -> str | None:
    """The answer a turn gives: its last `<answer>` body, else its last integer."""
    tagged = ANSWER.findall(text)
    if tagged:
        return tagged[-1].strip()
    numbers = NUMBER.findall(text)
    return numbers[-1] if numbers else None


class CalculatorEpisode(Episode):
    def __init__(self, value: int) -> None:
        self.value = value
        self.calls = 0

    def step(self, turn: Turn) -> Observation | Done:
        calls = parse_tool_calls(turn.text)
        if not calls:
            answer = final_answer(turn.text)
            right = answer is not None and answer == str(self.value)
            return Done(1.0 if right else 0.0, {"answer": answer, "tool_calls": self.calls})
        self.calls += len(calls)
        results = []
        for call in calls:
            if call.error is not None:
                results.append(f"error: {call.error}")
            elif call.name != "calculator":
                results.append(f"error: no tool {call.name!r}")
            else:
                try:
                    results.append(str(evaluate(str(call.arguments.get("expression", "")))))
                except ValueError as e:
                    results.append(f"error: {e}")
        return Observation(messages=tuple({"role": "tool", "content": r} for r in results))


class CalculatorEnvironment(Environment):
    name = "calculator"

    def __init__(self, args: Mapping[str, Any]) -> None:
        unknown = sorted(set(args) - set(ARGS))
        if unknown:
            raise ValueError(
                f"task.environment.args: calculator has no {', '.join(unknown)} (its args: "
                f"{', '.join(ARGS)})"
            )
        self.low = int(args.get("min_value", 2))
        self.high = int(args.get("max_value", 99))
        self.operands = int(args.get("operands", 2))
        self.ops = str(args.get("ops", "+-*"))
        self.system_prompt = str(args.get("system_prompt", SYSTEM_PROMPT))
        if not (0 <= self.low <= self.high) or not 2 <= self.operands <= 8:
            raise ValueError("calculator: 0 <= min_value <= max_value and 2 <= operands <= 8")
        if not self.ops or set(self.ops) - set("+-*"):
            raise ValueError("calculator: ops is a non-empty string of + - *")

    def sample(self, rng: random.Random) -> Example:
        terms = [str(rng.randint(self.low, self.high)) for _ in range(self.operands)]
        expr = terms[0] + "".join(rng.choice(self.ops) + t for t in terms[1:])
        value = evaluate(expr)
        question = f"{expr}=?"
        messages = (
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": question},
        )
        return Example(question, str(value), messages=messages, record={"expression": expr})

    def start(self, example: Example) -> Episode:
        return CalculatorEpisode(int(example.answer))
