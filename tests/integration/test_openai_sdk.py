"""OpenAI's fine-tuning API on the real stack (redis-server, `pdppo serve`, a worker), driven by
the official `openai` package exactly as a user's script drives OpenAI: upload with
`client.files.create`, a reinforcement job with a `multi` grader, list, retrieve, events page
by page, pause, resume, cancel, checkpoints, graders validated and run, and OpenAI's errors
(`BadRequestError` and friends, with `param`) for each kind of bad input."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
from openai import OpenAI

from tests.integration.openai_sdk import (
    MULTI,
    SMALL,
    TINY,
    reinforcement,
    rft_rows,
    upload,
    wait,
)
from tests.support.stack import KEYS, REPO, Service

TERMINAL = {"succeeded", "failed", "cancelled"}


@pytest.fixture
def client(service: Service) -> Iterator[OpenAI]:
    with OpenAI(base_url=f"{service.base_url}/v1", api_key=KEYS["alice"], max_retries=0) as c:
        yield c


def readme_example() -> tuple[str, str]:
    """The Python block of README's "Coming from OpenAI's fine-tuning API" paragraph, and the
    paragraph after it (what it prints)."""
    section = (REPO / "README.md").read_text().split("**Coming from OpenAI's fine-tuning API.**")[1]
    found = re.search(r"```python\n(.*?)```\n\n(.*?)\n\n", section, re.DOTALL)
    assert found, "README's OpenAI paragraph has no python block"
    return found.group(1), found.group(2)


def test_readmes_openai_example_runs_as_written_and_learns(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    """README's example printed "Job queued" and trained 2 steps at reward 0, a model that
    outputs noise. Now it makes its dataset, trains the tiny model to reverse digits and prints
    what it learned: run here as a user runs it, a script of its own, with a stack's URL and a
    key in place of README's (a stack with a sample worker, as `pdppo dev` and compose run)."""
    service = make_service()
    service.start_api()
    service.start_worker("cpu")
    service.start_sample_worker()
    code, says = readme_example()
    for shown, here in (
        ('base_url="http://127.0.0.1:8000/v1"', f'base_url="{service.base_url}/v1"'),
        ('api_key="..."', f'api_key="{KEYS["alice"]}"'),
    ):
        assert code.count(shown) == 1, shown
        code = code.replace(shown, here)
    script = tmp_path / "readme_openai.py"
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=540
    )
    assert done.returncode == 0, done.stderr
    printed = done.stdout.splitlines()
    assert len(printed) == 2, printed
    result = re.fullmatch(r"succeeded reward (\d\.\d\d) -> (\d\.\d\d)", printed[0])
    assert result, printed
    first, last = float(result.group(1)), float(result.group(2))
    assert last >= first + 0.1, printed  # the mean of the first five steps, of the last five
    assert re.fullmatch(r"reverse 123= \d{1,4}", printed[1]), printed
    # README shows lines of the same form
    assert re.search(r"`succeeded reward \d\.\d\d -> \d\.\d\d`", says), says
    assert re.search(r"`reverse 123= \d{1,4}`", says), says


