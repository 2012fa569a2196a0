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
        ("[" * 1_000_000, r"not JSON \(RecursionError"),  # the parser recurses per bracket
        ('{"prompt": "p", "answer": ' + "9" * 5000 + "}", r"not JSON \(ValueError"),  # long int
        ('["prompt", "answer"]', "a record is a JSON object, not an array"),
        ("not json", r"not JSON \(JSONDecodeError"),
    ],
)
def test_jsonl_poison_lines_are_value_errors_with_the_line(
    tmp_path: Path, line: str, problem: str
) -> None:
    path = tmp_path / "poison.jsonl"
    path.write_text('{"prompt": "a", "answer": "b"}\n' + line + "\n")
    with pytest.raises(ValueError, match=rf"poison\.jsonl' line 2: {problem}"):
        _jsonl(path)


def test_jsonl_regex_answers_must_compile(tmp_path: Path) -> None:
    path = _write(tmp_path, [{"prompt": "p", "answer": "(unclosed"}])
    with pytest.raises(ValueError, match="line 1: field 'answer' is not a regex"):
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


def _rows(tmp_path: Path, name: str, rows: list[dict[str, object]]) -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_chat_records_keep_their_fields_for_the_grader(tmp_path: Path) -> None:
    rows: list[dict[str, object]] = [
        {"messages": [{"role": "user", "content": "Capital of France?"}], "city": "Paris"},
        {"prompt": "Capital of Italy?", "city": "Rome", "answer": "unused"},
    ]
    path = _rows(tmp_path, "chat.jsonl", rows)
    grader = {"type": "string_check", "field": "city", "operation": "contains"}
    cfg = TaskConfig.model_validate({"name": "jsonl", "path": str(path), "grader": grader})
    with make_task(cfg) as task:
        first, second = task.examples
        assert first.messages == ({"role": "user", "content": "Capital of France?"},)
        assert first.record["city"] == "Paris" and first.answer == ""
        grades = task.grade([first, first, second], ["It is Paris.", "Lyon", "Rome"])
        assert grades.rewards == [1.0, 0.0, 1.0]
        assert grades.metrics == {"grader_errors": 0.0, "grader_timeouts": 0.0}
        assert task.score(second, "rome") == 0.0  # case-sensitive by default


def test_jsonl_without_grader_needs_answer_and_with_grader_its_fields(tmp_path: Path) -> None:
    path = _rows(tmp_path, "d.jsonl", [{"prompt": "a", "answer": 1}, {"prompt": "b", "n": 2}])
    with pytest.raises(ValueError, match=r"d\.jsonl' line 2: the record has no 'answer'"):
        make_task(TaskConfig(name="jsonl", path=str(path)))
    grader = {"type": "numeric", "field": "n"}
    cfg = TaskConfig.model_validate({"name": "jsonl", "path": str(path), "grader": grader})
    with pytest.raises(
        ValueError, match=r"d\.jsonl' line 1: the record has no field 'n', which the grader reads"
    ):
        make_task(cfg)


def test_jsonl_invalid_schema_in_a_record_fails_the_load_with_its_line(tmp_path: Path) -> None:
    rows = [
        {"prompt": "a", "schema": {"type": "object"}},
        {"prompt": "b", "schema": {"type": "object", "required": "name"}},
    ]
    path = _rows(tmp_path, "s.jsonl", rows)
    cfg = TaskConfig.model_validate(
        {"name": "jsonl", "path": str(path), "grader": {"type": "json_schema"}}
    )
    with pytest.raises(ValueError, match=r"s\.jsonl' line 2: field 'schema' is not a valid JSON"):
        make_task(cfg)


def test_jsonl_legacy_regex_runs_under_the_deadline(tmp_path: Path) -> None:
    path = _rows(tmp_path, "r.jsonl", [{"prompt": "p", "answer": "(a+)+$"}])
    cfg = TaskConfig(name="jsonl", path=str(path), match="regex", grader_timeout_seconds=1.0)
    with make_task(cfg) as task:
        ex = task.sample(random.Random(0))
        grades = task.grade([ex, ex], ["a" * 40 + "!", "aaa"])
    assert grades.rewards == [0.0, 1.0]
    assert grades.metrics == {"grader_errors": 0.0, "grader_timeouts": 0.5}


def test_jsonl_uploaded_files_come_from_file_paths_without_a_roots_check(tmp_path: Path) -> None:
    store, roots = tmp_path / "artifacts", tmp_path / "data"
    store.mkdir()
    roots.mkdir()
    train = _rows(store, "train.jsonl", [{"prompt": "a", "answer": "1"}])
    valid = _rows(store, "valid.jsonl", [{"prompt": "v", "answer": "2"}])
    file_id, valid_id = "file-" + "a" * 32, "file-" + "b" * 32
    cfg = TaskConfig(name="jsonl", file=file_id, validation_file=valid_id)
    task = make_task(cfg, [str(roots)], {file_id: train, valid_id: valid})
    assert [e.prompt for e in task.held_out()] == ["v"]
    assert task.sample(random.Random(0)).prompt == "a"
    with pytest.raises(ValueError) as e:
        make_task(cfg, [str(roots)], {file_id: train})
    assert str(e.value) == (
        f"task.validation_file={valid_id!r}: that uploaded file was not given to the trainer "
        "(file_paths has no such id)"
    )
    with pytest.raises(ValueError, match=r"task\.file='file-a+': that uploaded file"):
        make_task(cfg)


def test_jsonl_validation_path_is_under_the_data_roots(tmp_path: Path) -> None:
    train = _rows(tmp_path, "t.jsonl", [{"prompt": "a", "answer": "1"}])
    cfg = TaskConfig(name="jsonl", path=str(train), validation_path="/etc/passwd")
    with pytest.raises(ValueError, match=r"task\.validation_path='/etc/passwd' is not under"):
        make_task(cfg, [str(tmp_path)])


def test_jsonl_validation_fraction_is_a_seeded_split(tmp_path: Path) -> None:
    rows: list[dict[str, object]] = [{"prompt": f"q{i}", "answer": str(i)} for i in range(40)]
    path = _rows(tmp_path, "d.jsonl", rows)
    cfg = TaskConfig(name="jsonl", path=str(path), validation_fraction=0.25)

    def split(seed: int) -> tuple[list[str], list[str]]:
        task = make_task(cfg, seed=seed)
        return [e.prompt for e in task.examples], [e.prompt for e in task.held_out()]

    train, held = split(7)
    assert len(held) == 10 and len(train) == 30
    assert split(7) == (train, held)  # deterministic
    assert split(8)[1] != held  # another seed holds out others
    assert sorted(train + held, key=lambda p: int(p[1:])) == [f"q{i}" for i in range(40)]
    assert held == sorted(held, key=lambda p: int(p[1:]))  # file order
    task = make_task(cfg, seed=7)
    rng = random.Random(0)
    assert not {task.sample(rng).prompt for _ in range(2000)} & set(held)
    one = _rows(tmp_path, "one.jsonl", rows[:1])
    with pytest.raises(ValueError, match=r"validation_fraction=0.1 of 1 record\(s\) leaves none"):
        make_task(TaskConfig(name="jsonl", path=str(one), validation_fraction=0.1))
