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