def test_a_reinforcement_job_from_the_sdk_trains_and_reports(client: OpenAI) -> None:
    training = upload(client, rft_rows(16))
    validation = upload(client, rft_rows(4, "v"), "val.jsonl")
    job = client.fine_tuning.jobs.create(
        model="builtin:tiny",
        training_file=training,
        validation_file=validation,
        seed=3,
        suffix="digits",
        metadata={"team": "rl", "run": "a"},
        method=reinforcement(batch_size=4, n_epochs=2, learning_rate_multiplier=0.5),
        extra_body={"pdppo": SMALL},
    )
    assert job.id.startswith("ftjob-") and job.object == "fine_tuning.job"
    assert (job.model, job.training_file, job.validation_file) == (
        "builtin:tiny",
        training,
        validation,
    )
    assert (job.seed, job.user_provided_suffix, job.metadata) == (
        3,
        "digits",
        {"team": "rl", "run": "a"},
    )
    # 2 epochs of 16 records, 4 prompts a step: 8 steps; the rate is half the model's default
    assert job.hyperparameters.batch_size == 4 and job.hyperparameters.n_epochs == 2
    assert job.hyperparameters.learning_rate_multiplier == pytest.approx(0.5)
    assert job.model_extra is not None and job.model_extra["pdppo"]["total_steps"] == 8
    assert job.method is not None and job.method.type == "reinforcement"
    assert job.status == "queued" and job.fine_tuned_model is None

    done = wait(client, job.id, TERMINAL)
    assert done.status == "succeeded", done
    assert done.fine_tuned_model == f"job:{job.id.removeprefix('ftjob-')}"
    assert done.finished_at is not None and done.finished_at >= done.created_at

    listed = client.fine_tuning.jobs.list(limit=50, metadata={"team": "rl", "run": "a"})
    assert [j.id for j in listed.data] == [job.id]
    assert client.fine_tuning.jobs.list(metadata={"team": "other"}).data == []

    # every event, newest first, a page of 5 at a time (the SDK follows `after` by itself)
    events = list(client.fine_tuning.jobs.list_events(job.id, limit=5))
    assert len(events) > 10 and events[0].message.startswith("The job has ended: succeeded")
    ids = [e.id for e in events]
    assert len(set(ids)) == len(ids) and ids == sorted(ids, key=_stream_order, reverse=True)
    steps = [e.data["step"] for e in events if e.type == "metrics" and "eval" not in e.data]
    assert sorted(steps) == list(range(1, 9))
    evaluation = [e for e in events if e.type == "metrics" and e.data.get("eval")]
    assert evaluation and "eval_reward_mean" in evaluation[0].data
    first = client.fine_tuning.jobs.list_events(job.id, limit=5)
    assert [e.id for e in first.data] == ids[:5] and first.has_more

    checkpoints = client.fine_tuning.jobs.checkpoints.list(job.id)
    assert [c.step_number for c in checkpoints.data] == [8, 6]  # keep_checkpoints: 2, newest first
    assert checkpoints.data[0].fine_tuning_job_id == job.id
    assert checkpoints.data[0].metrics.step == 8
    assert "reward_mean" in (checkpoints.data[0].metrics.model_extra or {})

    # the fine-tuned model is a model a later job starts from
    later = client.fine_tuning.jobs.create(
        model=done.fine_tuned_model,
        training_file=training,
        method=reinforcement(batch_size=4),
        extra_body={"pdppo": {"train": {"steps": 1, "device": "cpu"}}},
    )
    assert wait(client, later.id, TERMINAL).status == "succeeded"


def test_a_reasoning_gym_job_from_the_sdk_needs_no_file_nor_grader(client: OpenAI) -> None:
    """The task in extra_body's pdppo extension: rows generated on the worker, scored by the
    dataset's score_answer; `training_file` left out with the SDK's `omit`. One epoch of 8 rows
    at 4 a step is 2 steps, and the held-out rows are evaluated at the last."""
    from openai import omit

    task = {
        "name": "reasoning_gym",
        "dataset": "spell_backward",
        "config": {"min_word_len": 3, "max_word_len": 3},
        "size": 8,
        "validation_size": 4,
    }
    tiny = {**TINY, "max_seq_len": 80}
    pdppo = {**SMALL, "train": {**SMALL["train"], "model": {"tiny": tiny}, "task": task}}
    job = client.fine_tuning.jobs.create(
        model="builtin:tiny",
        training_file=omit,  # type: ignore[arg-type]  # the SDK's signature wants a file
        method={"type": "reinforcement", "reinforcement": {"hyperparameters": {"batch_size": 4}}},
        extra_body={"pdppo": pdppo},
    )
    assert job.training_file is None
    assert job.model_extra is not None and job.model_extra["pdppo"]["total_steps"] == 2
    done = wait(client, job.id, TERMINAL)
    assert done.status == "succeeded", done
    events = list(client.fine_tuning.jobs.list_events(job.id, limit=100))
    evaluation = [e.data for e in events if e.type == "metrics" and e.data.get("eval")]
    assert [e["step"] for e in evaluation] == [2] and evaluation[0]["eval_prompts"] == 4

    file = upload(client, rft_rows(4))
    with pytest.raises(openai.BadRequestError) as info:
        client.fine_tuning.jobs.create(
            model="builtin:tiny",
            training_file=file,
            method={"type": "reinforcement", "reinforcement": {}},
            extra_body={"pdppo": pdppo},
        )
    assert info.value.param == "training_file"
    assert "a reasoning_gym task (pdppo.train.task) generates its rows" in info.value.message


