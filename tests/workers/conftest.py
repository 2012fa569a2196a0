"""The store tests' own redis-server and client fixtures (`tests.store.conftest`)."""

from tests.store.conftest import client, server

__all__ = ["client", "server"]
