"""The dataset record: one JSON object per line, `{"prompt": ...}` or `{"messages": [...]}`.

One definition for both places a dataset is read: the API checks every line of an upload with it
(`POST /v1/files` refuses a file with its first bad lines, by number), and the worker builds its
examples with it. Any other field of the record is kept as is and handed to the graders (the
reference `answer`, test cases, a JSON schema); `answer`, when present, must be a string or a
number, since the default match and most graders compare against it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from core.tasks.base import Example

ROLES = ("system", "user", "assistant")
MAX_MESSAGES = 256
MAX_REPORTED_PROBLEMS = 10
"""How many bad lines an upload's 422 lists (the count of all of them comes with it)."""


class RecordError(ValueError):
    """A line that is not a valid record; the message says what is wrong, without the line."""


def parse_line(line: str | bytes) -> dict[str, Any]:
    """The record of one line: a JSON object, or RecordError."""
    try:
        obj = json.loads(line)
    # ValueError: bad JSON (incl. bad UTF-8, an integer too long to print); RecursionError: a
    # line of a million "[" is valid input to the parser's recursion
    except (ValueError, RecursionError) as e:
        raise RecordError(f"not JSON ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(obj, dict):
        raise RecordError(f"a record is a JSON object, not {_json_type(obj)}")
    check_record(obj)
    return obj


def check_record(obj: dict[str, Any]) -> None:
    """Raises RecordError naming the first problem of a parsed record."""
    has_prompt, has_messages = "prompt" in obj, "messages" in obj
    if has_prompt == has_messages:
        raise RecordError("a record has exactly one of 'prompt' (text) and 'messages' (chat)")
    if has_prompt and not isinstance(obj["prompt"], str):
        raise RecordError(f"'prompt' must be a string, not {_json_type(obj['prompt'])}")
    if has_messages:
        _check_messages(obj["messages"])
    answer = obj.get("answer")
    if answer is not None and (
        isinstance(answer, bool) or not isinstance(answer, str | int | float)
    ):
        raise RecordError(f"'answer' must be a string or a number, not {_json_type(answer)}")


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise RecordError("'messages' must be a non-empty list of {role, content} objects")
    if len(messages) > MAX_MESSAGES:
        raise RecordError(f"'messages' has {len(messages)} turns, more than {MAX_MESSAGES}")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or set(message) != {"role", "content"}:
            raise RecordError(f"messages[{i}] must be an object with exactly 'role' and 'content'")
        if message["role"] not in ROLES:
            raise RecordError(f"messages[{i}].role must be one of {list(ROLES)}")
        if not isinstance(message["content"], str):
            raise RecordError(f"messages[{i}].content must be a string")
    if messages[-1]["role"] == "assistant":
        raise RecordError("the last message is the assistant's: the model has nothing to answer")


def to_example(obj: dict[str, Any]) -> Example:
    """The task example of a checked record."""
    answer = obj.get("answer")
    text_answer = "" if answer is None else str(answer)
    if "messages" in obj:
        turns = tuple({"role": m["role"], "content": m["content"]} for m in obj["messages"])
        last_user = next((m["content"] for m in reversed(turns) if m["role"] == "user"), "")
        return Example(last_user, text_answer, messages=turns, record=obj)
    return Example(obj["prompt"], text_answer, record=obj)


@dataclass(frozen=True)
class LineProblem:
    line: int  # 1-based
    message: str


def find_problems(
    lines: Iterable[tuple[int, str | bytes]], limit: int = MAX_REPORTED_PROBLEMS
) -> tuple[list[LineProblem], int, int]:
    """Checks every line; returns (the first `limit` problems, how many bad lines in all, how
    many records). Blank lines are skipped, as the task skips them."""
    problems: list[LineProblem] = []
    bad = records = 0
    for lineno, line in lines:
        if not line.strip():
            continue
        try:
            parse_line(line)
        except RecordError as e:
            bad += 1
            if len(problems) < limit:
                problems.append(LineProblem(lineno, str(e)))
            continue
        records += 1
    return problems, bad, records


def iter_records(lines: Iterable[tuple[int, str | bytes]], what: str) -> Iterator[dict[str, Any]]:
    """The records of `lines`, failing on the first bad one with `what` and its line number."""
    for _, record in numbered_records(lines, what):
        yield record


def numbered_records(
    lines: Iterable[tuple[int, str | bytes]], what: str
) -> Iterator[tuple[int, dict[str, Any]]]:
    """`iter_records` with each record's line number, for checks made after parsing (the
    fields a grader reads) to name the line too."""
    for lineno, line in lines:
        if not line.strip():
            continue
        try:
            yield lineno, parse_line(line)
        except RecordError as e:
            raise ValueError(f"{what} line {lineno}: {e}") from None


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"
