"""Every grader kind scores a real job: submitted through the API, run by a real worker (its
grading server included), succeeded, with the reward the grader gives a known completion.

A first job teaches the tiny model to answer "7" to every prompt (the answer warm-up); each
grader's job then starts from that model (`job:<id>`) and samples near-greedily (temperature
0.01), so every completion is "7" and each grader's reward is a number known in advance: 1 where
it matches, 0.5 where half the records match, the plugin's 0.5, a weighted mean, a fuzzy ratio.
One job per grader, one step each, on one worker of a service of this module's own (a plugin on
its PYTHONPATH, python and score_model graders allowed, a chat-completions endpoint to score
with). Issue 49: the json_schema jobs failed on the worker as `invalid_spec`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.core.chat_server import Endpoint
from tests.core.plugins import install_plugins
from tests.support.stack import RedisServer, Service, extra_service
from tests.support.waits import TERMINAL, wait_status

TENANT = "alice"
SHAPES = [{"type": "integer"}, {"type": "string"}]  # "7" is JSON 7: the first accepts it
PATTERNS = [r"\d", "[a-z]"]  # the first matches "7"
RECORDS = [
    {
        "prompt": f"{i}{i + 1}=",
        "answer": "7",
        "long": "77",
        "shape": SHAPES[i % 2],
        "pattern": PATTERNS[i % 2],
    }
    for i in range(4)
]
PLUGIN = "def half(completion, record, **options):\n    return options.get('value', 0.5)\n"
OUT = "{{sample.output_text}}"
EQ = {"type": "string_check", "name": "eq", "input": OUT, "reference": "{{item.answer}}"}
EQ["operation"] = "eq"
FUZZY = {
    "type": "text_similarity",
    "name": "fuzzy",
    "input": OUT,
    "reference": "{{item.long}}",
    "evaluation_metric": "fuzzy_match",
}
LONG = "def grade(sample, item):\n    return len(item['long']) / 4\n"
JUDGE = {
    "type": "score_model",
    "name": "judge",
    "model": "judge-model",
    "input": [{"role": "user", "content": f"Rate {OUT} against {{{{item.answer}}}} from 0 to 10"}],
    "range": [0, 10],
}
FUZZY_77 = 2 / 3  # rapidfuzz's ratio of "7" and "77", in [0, 1]


def _openai(grader: dict[str, Any]) -> dict[str, Any]:
    return {"type": "openai", "grader": grader}


# (case, the grader, the first step's mean reward)
GRADERS: list[tuple[str, dict[str, Any], float]] = [
    ("string_check", {"type": "string_check"}, 1.0),
    ("regex fixed", {"type": "regex", "pattern": r"\d"}, 1.0),
    ("regex per record", {"type": "regex", "field": "pattern"}, 0.5),
    ("numeric", {"type": "numeric", "extract": r"(\d+)"}, 1.0),
    ("math", {"type": "math"}, 1.0),
    ("json_schema fixed", {"type": "json_schema", "schema": {"type": "integer"}}, 1.0),
    ("json_schema per record", {"type": "json_schema", "field": "shape"}, 0.5),
    ("length_penalty", {"type": "length_penalty", "max_chars": 1}, 1.0),
    ("plugin", {"type": "plugin", "name": "half", "options": {"value": 0.25}}, 0.25),
    (
        "multi",
        {
            "type": "multi",
            "graders": {
                "exact": {"type": "string_check"},
                "half": {"type": "plugin", "name": "half"},
                "shape": {"type": "json_schema", "field": "shape"},
            },
            "weights": {"exact": 2.0},
        },
        (2 * 1.0 + 0.5 + 0.5) / 4,
    ),
    ("openai string_check", _openai(EQ), 1.0),
    ("openai text_similarity", _openai(FUZZY), FUZZY_77),
    ("openai python", _openai({"type": "python", "name": "long", "source": LONG}), 0.5),
    ("openai score_model", _openai(JUDGE), 0.7),
    (
        "openai multi",
        _openai(
            {
                "type": "multi",
                "name": "both",
                "graders": {"eq": EQ, "fuzzy": FUZZY},
                "calculate_output": "0.5 * eq + 0.5 * fuzzy",
            }
        ),
        0.5 + 0.5 * FUZZY_77,
    ),
]


def _spec(service: Service, model: str, grader: dict[str, Any] | None, **task: Any) -> dict:
    data = service.data_dir / "sevens.jsonl"  # written once, before any job reads it
    train = {
        "model": {"name": model},
        "task": {"name": "jsonl", "path": str(data), **task},
        # every record once a step, two near-greedy completions each
        "rollout": {"prompts_per_step": 4, "group_size": 2, "max_new_tokens": 4},
        "steps": 1,
        "checkpoint_every": 0,
        "device": "cpu",
    }
    if model == "builtin:tiny":
        train["model"]["tiny"] = {"d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 32}
    else:
        train["rollout"]["temperature"] = 0.01
    if grader is not None:
        train["task"]["grader"] = grader
    return {"name": "every-grader", "resources": {"device": "cpu"}, "train": train}


@pytest.fixture(scope="module")
def endpoint() -> Iterator[Endpoint]:
    served = Endpoint()
    served.reply = "7"  # out of 10: 0.7
    yield served
    served.close()


@pytest.fixture(scope="module")
def graded(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory, endpoint: Endpoint
) -> Iterator[tuple[Service, dict[str, dict[str, Any]]]]:
    """The service, and each case's finished job: all submitted at once, run one by one."""
    plugins = install_plugins(
        tmp_path_factory.mktemp("plugins"), "i49_half", PLUGIN, {"half": "half"}
    )
    service = extra_service(
        redis_server,
        tmp_path_factory,
        PYTHONPATH=str(plugins),
        PDPPO_OPENAI_PYTHON_GRADERS="true",
        PDPPO_SCORE_MODEL_ENDPOINT=endpoint.url,
        PDPPO_MAX_ACTIVE_JOBS_PER_TENANT=str(len(GRADERS)),
    )
    try:
        (service.data_dir / "sevens.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in RECORDS)
        )
        service.start_api()
        service.start_worker("cpu")
        with service.client(TENANT) as http:
            teach = _spec(service, "builtin:tiny", None, warmup_steps=40, warmup_lr=0.01)
            teach["train"]["task"]["warmup_target"] = "answer"
            teacher = _submitted(http, teach)
            assert wait_status(http, teacher, TERMINAL, 180)["status"] == "succeeded"
            ids = {
                case: _submitted(http, _spec(service, f"job:{teacher}", grader))
                for case, grader, _ in GRADERS
            }
            yield service, {case: _finished(http, job_id) for case, job_id in ids.items()}
    finally:
        service.stop()


