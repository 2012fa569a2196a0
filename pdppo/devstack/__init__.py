"""The machinery behind `pdppo dev`: its child processes, their logs, and their supervision.

`child.py` starts one process (through `launch.py`) and explains how it ended, `supervisor.py`
restarts the ones that die with a backoff and gives up on a crash loop, `stack.py` wires Redis,
the API and the worker together. The command itself is `pdppo.commands.dev`.
"""
