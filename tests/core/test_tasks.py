"""Verifiable rewards: built-in digit tasks with partial credit, and JSONL datasets."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from core.config import TaskConfig
from core.tasks import Example, make_task, positional_credit


def test_positional_credit() -> None:
    assert positional_credit("123", "123") == 1.0
    assert positional_credit("124", "123") == pytest.approx(2 / 3)
    assert positional_credit("12", "123") == pytest.approx(2 / 3)
    assert positional_credit("1234", "123") == pytest.approx(3 / 4)
    assert positional_credit("", "1") == 0.0


@pytest.mark.parametrize("name", ["copy", "reverse", "sort"])
def test_digit_tasks_reward_the_right_answer_only(name: str) -> None:
    task = make_task(TaskConfig.model_validate({"name": name, "min_len": 3, "max_len": 5}))
    rng = random.Random(0)
    for _ in range(50):
        ex = task.sample(rng)
        digits = ex.prompt.removeprefix(f"{name} ").removesuffix("=")
        want = {"copy": digits, "reverse": digits[::-1], "sort": "".join(sorted(digits))}[name]
        assert ex.answer == want and 3 <= len(want) <= 5
        assert task.score(ex, want) == 1.0
        assert 0.0 <= task.score(ex, "x" + want) < 1.0
        shaped = task.warmup_completion(ex, rng)
        assert len(shaped) == len(want) and shaped.isdigit()


def test_arithmetic_partial_credit_from_the_units_digit() -> None:
    task = make_task(TaskConfig(name="arithmetic", min_len=1, max_len=2))
    ex = Example("17+25=", "42")
    assert task.score(ex, "42") == 1.0
    assert task.score(ex, "32") == pytest.approx(0.45)  # units right
    assert task.score(ex, "47") == pytest.approx(0.45)  # tens right
    assert task.score(ex, "") == 0.0
    rng = random.Random(1)
    for _ in range(20):
        ex = task.sample(rng)
        a, b = ex.prompt.removesuffix("=").split("+")
        assert int(ex.answer) == int(a) + int(b)


def _write(tmp_path: Path, rows: list[dict[str, str]]) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_jsonl_scoring_modes(tmp_path: Path) -> None:
    path = _write(tmp_path, [{"prompt": "2+2=", "answer": "4"}])
    exact = make_task(TaskConfig(name="jsonl", path=str(path), match="exact"))
    ex = exact.sample(random.Random(0))
    assert ex == Example("2+2=", "4")
    assert exact.score(ex, " 4 ") == 1.0 and exact.score(ex, "4.0") == 0.0
    numeric = make_task(TaskConfig(name="jsonl", path=str(path), match="numeric"))
    assert numeric.score(ex, "4.0") == 1.0 and numeric.score(ex, "4.1") == 0.0
    assert numeric.score(ex, "four") == 0.0
    rpath = _write(tmp_path, [{"prompt": "say hi", "answer": "h(i|ello)!?"}])
    regex = make_task(TaskConfig(name="jsonl", path=str(rpath), match="regex"))
    rex = regex.sample(random.Random(0))
    assert regex.score(rex, "hello!") == 1.0 and regex.score(rex, "oh hi") == 0.0


def test_jsonl_bad_line_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "a", "answer": "b"}\n{"prompt": "no answer"}\n')
    with pytest.raises(ValueError, match=r"line 2"):
        make_task(TaskConfig(name="jsonl", path=str(path)))


def _jsonl(path: Path | str, data_roots: list[str] | None = None) -> object:
    return make_task(TaskConfig(name="jsonl", path=str(path)), data_roots=data_roots)


def test_jsonl_refuses_a_fifo_without_blocking(tmp_path: Path) -> None:
    """A FIFO under the data root used to block `open()` (and the worker) forever."""
    import os
    import threading

    fifo = tmp_path / "data.jsonl"
    os.mkfifo(fifo)
    errors: list[BaseException] = []

    def load() -> None:
        try:
            _jsonl(fifo, [str(tmp_path)])
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "make_task blocked on a FIFO"
    assert len(errors) == 1 and isinstance(errors[0], ValueError)
    assert str(errors[0]) == f"task.path={str(fifo)!r} is a FIFO, not a regular file"


def test_jsonl_with_data_roots_resolves_symlinks_and_refuses_relative_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, outside = tmp_path / "data", tmp_path / "artifacts"
    root.mkdir()
    outside.mkdir()
    secret = _write(outside, [{"prompt": "other tenant", "answer": "secret"}])
    (root / "steal.jsonl").symlink_to(secret)
    (root / "zero.jsonl").symlink_to("/dev/zero")
    for name in ("steal.jsonl", "zero.jsonl"):
        with pytest.raises(ValueError, match="leads outside the data roots"):
            _jsonl(root / name, [str(root)])
    monkeypatch.chdir(root)
    _write(root, [{"prompt": "p", "answer": "a"}])
    with pytest.raises(
        ValueError, match=r"task\.path='data\.jsonl' must be an absolute path under"
    ):
        _jsonl("data.jsonl", [str(root)])
    assert _jsonl(root / "data.jsonl", [str(root)]) is not None
    assert _jsonl("data.jsonl") is not None  # no roots (local `pdppo train`): cwd is fine
    with pytest.raises(ValueError, match="is not under any of the allowed data roots"):
        _jsonl(secret, [str(root)])


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("[" * 1_000_000, "RecursionError"),  # the parser recurses once per bracket
        ('{"prompt": "p", "answer": ' + "9" * 5000 + "}", "ValueError"),  # int too long
        ('["prompt", "answer"]', "TypeError"),
        ("not json", "JSONDecodeError"),
    ],
)
def test_jsonl_poison_lines_are_value_errors_with_the_line(
    tmp_path: Path, line: str, problem: str
) -> None:
    path = tmp_path / "poison.jsonl"
    path.write_text('{"prompt": "a", "answer": "b"}\n' + line + "\n")
    with pytest.raises(ValueError, match=rf"line 2: expected an object .*\({problem}"):
        _jsonl(path)


def test_jsonl_regex_answers_must_compile(tmp_path: Path) -> None:
    path = _write(tmp_path, [{"prompt": "p", "answer": "(unclosed"}])
    with pytest.raises(ValueError, match="line 1: answer is not a regex"):
        make_task(TaskConfig(name="jsonl", path=str(path), match="regex"))


def test_jsonl_line_length_is_bounded(tmp_path: Path) -> None:
    from core.tasks.jsonl import JsonlTask

    path = tmp_path / "long.jsonl"
    path.write_text('{"prompt": "' + "x" * 100 + '", "answer": "y"}\n')
    with pytest.raises(ValueError, match="line 1 is longer than the limit of 64 bytes"):
        JsonlTask(path, max_line_bytes=64)
    with pytest.raises(ValueError, match="larger than the limit of 64 bytes"):
        JsonlTask(path, max_bytes=64)
    assert len(JsonlTask(path).examples) == 1