def _submitted(http: httpx.Client, spec: dict[str, Any]) -> str:
    answer = http.post("/v1/jobs", json=spec)
    assert answer.status_code == 201, answer.text
    job_id: str = answer.json()["id"]
    return job_id


def _finished(http: httpx.Client, job_id: str) -> dict[str, Any]:
    """The job once it ended, with its metrics rows."""
    job = wait_status(http, job_id, TERMINAL, 300)
    job["rows"] = http.get(f"/v1/jobs/{job_id}/metrics").json()["items"]
    return job


@pytest.mark.parametrize(
    ("case", "reward"), [(c, r) for c, _, r in GRADERS], ids=[c[0] for c in GRADERS]
)
def test_the_grader_scores_a_real_job(
    graded: tuple[Service, dict[str, dict[str, Any]]], case: str, reward: float
) -> None:
    service, jobs = graded
    job = jobs[case]
    assert job["status"] == "succeeded", (job["error"], service.worker_log()[-3000:])
    assert job["error"] is None
    (row,) = job["rows"]
    assert row["step"] == 1
    assert row["metrics"]["reward_mean"] == pytest.approx(reward, abs=1e-6), row
    assert (row["metrics"]["grader_errors"], row["metrics"]["grader_timeouts"]) == (0.0, 0.0)
