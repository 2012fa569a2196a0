"""`task.name: reasoning_gym` (core/tasks/reasoning_gym.py, core/config/reasoning_gym.py): the
shipped catalogue against the installed package, scoring through the dataset's own
`score_answer`, the held-out split by seed, the weighted composite, chat or plain prompts, and the
spec's checks of names, keys and values."""

from __future__ import annotations

import random
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from core.config import TaskConfig
from core.config.reasoning_gym_catalog import CATALOG
from core.models.base import encode_example, renders_chat
from core.tasks import make_task
from core.tasks.reasoning_gym import (
    EVAL_SEED_OFFSET,
    ReasoningGymTask,
    catalog,
    check_values,
    row_key,
)

REPO = Path(__file__).resolve().parents[2]

SPELL = {"min_word_len": 3, "max_word_len": 4}
ONE_DIGIT_SUMS = {
    "min_terms": 2,
    "max_terms": 2,
    "min_digits": 1,
    "max_digits": 1,
    "operators": ["+"],
    "allow_negation": False,
    "allow_parentheses": False,
}
"""121 questions ("Calculate 0 + 4.": the operands' signs vary whatever allow_negation says)."""


def _task(**fields: Any) -> ReasoningGymTask:
    run_seed = fields.pop("run_seed", 0)
    task = make_task(TaskConfig(name="reasoning_gym", **fields), seed=run_seed)
    assert isinstance(task, ReasoningGymTask)
    return task


def test_the_shipped_catalogue_is_the_installed_packages() -> None:
    """The API checks names and keys without reasoning-gym (core/config/reasoning_gym.py): its
    catalogue must be what the installed release registers. Regenerate with
    `python -m core.tasks.reasoning_gym` after an upgrade."""
    assert catalog() == CATALOG
    assert len(CATALOG) == 105  # 0.1.25: 106 registered, `composite` is task.datasets
    assert CATALOG["spell_backward"] == {
        "min_word_len": "int",
        "max_word_len": "int",
        "data_file": "str",
    }


def test_scores_are_the_datasets_own_score_answer() -> None:
    """spell_backward's scorer gives the share of letters in place; a tagged answer is read from
    its last <answer> tag, as reasoning-gym's own training code reads it."""
    task = _task(dataset="spell_backward", config=SPELL, size=50, validation_size=0)
    ex = task.examples[2]
    assert (ex.prompt, ex.answer) == ("Spell this word backward (example: sun -> nus): hay", "yah")
    assert task.score(ex, "yah") == 1.0
    assert task.score(ex, "  yah\n") == 1.0
    assert task.score(ex, "I think <answer>yax</answer>") == pytest.approx(2 / 3)
    assert task.score(ex, "<answer>no</answer> then <answer>yah</answer>") == 1.0
    assert task.score(ex, "hay") == pytest.approx(1 / 3)  # only the middle letter in place
    assert task.score(ex, "") == 0.0
    grades = task.grade([ex, ex], ["yah", "xyz"])
    assert grades.rewards == [1.0, 0.0]
    assert grades.metrics == {"grader_errors": 0.0}


def test_a_scorer_that_raises_costs_its_completion_and_is_counted(monkeypatch: Any) -> None:
    task = _task(dataset="spell_backward", config=SPELL, size=10, validation_size=0)

    def boom(answer: str, entry: dict[str, Any]) -> float:
        if answer == "bad":
            raise RuntimeError("scorer bug")
        return 1.0

    monkeypatch.setattr(task.dataset, "score_answer", boom)
    ex = task.examples[0]
    grades = task.grade([ex, ex, ex, ex], ["bad", "ok", "bad", "ok"])
    assert grades.rewards == [0.0, 1.0, 0.0, 1.0]
    assert grades.metrics == {"grader_errors": 0.5}


def test_the_held_out_rows_are_another_seeds_and_never_a_training_question() -> None:
    """One-digit sums have 121 questions: 60 training rows from seed 7 hold about 48 of them and
    the held-out seed's stream repeats some; the held-out rows are that stream less every
    training question and every repeat, in order."""
    import reasoning_gym

    task = _task(
        dataset="basic_arithmetic", config=ONE_DIGIT_SUMS, size=60, seed=7, validation_size=20
    )
    assert task.seeds == (7, 7 + EVAL_SEED_OFFSET)
    train = {row_key(e.record) for e in task.examples}
    held = [row_key(e.record) for e in task.held_out()]
    assert len(held) == 20 and len(set(held)) == 20
    assert not train & set(held)

    stream = reasoning_gym.create_dataset(
        "basic_arithmetic", size=60, seed=7 + EVAL_SEED_OFFSET, **ONE_DIGIT_SUMS
    )
    raw = [row_key(r) for r in stream]
    assert len(set(raw) & train) >= 5  # the split had work to do
    expected: list[tuple[str, str]] = []
    for key in raw:
        if key not in train and key not in expected:
            expected.append(key)
    assert held == expected[:20]


def test_a_question_space_too_small_for_the_split_is_refused() -> None:
    """1000 training rows hold all 121 questions: no held-out row is left."""
    with pytest.raises(ValueError, match=r"task.validation_size=100: only 0 of 2000 rows"):
        _task(dataset="basic_arithmetic", config=ONE_DIGIT_SUMS, size=1000, seed=0)
    with pytest.raises(ValueError, match=r"task.validation_size=1: only 0 of 20 rows"):
        _task(
            dataset="basic_arithmetic", config=ONE_DIGIT_SUMS, size=1000, seed=0, validation_size=1
        )
    assert (
        _task(
            dataset="basic_arithmetic", config=ONE_DIGIT_SUMS, size=1000, seed=0, validation_size=0
        ).held_out()
        == []
    )


