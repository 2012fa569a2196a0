"""One module per group of `pdppo` subcommands; heavy imports stay inside the commands."""
