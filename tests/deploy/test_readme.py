"""README and docs/ claims checked against the code, so the documentation cannot drift silently.

README's two quick-start commands must be exactly what CI runs; every `pdppo` invocation, every
spec example and field, and every `PDPPO_` variable that README or a page under docs/ names must
exist as written, and the metrics page must explain only metrics the trainer reports. (The
site's own build, links and generated pages: tests/docs.)
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from pydantic import BaseModel

from pdppo.cli import main
from pdppo.settings import Settings
from pdppo.spec import JobSpec, load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
DOC_PAGES = sorted((ROOT / "docs").rglob("*.md"))
# What a reader can read: the landing page and every page of the site, checked as one text.
DOCS = "\n".join([README, *(page.read_text() for page in DOC_PAGES)])
CLIENT_VARS = {"PDPPO_URL", "PDPPO_API_KEY", "PDPPO_DEBUG"}  # read by the client and CLI
TEST_VARS = {"PDPPO_BROWSER_ARTIFACTS"}  # read by tests/browser (.ci/browser), not the service
TEST_COMMAND = "python -m pytest -q -n auto --dist worksteal"  # in parallel: tests/conftest.py


def _code_blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOCS, re.DOTALL)


def _section(title: str, text: str = README, level: str = "##") -> str:
    match = re.search(
        rf"^{level} {re.escape(title)}\n(.*?)(?=^{level} |\Z)", text, re.DOTALL | re.MULTILINE
    )
    assert match, f"no '{level} {title}' section"
    return match.group(1)


def _commands(block: str) -> list[str]:
    joined = block.replace("\\\n", " ")  # shell line continuations
    lines = [line.split(" #")[0].strip() for line in joined.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def test_quick_start_is_two_commands_stack_first_then_tests() -> None:
    block = re.search(r"```bash\n(.*?)```", _section("Quick start"), re.DOTALL)
    assert block
    first, second = _commands(block.group(1))
    assert first.startswith("python3 -m venv .venv")
    assert "pip install -e" in first and first.endswith("pdppo dev --demo")
    assert second == TEST_COMMAND
    assert TEST_COMMAND in _commands(_section("Tests"))
    # and it is what CI runs
    assert TEST_COMMAND in (ROOT / ".ci" / "run").read_text()


CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def test_every_torch_install_line_is_true_off_this_machine() -> None:
    """`pip install torch==V` takes the CPU build only where pip is set up to serve a local
    `+cpu` wheel (CI's machine); against the public index it resolves the CUDA build, about 20
    packages and several GB more. So every torch install a reader can copy names PyTorch's CPU
    index, the release CI tests (`.ci/run`) and the CPU image's (deploy/Dockerfile)."""
    ci = re.findall(r"pip install torch==(\S+)", (ROOT / ".ci" / "run").read_text())
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    image = re.findall(r"^ARG TORCH_VERSION=(\S+)$", dockerfile, re.MULTILINE)
    assert ci == image == ["2.13.0"], (ci, image)
    assert f"ARG TORCH_INDEX_URL={CPU_INDEX}\n" in dockerfile
    lines = {
        f"{page.name}: {line}": line
        for page in [ROOT / "README.md", *DOC_PAGES]
        for line in page.read_text().splitlines()
        if re.search(r"pip install [^`]*\btorch\b", line)
    }
    assert len(lines) >= 5, lines  # the quick start, README's tests, the pages that repeat them
    wrong = [
        where
        for where, line in lines.items()
        for install in re.findall(r"pip install torch[^\s`]*(?: --index-url [^\s`]+)?", line)
        if install != f"pip install torch=={ci[0]} --index-url {CPU_INDEX}"
    ]
    assert wrong == []
    quick_start = _commands(re.findall(r"```bash\n(.*?)```", _section("Quick start"), re.DOTALL)[0])
    assert f"pip install torch=={ci[0]} --index-url {CPU_INDEX} && " in quick_start[0]
    # and what a GPU machine does instead
    assert "leave that `pip install` out" in " ".join(_section("Quick start").split())


def test_readme_is_a_landing_page_that_links_into_the_docs() -> None:
    """The first screen says what this is and the two commands; the reference is in docs/."""
    lines = README.splitlines()
    assert len(lines) <= 200
    assert lines.index("## Quick start") < 30
    linked = set(re.findall(r"\]\((docs/[^)#]+\.md)\)", README))
    assert {"docs/users/job-spec.md", "docs/operators/deployment.md"} <= linked
    assert sorted(link for link in linked if not (ROOT / link).is_file()) == []
    assert (ROOT / "docs" / "dashboard.png").is_file() and "](docs/dashboard.png)" in README


def test_getting_started_page_has_readmes_two_commands() -> None:
    page = (ROOT / "docs" / "users" / "getting-started.md").read_text()
    readme_block = re.search(r"```bash\n(.*?)```", _section("Quick start"), re.DOTALL)
    page_block = re.search(r"```bash\n(.*?)```", _section("Quick start", page), re.DOTALL)
    assert readme_block and page_block
    assert _commands(page_block.group(1)) == _commands(readme_block.group(1))


def _pdppo_invocations() -> list[list[str]]:
    found = []
    for block in _code_blocks("bash"):
        for line in _commands(block):
            for part in line.split("&&"):
                if part.strip().startswith("pdppo "):
                    found.append(shlex.split(part.strip())[1:])
    return found


def test_every_pdppo_command_in_the_docs_exists_with_its_options() -> None:
    invocations = _pdppo_invocations()
    assert {"dev", "submit", "list", "status", "logs", "cancel"} <= {a[0] for a in invocations}
    for args in invocations:
        command = main.commands.get(args[0])
        assert command is not None, f"the docs run unknown `pdppo {args[0]}`"
        rest = args[1:]
        while isinstance(command, click.Group) and rest:  # `pdppo files upload ...`
            sub = command.commands.get(rest[0])
            assert sub is not None, f"the docs run unknown `pdppo {' '.join(args[:2])}`"
            command, rest = sub, rest[1:]
        known = {opt for param in command.params for opt in getattr(param, "opts", [])}
        unknown = [a for a in rest if a.startswith("-") and a not in known]
        assert not unknown, f"`pdppo {' '.join(args)}`: {unknown} unknown"


def test_every_spec_example_in_the_docs_is_a_valid_job_spec() -> None:
    examples = [yaml.safe_load(b) for b in _code_blocks("yaml")]
    specs = [e for e in examples if isinstance(e, dict) and "train" in e]
    assert len(specs) >= 2, "README and the job spec page each show a job spec"
    for spec in specs:
        parse_spec(spec, "docs")


def _field_paths(model: type[BaseModel], prefix: str = "") -> set[str]:
    paths = set()
    for name, field in model.model_fields.items():
        paths.add(prefix + name)
        candidates = [field.annotation, *getattr(field.annotation, "__args__", ())]
        for sub in candidates:
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                paths |= _field_paths(sub, f"{prefix}{name}.")
    return paths


def test_every_field_the_docs_name_exists() -> None:
    """A name that opens an error message the docs quote (`train.optim.lrr: unknown field ...`,
    or a union member's location such as `train.task.grader.regex.pattern: ...`) is the message,
    not a field the docs claim."""
    fields = _field_paths(JobSpec)
    quoted_error = r"(?=: (?:unknown field|'[^']*' is not))"
    docs = re.sub(r"`(?:train|resources)\.[a-z_.]+[a-z_]" + quoted_error, "`", DOCS)
    named = set(re.findall(r"`((?:train|resources)\.[a-z_.]+[a-z_])", docs))
    named |= {
        f"train.{m}"
        for m in re.findall(r"`((?:rollout|algorithm|task|model|optim)\.[a-z_.]+[a-z_])", docs)
    }
    assert {"train.rollout.staleness", "train.algorithm.fused_loss"} <= named
    assert sorted(named - fields) == []


def test_every_pdppo_variable_in_the_docs_is_a_setting() -> None:
    """Service variables are `Settings` fields; `PDPPO_DEV_*` tune `pdppo dev`'s supervisor,
    which reads them itself (it runs before any service settings exist)."""
    named = set(re.findall(r"\bPDPPO_[A-Z_]+[A-Z]", DOCS)) - CLIENT_VARS - TEST_VARS
    assert all(
        f'"{n}"' in (ROOT / "tests" / "browser" / "conftest.py").read_text() for n in TEST_VARS
    )
    assert {"PDPPO_API_KEYS", "PDPPO_REDIS_URL"} <= named
    dev = {n for n in named if n.startswith("PDPPO_DEV_")}
    unknown = sorted(
        n for n in named - dev if n.removeprefix("PDPPO_").lower() not in Settings.model_fields
    )
    assert unknown == []
    supervisor = (ROOT / "pdppo" / "devstack" / "supervisor.py").read_text()
    assert sorted(n for n in dev if f'"{n}"' not in supervisor) == []


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_are_valid_job_specs(path: Path) -> None:
    spec: Any = load_spec(path)
    assert spec.train.steps >= 1


def test_every_metric_the_docs_explain_is_one_the_trainer_reports(tmp_path: Path) -> None:
    import json

    from core.training.trainer import train

    spec = load_spec(ROOT / "examples" / "smoke.yaml")
    spec.train.steps = 1
    reported: set[str] = set()
    # a sync run's metrics, and those an async run adds (`rollout.mode: async`)
    for mode in ("sync", "async"):
        cfg = spec.train.model_copy(
            update={"rollout": spec.train.rollout.model_copy(update={"mode": mode})}
        )
        train(cfg, tmp_path / mode)
        reported |= set(json.loads((tmp_path / mode / "metrics.jsonl").read_text().splitlines()[0]))
    table = (ROOT / "docs" / "users" / "metrics.md").read_text()
    explained = {
        name
        for row in re.findall(r"^\| (.+?) \|", table, re.MULTILINE)
        for name in re.findall(r"`(\w+)`", row)
    }
    assert {"reward_mean", "masked_fraction", "direction_disagreement"} <= explained
    assert sorted(explained - reported) == []


def test_the_docs_home_says_why_the_predictive_mask_as_readme_does() -> None:
    """The one passage both carry: the site's home must not drift from the landing page."""
    readme = README.split("**Why the predictive mask.** ", 1)[1].split("\n\n", 1)[0]
    home = (ROOT / "docs" / "index.md").read_text()
    home = home.split("## Why the predictive mask\n\n", 1)[1].split("\n\n", 1)[0]
    assert "masks a token iff `D(mu, pi) > delta`" in readme
    assert home == readme.replace("](docs/", "](")


def test_the_failure_codes_page_lists_every_code_a_job_can_end_with() -> None:
    from api.http.service_metrics import FAILURE_CODES

    page = (ROOT / "docs" / "operators" / "limits-and-failures.md").read_text()
    table = _section("Limits and failures", page, level="#")
    listed = re.findall(r"^\| `([a-z_]+)` \|", table, re.MULTILINE)
    assert sorted(listed) == sorted(FAILURE_CODES)


def test_what_a_cancel_keeps_is_told_as_the_job_log_tells_it() -> None:
    """The steering page said a cancel "keeps nothing" while the job's own log says it stops
    "keeping its last checkpoint" (pdppo/store/jobs/api_side.py), which is what the trainer does
    (core/training/trainer.py: a cancel mid-update discards that step's partial update and
    keeps the latest checkpoint; between steps it checkpoints the last one)."""
    from pdppo.store.jobs import api_side

    assert "the job stops within seconds, keeping its last checkpoint" in (
        Path(api_side.__file__).read_text()
    )
    assert "keeps nothing" not in DOCS
    steering = (ROOT / "docs" / "users" / "steering.md").read_text()
    assert "a cancelled job keeps its last\ncheckpoint" in steering


def test_the_active_job_limit_is_told_as_the_store_counts_it() -> None:
    """POST /v1/jobs answers 429 when the tenant's active set (queued, running and paused jobs:
    a paused job is still active, pdppo/store/jobs/api_side.py) is at the limit; the setting's
    description and deploy/.env.example said queued plus running."""
    from pdppo.store.jobs import api_side

    assert "Queued, running or paused jobs come from the small active set" in (
        Path(api_side.__file__).read_text()
    )
    field = Settings.model_fields["max_active_jobs_per_tenant"]
    assert field.description == "queued, running and paused jobs per tenant before POST answers 429"
    env = (ROOT / "deploy" / ".env.example").read_text()
    assert "# Queued, running and paused jobs per tenant before POST /v1/jobs answers 429." in env
    told = DOCS + env
    assert re.findall(r"(?i)queued (?:plus|or|and) running jobs", told) == []


def test_the_docs_site_stays_on_the_line_that_gets_fixes() -> None:
    """Material prints an end-of-life notice on every build (9.7.2 on): the `docs` extra keeps
    MkDocs 1.x and Material 9.x (MkDocs 2 does not run Material; Zensical does not run
    docs/hooks.py), CI's builds silence the notice, and the developers' page says why."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    docs = extras["optional-dependencies"]["docs"]
    assert {"mkdocs>=1.6,<2", "mkdocs-material>=9.7,<10"} <= set(docs)
    assert "export NO_MKDOCS_2_WARNING=1" in (ROOT / ".ci" / "docs").read_text()
    page = (ROOT / "docs" / "developers" / "tests.md").read_text()
    assert "does not run MkDocs hooks" in page and "2027-05-05" in page


def test_the_deployment_commands_are_the_ones_ci_runs() -> None:
    """README's and the deployment page's compose commands are the plain `up -d --build` with no
    service names (before: README's failed on `Service 'worker-gpu' needs to be built`, the
    page named services and left `sample` out), and .ci/compose runs exactly that, with the
    Compose v2 CLI (`docker compose`) and with Compose 1.29."""
    cp = "cp deploy/.env.example deploy/.env"
    up = "docker compose -f deploy/docker-compose.yml up -d --build"
    block = re.findall(r"```bash\n(.*?)```", _section("A tour"), re.DOTALL)[-1]
    assert _commands(block) == [cp, up]
    page = (ROOT / "docs" / "operators" / "deployment.md").read_text()
    starting = _commands(
        re.findall(r"```bash\n(.*?)```", _section("Starting it", page), re.DOTALL)[0]
    )
    assert starting[:2] == [cp, up]
    ci = (ROOT / ".ci" / "compose").read_text()
    assert 'step "${name}: up -d --build" "${compose[@]}" up -d --build\n' in ci
    assert "--file deploy/docker-compose.yml)" in ci
    assert 'deployment v2 "/usr/bin/docker compose --progress quiet"' in ci
    assert "deployment v1.29 docker-compose " in ci
    # nowhere a list of services to start instead (restarting one, `up -d redis`, is fine)
    assert not re.search(r"up -d (?:--no-build |--build )?redis api", ci + page + README)


def test_every_documented_sample_prompt_is_in_a_built_in_tasks_format() -> None:
    """The pages tried a tuned model with `"12="`, which no built-in task asks (their prompts
    are `reverse 123=`, `copy 90=`, ...): a model trained on examples/ answered noise to it."""
    import json
    import random

    from core.tasks.builtin import DigitStringTask

    formats = set()
    for name in ("copy", "reverse", "sort"):
        example = DigitStringTask(name, min_len=3, max_len=3).sample(random.Random(0))
        formats.add(re.sub(r"\d+", "D", example.prompt))
    assert formats == {"copy D=", "reverse D=", "sort D="}
    for line in (ROOT / "examples" / "data" / "chat_math.jsonl").read_text().splitlines():
        turns = json.loads(line)["messages"]  # examples/chat_math.yaml's chat prompts
        formats |= {re.sub(r"\d+", "D", m["content"]) for m in turns if m["role"] == "user"}
    prompts = re.findall(r'pdppo sample \w+ "([^"]+)"', DOCS)
    prompts += re.findall(r'client\.complete\(\w+, "([^"]+)"', DOCS)
    prompts += re.findall(r'"content": "([^"]*\d=)"', DOCS)
    assert len(prompts) >= 5, prompts
    assert sorted({p for p in prompts if re.sub(r"\d+", "D", p) not in formats}) == []
