"""Cohort files do not pile up: idle cohorts' files are removed, never those of a cohort in use, and a lock
file removed under a process that had just opened it is never held by two."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from fakes import RES, FakeApi

from cloudshell_mutex.lock.cohort import files as cohort_files
from cloudshell_mutex.lock.cohort.cohort import CohortMutex
from cloudshell_mutex.lock.cohort.files import new_file_lock, sweep_cohort_dir, sweep_now_and_then
from cloudshell_mutex.lock.engine import Runtime

pytestmark = pytest.mark.skipif(not cohort_files.cohort_available(), reason="no OS file lock here")


def age(folder: Path, seconds: float) -> None:
    old = time.time() - seconds
    for path in folder.iterdir():
        os.utime(path, (old, old))


def test_idle_cohorts_files_go_and_a_folder_used_for_months_stays_small(clock, tmp_path):
    api = FakeApi(clock=clock)
    for number in range(40):  # one lock in each of 40 sandboxes, one after another
        lock = CohortMutex(
            api, RES, name=f"L{number}", owner="A", cohort_dir=tmp_path, runtime=Runtime(clock, clock.sleep)
        )
        lock.acquire()
        lock.release()
    # Per cohort: state, releasing record (each released to the server), local lock, state lock.
    assert len(list(tmp_path.glob("*.releasing.json"))) == 40
    assert len(list(tmp_path.glob("*.json"))) == 80
    age(tmp_path, 2 * cohort_files.IDLE_FILES_SECONDS)
    removed = sweep_cohort_dir(tmp_path)
    assert removed == 160 and [p.name for p in tmp_path.iterdir() if p.name != ".swept"] == []


def test_a_cohort_in_use_keeps_its_files(clock, tmp_path):
    api = FakeApi(clock=clock)
    held = CohortMutex(
        api, RES, name="HELD", owner="A", cohort_dir=tmp_path, runtime=Runtime(clock, clock.sleep)
    )
    held.acquire()
    passed = CohortMutex(
        api, RES, name="PASSED", owner="B", cohort_dir=tmp_path, runtime=Runtime(clock, clock.sleep)
    )
    passed.acquire()
    with passed._files.state() as state:
        state.holder = None  # passed on, not taken yet: the cohort still holds the server lock
    passed._let_go()
    age(tmp_path, 2 * cohort_files.IDLE_FILES_SECONDS)
    assert sweep_cohort_dir(tmp_path) == 0
    assert len(list(tmp_path.glob("*.json"))) == 2
    held.release()


def test_recent_files_stay_and_the_folder_is_swept_at_most_once_an_interval(clock, tmp_path):
    api = FakeApi(clock=clock)
    lock = CohortMutex(api, RES, owner="A", cohort_dir=tmp_path, runtime=Runtime(clock, clock.sleep))
    lock.acquire()
    lock.release()
    assert sweep_cohort_dir(tmp_path) == 0  # used a moment ago
    age(tmp_path, 2 * cohort_files.IDLE_FILES_SECONDS)
    (tmp_path / ".swept").touch()  # another process swept a moment ago
    sweep_now_and_then(tmp_path)
    assert (tmp_path / f"{lock._files.key}.json").exists()
    age(tmp_path, 2 * cohort_files.SWEEP_INTERVAL)
    sweep_now_and_then(tmp_path)
    assert not (tmp_path / f"{lock._files.key}.json").exists()


@pytest.mark.skipif(os.name == "nt", reason="Windows refuses to remove an open file")
def test_a_lock_file_removed_between_open_and_lock_is_let_go_and_the_path_locked_anew(tmp_path):
    path = tmp_path / "k.lock"

    class RacedBySweeper(cohort_files._NamedFileLock):
        raced = False

        def _names_its_file(self, fd: int) -> bool:
            if not RacedBySweeper.raced:  # a sweeper removed the file after this process opened it
                RacedBySweeper.raced = True
                path.unlink()
            return super()._names_its_file(fd)

    lock = RacedBySweeper(str(path), thread_local=False)
    lock.acquire(timeout=5)
    try:
        held = os.fstat(lock._context.lock_file_fd)
        assert RacedBySweeper.raced and held.st_nlink == 1 and held.st_ino == os.stat(path).st_ino
        other = new_file_lock(path)  # the next process finds it held: one holder at a time
        with pytest.raises(cohort_files.filelock.Timeout):
            other.acquire(timeout=0.05)
    finally:
        lock.release()
