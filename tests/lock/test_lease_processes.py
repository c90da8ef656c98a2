"""Leases across OS processes (spawn), against the emulator with the real CloudShellAPISession.

Holders run in their own processes and are killed (SIGKILL) or stopped (SIGSTOP) for real; waiters judge
them on their own monotonic clocks. Exclusion is checked on the emulator's ordered event log: MUTEX is never
added while it is held, and never removed by anyone but the holder whose token it carries or one breaker.
Leases are short (2 s) to keep the tests quick.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import signal
import threading
import time
import zipfile
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
from cloudshell.api.cloudshell_api import AttributeNameValue, CloudShellAPISession

from cloudshell_mutex import MutexLostError, MutexTimeout, ReservationMutex, protocol
from cloudshell_mutex.lock.lease.lease import stale_margin
from cloudshell_mutex.lock.options import FRESH_READ_LAG
from cloudshell_mutex.lock.pacing import DefaultPacing

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
LEASE = 2.0
POLL = 0.25  # the waiters' holder_check_interval
FAST = dict(pacing=DefaultPacing(first=0.01, base=0.02, cap=0.1), holder_check_interval=POLL)
#: Slack for the calls of a break (a few loopback round trips) on a busy 2-core machine.
SLACK = 3.0

Address = Tuple[str, int, str, str, str]


def our_package() -> bytes:
    package = io.BytesIO()
    with zipfile.ZipFile(package, "w") as archive:
        archive.write(ROOT / "package" / "metadata.xml", "metadata.xml")
        archive.write(ROOT / "DataModel" / "datamodel.xml", "DataModel/datamodel.xml")
    return package.getvalue()


@pytest.fixture
def emu(cloudshell_emulator_factory):
    return cloudshell_emulator_factory(packages=[our_package()])


def address(emu) -> Address:
    return (emu.host, emu.port, emu.admin_user, emu.admin_password, emu.admin_domain)


def session(addr: Address) -> CloudShellAPISession:
    host, port, user, password, domain = addr
    return CloudShellAPISession(host, user, password, domain, port=port)


# ---------------------------------------------------------------- workers (spawned processes)


def check_and_release(mutex: ReservationMutex, report: Dict[str, Any]) -> None:
    """Report what ensure_held() and release() say: "held"/"released", or "lost: <why>"."""
    try:
        mutex.ensure_held()
        report["ensure_held"] = "held"
    except MutexLostError as error:
        report["ensure_held"] = f"lost: {error}"
    try:
        mutex.release()
        report["release"] = "released"
    except MutexLostError as error:
        report["release"] = f"lost: {error}"


def holder_worker(
    addr: Address, rid: str, lease: float, events, go, results, name: str = protocol.DEFAULT_ALIAS
) -> None:
    """Acquire ``name`` with a lease, say so, wait for ``go``; then check the lock and release (reporting
    both)."""
    report: Dict[str, Any] = {"error": None}
    try:
        lost: List[str] = []
        mutex = ReservationMutex(
            session(addr),
            rid,
            owner="holder",
            name=name,
            lease=lease,
            on_lost=lambda e: lost.append(str(e)),
            **FAST,
        )
        mutex.acquire()
        events.put(("held", mutex.token, os.getpid()))
        go.wait(120)
        time.sleep(lease)  # the heartbeat thread runs again after a SIGCONT
        check_and_release(mutex, report)
        report["on_lost"] = lost
    except BaseException as error:  # report, never hang the parent
        report["error"] = f"{type(error).__name__}: {error}"
    results.put(report)


def waiter_worker(
    addr: Address, rid: str, lease: float, timeout: float, barrier, results, wall_clock_shift: float = 0.0
) -> None:
    """Wait for the lock (judging staleness itself), hold it briefly, release; report what happened."""
    report: Dict[str, Any] = {"error": None, "kinds": []}
    try:
        if wall_clock_shift:  # this machine's wall clock is hours off: nothing may change
            real_time = time.time
            time.time = lambda: real_time() + wall_clock_shift  # type: ignore[assignment]
        api = session(addr)
        kinds: List[str] = report["kinds"]
        mutex = ReservationMutex(
            api,
            rid,
            owner="waiter",
            lease=lease,
            timeout=timeout,
            on_event=lambda e: kinds.append(e.kind),
            **FAST,
        )
        barrier.wait(60)
        start = time.monotonic()
        try:
            mutex.acquire()
        except MutexTimeout as error:
            report["timeout"] = str(error)
        else:
            report["waited"] = time.monotonic() - start
            report["token"] = mutex.token
            time.sleep(0.2)
            mutex.release()
    except BaseException as error:
        report["error"] = f"{type(error).__name__}: {error}"
    results.put(report)


def orchestrator_worker(addr: Address, rid: str, lease: float, handles, adopted) -> None:
    """Acquire, export, wait until the driver adopted, then exit without releasing."""
    mutex = ReservationMutex(session(addr), rid, owner="orchestrator", lease=lease, **FAST)
    mutex.acquire()
    handles.put(mutex.export())
    adopted.get(timeout=60)
    os._exit(0)  # the orchestrator's script ends; its heartbeat thread dies with it


def driver_worker(
    addr: Address, handle: str, lease: float, hold: float, adopted, results, options: Dict[str, Any]
) -> None:
    """Adopt the exported lock, keep it past several leases (checking it before each step), release it."""
    report: Dict[str, Any] = {"error": None}
    try:
        mutex = ReservationMutex.adopt(session(addr), handle, owner="driver", **FAST, **options)
        adopted.put("adopted")
        started = time.monotonic()
        while time.monotonic() - started < hold:
            mutex.ensure_held()  # before each side effect
            time.sleep(0.25)
        mutex.release()
        report["held_for"] = time.monotonic() - started
        report["token"] = mutex.token
    except BaseException as error:
        report["error"] = f"{type(error).__name__}: {error}"
    results.put(report)


def start(target, *args) -> multiprocessing.Process:
    process = multiprocessing.get_context("spawn").Process(target=target, args=args, daemon=True)
    process.start()
    return process


def stop_all(*processes: multiprocessing.Process) -> None:
    for process in processes:
        if process.is_alive():
            os.kill(process.pid, signal.SIGCONT)
            process.kill()
        process.join(10)


def check_log(emu, rid: str) -> Dict[str, int]:
    """The ordered log never shows two holders; returns the number of grants and removes."""
    holder = None
    grants = removes = 0
    for event in sorted(emu.control.events(rid), key=lambda e: e["seq"]):
        if event["alias"] != protocol.DEFAULT_ALIAS:
            continue
        if event["op"] == "service_added":
            assert holder is None, f"MUTEX added while held by {holder!r}: {event}"
            holder = event["attributes"].get(protocol.ATTR_OWNER)
            grants += 1
        elif event["op"] == "service_removed":
            assert holder is not None, f"MUTEX removed while free: {event}"
            holder = None
            removes += 1
        elif event["op"] == "service_attributes_set":
            assert event["attributes"].get(protocol.ATTR_OWNER) == holder
    return {"grants": grants, "removes": removes}


def spawn_holder(emu, rid: str, lease: float = LEASE, name: str = protocol.DEFAULT_ALIAS):
    ctx = multiprocessing.get_context("spawn")
    events, go, results = ctx.Queue(), ctx.Event(), ctx.Queue()
    process = start(holder_worker, address(emu), rid, lease, events, go, results, name)
    kind, token, _pid = events.get(timeout=60)
    assert kind == "held"
    return process, token, go, results


# ---------------------------------------------------------------- tests


def test_a_killed_holder_is_broken_within_lease_plus_margin_plus_one_poll(emu):
    rid = emu.create_reservation()
    process, token, _, _ = spawn_holder(emu, rid)
    time.sleep(LEASE)  # it heartbeats meanwhile
    process.kill()  # SIGKILL: no release, no clean-up
    killed = time.monotonic()
    process.join(10)
    seen = []
    waiter = ReservationMutex(
        emu.session(), rid, owner="waiter", lease=LEASE, timeout=30, on_event=seen.append, **FAST
    )
    waiter.acquire()
    recovered = time.monotonic() - killed
    bound = LEASE + stale_margin(LEASE) + POLL + FRESH_READ_LAG  # + the breaker's wait for lagging reads
    print(
        f"\nkill -9 of a holder with a {LEASE:g} s lease: acquired {recovered:.2f} s later "
        f"(bound {bound:g} s)"
    )
    assert LEASE + stale_margin(LEASE) <= recovered <= bound + SLACK  # never early: it saw the holder after
    assert [e.kind for e in seen].count("broken") == 1
    assert any("broke the stale lock" in line and token in line for line in emu.control.output(rid))
    waiter.release()
    assert check_log(emu, rid) == {"grants": 2, "removes": 2}


def test_a_holder_that_came_while_a_slow_read_was_on_its_way_is_broken_only_a_lease_after_it_came(emu):
    """The server serves a waiter's read 3 s late (a spike before it takes effect): the read shows a holder
    that came 2 s after the read was sent. Judged from the read's dispatch, the waiter broke it 2 s after it
    came, inside its lease (a short stress run caught a holder's lease cut this way); judged from the
    answer, never before lease + margin."""
    rid = emu.create_reservation()
    api = emu.session()
    api.AddServiceToReservation(
        rid, protocol.SERVICE_MODEL, protocol.DEFAULT_ALIAS, [AttributeNameValue(protocol.ATTR_OWNER, "job")]
    )
    emu.control.inject_fault("GetReservationDetails", "spike", seconds=3.0)
    waiter = ReservationMutex(emu.session(), rid, owner="waiter", lease=LEASE, timeout=30, **FAST)
    acquired = threading.Thread(target=waiter.acquire, daemon=True)
    acquired.start()
    deadline = time.monotonic() + 10
    while not any(f["kind"] == "spike" for f in emu.control.faults_injected()):
        assert time.monotonic() < deadline, "the waiter never read"
        time.sleep(0.02)
    time.sleep(2.0)  # the read is on its way: the job leaves, a holder comes (and dies at once)
    api.RemoveServicesFromReservation(rid, [protocol.DEFAULT_ALIAS])
    crashed = "Crashed driver@exec-01:4242:deadbeef"
    api.AddServiceToReservation(
        rid,
        protocol.SERVICE_MODEL,
        protocol.DEFAULT_ALIAS,
        [
            AttributeNameValue(protocol.ATTR_OWNER, crashed),
            AttributeNameValue(protocol.ATTR_LEASE_SECONDS, f"{LEASE:g}"),
            AttributeNameValue(protocol.ATTR_HEARTBEAT, "deadbeef:aa01:0"),
        ],
    )
    acquired.join(30)
    assert waiter.locked()
    mutex_events = [e for e in emu.control.events(rid) if e["alias"] == protocol.DEFAULT_ALIAS]
    (came,) = [e for e in mutex_events if e["op"] == "service_added" and crashed in str(e["attributes"])]
    broken = next(e for e in mutex_events if e["op"] == "service_removed" and e["seq"] > came["seq"])
    after = broken["monotonic"] - came["monotonic"]
    print(f"\na holder a read served 3 s late showed: broken {after:.2f} s after it came (lease {LEASE:g} s)")
    assert after >= LEASE + stale_margin(LEASE)
    waiter.release()


def test_a_waiter_that_holds_another_lock_still_breaks_a_killed_holder(emu):
    """A waiter that holds another named lock reads in line for deadlocks, not by its own holder checks; those
    reads judge the holder too, so a crashed holder is broken as for a waiter that holds nothing."""
    rid = emu.create_reservation()
    process, token, _, _ = spawn_holder(emu, rid, name="L2")
    time.sleep(LEASE)
    process.kill()
    killed = time.monotonic()
    process.join(10)
    api = emu.session()
    seen: List[Any] = []
    with ReservationMutex(api, rid, owner="waiter", name="L1", lease=LEASE, **FAST):
        # The default holder_check_interval (5 s): longer than the deadlock checks' reads in line.
        waiter = ReservationMutex(api, rid, owner="waiter", name="L2", timeout=30, on_event=seen.append)
        waiter.acquire()  # a MutexTimeout here is the defect: the holder was never judged
        recovered = time.monotonic() - killed
        waiter.release()
    print(f"\nkill -9 of L2's holder, its waiter holding L1: acquired {recovered:.2f} s later")
    assert LEASE + stale_margin(LEASE) <= recovered
    assert [e.kind for e in seen].count("broken") == 1
    assert any("broke the stale lock" in line and token in line for line in emu.control.output(rid))


def test_a_holder_stopped_beyond_its_lease_learns_it_lost_and_its_release_removes_nothing(emu):
    rid = emu.create_reservation()
    process, _token, go, results = spawn_holder(emu, rid)
    os.kill(process.pid, signal.SIGSTOP)
    try:
        waiter = ReservationMutex(emu.session(), rid, owner="waiter", lease=LEASE, timeout=30, **FAST)
        waiter.acquire()  # breaks the stopped holder
        os.kill(process.pid, signal.SIGCONT)
        go.set()  # after SIGCONT: setting an Event waits for its stopped waiter to wake
        report = results.get(timeout=60)
        assert report["error"] is None, report["error"]
        assert report["ensure_held"].startswith("lost")
        assert report["release"].startswith("lost")
        assert report["on_lost"], "on_lost was not called"
        # The resumed holder neither removed nor wrote onto its successor's service.
        services = {s["alias"]: s for s in emu.control.reservation(rid)["services"]}
        assert services[protocol.DEFAULT_ALIAS]["attributes"][protocol.ATTR_OWNER] == waiter.token
        waiter.release()
    finally:
        stop_all(process)
    assert check_log(emu, rid) == {"grants": 2, "removes": 2}


def test_a_holder_whose_add_was_settled_by_a_read_heartbeats_its_lease(emu):
    """The holder process's first add commits and its answer is lost (the client's re-send then finds the
    alias taken, and a read shows our token). The service carries the lease that add wrote, so the holder
    must heartbeat it, although no add of this process was ever answered: a waiter never breaks it."""
    rid = emu.create_reservation()
    emu.control.inject_fault("AddServiceToReservation", "drop_after_commit")
    process, token, go, results = spawn_holder(emu, rid)
    try:
        waiter = ReservationMutex(emu.session(), rid, owner="waiter", lease=LEASE, **FAST)
        silent_for = 3 * (LEASE + stale_margin(LEASE))  # a holder without heartbeats is broken well before
        with pytest.raises(MutexTimeout, match="held by holder"):
            waiter.acquire(timeout=silent_for)
        go.set()
        report = results.get(timeout=60)
        assert report["error"] is None, report["error"]
        assert (report["ensure_held"], report["release"]) == ("held", "released")
    finally:
        stop_all(process)
    assert not [
        e for e in emu.control.events(rid) if e["alias"] == protocol.breaker_alias(protocol.DEFAULT_ALIAS)
    ]
    heartbeats = [e for e in emu.control.events(rid) if e["op"] == "service_attributes_set"]
    assert heartbeats and all(e["attributes"][protocol.ATTR_OWNER] == token for e in heartbeats)
    assert check_log(emu, rid) == {"grants": 1, "removes": 1}


def test_two_simultaneous_breakers_exactly_one_wins(emu):
    rid = emu.create_reservation()
    process, _, _, _ = spawn_holder(emu, rid)
    process.kill()
    process.join(10)
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    waiters = [start(waiter_worker, address(emu), rid, LEASE, 60.0, barrier, results) for _ in range(2)]
    try:
        reports = [results.get(timeout=90) for _ in waiters]
    finally:
        stop_all(*waiters)
    assert all(r["error"] is None for r in reports), reports
    assert all("token" in r for r in reports), reports
    assert sum(r["kinds"].count("broken") for r in reports) == 1
    assert check_log(emu, rid) == {"grants": 3, "removes": 3}


def test_a_waiter_whose_wall_clock_is_hours_off_does_not_break_a_living_holder(emu):
    rid = emu.create_reservation()
    process, _token, go, results = spawn_holder(emu, rid)
    ctx = multiprocessing.get_context("spawn")
    barrier, waiter_results = ctx.Barrier(1), ctx.Queue()
    try:
        for shift in (5 * 3600.0, -7 * 3600.0):
            waiter = start(waiter_worker, address(emu), rid, LEASE, 4 * LEASE, barrier, waiter_results, shift)
            report = waiter_results.get(timeout=60)
            waiter.join(10)
            assert report["error"] is None, report["error"]
            assert "timeout" in report and "broken" not in report["kinds"]
        go.set()
        assert results.get(timeout=60)["release"] == "released"
    finally:
        stop_all(process)
    assert check_log(emu, rid) == {"grants": 1, "removes": 1}


def test_a_waiter_whose_wall_clock_is_hours_off_breaks_a_dead_holder_only_after_lease_plus_margin(emu):
    rid = emu.create_reservation()
    process, _, _, _ = spawn_holder(emu, rid)
    process.kill()
    process.join(10)
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(1), ctx.Queue()
    waiter = start(waiter_worker, address(emu), rid, LEASE, 30.0, barrier, results, 10 * 3600.0)
    report = results.get(timeout=60)
    waiter.join(10)
    assert report["error"] is None, report["error"]
    assert report["kinds"].count("broken") == 1
    assert report["waited"] >= LEASE + stale_margin(LEASE)
    assert check_log(emu, rid) == {"grants": 2, "removes": 2}


def test_a_site_with_only_the_original_package_never_auto_breaks_and_says_why(
    cloudshell_emulator_factory, original_package_zip
):
    emu = cloudshell_emulator_factory(packages=[original_package_zip])
    rid = emu.create_reservation()
    process, token, _, _ = spawn_holder(emu, rid)
    process.kill()
    process.join(10)
    waiter = ReservationMutex(emu.session(), rid, owner="waiter", lease=LEASE, timeout=3 * LEASE, **FAST)
    with pytest.raises(MutexTimeout, match=r"no lease.*never broken automatically.*release --force"):
        waiter.acquire()
    (service,) = emu.control.reservation(rid)["services"]
    assert service["attributes"] == {protocol.ATTR_OWNER: token}  # no lease attributes were ever written
    assert check_log(emu, rid) == {"grants": 1, "removes": 0}


def test_heartbeat_cost_in_calls_per_second_per_held_lock(emu):
    rid = emu.create_reservation()
    api = emu.session()
    mutex = ReservationMutex(api, rid, owner="holder", lease=LEASE, **FAST)
    mutex.acquire()
    emu.control.reset_counts()
    hold = 5 * LEASE
    time.sleep(hold)
    counts = emu.control.call_counts()
    mutex.release()
    beats = counts.get("SetServiceAttributesValues", 0)
    calls = sum(counts.values())
    rate = calls / hold
    print(
        f"\nheartbeat of one held lock, lease {LEASE:g} s: {calls} calls in {hold:g} s = {rate:.2f} calls/s "
        f"({beats} heartbeats); scales as 6/lease: {6 / 60:.2f} calls/s with the default 60 s lease"
    )
    assert set(counts) <= {"GetReservationDetails", "SetServiceAttributesValues"}
    # About 3 rounds (a read and a write) per lease: 6/lease calls/s, with jitter.
    assert 0.5 * 6 / LEASE <= rate <= 1.5 * 6 / LEASE


@pytest.mark.parametrize(
    "options",
    [{}, {"lease": 0}],
    ids=[
        "adopter with the default lease",
        "adopter with lease=0 heartbeats the lock's own lease all the same",
    ],
)
def test_an_orchestrator_exports_a_driver_adopts_and_keeps_the_lock_past_several_leases(emu, options):
    rid = emu.create_reservation()
    ctx = multiprocessing.get_context("spawn")
    handles, adopted, results = ctx.Queue(), ctx.Queue(), ctx.Queue()
    orchestrator = start(orchestrator_worker, address(emu), rid, LEASE, handles, adopted)
    handle = handles.get(timeout=60)
    hold = 4 * LEASE
    driver = start(driver_worker, address(emu), handle, LEASE, hold, adopted, results, options)
    try:
        orchestrator.join(60)
        assert orchestrator.exitcode == 0
        seen = []
        waiter = ReservationMutex(
            emu.session(), rid, owner="waiter", lease=LEASE, timeout=60, on_event=seen.append, **FAST
        )
        waiter.acquire()  # only once the driver released: the orchestrator's exit broke nothing
        report = results.get(timeout=60)
        assert report["error"] is None, report["error"]
        assert report["held_for"] >= hold
        assert "broken" not in [e.kind for e in seen]
        waiter_token = waiter.token
        waiter.release()
    finally:
        stop_all(orchestrator, driver)
    assert check_log(emu, rid) == {"grants": 2, "removes": 2}
    beats = [
        e["attributes"][protocol.ATTR_HEARTBEAT]
        for e in emu.control.events(rid)
        if e["alias"] == protocol.DEFAULT_ALIAS and e["attributes"][protocol.ATTR_OWNER] != waiter_token
    ]
    # The orchestrator's first beat came with its add; the driver's with each of its own writes.
    assert len({b.split(":")[1] for b in beats}) == 2
    assert len(beats) >= 1 + 3 * 4 // 2  # the driver beat about every lease/3 for 4 leases


# ---------------------------------------------------------------- max_hold


def stuck_holder_worker(addr: Address, rid: str, lease: float, max_hold: float, events, go, results) -> None:
    """Take the lock with ``max_hold`` and never release it (a stuck command); once told, check it."""
    report: Dict[str, Any] = {"error": None}
    try:
        lost: List[Tuple[float, str]] = []
        mutex = ReservationMutex(
            session(addr),
            rid,
            owner="stuck command",
            lease=lease,
            max_hold=max_hold,
            on_lost=lambda error: lost.append((time.monotonic(), str(error))),
            **FAST,
        )
        started = time.monotonic()  # max_hold counts from inside acquire(): between these two moments
        mutex.acquire()
        events.put(("held", mutex.token, started, time.monotonic()))
        time.sleep(max_hold / 2)
        mutex.ensure_held()  # within max_hold: held, and renewed
        go.wait(120)  # stuck: no release meanwhile
        check_and_release(mutex, report)
        report["on_lost"] = lost
    except BaseException as error:  # report, never hang the parent
        report["error"] = f"{type(error).__name__}: {error}"
    results.put(report)


def test_a_stuck_holder_stops_renewing_at_max_hold_and_a_waiter_breaks_it(emu):
    """max_hold: the holder's heartbeat stops renewing max_hold after it took the lock; a waiter in another
    process breaks it about a lease (+ margin) later; the holder hears it from on_lost at max_hold, its
    ensure_held() raises from then on, and its late release removes nothing of the waiter's."""
    max_hold = 3.0
    rid = emu.create_reservation()
    ctx = multiprocessing.get_context("spawn")
    events, go, results = ctx.Queue(), ctx.Event(), ctx.Queue()
    process = start(stuck_holder_worker, address(emu), rid, LEASE, max_hold, events, go, results)
    try:
        kind, token, started, acquired = events.get(timeout=60)
        assert kind == "held"
        waiter = ReservationMutex(emu.session(), rid, owner="waiter", lease=LEASE, timeout=60, **FAST)
        waiter.acquire()
        waited = time.monotonic() - acquired
        go.set()
        report = results.get(timeout=60)
    finally:
        stop_all(process)
    bound = max_hold + LEASE + stale_margin(LEASE) + POLL + FRESH_READ_LAG
    print(f"\nmax_hold={max_hold:g} s, lease={LEASE:g} s: the waiter got the stuck lock after {waited:.2f} s")
    # Never before the lease lapsed: the last renewal was at most a beat (lease/3) before max_hold.
    assert max_hold + LEASE <= waited <= bound + SLACK
    assert report["error"] is None, report["error"]
    ((told_at, told),) = report["on_lost"]
    assert max_hold <= told_at - started and told_at - acquired <= max_hold + 1.0
    assert "held for max_hold (3 s)" in told and "no longer renewed" in told
    assert report["ensure_held"].startswith("lost") and "max_hold" in report["ensure_held"]
    assert report["release"].startswith("lost")  # it was broken: nothing of the waiter's was removed
    assert waiter.holder().token == waiter.token
    assert any("held for max_hold" in line for line in emu.control.output(rid))  # the sandbox output says so
    waiter.release()
    assert check_log(emu, rid) == {"grants": 2, "removes": 2}
    assert token != waiter.token


