"""Shared fixtures: the real local broker (Tansu) on a free loopback port; PyTorch's threads as each test found them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from deploy.local.broker import LocalBroker, free_port


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    """A broker of the session's own, never the user's one on the default port."""
    local = LocalBroker(port=free_port(), state_dir=tmp_path_factory.mktemp("broker"))
    local.start()
    yield local
    local.stop()


@pytest.fixture(autouse=True)
def torch_threads() -> Iterator[None]:
    """A job's stages set the process's PyTorch threads (``--model_threads``): each test starts with the default."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
