"""How the CLI reports a failure: one message on stderr, never a traceback unless asked for.

Exit status 2 for what the user can fix (a bad file, an unreachable server, a wrong key, any 4xx
answer, a bad PDPPO_* setting), 1 for what the server got wrong (a 5xx) or an unexpected error
(a bug: the message says how to see its traceback). `pdppo --debug` or PDPPO_DEBUG=1 lets the
original exception through instead.

The mapping lives here, applied once by the command group (`pdppo.cli`), so that a new command is
covered without a try/except of its own. Optional libraries are looked up in `sys.modules`, not
imported: an exception of a library that was never imported cannot be the one being handled, and
`pdppo --help` stays as light as it is.
"""

from __future__ import annotations

import sys
from typing import Any

import click


class UserError(click.ClickException):
    """Something the user can fix: exit status 2, like click's own usage errors."""

    exit_code = 2


class ServerError(click.ClickException):
    """The server failed (5xx), or pdppo itself did: exit status 1."""

    exit_code = 1


DEBUG_HINT = "run again with --debug (or PDPPO_DEBUG=1) for the traceback"


def debugging() -> bool:
    """Whether `pdppo --debug` (or PDPPO_DEBUG=1) asked for tracebacks: a command that reports
    a failure itself lets the exception through instead."""
    ctx = click.get_current_context(silent=True)
    return ctx is not None and bool(ctx.find_root().params.get("debug"))


MAX_BODY_CHARS = 300  # of a non-JSON error page (a proxy's HTML) shown in a message


def _class(module: str, name: str) -> type[BaseException] | None:
    """`module.name` if that module is loaded, else None (see the module docstring)."""
    found: Any = getattr(sys.modules.get(module), name, None)
    return found if isinstance(found, type) and issubclass(found, BaseException) else None


def _is(exc: BaseException, module: str, name: str) -> bool:
    cls = _class(module, name)
    return cls is not None and isinstance(exc, cls)


def _one_line(text: str, limit: int = MAX_BODY_CHARS) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _api_error(exc: Any) -> click.ClickException:
    """An HTTP error answer: its detail first, then where it came from."""
    from pdppo.client import detail_text

    detail = _one_line(detail_text(exc.detail)) or "(no detail)"
    where = f" from {exc.method} {exc.url}" if exc.method else ""
    if exc.status_code >= 500:
        return ServerError(f"the server failed: {detail} (HTTP {exc.status_code}{where})")
    hint = ""
    if exc.status_code == 401:
        hint = "; check --api-key or PDPPO_API_KEY (for pdppo dev: source .pdppo/dev.env)"
    return UserError(f"{detail} (HTTP {exc.status_code}{where}){hint}")


def _transport_error(exc: Any) -> click.ClickException:
    try:
        url = str(exc.request.url)
    except RuntimeError:  # an httpx error raised before its request was attached
        url = "the server"
    reason = str(exc) or type(exc).__name__
    return UserError(
        f"cannot reach {url}: {reason}; is the server up, and are --url / PDPPO_URL right?"
    )


def _validation_error(exc: Any) -> click.ClickException:
    """pydantic's errors, one per line; a Settings field named as its environment variable."""
    settings = exc.title == "Settings"
    lines = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err.get("loc", ()))
        name = f"PDPPO_{loc.upper()}" if settings else loc
        msg = str(err.get("msg", "")).removeprefix("Value error, ")
        lines.append(f"  {name}: {msg}" if name else f"  {msg}")
    what = "PDPPO_* settings" if settings else exc.title
    return UserError(f"invalid {what}:\n" + "\n".join(lines))


def explain(exc: Exception) -> click.ClickException:
    """The CLI's report of `exc`, an exception a command let through."""
    if isinstance(exc, click.ClickException):
        return exc
    if _is(exc, "pdppo.client", "ApiError"):
        return _api_error(exc)
    if _is(exc, "pdppo.client", "FollowError"):
        return UserError(f"lost the job's event stream: {exc}")
    if _is(exc, "httpx", "TransportError"):
        return _transport_error(exc)
    if _is(exc, "yaml", "YAMLError"):
        return UserError(f"not valid YAML: {exc}")
    if _is(exc, "pdppo.client.specs", "SpecFileError") or _is(exc, "pdppo.spec", "SpecError"):
        return UserError(str(exc))
    if _is(exc, "pydantic_core", "ValidationError"):
        return _validation_error(exc)
    if _is(exc, "redis.exceptions", "ConnectionError"):
        return UserError(f"cannot reach Redis: {exc}; check PDPPO_REDIS_URL")
    if isinstance(exc, OSError) and exc.filename is not None:
        return UserError(f"{exc.filename}: {exc.strerror or exc}")
    return ServerError(f"unexpected {type(exc).__name__}: {exc} (a bug in pdppo? {DEBUG_HINT})")