def _stream_order(event_id: str) -> tuple[int, int]:
    ms, seq = event_id.removeprefix("ftevent-").split("-")
    return int(ms), int(seq)


def test_pause_resume_and_cancel_from_the_sdk(client: OpenAI) -> None:
    training = upload(client, rft_rows(8))
    job = client.fine_tuning.jobs.create(
        model="builtin:tiny",
        training_file=training,
        method=reinforcement(batch_size=4),
        extra_body={"pdppo": {**SMALL, "train": {**SMALL["train"], "steps": 400}}},
    )
    running = wait(client, job.id, {"running", *TERMINAL})
    assert running.status == "running"
    client.fine_tuning.jobs.pause(job.id)
    paused = wait(client, job.id, {"paused", *TERMINAL})
    assert paused.status == "paused"
    resumed = client.fine_tuning.jobs.resume(job.id)
    assert resumed.status in ("queued", "running")
    cancelled = client.fine_tuning.jobs.cancel(job.id)
    assert cancelled.id == job.id
    assert wait(client, job.id, TERMINAL).status == "cancelled"
    with pytest.raises(openai.ConflictError) as caught:
        client.fine_tuning.jobs.pause(job.id)
    assert "already cancelled" in caught.value.message
    assert caught.value.response.headers["x-should-retry"] == "false"


def test_graders_are_validated_and_run_before_a_job_is_spent(client: OpenAI) -> None:
    graders = client.fine_tuning.alpha.graders
    ran = graders.run(grader=MULTI, model_sample="123", item={"answer": "123"})
    assert ran.reward == 1.0 and ran.sub_rewards == {"exact": 1.0, "close": 1.0}
    half = graders.run(grader=MULTI, model_sample="124", item={"answer": "123"})
    # rapidfuzz's ratio of 124 and 123: 2 of 3 characters, 66.7; the formula halves it
    assert half.reward == pytest.approx(0.5 * 200 / 3 / 100)
    missing = graders.run(grader=MULTI, model_sample="1", item={"other": "1"})
    assert missing.reward == 0.0 and missing.metadata.errors.invalid_variable_error
    # (the SDK's model of this answer has no discriminator: read the JSON it parsed)
    validated = graders.with_raw_response.validate(grader=MULTI)
    assert validated.http_response.json() == {"grader": MULTI}
    python = {"type": "python", "name": "p", "source": "def grade(sample, item):\n    return 1\n"}
    with pytest.raises(openai.BadRequestError) as caught:
        graders.validate(grader=python)
    assert caught.value.param == "grader"
    assert "python graders are off on this service" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        graders.run(grader={**MULTI, "calculate_output": "exact +"}, model_sample="1")
    assert caught.value.param == "grader.multi"
    assert "is not a formula" in caught.value.message


GRADE_ONE = "def grade(sample, item):\n    return 1\n"

