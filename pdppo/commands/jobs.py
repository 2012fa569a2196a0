"""Client subcommands (placeholder until their issue lands)."""

import click

COMMANDS: list[click.Command] = []
