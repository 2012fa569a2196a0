"""`pdppo sample JOB_ID PROMPT`: try a succeeded job's model (`Client.complete`; generated on the
service's sample worker). The completion goes to stdout, so it can be piped; the counts and
timings to stderr."""

from __future__ import annotations

import json

import click

from pdppo.commands.jobs import key_option, make_client, url_option


@click.command("sample")
@click.argument("job_id")
@click.argument("prompt")
@click.option("--chat", is_flag=True, help="Send PROMPT as a user turn (the chat template).")
@click.option("--system", default=None, help="A system turn before it (implies --chat).")
@click.option("--max-tokens", type=click.IntRange(1), default=32, show_default=True)
@click.option("--temperature", type=click.FloatRange(0, 2), default=1.0, show_default=True)
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True)
@click.option("-n", "n", type=click.IntRange(1), default=1, show_default=True)
@click.option("--seed", type=click.IntRange(0), default=None, help="Repeatable draws.")
@click.option("--stop", multiple=True, help="A string that ends a completion (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the server's answer as JSON.")
@url_option
@key_option
def sample(
    job_id: str,
    prompt: str,
    chat: bool,
    system: str | None,
    max_tokens: int,
    temperature: float,
    top_p: float,
    n: int,
    seed: int | None,
    stop: tuple[str, ...],
    as_json: bool,
    url: str,
    api_key: str | None,
) -> None:
    """Completions of PROMPT by the final model of job JOB_ID (succeeded jobs only). For real
    traffic, serve the downloaded model with `vllm serve <final dir>` instead."""
    messages = None
    if chat or system is not None:
        messages = [{"role": "system", "content": system}] if system is not None else []
        messages.append({"role": "user", "content": prompt})
    with make_client(url, api_key) as client:
        out = client.complete(
            job_id,
            None if messages is not None else prompt,
            messages=messages,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            n=n,
            seed=seed,
            stop=list(stop) or None,
        )
    if as_json:
        click.echo(json.dumps(out.model_dump(mode="json"), indent=2))
        return
    for choice in out.choices:
        if n > 1:
            click.echo(f"--- {choice.index} ({choice.finish_reason}, {choice.tokens} tokens)")
        click.echo(choice.text)
    t = out.timings
    click.echo(
        f"{out.usage.prompt_tokens} prompt + {out.usage.completion_tokens} completion tokens; "
        f"{t.get('total_ms', 0):.0f} ms ({'cold: model loaded' if out.cold else 'warm'}, "
        f"generation {t.get('generate_ms', 0):.0f} ms)",
        err=True,
    )
