"""Secrets never appear in logs, CLI output, exception text or the reservation output.

One run through the lock's success and failure paths, the driver mixin's session, and every CLI command's
success and failure paths, with a distinctive admin password and admin token; everything captured is
scanned for both (and for the session tokens the emulator handed out).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from cloudshell_mutex import MutexError, ReservationMutex
from cloudshell_mutex.lock.pacing import DefaultPacing

pytestmark = pytest.mark.integration

PASSWORD = "Pw-7f3a-never-printed"
FAST = DefaultPacing(first=0.01, base=0.02, cap=0.1)


def cli(*args, env_password=PASSWORD, port=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLOUDSHELL_")}
    env.update(CLOUDSHELL_HOST="127.0.0.1", CLOUDSHELL_PASSWORD=env_password)
    if port is not None:
        env["CLOUDSHELL_API_PORT"] = str(port)
    run = subprocess.run(
        [sys.executable, "-m", "cloudshell_mutex.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    return run.stdout + run.stderr


def test_no_secret_in_anything_the_product_prints_raises_or_writes(
    cloudshell_emulator_factory, original_package_zip, caplog, tmp_path
):
    emu = cloudshell_emulator_factory(packages=[original_package_zip], admin_password=PASSWORD)
    admin_token = emu.issue_token()
    seen = []
    caplog.set_level(logging.DEBUG)
    rid = emu.create_reservation()

    # The lock: success, contention, timeout, fatal errors, a lost lock, a revoked session.
    api = emu.session()
    token_api = emu.session(token_id=admin_token, username="", password="")
    with ReservationMutex(api, rid, owner="one", pacing=FAST) as held:
        try:
            ReservationMutex(token_api, rid, owner="two", pacing=FAST).acquire(timeout=0.3)
        except MutexError as error:
            seen.append(str(error))
        seen.append(repr(held))
    for bad_rid in ("no-such-reservation",):
        try:
            ReservationMutex(api, bad_rid, pacing=FAST).acquire(timeout=1)
        except MutexError as error:
            seen.append(str(error))
    lost = ReservationMutex(api, rid, pacing=FAST)
    lost.acquire()
    api.RemoveServicesFromReservation(rid, ["MUTEX"])
    try:
        lost.release()
    except MutexError as error:
        seen.append(str(error))
    emu.control.revoke_sessions()
    with ReservationMutex(token_api, rid, owner="after revoke", pacing=FAST):
        pass

    # The CLI: status and release (held, free, refused, wrong password, unreachable), install failures.
    holder = ReservationMutex(emu.session(), rid, owner="held for the CLI", pacing=FAST)
    holder.acquire()
    seen.append(cli("status", rid, port=emu.port))
    seen.append(cli("status", rid, "--json", port=emu.port))
    seen.append(cli("release", rid, port=emu.port))
    seen.append(cli("release", rid, "--force", "--reason", "secrets test", port=emu.port))
    seen.append(cli("status", rid, env_password="wrong-" + PASSWORD, port=emu.port))
    seen.append(cli("status", rid, port=1))
    seen.append(cli("status", rid, "--host", f"admin:{PASSWORD}@127.0.0.1", port=emu.port))
    seen.append(cli("install", "--port", str(emu.quali_port), "--package", str(tmp_path / "missing.zip")))
    seen.append(cli("install", "--port", str(emu.quali_port), "--package", str(original_package_zip),
                    env_password="wrong-" + PASSWORD))  # fmt: skip
    seen.append(cli("install", "--port", "8029", "--package", str(original_package_zip)))
    seen.append(cli("install", "--passwd", PASSWORD))  # a mistyped flag

    seen.extend(record.getMessage() for record in caplog.records)
    seen.extend(emu.control.output(rid))
    everything = "\n".join(seen)
    assert "secrets test" in everything  # the release's audit line was captured: the scan saw real output
    for secret in (PASSWORD, admin_token):
        assert secret not in everything
