"""OpenAI's graders that reach past the text: `python` (a tenant's `grade(sample, item)`) and
`score_model` (a model's opinion, asked over HTTP). Both only where the operator allows them
(`core.graders.options`), and both in the grading server (`isolated`): a tenant's loop and a
model endpoint that does not answer cost one completion's score under the server's deadline,
never the job.

The python grader is not a security sandbox: its code runs in the grading server's process (whose
environment lacks the service's `PDPPO_*` settings), with the worker's user, files and network,
which is why it is off unless the operator turns it on.
Only the grading server executes it (`load=True`); the config parses it (`parse_source`), to
refuse a syntax error at submission, and nothing else runs it. Its top level runs once, when the
server loads it: an exception there (or the process ending) is a `GraderLoadError` naming the
grader and the exception's last line, and the server's parent bounds that run (`LOADING`: it is
told when each top level starts), so a worker refuses the job before training and graders.run
answers 400.
"""

from __future__ import annotations

import ast
import copy
import json
import math
import re
import traceback
from collections.abc import Callable
from contextvars import ContextVar
from numbers import Real
from typing import Any
from urllib.error import HTTPError, URLError
from urllib.request import Request, urlopen

from core.config.openai_graders import (
    OpenAIGraderConfig,
    OpenAIMulti,
    OpenAIPython,
    OpenAIScoreModel,
    parse_source,
    template_paths,
)
from core.graders.base import Grader, GraderLoadError, Record
from core.graders.options import ModelEndpoint
from core.graders.templates import NotJson, check_paths, render

MAX_REPLY_BYTES = 1 << 20
"""The most of an endpoint's answer read (a chat completion of a score is a few hundred bytes)."""

LOADING: ContextVar[Callable[[str, str], None] | None] = ContextVar(
    "pdppo_python_grader_loading", default=None
)
"""Called with (where, name) just before a python grader's top level runs. The grading server
sets it to tell its parent, which gives the top level `python_load_seconds` from then on; unset,
nothing bounds it (a test, a library user)."""

_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


class EndpointError(RuntimeError):
    """The score model endpoint failed: unreachable, an error status, an answer of another
    shape (OpenAI's `model_grader_server_error`)."""


class NoScore(ValueError):
    """The score model's reply holds no number (OpenAI's `model_grader_parse_error`)."""


def sample_of(completion: str) -> dict[str, Any]:
    """OpenAI's `sample` for a text completion: the text, the text parsed as JSON (None when it
    is not JSON), and no tool calls."""
    try:
        parsed: Any = json.loads(completion)
    except (ValueError, RecursionError):
        parsed = None
    return {"output_text": completion, "output_json": parsed, "output_tools": []}


def _threshold(value: float, threshold: float | None) -> float:
    return value if threshold is None else float(value >= threshold)


def holds_python(cfg: OpenAIGraderConfig) -> bool:
    """Whether `cfg` holds a python grader (alone or in a multi): a tenant's code to run."""
    leaves = cfg.graders.values() if isinstance(cfg, OpenAIMulti) else [cfg]
    return any(isinstance(leaf, OpenAIPython) for leaf in leaves)


class Python(Grader):
    """The tenant's `grade(sample, item)`; its number (a bool counts) clipped to [0, 1]. An
    exception, or a result that is not a finite number, is the grader's failure (counted in
    `grader_errors`); a loop without end is cut by the grading server's deadline
    (`grader_timeouts`)."""

    def __init__(self, cfg: OpenAIPython, where: str, *, load: bool) -> None:
        """`load=False` (the trainer's process) only parses the source; `load=True` (the
        grading server) also runs it, once, to define the function."""
        self.name = cfg.name
        self.threshold = cfg.pass_threshold
        tree = parse_source(cfg.source)  # parses and defines grade: the config checked it
        self.fn: Callable[..., Any] | None = None
        if load:
            self.fn = self._load(tree, where)

    def _load(self, tree: ast.Module, where: str) -> Callable[..., Any]:
        """Runs the top level (the tenant's code, in the grading server only) and returns its
        `grade`. A GraderLoadError when the top level raises, `sys.exit` included."""
        announce = LOADING.get()
        if announce is not None:
            announce(where, self.name)
        namespace: dict[str, Any] = {"__name__": "pdppo_python_grader"}
        filename = f"<{where}.source>"
        try:
            exec(compile(tree, filename, "exec"), namespace)
        except (Exception, SystemExit) as e:
            raise GraderLoadError(
                f"{where}: python grader {self.name!r} raised while loading"
                f"{_line_in(e, filename)}: {last_line(e)}",
                where,
            ) from None
        fn = namespace.get("grade")
        if not callable(fn):
            raise GraderLoadError(
                f"{where}: python grader {self.name!r}: grade is not a function once its code ran",
                where,
            )
        return fn

    def score(self, completion: str, record: Record) -> float:
        if self.fn is None:
            raise RuntimeError(f"python grader {self.name!r} runs in the grading server only")
        # a deep copy: the completions of one prompt share their record in the server
        result = self.fn(sample_of(completion), copy.deepcopy(dict(record)))
        if not isinstance(result, Real):
            raise TypeError(
                f"python grader {self.name!r} returned {type(result).__name__}, not a number"
            )
        value = float(result)
        if not math.isfinite(value):
            raise ValueError(f"python grader {self.name!r} returned {value}, not a finite number")
        return _threshold(min(1.0, max(0.0, value)), self.threshold)


