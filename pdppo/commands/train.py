"""`pdppo train` (placeholder until its issue lands)."""

import click


@click.command()
def train() -> None:
    """Not available yet."""
    raise click.ClickException("pdppo train is not implemented yet")