def test_seeds_pick_the_rows() -> None:
    """task.seed, else the run's seed; the same seed gives the same rows."""
    a = _task(dataset="spell_backward", config=SPELL, size=20, validation_size=5, run_seed=3)
    b = _task(dataset="spell_backward", config=SPELL, size=20, validation_size=5, seed=3)
    c = _task(dataset="spell_backward", config=SPELL, size=20, validation_size=5, seed=4)
    assert a.seeds == b.seeds == (3, 3 + EVAL_SEED_OFFSET)
    assert [e.prompt for e in a.examples] == [e.prompt for e in b.examples]
    assert [e.prompt for e in a.examples] != [e.prompt for e in c.examples]
    ex = a.sample(random.Random(0))
    assert ex in a.examples


def test_weighted_datasets_draw_rows_by_weight() -> None:
    """reasoning-gym's CompositeDataset: 1:3 over 400 rows, each row scored by its own
    dataset's scorer."""
    task = _task(
        datasets=[
            {"name": "spell_backward", "weight": 1, "config": SPELL},
            {"name": "basic_arithmetic", "weight": 3, "config": ONE_DIGIT_SUMS},
        ],
        size=400,
        validation_size=0,
        seed=0,
    )
    counts = Counter(e.record["metadata"]["source_dataset"] for e in task.examples)
    assert counts == {"spell_backward": 112, "basic_arithmetic": 288}
    for ex in (task.examples[0], task.examples[1]):
        assert task.score(ex, ex.answer) == 1.0
        assert task.score(ex, ex.answer + "9x") < 1.0


def test_prompts_are_chat_turns_with_a_template_and_plain_text_without(tmp_path: Path) -> None:
    """The chat model of examples/ (a Llama-3-like template) gets the turns; builtin:tiny's byte
    tokenizer, with no template, gets the plain question."""
    from transformers import AutoTokenizer

    from core.models.hf import HFTokenizer
    from core.models.local_hf import make_chat_hf
    from core.models.tiny import ByteTokenizer

    task = _task(
        dataset="spell_backward",
        config=SPELL,
        size=5,
        validation_size=0,
        system_prompt="Reply with the word only.",
    )
    ex = task.examples[0]
    assert ex.messages == (
        {"role": "system", "content": "Reply with the word only."},
        {"role": "user", "content": ex.record["question"]},
    )
    assert ex.prompt == "Reply with the word only.\n" + ex.record["question"]

    tok = HFTokenizer(AutoTokenizer.from_pretrained(str(make_chat_hf(tmp_path / "chat"))))
    assert renders_chat(tok, ex)
    text = tok.tok.decode(encode_example(tok, ex))
    assert "<|start_header_id|>system<|end_header_id|>" in text
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")

    byte = ByteTokenizer()
    assert not renders_chat(byte, ex)
    assert encode_example(byte, ex) == byte.encode_prompt(ex.prompt)


VALIDATION = [
    (
        {"dataset": "spell_backwards"},
        "task.dataset='spell_backwards' is not a reasoning-gym dataset; did you mean "
        "spell_backward?",
    ),
    (
        {"dataset": "spell_backward", "config": {"max_word_length": 4}},
        "task.config.max_word_length: spell_backward has no such key; "
        "did you mean max_word_len or min_word_len? "
        "(its keys: min_word_len, max_word_len, data_file)",
    ),
    (
        {"dataset": "spell_backward", "config": {"max_word_len": "four"}},
        "task.config.max_word_len: spell_backward takes an integer, not 'four'",
    ),
    (
        {"dataset": "spell_backward", "config": {"seed": 3}},
        "task.config.seed: set task.seed instead",
    ),
    (
        {"datasets": [{"name": "spell_backward"}, {"name": "leter_counting"}]},
        "task.datasets[1].name='leter_counting' is not a reasoning-gym dataset; did you mean "
        "letter_counting or leg_counting?",
    ),
    (
        {"dataset": "spell_backward", "datasets": [{"name": "spell_backward"}]},
        "needs exactly one of task.dataset",
    ),
    ({}, "needs exactly one of task.dataset"),
]


@pytest.mark.parametrize(("fields", "message"), VALIDATION)
def test_the_spec_refuses_unknown_names_and_keys(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as info:
        TaskConfig(name="reasoning_gym", **fields)
    assert message in info.value.errors()[0]["msg"]


def test_reasoning_gym_fields_belong_to_reasoning_gym_tasks() -> None:
    with pytest.raises(ValidationError, match=r"task.dataset is only used when task.name="):
        TaskConfig(name="reverse", dataset="spell_backward")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"min_word_len": 5, "max_word_len": 3}, "task.config: spell_backward refuses it: "),
        ({"min_word_len": 0}, "task.config: spell_backward refuses it: "),
    ],
)
def test_values_the_datasets_config_refuses_are_named(config: dict[str, Any], message: str) -> None:
    cfg = TaskConfig(name="reasoning_gym", dataset="spell_backward", config=config)
    with pytest.raises(ValueError, match=message):
        check_values(cfg)


def test_a_good_config_builds_without_generating() -> None:
    check_values(TaskConfig(name="reasoning_gym", dataset="spell_backward", config=SPELL))


def test_without_the_extra_the_task_names_it() -> None:
    """A worker without reasoning-gym: the job fails with the extra to install, not a
    traceback from inside the package."""
    code = (
        "import sys; sys.modules['reasoning_gym'] = None\n"
        "from core.config import TaskConfig\n"
        "from core.tasks import make_task\n"
        "try:\n"
        "    make_task(TaskConfig(name='reasoning_gym', dataset='spell_backward'))\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.stdout.strip() == (
        "task.name='reasoning_gym' needs the reasoning extra: pip install 'pdppo[reasoning]' "
        "(reasoning_gym is missing)"
    ), out.stderr
