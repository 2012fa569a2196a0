"""The shipped chat-math example: its data is what the committed script makes, every record is a
right sum, and the spec reads the files and the model folder the scripts write, from wherever it
is run."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from core.tasks.records import parse_line
from pdppo.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
DATA = EXAMPLES / "data"


def _records(path: Path) -> list[dict[str, object]]:
    return [parse_line(line) for line in path.read_text().splitlines()]


def test_committed_data_is_what_the_seeded_script_makes(tmp_path: Path) -> None:
    script = EXAMPLES / "make_chat_math_data.py"
    subprocess.run([sys.executable, str(script), "--out-dir", str(tmp_path)], check=True)
    for name in ("chat_math.jsonl", "chat_math_val.jsonl"):
        assert (tmp_path / name).read_bytes() == (DATA / name).read_bytes(), name


def test_records_are_chats_with_right_answers_and_validation_is_held_out() -> None:
    train, val = _records(DATA / "chat_math.jsonl"), _records(DATA / "chat_math_val.jsonl")
    assert (len(train), len(val)) == (342, 50)
    for path in (DATA / "chat_math.jsonl", DATA / "chat_math_val.jsonl"):
        assert path.stat().st_size < 100_000
    questions = []
    for rec in train + val:
        messages = rec["messages"]
        assert isinstance(messages, list) and [m["role"] for m in messages] == ["system", "user"]
        match = re.fullmatch(r"What is (\d+) ([+-]) (\d+)\?", messages[1]["content"])
        assert match, messages[1]
        a, op, b = int(match[1]), match[2], int(match[3])
        assert rec["answer"] == str(a + b if op == "+" else a - b)
        questions.append(messages[1]["content"])
    assert len(set(questions)) == len(questions) == 392  # no question twice, none in both files


def test_spec_names_the_example_files_relative_to_itself() -> None:
    spec = load_spec(EXAMPLES / "chat_math.yaml")
    task = spec.train.task
    assert spec.train.model.name == f"hf:{EXAMPLES / 'models' / 'chat-llama'}"
    assert (task.path, task.validation_path) == (
        str(DATA / "chat_math.jsonl"),
        str(DATA / "chat_math_val.jsonl"),
    )
    assert task.warmup_target == "answer" and task.warmup_steps > 0
    # the documented build step writes exactly the folder the spec names
    build = (EXAMPLES / "build_chat_model.py").read_text()
    assert 'DEFAULT_OUT = Path(__file__).resolve().parent / "models" / "chat-llama"' in build
    # and git never picks the built model up
    assert (EXAMPLES / "models" / ".gitignore").read_text().splitlines()[1:] == ["*", "!.gitignore"]


def test_build_script_makes_a_loadable_chat_model(tmp_path: Path) -> None:
    out = tmp_path / "chat-llama"
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "build_chat_model.py"), "--out", str(out)],
        check=True,
        capture_output=True,
        text=True,
    )
    assert done.stdout.strip() == f"chat model saved to {out}"
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert "<|start_header_id|>" in (out / "chat_template.jinja").read_text()