BAD_CREATES: list[tuple[str, dict[str, Any], str | None, str]] = [
    (
        "supervised",
        {"method": {"type": "supervised", "supervised": {}}},
        "method.type",
        "reinforcement only",
    ),
    ("no method", {"method": None}, "method", "reinforcement only"),
    ("no such file", {"training_file": "file-" + "0" * 32}, "training_file", "not found"),
    (
        "a template that names nothing",
        {"method": reinforcement({**MULTI["graders"]["exact"], "reference": "{{answer}}"})},
        "method.reinforcement.grader.string_check.reference",
        "names neither item.<field> nor sample.output_text",
    ),
    (
        "a python grader",
        # valid code: only the setting refuses it
        {"method": reinforcement({"type": "python", "name": "p", "source": GRADE_ONE})},
        "method.reinforcement.grader",
        "python graders are off",
    ),
    (
        "a bad pdppo knob",
        {"extra_body": {"pdppo": {"train": {"steps": 0}}}},
        "pdppo.train.steps",
        "greater than or equal to 1",
    ),
    (
        "integrations",
        {"integrations": [{"type": "wandb", "wandb": {"project": "p"}}]},
        "integrations",
        "not supported",
    ),
    ("a negative seed", {"seed": -1}, "seed", "greater than or equal to 0"),
    ("a model outside the data roots", {"model": "hf:/etc"}, "model", "is not under any of"),
    (
        "17 metadata keys",
        {"metadata": {f"k{i}": "v" for i in range(17)}},
        "metadata",
        "at most 16 items",
    ),
    (
        "an unknown field",
        {"extra_body": {"epochs": 3}},
        "epochs",
        "unknown field epochs (this section takes: model, training_file, validation_file, seed, "
        "suffix, metadata, method, hyperparameters, integrations, pdppo)",
    ),
    (
        "an unknown grader type",
        {"method": reinforcement({"type": "label_model", "name": "l"})},
        "method.reinforcement.grader",
        "does not match any of the expected tags",
    ),
]


@pytest.mark.parametrize(
    ("case", "change", "param", "says"), BAD_CREATES, ids=[c[0] for c in BAD_CREATES]
)
def test_each_bad_create_is_a_400_naming_its_param(
    client: OpenAI, case: str, change: dict[str, Any], param: str | None, says: str
) -> None:
    arguments: dict[str, Any] = {
        "model": "builtin:tiny",
        "training_file": upload(client, rft_rows(4)),
        "method": reinforcement(),
    }
    arguments.update(change)
    if arguments["method"] is None:
        del arguments["method"]
    with pytest.raises(openai.BadRequestError) as caught:
        client.fine_tuning.jobs.create(**arguments)
    error = caught.value
    assert (error.status_code, error.param, error.type) == (400, param, "invalid_request_error")
    assert says in error.message, error.message


def test_bad_pages_are_400s_and_unknown_jobs_404s(client: OpenAI) -> None:
    job_id = "ftjob-" + "0" * 24
    with pytest.raises(openai.NotFoundError):
        client.fine_tuning.jobs.list_events(job_id)
    with pytest.raises(openai.NotFoundError):
        client.fine_tuning.jobs.cancel(job_id)
    with pytest.raises(openai.BadRequestError) as caught:
        client.fine_tuning.jobs.list(limit=0)
    assert caught.value.param == "limit"
    mine = client.fine_tuning.jobs.create(
        model="builtin:tiny",
        training_file=upload(client, rft_rows(4)),
        method=reinforcement(),
        extra_body={"pdppo": {**SMALL, "train": {**SMALL["train"], "steps": 1}}},
    )
    with pytest.raises(openai.BadRequestError) as caught:
        client.fine_tuning.jobs.list_events(mine.id, after="ftevent-not-an-id")
    assert caught.value.param == "after"
    with pytest.raises(openai.BadRequestError) as caught:  # each part of an id is below 2^64
        client.fine_tuning.jobs.list_events(mine.id, after="ftevent-99999999999999999999-0")
    assert caught.value.body["param"] is None
    assert caught.value.body["message"].startswith("after: '99999999999999999999-0'")
    with pytest.raises(openai.BadRequestError) as caught:
        client.fine_tuning.jobs.list_events(mine.id, limit=101)
    assert caught.value.param == "limit"
    wait(client, mine.id, TERMINAL)


