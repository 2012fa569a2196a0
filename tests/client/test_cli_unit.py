"""The CLI's pieces that decide what a user reads, each with its exact text: how an exception
becomes the one-line message and exit status (`pdppo.commands.errors.explain`), and what
`status`, `list`, `cancel`, `set` and a followed job's events print (`pdppo.commands.jobs`).
Found by the mutation run of the commands (bench/mutation.toml, group "commands"): the
end-to-end CLI tests run these lines but check a word or the exit status, not the values."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from typing import Any

import click
import httpx
import pydantic
import pytest
import yaml
from tqdm import tqdm

from pdppo.client import ApiError, Event, FollowError, Job
from pdppo.client.specs import SpecFileError
from pdppo.commands import jobs
from pdppo.commands.errors import DEBUG_HINT, ServerError, UserError, _one_line, explain
from pdppo.settings import Settings


def explained(exc: Exception) -> tuple[int, str]:
    report = explain(exc)
    return report.exit_code, report.message


def test_http_errors_say_the_detail_then_where() -> None:
    url = "http://h/v1/jobs/j"
    assert explained(ApiError(404, "no such job", "GET", url)) == (
        2,
        f"no such job (HTTP 404 from GET {url})",
    )
    assert explained(ApiError(401, "bad key")) == (
        2,
        "bad key (HTTP 401); check --api-key or PDPPO_API_KEY (for pdppo dev: source "
        ".pdppo/dev.env)",
    )
    assert explained(ApiError(499, "")) == (2, "(no detail) (HTTP 499)")
    assert explained(ApiError(500, "boom", "POST", url)) == (
        1,
        f"the server failed: boom (HTTP 500 from POST {url})",
    )
    assert explained(ApiError(502, "<html>\n bad   gateway</html>")) == (
        1,
        "the server failed: <html> bad gateway</html> (HTTP 502)",
    )


def test_one_line_cuts_long_bodies_at_the_limit() -> None:
    assert _one_line("a\n b", 10) == "a b"
    assert _one_line("x" * 10, 10) == "x" * 10
    assert _one_line("x" * 11, 10) == "x" * 9 + "…"


def test_transport_and_library_errors_are_the_users_to_fix(tmp_path: Any) -> None:
    request = httpx.Request("GET", "http://127.0.0.1:9/v1/jobs")
    assert explained(httpx.ConnectError("refused", request=request)) == (
        2,
        "cannot reach http://127.0.0.1:9/v1/jobs: refused; is the server up, and are --url / "
        "PDPPO_URL right?",
    )
    assert explained(httpx.ReadTimeout("")) == (
        2,
        "cannot reach the server: ReadTimeout; is the server up, and are --url / PDPPO_URL right?",
    )
    assert explained(FollowError("gave up")) == (2, "lost the job's event stream: gave up")
    assert explained(yaml.YAMLError("bad")) == (2, "not valid YAML: bad")
    assert explained(SpecFileError("s.yaml: a job spec must be a mapping")) == (
        2,
        "s.yaml: a job spec must be a mapping",
    )
    missing = FileNotFoundError(2, "No such file or directory", str(tmp_path / "x"))
    assert explained(missing) == (2, f"{tmp_path / 'x'}: No such file or directory")
    assert explained(OSError("no name")) == (
        1,
        f"unexpected OSError: no name (a bug in pdppo? {DEBUG_HINT})",
    )
    assert explained(KeyError("k")) == (
        1,
        f"unexpected KeyError: 'k' (a bug in pdppo? {DEBUG_HINT})",
    )
    usage = click.UsageError("no API key")
    assert explain(usage) is usage
    assert (UserError("x").exit_code, ServerError("x").exit_code) == (2, 1)


def test_a_bad_setting_is_named_as_its_variable() -> None:
    with pytest.raises(pydantic.ValidationError) as bad:
        Settings(max_file_bytes="lots", _env_file=None)  # type: ignore[call-arg,arg-type]
    code, message = explained(bad.value)
    assert code == 2
    assert message.startswith("invalid PDPPO_* settings:\n  PDPPO_MAX_FILE_BYTES: ")

    class Spec(pydantic.BaseModel):
        steps: int

    with pytest.raises(pydantic.ValidationError) as spec:
        Spec(steps="x")  # type: ignore[arg-type]
    assert explained(spec.value) == (
        2,
        "invalid Spec:\n  steps: Input should be a valid integer, unable to parse string as an "
        "integer",
    )


def job(**fields: Any) -> Job:
    return Job.model_validate({"id": "job-1", "status": "running"} | fields)


def test_status_and_list_lines() -> None:
    created = datetime(2026, 12, 5, hour=3, minute=4, second=5, tzinfo=UTC)
    done = job(
        status="failed",
        name="demo",
        created_at=created,
        progress={"step": 3, "total": 8},
        metrics={"loss": 0.5, "reward_mean": 0.25, "step": 3, "ok": True, "zeta": 1.0},
        error={"code": "oom", "message": "out of memory"},
    )
    line = "job-1  failed           3/8  demo                     2026-12-05 03:04:05"
    assert jobs._job_line(done) == line
    assert jobs.status_lines(done) == [
        line,
        "  reward=0.25  loss=0.5",
        "error (oom): out of memory",
    ]
    assert jobs._job_line(job()) == "job-1  running          0/0                           "
    assert jobs._format_metrics({"a": 1, "b": 2.0, "c": 3, "d": 4, "e": 5, "s": "x"}) == {
        "a": "1",
        "b": "2",
        "c": "3",
        "d": "4",
    }
    many = iter([job(id=str(i)) for i in range(5)])
    assert [j.id for j in jobs._take(many, 3)] == ["0", "1", "2"]
    assert next(many).id == "4"  # one more was read to see the limit, not all of them


def test_cancel_lines_and_exit_statuses() -> None:
    assert jobs.cancel_line(job(status="cancelled", cancel_requested=True)) == "job-1 cancelled"
    assert jobs.cancel_line(job(status="queued")) == "job-1 queued"
    assert jobs.cancel_line(job(cancel_requested=True)) == (
        "job-1 cancel requested: the running job stops within seconds, keeping its checkpoints "
        "(pdppo status job-1 says cancelled once it has)"
    )
    jobs._exit_for("succeeded")
    for status in ("failed", "cancelled"):
        with pytest.raises(SystemExit) as exited:
            jobs._exit_for(status)
        assert exited.value.code == 1


def test_settings_pairs_become_a_merge_patch() -> None:
    assert jobs.settings_patch(("optim.lr=1e-4", "train.steps=200", "name=x=y")) == {
        "train": {"optim": {"lr": 1e-4}, "steps": 200, "name": "x=y"}
    }
    for bad in ("lr", "=3"):
        with pytest.raises(click.BadParameter) as refused:
            jobs.settings_patch((bad,))
        assert refused.value.message == f"{bad!r}: expected KEY=VALUE"


def shown(events: list[Event], total: int | None = None) -> tuple[str, list[str], tqdm[Any]]:
    """The events drawn on a real bar: the status after them, the lines written above the bar,
    and the bar."""
    out = io.StringIO()
    bar: tqdm[Any] = tqdm(total=total, file=out, disable=False)
    written: list[str] = []
    bar.write = lambda line, *a, **k: written.append(line)
    status = "queued"
    for event in events:
        status = jobs._show_event(event, bar, status)
    return status, written, bar


def ev(name: str, data: str) -> Event:
    return Event(name, data, None)


class _Record:
    """`Client.get` alone, answering one job (`_final_warnings` reads nothing else)."""

    def __init__(self, found: Job) -> None:
        self.found = found

    def get(self, job_id: str) -> Job:
        return self.found


def test_the_warnings_after_the_stream_are_those_it_did_not_show() -> None:
    ended = job(
        status="succeeded",
        warnings=[
            {"code": "rewards_all_zero", "message": "every reward was 0"},
            {"code": "no_reward_variance", "message": "every advantage was 0"},
        ],
    )
    warned = ["run finished with a warning (rewards_all_zero): every reward was 0"]
    record: Any = _Record(ended)
    assert jobs._final_warnings(record, "job-1", warned) == [
        "warning (no_reward_variance): every advantage was 0"
    ]
    assert jobs._final_warnings(record, "job-1", []) == [
        "warning (rewards_all_zero): every reward was 0",
        "warning (no_reward_variance): every advantage was 0",
    ]


def test_a_followed_jobs_events() -> None:
    status, written, bar = shown(
        [
            ev("status", '{"status": "queued"}'),
            ev("status", '{"status": "running"}'),
            ev("metrics", '{"step": 2, "total": 8, "metrics": {"loss": 0.5}}'),
            ev("metrics", '{"step": 1, "total": 0}'),  # older: the bar does not go back
            ev("checkpoint", '{"name": "step-000002", "step": 2}'),
            ev("checkpoint", "{}"),
            ev("log", '{"message": "hello"}'),
            ev("log", "not json"),
            ev("config", '{"version": 2, "step": 3, "changes": {"optim.lr": 0.1, "steps": 9}}'),
            ev("config", "{}"),
            ev("status", '{"status": "failed", "error": {"message": "oom"}}'),
            ev("done", '{"status": "failed", "error": "plain"}'),
        ]
    )
    assert status == "failed"
    assert (bar.n, bar.total) == (2, 8)
    assert written == [
        "status: running",
        "checkpoint step-000002 (step 2)",
        "checkpoint  (step ?)",
        "hello",
        "not json",
        "config 2 after step 3: optim.lr=0.1, steps=9",
        "config ? after step ?: ",
        "status: failed",
        "error: oom",
        "error: plain",
    ]


def test_eval_and_samples_lines() -> None:
    metrics = {
        "eval_reward_mean": 0.4123,
        "eval_pass@4": 0.6,
        "eval_pass@1": 0.25,
        "eval_greedy_reward_mean": 0.5,
        "eval_prompts": 64,
    }
    assert jobs._eval_line({"step": 20, "metrics": metrics}) == (
        "eval step 20: reward 0.412  pass@1 0.25  pass@4 0.6  greedy 0.5  (64 prompts)"
    )
    assert jobs._eval_line({}) == "eval step ?: "
    samples = [
        {"reward": 1, "prompt": "p" * 50, "completion": "a\nb"},
        {"prompt": "q"},
        "not a sample",
        {"reward": 0.5, "prompt": "r", "completion": "c"},
        {"reward": 0.25, "prompt": "s", "completion": "d"},
    ]
    assert jobs._samples_lines({"step": 4, "samples": samples}) == [
        "samples step 4:",
        f"  [1.00] {'p' * 39}… -> a b",
        "  [?] q -> ",
        "  [0.50] r -> c",
    ]
    assert jobs._samples_lines({"samples": "x"}) == ["samples step ?:"]


def test_file_and_usage_lines() -> None:
    from pdppo.client.files import File
    from pdppo.client.storage import Usage
    from pdppo.commands.files import _file_line
    from pdppo.commands.storage import usage_lines

    created = datetime(2026, 12, 5, hour=3, minute=4, second=5, tzinfo=UTC)
    f = File(id="file-1", filename="d.jsonl", bytes=1234, records=7, created_at=created)
    assert _file_line(f) == (
        "file-1          1234         7  -           d.jsonl  2026-12-05 03:04:05"
    )
    assert _file_line(File(id="f", purpose="train")).endswith("  train         ")
    found = Usage.model_validate(
        {
            "tenant": "alice",
            "jobs": {"queued": 1, "succeeded": 2, "bogus": 9},
            "files": 3,
            "bytes": {"files": 100, "artifacts": 300, "total": 400},
            "quota_bytes": 1600,
        }
    )
    assert usage_lines(found) == [
        "tenant alice",
        "jobs: 1 queued, 0 running, 0 paused, 2 succeeded, 0 failed, 0 cancelled",
        "files: 3",
        "bytes: 400 of a quota of 1600 (25.0%): 100 of files, 300 of job artifacts",
    ]
    unlimited = usage_lines(found.model_copy(update={"quota_bytes": None}))
    assert unlimited[-1] == "bytes: 400 (no quota): 100 of files, 300 of job artifacts"


def closed_url() -> str:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"  # nobody listens once it is closed


def test_every_client_command_takes_url_and_key_and_says_what_it_cannot_reach(
    tmp_path: Any,
) -> None:
    """The real commands, run by click, against a port nobody listens on: each takes --url and
    --api-key (or PDPPO_API_KEY), and says the one line of an unreachable server, exit 2; with
    no key at all, a usage error naming the variable."""
    from click.testing import CliRunner

    from pdppo.cli import main

    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "1"}\n')
    spec = tmp_path / "s.yaml"
    spec.write_text("name: x\n")
    commands = [
        ["files", "upload", str(data)],
        ["files", "list"],
        ["files", "show", "file-1"],
        ["files", "download", "file-1"],
        ["files", "delete", "file-1"],
        ["submit", str(spec)],
        ["status", "job-1"],
        ["list"],
        ["cancel", "job-1"],
        ["set", "job-1", "steps=3"],
        ["pause", "job-1"],
        ["resume", "job-1"],
        ["logs", "job-1"],
        ["delete", "job-1"],
        ["usage"],
        ["webhooks", "create", "https://example.com/h"],
        ["webhooks", "list"],
        ["webhooks", "show", "wh_1"],
        ["webhooks", "delete", "wh_1"],
        ["webhooks", "deliveries", "wh_1"],
        ["webhooks", "redeliver", "wh_1", "msg_1"],
        ["webhooks", "test", "wh_1"],
    ]
    url = closed_url()
    runner = CliRunner()
    for args in commands:
        result = runner.invoke(main, [*args, "--url", url, "--api-key", "k"])
        assert result.exit_code == 2, (args, result.output)
        assert result.output.startswith(f"Error: cannot reach {url}/"), (args, result.output)
        assert result.output.endswith("is the server up, and are --url / PDPPO_URL right?\n")
        by_env = runner.invoke(main, args, env={"PDPPO_URL": url, "PDPPO_API_KEY": "k"})
        assert by_env.output == result.output, args
        keyless = runner.invoke(main, args, env={"PDPPO_URL": url, "PDPPO_API_KEY": ""})
        assert keyless.exit_code == 2, args
        assert "no API key: pass --api-key or set PDPPO_API_KEY" in keyless.output, args


def test_a_sample_line_is_cut_at_its_width() -> None:
    assert jobs._one_line("x" * 40, 40) == "x" * 40
    assert jobs._one_line("x" * 41, 40) == "x" * 39 + "…"
    assert jobs._one_line(" a \n b ", 40) == "a b"


def test_every_option_of_the_client_commands_is_taken(tmp_path: Any) -> None:
    """Each command's own options, all given, parse: the command goes on to call the server
    (here nobody, so the unreachable line, exit 2), where an option it lost is a usage error."""
    from click.testing import CliRunner

    from pdppo.cli import main

    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "1"}\n')
    spec = tmp_path / "s.yaml"
    spec.write_text("name: x\n")
    commands = [
        ["files", "upload", str(data), "--purpose", "train", "--json"],
        ["files", "list", "--limit", "5", "--json"],
        ["files", "download", "file-1", "--output", str(tmp_path / "out.jsonl")],
        ["submit", str(spec), "--follow", "--idempotency-key", "k1"],
        ["submit", str(spec), "--dry-run"],
        ["status", "job-1", "--json"],
        ["list", "--status", "running", "--limit", "5", "--json"],
        ["usage", "--json"],
        ["webhooks", "create", "https://e.com/h", "--event", "job.failed", "--event", "job.queued"],
        ["webhooks", "create", "https://e.com/h", "--description", "d", "--json"],
        ["webhooks", "list", "--json"],
        ["webhooks", "deliveries", "wh_1", "--limit", "5", "--json"],
    ]
    url = closed_url()
    for args in commands:
        result = CliRunner().invoke(main, [*args, "--url", url, "--api-key", "k"])
        assert result.exit_code == 2, (args, result.output)
        assert result.output.startswith(f"Error: cannot reach {url}/"), (args, result.output)


def test_the_cli_starts_without_the_client_or_trainer_libraries() -> None:
    """`pdppo --help` (or a typo) loads click and pdppo's own command modules only: each command
    imports the client (httpx, pydantic), tqdm or the job spec (core.config) when it runs. With
    them at import (a `TYPE_CHECKING` block's imports made real), the start took about 4 times
    as long on the 2-core test machine (`python -X importtime`: 0.6 s against 2.4 s)."""
    import subprocess
    import sys

    code = (
        "import sys, pdppo.cli;"
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('core', 'httpx', 'pydantic', 'tqdm', 'yaml', 'torch', 'fastapi', 'celery') "
        "or m.startswith(('pdppo.client', 'pdppo.spec', 'pdppo.settings')))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["core", "core.extras"]


def test_train_says_why_the_run_could_not_start_in_one_line(tmp_path: Any) -> None:
    """A RuntimeError of the run (here no CUDA for a spec that asks for it) is the user's one
    line, `Error: ...`, exit 1, not the traceback-hint of an unexpected error."""
    import torch
    from click.testing import CliRunner

    from pdppo.cli import main
    from tests.support.specs import smoke_spec

    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    spec = tmp_path / "cuda.yaml"
    spec.write_text(yaml.safe_dump(smoke_spec(device="cuda") | {"resources": {"device": "gpu"}}))
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["train", str(spec), "--quiet", "--out", str(out)])
    assert result.exit_code == 1
    assert result.output.splitlines()[-1] == (
        "Error: device='cuda' was requested but CUDA is not available"
    )


def test_a_broken_pipe_that_is_not_stdouts_is_reported() -> None:
    """Only a gone reader of stdout ends a command quietly (tests/client/test_closed_stdout.py):
    a BrokenPipeError of a socket, stdout being fine, is an error like any other."""
    from click.testing import CliRunner

    from pdppo.cli import main

    @click.command(name="pipe-test")
    def pipe_test() -> None:
        raise BrokenPipeError(32, "Broken pipe")

    main.add_command(pipe_test)
    try:
        result = CliRunner().invoke(main, ["pipe-test"])
    finally:
        main.commands.pop("pipe-test")
    assert result.exit_code == 1
    assert result.stderr == (
        "Error: unexpected BrokenPipeError: [Errno 32] Broken pipe "
        f"(a bug in pdppo? {DEBUG_HINT})\n"
    )
