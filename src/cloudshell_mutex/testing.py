"""pytest fixtures that start the CloudShell API emulator on free loopback ports, for testing locks.

The fixtures live here, not in the emulator, because they also reset what the lock caches per
server (the emulator knows nothing of the lock). Enable them in a ``conftest.py`` with
``pytest_plugins = ["cloudshell_mutex.testing"]``, then::

    def test_lock(cloudshell_emulator):
        api = cloudshell_emulator.session()

    def test_with_package(cloudshell_emulator_factory, tmp_path):
        emu = cloudshell_emulator_factory(packages=["Mutex_Package.zip"], latency={"distribution": "fixed",
                                                                                    "seconds": 0.01})
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, List

import pytest

from .emulator import Emulator
from .lock.server import catalog, late_adds


@pytest.fixture
def cloudshell_emulator_factory() -> Iterator[Callable[..., Emulator]]:
    """A callable ``(**Emulator kwargs) -> started Emulator``; every emulator it made stops at teardown.

    ``host`` defaults to 127.0.0.1 and both ports to 0 (free ports). Emulators come and go on reused
    loopback ports, so what this process's locks cached about a server's catalog is forgotten around
    each test, and so are the adds its late-add watcher still watches on the emulators it stopped.
    """
    started: List[Emulator] = []
    catalog.forget()

    def make(**kwargs: Any) -> Emulator:
        kwargs.setdefault("host", "127.0.0.1")
        kwargs.setdefault("port", 0)
        kwargs.setdefault("quali_port", 0)
        emulator = Emulator(**kwargs)
        emulator.start()
        started.append(emulator)
        return emulator

    yield make
    for emulator in reversed(started):
        emulator.stop()
    catalog.forget()
    watcher = late_adds.started_late_adds()
    if watcher is not None:
        # Adds watched on a stopped emulator went with it; left watched, their reads would reach the next
        # emulator that gets the same port.
        gone = tuple(f"//{emulator.host}:{emulator.port}/" for emulator in started)
        watcher.forget(lambda entry: any(url in str(getattr(entry.alias.api, "url", "")) for url in gone))


@pytest.fixture
def cloudshell_emulator(cloudshell_emulator_factory: Callable[..., Emulator]) -> Emulator:
    """A fresh, started emulator on free loopback ports, with an empty catalog (no packages)."""
    return cloudshell_emulator_factory()