def last_line(e: BaseException) -> str:
    """What a traceback's last line says of `e` (`ZeroDivisionError: division by zero`), at
    most 500 characters; the type is kept when a message of several lines ends the text."""
    text = "".join(traceback.format_exception_only(e)).strip()
    last = text.splitlines()[-1] if text else type(e).__name__
    name = type(e).__name__
    if last.partition(":")[0].rsplit(".", 1)[-1] != name:  # json.decoder.JSONDecodeError: ...
        last = f"{name}: ... {last}"
    return last[:500]


def _line_in(e: BaseException, filename: str) -> str:
    """` at line N` of the tenant's code where `e` was raised (its innermost frame there)."""
    line = None
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    return "" if line is None else f" at line {line}"


def parse_score(reply: str) -> float:
    """The score in a model's reply: the reply as a JSON number, or a JSON object's `result`
    (OpenAI's structured answer, `{"steps": [...], "result": 7}`) or `score`, or else the first
    number written in it ("Score: 7/10" is 7). NoScore when there is none."""
    try:
        parsed: Any = json.loads(reply)
    except (ValueError, RecursionError):
        parsed = None
    if isinstance(parsed, dict):
        parsed = parsed.get("result", parsed.get("score"))
    if isinstance(parsed, int | float) and not isinstance(parsed, bool):
        value = float(parsed)
    else:
        found = _NUMBER.search(reply)
        if found is None:
            raise NoScore(f"the score model's reply holds no number: {reply[:200]!r}")
        value = float(found.group())
    if not math.isfinite(value):
        raise NoScore(f"the score model answered {value}, not a finite number")
    return value


def normalise(value: float, low: float, high: float) -> float:
    """`value` in [low, high] mapped onto [0, 1]; outside the range, the nearer end."""
    return min(1.0, max(0.0, (value - low) / (high - low)))


def chat(endpoint: ModelEndpoint, body: dict[str, Any]) -> str:
    """The first choice's text of `POST <endpoint>/chat/completions`; a RuntimeError saying
    what went wrong (EndpointError: unreachable, an error status and its body, an answer of
    another shape)."""
    headers = {"Content-Type": "application/json"}
    if endpoint.api_key:
        headers["Authorization"] = f"Bearer {endpoint.api_key}"
    request = Request(
        endpoint.url.rstrip("/") + "/chat/completions",
        data=json.dumps(body).encode(),
        headers=headers,
        method="POST",
    )
    try:
        with urlopen(request, timeout=endpoint.timeout_seconds) as response:
            raw = response.read(MAX_REPLY_BYTES)
    except HTTPError as e:
        detail = e.read(300).decode(errors="replace")
        raise EndpointError(f"the score model endpoint answered {e.code}: {detail}") from None
    except (URLError, OSError) as e:  # refused, unresolved, timed out
        reason = e.reason if isinstance(e, URLError) else e
        raise EndpointError(f"the score model endpoint did not answer: {reason}") from None
    try:
        content = json.loads(raw)["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise EndpointError(
            f"the score model endpoint's answer is no chat completion: {raw[:200]!r}"
        ) from None
    if not isinstance(content, str):
        raise EndpointError(f"the score model's message content is {type(content).__name__}")
    return content


class ScoreModel(Grader):
    """Renders `input`, asks the endpoint, reads the score (`parse_score`) and maps `range`
    onto [0, 1]. A completion that is not the JSON a template reads scores 0 without a call; an
    endpoint that fails, or a reply without a number, is the grader's failure."""

    def __init__(self, cfg: OpenAIScoreModel, endpoint: ModelEndpoint) -> None:
        self.endpoint = endpoint
        self.model = cfg.model
        # developer is OpenAI's newer name of system, which every chat template knows
        self.messages = [
            ("system" if m.role == "developer" else m.role, m.text()) for m in cfg.input
        ]
        self.item_paths = [
            p for _, t in self.messages for p in template_paths(t) if p.startswith("item.")
        ]
        self.low, self.high = cfg.range
        self.threshold = cfg.pass_threshold
        params = cfg.sampling_params
        self.sampling: dict[str, Any] = {}
        if params is not None:
            fields = params.model_dump(exclude_none=True)
            if "max_completions_tokens" in fields:
                fields["max_tokens"] = fields.pop("max_completions_tokens")
            self.sampling = fields

    def check(self, record: Record) -> None:
        check_paths(self.item_paths, record)

    def request(self, completion: str, record: Record) -> dict[str, Any]:
        """The chat-completions body for one completion (NotJson: see `render`)."""
        messages = [
            {"role": role, "content": render(text, completion, record)}
            for role, text in self.messages
        ]
        return {"model": self.model, "messages": messages, **self.sampling}

    def score(self, completion: str, record: Record) -> float:
        try:
            body = self.request(completion, record)
        except NotJson:
            return 0.0
        value = parse_score(chat(self.endpoint, body))
        if self.threshold is not None:
            return float(value >= self.threshold)
        return normalise(value, self.low, self.high)
