"""Shared fixtures: the real local broker (Tansu) on a free loopback port; PyTorch's threads as each test found them.
And how many workers ``-n auto`` starts."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

from deploy.local.broker import LocalBroker, free_port


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """One worker more than the cores this process may run on: a fair share of the suite waits on brokers, Beam's
    executor threads and timeouts, not on a core (on 2 cores the default suite took 562 s with three workers, 659 s
    with two and 577 s with four). ``--maxprocesses`` still caps it."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # not on macOS
    return cores + 1


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
