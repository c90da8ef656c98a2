"""The names Python users know mean what they expect: ``MutexTimeout`` is a ``TimeoutError``; ``locked()`` and
its alias ``owned()`` say whether *this object* holds the lock (redis-py's ``owned()``), ``holder()`` whether
anyone does (threading's and redis-py's ``locked()``); ``blocking=False`` and ``timeout=0`` try once."""

from __future__ import annotations

import pickle
import types
from pathlib import Path

import pytest

from cloudshell_mutex import CohortMutex, MutexError, MutexTimeout, ReservationMutex, ReservationRWLock


def test_mutex_timeout_is_a_timeout_error_and_keeps_its_details() -> None:
    error = MutexTimeout("waited 3 s for 'MUTEX'", holder="A", waited=3.0, reservation_id="r-1", code="100")
    assert isinstance(error, MutexError) and isinstance(error, TimeoutError) and isinstance(error, OSError)
    assert str(error) == "waited 3 s for 'MUTEX'" and error.errno is None
    copy = pickle.loads(pickle.dumps(error))  # crosses process boundaries (multiprocessing, executors)
    assert type(copy) is MutexTimeout and str(copy) == str(error)
    assert (copy.holder, copy.waited, copy.reservation_id, copy.code) == ("A", 3.0, "r-1", "100")


@pytest.mark.integration
def test_owned_is_this_object_and_holder_is_anyone(cloudshell_emulator_factory, original_package_zip) -> None:
    emu = cloudshell_emulator_factory(packages=[original_package_zip])
    reservation_id = emu.create_reservation("conventions")
    first = ReservationMutex(emu.session(), reservation_id, owner="First")
    second = ReservationMutex(emu.session(), reservation_id, owner="Second")
    assert first.acquire(blocking=False)
    assert first.locked() and first.owned()
    assert not second.locked() and not second.owned()  # someone holds it, but not this object
    assert second.holder() is not None and second.holder().label.startswith("First")
    assert second.acquire(blocking=False) is False
    with pytest.raises(TimeoutError) as caught:  # timeout=0: one attempt, then the timeout error
        second.acquire(timeout=0)
    assert isinstance(caught.value, MutexTimeout) and "First" in str(caught.value)
    assert not second.owned()
    first.release()
    assert not first.owned() and second.holder() is None


@pytest.mark.integration
def test_every_lock_object_has_owned(
    cloudshell_emulator_factory, original_package_zip, tmp_path: Path
) -> None:
    emu = cloudshell_emulator_factory(packages=[original_package_zip])
    reservation_id = emu.create_reservation("conventions")
    cohort = CohortMutex(emu.session(), reservation_id, owner="Cohort", cohort_dir=tmp_path)
    with cohort:
        assert cohort.owned() and cohort.locked()
    assert not cohort.owned()
    rw = ReservationRWLock(emu.session(), reservation_id, owner="Report")
    for side in (rw.read(), rw.write()):
        with side:
            assert side.owned() and side.locked()
        assert not side.owned()


def test_the_package_exports_the_locks_acquire_all_and_every_error_and_no_more() -> None:
    """Every error the lock raises is importable from ``cloudshell_mutex`` (a README snippet that catches
    ``MutexDeadlock`` must not need ``cloudshell_mutex.lock.errors``), each with a docstring; beside the
    errors only the locks, their options, ``acquire_all``, the version and the protocol's names."""
    import cloudshell_mutex
    from cloudshell_mutex.lock import errors

    # Submodules (lock, and the emulator or testing once imported) are attributes too: not counted.
    public = {
        name
        for name, value in vars(cloudshell_mutex).items()
        if not name.startswith("_") and (not isinstance(value, types.ModuleType) or name == "protocol")
    }
    assert public - {"annotations"} == set(cloudshell_mutex.__all__) - {"__version__"}
    for name in errors.__all__:
        assert getattr(errors, name).__doc__, name
        assert getattr(cloudshell_mutex, name) is getattr(errors, name), name
    others = set(cloudshell_mutex.__all__) - set(errors.__all__)
    assert others == {
        "CohortMutex",
        "MutexOptions",
        "ReservationMutex",
        "ReservationRWLock",
        "__version__",
        "acquire_all",
        "protocol",
    }
