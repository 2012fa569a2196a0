"""The JSONL record schema shared by uploads (the API's 422) and the worker (the task)."""

from __future__ import annotations

import json

import pytest

from core.tasks.records import (
    RecordError,
    find_problems,
    iter_records,
    numbered_records,
    parse_line,
    to_example,
)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "not JSON (JSONDecodeError: Expecting value: line 1 column 1 (char 0))"),
        ("[" * 100_000, "not JSON (RecursionError: maximum recursion depth exceeded"),
        (b'{"prompt": "\xff"}', "not JSON (UnicodeDecodeError:"),
        ('["a"]', "a record is a JSON object, not an array"),
        ('"text"', "a record is a JSON object, not a string"),
        ("{}", "a record has exactly one of 'prompt' (text) and 'messages' (chat)"),
        (
            '{"prompt": "p", "messages": [{"role": "user", "content": "q"}]}',
            "a record has exactly one of 'prompt' (text) and 'messages' (chat)",
        ),
        ('{"prompt": 3}', "'prompt' must be a string, not a number"),
        ('{"messages": []}', "'messages' must be a non-empty list of {role, content} objects"),
        ('{"messages": [{"role": "user"}]}', "messages[0] must be an object with exactly"),
        (
            '{"messages": [{"role": "bot", "content": "x"}]}',
            "messages[0].role must be one of ['system', 'user', 'assistant']",
        ),
        ('{"messages": [{"role": "user", "content": 1}]}', "messages[0].content must be a string"),
        (
            '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", '
            '"content": "a"}]}',
            "the last message is the assistant's: the model has nothing to answer",
        ),
        ('{"prompt": "p", "answer": true}', "'answer' must be a string or a number, not a boolean"),
        ('{"prompt": "p", "answer": [1]}', "'answer' must be a string or a number, not an array"),
    ],
)
def test_bad_lines_say_what_is_wrong(line: str | bytes, message: str) -> None:
    with pytest.raises(RecordError) as e:
        parse_line(line)
    assert str(e.value).startswith(message)


def test_too_many_turns() -> None:
    turns = [{"role": "user", "content": "q"}] * 257
    with pytest.raises(RecordError, match="'messages' has 257 turns, more than 256"):
        parse_line(json.dumps({"messages": turns}))


def test_text_and_chat_records_become_examples_with_their_record() -> None:
    text = parse_line('{"prompt": "2+2=", "answer": 4, "level": "easy"}')
    example = to_example(text)
    assert (example.prompt, example.answer, example.messages) == ("2+2=", "4", None)
    assert example.record == {"prompt": "2+2=", "answer": 4, "level": "easy"}
    chat = parse_line(
        json.dumps(
            {
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Capital of France?"},
                ],
                "schema": {"type": "string"},
            }
        )
    )
    example = to_example(chat)
    assert example.prompt == "Capital of France?" and example.answer == ""
    assert example.messages == (
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Capital of France?"},
    )
    assert example.record["schema"] == {"type": "string"}


def test_find_problems_counts_every_bad_line_and_lists_the_first() -> None:
    good = '{"prompt": "p"}'
    lines = list(enumerate([good, "x", "", "  ", "{}", good, "[1]", "y"], start=1))
    problems, bad, records = find_problems(lines, limit=2)
    assert (bad, records) == (4, 2)
    assert [(p.line, p.message[:10]) for p in problems] == [(2, "not JSON ("), (5, "a record h")]


def test_iter_records_names_the_source_and_line() -> None:
    lines = [(1, '{"prompt": "a"}'), (2, ""), (3, '{"prompt": "b"}'), (4, "{}")]
    records = iter_records(lines, "task.file='file-x'")
    assert next(records) == {"prompt": "a"}
    assert next(records) == {"prompt": "b"}
    with pytest.raises(ValueError, match=r"^task\.file='file-x' line 4: a record has exactly one"):
        next(records)
    assert [n for n, _ in numbered_records(lines[:3], "x")] == [1, 3]
