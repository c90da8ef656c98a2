"""``cloudshell-mutex status`` on the machine of a cohort: the cohort and its local holder are shown."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from cloudshell.api.cloudshell_api import AttributeNameValue

from cloudshell_mutex import cli, protocol
from cloudshell_mutex.lock.cohort.cohort import CohortMutex
from cloudshell_mutex.lock.holder import this_host

pytestmark = pytest.mark.integration

PASSWORD = "Adm1n-Pw-never-shown"


@pytest.fixture
def emu(cloudshell_emulator_factory, original_package_zip, monkeypatch, tmp_path):
    emulator = cloudshell_emulator_factory(packages=[original_package_zip], admin_password=PASSWORD)
    monkeypatch.chdir(tmp_path)  # no stray cloudshell_config.yml
    for name in ("CLOUDSHELL_PORT", "CLOUDSHELL_USERNAME", "CLOUDSHELL_DOMAIN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLOUDSHELL_HOST", emulator.host)
    monkeypatch.setenv("CLOUDSHELL_API_PORT", str(emulator.port))
    monkeypatch.setenv("CLOUDSHELL_PASSWORD", PASSWORD)
    return emulator


def status(capsys, *argv: str, code: int = 0) -> str:
    assert cli.main(["status", *argv]) == code
    out, err = capsys.readouterr()
    assert PASSWORD not in out + err
    return out


def test_status_shows_this_machines_cohort_and_its_local_holder(emu, capsys, tmp_path):
    rid = emu.create_reservation()
    folder = tmp_path / "cohort"
    lock = CohortMutex(emu.session(), rid, owner="Router A driver", cohort_dir=folder)
    with lock:
        out = status(capsys, rid, "--cohort-dir", str(folder))
        assert "cohort on this machine: holds it (0 passes in a row" in out
        assert f"local holder pid {os.getpid()} (Router A driver)" in out
        assert "0 local waiters" in out
    out = status(capsys, rid, "--cohort-dir", str(folder), code=3)  # 3: nobody holds it
    assert "cohort" not in out  # nothing to add


def test_status_says_when_this_machines_cohort_does_not_hold_it(emu, capsys, tmp_path):
    rid = emu.create_reservation()
    folder = tmp_path / "cohort"
    with CohortMutex(emu.session(), rid, owner="earlier", cohort_dir=folder):
        pass
    with CohortMutex(emu.session(), rid, owner="elsewhere", cohort_dir=tmp_path / "other machine"):
        out = status(capsys, rid, "--cohort-dir", str(folder))
    assert "cohort on this machine: does not hold it" in out


@pytest.mark.parametrize(
    ("fault", "params"), [("apply_late", {"delay": None}), ("spike", {"seconds": 1.5})], ids=["late", "spike"]
)
def test_the_death_of_a_local_holder_is_told_to_the_sandbox_output_even_when_that_write_lands_late(
    emu, tmp_path, fault, params
):
    """The successor's line in the output is a courtesy: a write that gets no answer, or lands after the
    acquire gave up waiting for it, neither holds up the lock nor leaves anything behind."""
    rid = emu.create_reservation()
    folder = tmp_path / "cohort"
    dead = CohortMutex(emu.session(), rid, owner="Router A rewire", cohort_dir=folder)
    dead.acquire()
    token = dead.token
    dead._local.release()  # what the OS does when its process dies: the local lock is freed, nothing else
    emu.control.inject_fault("WriteMessageToReservationOutput", fault, **params)  # lands after its timeout
    successor = CohortMutex(emu.session(timeout=1), rid, owner="Router B rewire", cohort_dir=folder)
    assert successor.acquire(timeout=30)
    assert successor.passed and successor.token == token  # carried on under the same server lock
    successor.release()
    assert emu.control.reservation(rid)["services"] == []
    emu.control.land_late()
    lines = [line for line in emu.control.output(rid) if "died holding it" in line]
    assert lines and all(
        f"Router B rewire: the local holder of MUTEX in reservation {rid}" in x for x in lines
    )
    assert f"(pid {os.getpid()} on " in lines[0] and "Router A rewire) died holding it" in lines[0]


def a_dead_pid() -> int:
    """The id of a process of this machine that has ended (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_status_says_when_the_holders_process_on_this_host_is_dead(emu, capsys, tmp_path):
    """A holder of this host whose process is gone (a driver killed with kill -9): status says so, and what
    frees the lock, instead of showing it as if it were held by a live command."""
    rid = emu.create_reservation()
    pid = a_dead_pid()
    token = f"Router A rewire@{this_host()}:{pid}:0123456789abcdef"  # what that process left in the sandbox
    emu.session().AddServiceToReservation(
        rid, protocol.SERVICE_MODEL, "MUTEX", [AttributeNameValue(protocol.ATTR_OWNER, token)]
    )
    out = status(capsys, rid, "--cohort-dir", str(tmp_path / "cohort"))
    assert "is held by Router A rewire" in out
    assert f"the holder (pid {pid}) is not running on this host: it died holding the lock" in out
    assert f"only a force release frees it (cloudshell-mutex release {rid} --force" in out
    emu.session().RemoveServicesFromReservation(rid, ["MUTEX"])

    # The same token from another host: nothing can be told from here.
    other = token.replace(f"@{this_host()}:", "@exec-elsewhere:")
    emu.session().AddServiceToReservation(
        rid, protocol.SERVICE_MODEL, "MUTEX", [AttributeNameValue(protocol.ATTR_OWNER, other)]
    )
    assert "not running" not in status(capsys, rid, "--cohort-dir", str(tmp_path / "cohort"))


def test_status_names_a_dead_local_holder_of_a_cohort_not_the_process_that_took_the_lock(
    emu, capsys, tmp_path
):
    """In a cohort the token names the process that took the lock from the server, which may have ended after
    passing it on: the local holder's process is the one that matters."""
    rid = emu.create_reservation()
    folder = tmp_path / "cohort"
    lock = CohortMutex(emu.session(), rid, owner="Router A rewire", cohort_dir=folder)
    with lock:
        assert "not running" not in status(capsys, rid, "--cohort-dir", str(folder))  # alive: this process
        pid = a_dead_pid()
        with lock._files.state() as state:
            state.holder["pid"] = pid  # as if the command it was passed to had been killed
        out = status(capsys, rid, "--cohort-dir", str(folder))
        assert f"the cohort's local holder (pid {pid}) is not running on this host" in out
        assert "the next command of this machine's cohort carries on under the lock" in out
        with lock._files.state() as state:
            state.holder["pid"] = os.getpid()
