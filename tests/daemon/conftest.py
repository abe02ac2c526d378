"""Fixtures that start the real daemon (tests/support/daemon.py) for the daemon tests."""

from __future__ import annotations

import pytest
from support.daemon import GREEDY, Daemon

__all__ = ["GREEDY", "Daemon"]


@pytest.fixture
def start_daemon(tmp_path):
    started: list[Daemon] = []

    def start(**kwargs) -> Daemon:
        path = tmp_path / f"d{len(started)}"
        path.mkdir()
        started.append(Daemon(path, **kwargs))
        return started[-1]

    yield start
    for d in started:
        d.close()


@pytest.fixture(scope="module")
def shared_daemon(tmp_path_factory):
    """One daemon for the read-only protocol tests of a module (queue large enough for 32 at once)."""
    tmp = tmp_path_factory.mktemp("daemon")
    d = Daemon(tmp, config="[daemon]\nqueue_limit = 64\n")
    yield d
    d.close()
