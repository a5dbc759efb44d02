"""Shared fixtures: the real local broker (Tansu) on a free loopback port."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from deploy.local.broker import LocalBroker, free_port


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    """A broker of the session's own, never the user's one on the default port."""
    local = LocalBroker(port=free_port(), state_dir=tmp_path_factory.mktemp("broker"))
    local.start()
    yield local
    local.stop()
