"""Tests of the shipped deployment: real images, real containers, `deploy/docker-compose.yml` as
a user runs it. `.ci/compose` builds the images, brings the stack up and runs these from the
host; they need Docker, so the plain suite (`python -m pytest`) does not collect them (nothing is
skipped: they are simply not part of it, and CI runs them in their own step).

To run them against a stack you brought up yourself, set what `.ci/compose` sets:
PDPPO_COMPOSE_PROJECT, PDPPO_COMPOSE_ENV_FILE, PDPPO_COMPOSE_URL, PDPPO_COMPOSE_API_KEYS
(tenant:key,...), PDPPO_COMPOSE_DATA_DIR and PDPPO_COMPOSE_CMD (`docker-compose` or `docker
compose`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import pytest

from tests.compose.stack import Stack, wait_api

if "PDPPO_COMPOSE_PROJECT" not in os.environ:
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def stack() -> Stack:
    return Stack.from_env()


@pytest.fixture
def alice(stack: Stack) -> Iterator[httpx.Client]:
    """The first tenant's client, after making sure every service is back up: a test that
    restarts a service leaves the stack whole for the next one."""
    stack.run("up", "-d", "--no-build")  # the default set, as the docs' `up` starts it
    stack.wait_healthy()
    with stack.client("alice") as client:
        wait_api(client)
        yield client