@pytest.mark.usefixtures("parked_at_once")  # the waiter here parks at its first busy add, behind the head
def test_a_killed_holder_and_a_killed_head_together_are_passed_within_the_holders_lease(emu):
    # One execution server dies: the holder and the queue's head go together. Only the head polled the
    # add, so only it judged the holder; a waiter in line behind it now judges the holder too, and breaks
    # it within the holder's lease + margin, not the dead head ticket's (150 s).
    rid = emu.create_reservation()
    holder, _token, _, _ = spawn_holder(emu, rid)
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    head = start(waiter_worker, address(emu), rid, LEASE, 120.0, barrier, results)
    barrier.wait(60)
    deadline = time.monotonic() + 30
    while not any(protocol.TICKET_INFIX in alias for alias in _aliases(emu, rid)):
        assert time.monotonic() < deadline, "the head never parked"
        time.sleep(0.2)
    holder.kill()
    head.kill()  # SIGKILL both: no release, their ticket and lock stay
    killed = time.monotonic()
    stop_all(holder, head)
    waiter = ReservationMutex(emu.session(), rid, owner="behind the head", lease=LEASE, timeout=60, **FAST)
    waiter.acquire()
    recovered = time.monotonic() - killed
    print(f"\nholder and head killed together: the waiter behind acquired {recovered:.2f} s later")
    assert recovered <= LEASE + stale_margin(LEASE) + POLL + FRESH_READ_LAG + SLACK + 5
    waiter.release()


def _aliases(emu, rid: str) -> List[str]:
    return [s.Alias for s in emu.session().GetReservationDetails(rid, True).ReservationDescription.Services]
