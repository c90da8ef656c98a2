"""Ctrl-C inside ``release()``, in separate processes, against the emulator with the real client.

A remove interrupted on its way is a request whose outcome is unknown: it may land after the interrupt. A
process that catches the interrupt and releases again must not send a second remove while the first may
still land (the first would then delete the lock of the waiter that came in between). A process that exits
on the interrupt leaves at most a lock with a lease, which the next waiter breaks: never two holders, and
nothing that nobody can remove. SIGINT arrives at random moments of the release in the second test.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from cloudshell_mutex import ReservationMutex, protocol
from cloudshell_mutex.lock.lease.lease import stale_margin
from cloudshell_mutex.lock.pacing import DefaultPacing

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.name != "posix", reason="sends SIGINT"),
]

MUTEX = protocol.DEFAULT_ALIAS
FAST = DefaultPacing(first=0.01, base=0.02, cap=0.1)

CHILD = textwrap.dedent(
    """
    import sys
    from cloudshell.api.cloudshell_api import CloudShellAPISession
    from cloudshell_mutex import ReservationMutex
    host, port, user, password, domain, rid, lease, again = sys.argv[1:]
    api = CloudShellAPISession(host, user, password, domain, port=int(port))
    lock = ReservationMutex(api, rid, owner="interrupted", request_lifetime=30, lease=float(lease))
    lock.acquire(timeout=60)
    print("held", lock.token, flush=True)
    sys.stdin.readline()  # the parent injects its fault first
    try:
        lock.release()
        print("released", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        if again == "again":
            sys.stdin.readline()  # the parent lets it go on
            try:
                lock.release()
                print("released again", flush=True)
            except Exception as error:
                print(type(error).__name__, flush=True)
    """
)


def lock_history(emu, rid):
    return [
        (e["op"], e["attributes"].get(protocol.ATTR_OWNER))
        for e in emu.control.events(rid)
        if e["alias"] == MUTEX
    ]


def child(emu, rid, lease: float, again: bool) -> subprocess.Popen:
    args = [emu.host, str(emu.port), emu.admin_user, emu.admin_password, emu.admin_domain, rid]
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, *args, str(lease), "again" if again else "exit"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_until(condition, timeout=15.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


def test_a_release_again_after_ctrl_c_never_sends_a_second_remove_while_the_first_may_land(
    cloudshell_emulator_factory, original_package_zip
):
    emu = cloudshell_emulator_factory(packages=[original_package_zip])
    rid = emu.create_reservation()
    proc = child(emu, rid, lease=0, again=True)
    try:
        held, token = proc.stdout.readline().split()
        assert held == "held"
        emu.control.inject_fault("RemoveServicesFromReservation", "apply_late", delay=None, reply="hang")
        proc.stdin.write("release\n")
        proc.stdin.flush()
        wait_until(lambda: emu.control.call_counts().get("RemoveServicesFromReservation"))
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)  # Ctrl-C while the remove is at the server
        assert proc.stdout.readline().strip() == "interrupted"
        proc.stdin.write("go\n")
        proc.stdin.flush()
        time.sleep(1.5)  # the second release() reads: still ours, but its first remove may land
        assert emu.control.call_counts()["RemoveServicesFromReservation"] == 1
        assert emu.control.land_late() == 1  # now it lands
        assert proc.stdout.readline().strip() == "released again"
        proc.communicate(timeout=30)
    finally:
        proc.kill()
    waiter = ReservationMutex(emu.session(), rid, owner="waiter", pacing=FAST, timeout=10)
    with waiter:
        mine = waiter.token
        assert waiter.holder().token == mine
    history = lock_history(emu, rid)
    assert history == [
        ("service_added", token),
        ("service_removed", token),
        ("service_added", mine),
        ("service_removed", mine),
    ]


def our_package() -> bytes:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "stress"))
    from stress_harness import our_package as build

    return build()


LEASE = 2.0


@pytest.mark.slow
def test_ctrl_c_at_random_moments_of_release_never_leaves_two_holders_or_an_unbreakable_lock(
    cloudshell_emulator_factory,
):
    """Each round: a process holds (lease 2 s), releases, and gets SIGINT at a random moment of the release
    (every call takes 30 ms, so the release's read and remove are both hit); half of the processes release
    again after catching it, the others exit. Meanwhile a waiter in this process wants the lock. The waiter
    always gets it (removed, or broken after the lease), keeps it while it holds, and the server's log
    never shows a removal of its lock by anyone else."""
    emu = cloudshell_emulator_factory(packages=[our_package()])
    emu.control.configure(latency={"distribution": "fixed", "seconds": 0.03})
    rng = random.Random(20261123)
    outcomes = []
    for round_ in range(8):
        rid = emu.create_reservation(f"ctrl-c {round_}")
        again = round_ % 2 == 0
        proc = child(emu, rid, lease=LEASE, again=again)
        try:
            held, token = proc.stdout.readline().split()
            assert held == "held"
            proc.stdin.write("release\n")
            proc.stdin.flush()
            time.sleep(rng.uniform(0.0, 0.09))
            proc.send_signal(signal.SIGINT)
            outcome = proc.stdout.readline().strip()
            if outcome == "interrupted" and again:
                proc.stdin.write("go\n")
                proc.stdin.flush()
                outcome += ", then " + proc.stdout.readline().strip()
            outcomes.append(outcome)
            waiter = ReservationMutex(
                emu.session(), rid, owner="waiter", pacing=FAST, holder_check_interval=0.25, lease=LEASE,
                timeout=LEASE + stale_margin(LEASE) + 10,
            )  # fmt: skip
            with waiter:
                mine = waiter.token
                time.sleep(0.3)
                assert waiter.holder().token == mine
            proc.communicate(timeout=30)
        finally:
            proc.kill()
        history = lock_history(emu, rid)
        assert history[-2:] == [("service_added", mine), ("service_removed", mine)]
        assert [owner for op, owner in history if op == "service_added"] == [token, mine]
    print("\nCtrl-C during release:", outcomes)
    assert any(o.startswith("interrupted") for o in outcomes)
