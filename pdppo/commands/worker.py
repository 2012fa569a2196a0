"""`pdppo worker` (placeholder until its issue lands)."""

import click


@click.command()
def worker() -> None:
    """Not available yet."""
    raise click.ClickException("pdppo worker is not implemented yet")
