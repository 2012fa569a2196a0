"""`pdppo dev` (placeholder until its issue lands)."""

import click


@click.command()
def dev() -> None:
    """Not available yet."""
    raise click.ClickException("pdppo dev is not implemented yet")
