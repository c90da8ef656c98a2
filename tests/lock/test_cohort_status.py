"""``cloudshell-mutex status`` on the machine of a cohort: the cohort and its local holder are shown."""

from __future__ import annotations

import os

import pytest

from cloudshell_mutex import cli
from cloudshell_mutex.lock.cohort import CohortMutex

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