def test_unknown_jobs_other_tenants_and_bad_keys(service: Service, client: OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.fine_tuning.jobs.retrieve("ftjob-" + "0" * 24)
    assert caught.value.body == {
        "message": f"job {'0' * 24!r} not found",
        "type": "invalid_request_error",
        "param": None,
        "code": "not_found",
    }
    mine = client.fine_tuning.jobs.create(
        model="builtin:tiny",
        training_file=upload(client, rft_rows(4)),
        method=reinforcement(),
        extra_body={"pdppo": {**SMALL, "train": {**SMALL["train"], "steps": 1}}},
    )
    with OpenAI(base_url=f"{service.base_url}/v1", api_key=KEYS["bob"], max_retries=0) as bob:
        with pytest.raises(openai.NotFoundError):
            bob.fine_tuning.jobs.retrieve(mine.id)
        assert mine.id not in [j.id for j in bob.fine_tuning.jobs.list(limit=100).data]
    nobody = OpenAI(base_url=f"{service.base_url}/v1", api_key="wrong", max_retries=0)
    with nobody, pytest.raises(openai.AuthenticationError) as denied:
        nobody.fine_tuning.jobs.list()
    assert denied.value.type == "authentication_error"
    wait(client, mine.id, TERMINAL)


class LoseFirstAnswer(httpx2.HTTPTransport):
    """Sends each request, but loses the answer of the first job create: the server made the
    job, the client never heard (a timeout), and the SDK retries, as it does."""

    def __init__(self) -> None:
        super().__init__()
        self.creates = 0

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        response = super().handle_request(request)
        if request.method == "POST" and request.url.path.endswith("/fine_tuning/jobs"):
            self.creates += 1
            if self.creates == 1:
                response.read()
                raise httpx2.ReadTimeout("answer lost", request=request)
        return response


def test_the_sdks_retry_of_a_create_whose_answer_was_lost_makes_no_second_job(
    service: Service, client: OpenAI
) -> None:
    transport = LoseFirstAnswer()
    with OpenAI(
        base_url=f"{service.base_url}/v1",
        api_key=KEYS["carol"],
        max_retries=2,
        http_client=httpx2.Client(transport=transport),
    ) as carol:
        training = upload(carol, rft_rows(4))
        before = {j.id for j in carol.fine_tuning.jobs.list(limit=100).data}
        arguments: dict[str, Any] = {
            "model": "builtin:tiny",
            "training_file": training,
            "method": reinforcement(),
            "extra_body": {"pdppo": {**SMALL, "train": {**SMALL["train"], "steps": 1}}},
        }
        job = carol.fine_tuning.jobs.create(**arguments)
        assert transport.creates == 2  # the lost answer, then the retry
        made = {j.id for j in carol.fine_tuning.jobs.list(limit=100).data} - before
        assert made == {job.id}
        # a new create of the same request (not a retry) is a new job
        again = carol.fine_tuning.jobs.create(**arguments)
        assert again.id != job.id
        for made_job in (job.id, again.id):
            wait(carol, made_job, TERMINAL)


def test_files_from_the_sdk_are_openai_file_objects(client: OpenAI) -> None:
    content = rft_rows(3, "f")
    made = client.files.create(file=("rft.jsonl", content), purpose="fine-tune")
    assert (made.object, made.status, made.purpose) == ("file", "processed", "fine-tune")
    assert (made.filename, made.bytes) == ("rft.jsonl", len(content))
    again = client.files.retrieve(made.id)
    assert (again.id, again.object, again.bytes) == (made.id, "file", len(content))
    assert client.files.content(made.id).read() == content


def test_the_sdk_lists_files_page_by_page_and_a_deleted_file_is_gone(client: OpenAI) -> None:
    tag = f"pages{time.time_ns()}-"  # content no earlier test uploaded: three new files
    made = [upload(client, rft_rows(2, f"{tag}{i}"), f"p{i}.jsonl") for i in range(3)]
    newest = made[::-1]
    first = client.files.list(limit=2)
    assert ([f.id for f in first.data], first.has_more) == (newest[:2], True)
    second = first.get_next_page()  # `after` is the last id of the first page
    assert second.data[0].id == newest[2]
    walked = [f.id for f in client.files.list(limit=2)]  # every page, the SDK's own loop
    assert walked[:3] == newest and len(walked) == len(set(walked))
    deleted = client.files.delete(made[1])
    assert (deleted.id, deleted.object, deleted.deleted) == (made[1], "file", True)
    with pytest.raises(openai.NotFoundError) as gone:
        client.files.retrieve(made[1])
    assert gone.value.code == "not_found" and f"file {made[1]!r} not found" in gone.value.message
    left = [f.id for f in client.files.list(limit=2)]
    assert made[1] not in left and [i for i in left if i in made] == [made[2], made[0]]
    for file_id in (made[0], made[2]):
        assert client.files.delete(file_id).deleted
