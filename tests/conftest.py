"""Shared fixtures: the real local broker (Tansu) on a free loopback port."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from deploy.local.broker import LocalBroker


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    """A broker of the session's own, never the user's one on the default port."""
    local = LocalBroker(port=free_port(), state_dir=tmp_path_factory.mktemp("broker"))
    local.start()
    yield local
    local.stop()
