"""Fixtures of the lock's tests: a virtual clock, and a catalog cache forgotten around each test."""

from __future__ import annotations

import pytest
from fakes import Clock

from cloudshell_mutex.lock.server import catalog


@pytest.fixture(autouse=True)
def _fresh_catalog():
    catalog.forget()
    yield
    catalog.forget()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def parked_at_once(monkeypatch):
    """A waiter that finds the lock busy parks in the queue at once instead of spinning first: for the tests
    of the parked queue's own steps (tickets, heads, heartbeats), in this process."""
    from cloudshell_mutex.lock.queue import queue

    monkeypatch.setattr(queue, "SPIN_MIN", 0.0)
    monkeypatch.setattr(queue, "SPIN_MAX", 0.0)
