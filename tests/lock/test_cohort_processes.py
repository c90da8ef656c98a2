"""Cohort mode across OS processes (spawn), against the emulator with the real CloudShellAPISession.

Each cohort directory stands for one execution server; its processes share the local lock. Every hold reads
a counter service, waits a moment and writes counter + 1, naming ``<server lock token>|<process>:<round>``.
Exclusion is checked three ways:

* the server's ordered event log: MUTEX is never added while held nor removed while free, and every counter
  write happens while MUTEX is held by the token the writer names (so passes stay inside one server grant);
* the lost-update counter: it ends at the number of holds, each write +1 (two holders in one cohort would lose
  updates: the server cannot see them);
* the processes' own hold intervals (CLOCK_MONOTONIC is system-wide): none overlap, across cohorts or within.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import time
import zipfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest
from cloudshell.api.cloudshell_api import AttributeNameValue, CloudShellAPISession

from cloudshell_mutex import MutexTimeout, ReservationMutex, protocol
from cloudshell_mutex.lock.cohort import cohort as cohort_module
from cloudshell_mutex.lock.cohort.cohort import CohortMutex
from cloudshell_mutex.lock.pacing import DefaultPacing
from original_protocol import OriginalMutex

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
COUNTER_MODEL = "Lock Test Counter"
COUNTER_ALIAS = "COUNTER"
ATTR_COUNT = "Count"
ATTR_WRITER = "Last Writer"
HOLD_SECONDS = 0.01
LATENCY = {"distribution": "uniform", "low": 0.002, "high": 0.008}
LEASE = 2.0
FAST = dict(pacing=DefaultPacing(first=0.01, base=0.02, cap=0.1), holder_check_interval=0.25)

Address = Tuple[str, int, str, str, str]


def our_package() -> bytes:
    package = io.BytesIO()
    with zipfile.ZipFile(package, "w") as archive:
        archive.write(ROOT / "package" / "metadata.xml", "metadata.xml")
        archive.write(ROOT / "DataModel" / "datamodel.xml", "DataModel/datamodel.xml")
    return package.getvalue()


# ---------------------------------------------------------------- workers (spawned processes)


def _read_count(api: Any, rid: str) -> int:
    for service in api.GetReservationDetails(rid, disableCache=True).ReservationDescription.Services:
        if service.Alias == COUNTER_ALIAS:
            return int(next(a.Value for a in service.Attributes if a.Name == ATTR_COUNT))
    raise AssertionError("the counter service is missing")


def _critical_section(api: Any, rid: str, writer: str) -> Tuple[float, float]:
    start = time.monotonic()
    count = _read_count(api, rid)
    time.sleep(HOLD_SECONDS)  # widen the window in which an overlap would lose an update
    api.SetServiceAttributesValues(
        rid,
        COUNTER_ALIAS,
        [AttributeNameValue(ATTR_COUNT, str(count + 1)), AttributeNameValue(ATTR_WRITER, writer)],
    )
    return start, time.monotonic()


def worker(
    kind: str,
    index: int,
    addr: Address,
    rid: str,
    cohort_dir: str,
    rounds: int,
    options: Dict[str, Any],
    barrier,
    results,
) -> None:
    """``rounds`` locked increments: "cohort" (CohortMutex in ``cohort_dir``), "plain" (ReservationMutex), or
    "v1" (the original snippet). "victim": take the cohort lock, say so, and hang until killed."""
    host, port, user, password, domain = addr
    report: Dict[str, Any] = {"kind": kind, "index": index, "holds": [], "error": None, "pid": os.getpid()}
    try:
        if kind == "no-local-lock":  # negative control: a cohort whose local lock excludes nobody
            from cloudshell_mutex.lock.cohort import files as cohort_files

            counter = iter(range(10**6))
            cohort_files.CohortFiles.local_lock = lambda files: cohort_files.new_file_lock(  # type: ignore[method-assign]
                files.directory / f"own-{os.getpid()}-{next(counter)}.lock"
            )
            kind, stagger = "cohort", True
        else:
            stagger = False
        api = CloudShellAPISession(host, user, password, domain, port=port)
        barrier.wait(timeout=120)
        for round_ in range(rounds):
            if stagger:  # arrive while another process holds the lock, not all at once
                time.sleep(0.02 * (index + 1))
            if kind in ("cohort", "victim"):
                lock = CohortMutex(
                    api, rid, owner=f"w{index}", cohort_dir=cohort_dir, timeout=120, **FAST, **options
                )
                with lock:
                    calls = lock.calls
                    waited_until = time.monotonic()
                    if kind == "victim":
                        results.put({"held": lock.token, "pid": os.getpid()})
                        time.sleep(600)  # killed here, mid-hold
                    interval = _critical_section(api, rid, f"{lock.token}|{index}:{round_}")
                    report["holds"].append(
                        {
                            "interval": interval,
                            "token": lock.token,
                            "passed": lock.passed,
                            "predecessor": lock.predecessor,
                            "acquired_at": waited_until,
                            "join_calls": calls,
                        }
                    )
            elif kind == "plain":
                lock = ReservationMutex(api, rid, owner=f"plain {index}", timeout=120, **FAST, **options)
                with lock:
                    interval = _critical_section(api, rid, f"{lock.token}|{index}:{round_}")
                report["holds"].append({"interval": interval, "token": lock.token, "passed": False})
            else:
                name = f"v1:{index}:{round_}"
                original = OriginalMutex(
                    api, rid, variant="v1", my_unique_name=name, attempts=100_000, sleep_range=(0.005, 0.02)
                )
                with original:
                    interval = _critical_section(api, rid, name)
                report["holds"].append({"interval": interval, "token": "", "passed": False})
    except BaseException as error:  # report, never hang the parent
        report["error"] = f"{type(error).__name__}: {error}"
    results.put(report)


# ---------------------------------------------------------------- checks


def check_history(events: List[Dict[str, Any]]) -> Dict[str, List[int]]:
    """Walk the ordered log; fail on any write outside its holder's server grant. Returns, per grant (owner
    token), how many holds wrote under it, in grant order."""
    holder = None
    writes: Dict[str, List[int]] = {}
    last_count = 0
    for event in sorted(events, key=lambda e: e["seq"]):
        if event["alias"] == protocol.DEFAULT_ALIAS:
            if event["op"] == "service_added":
                assert holder is None, f"MUTEX added while held: {event}"
                holder = event["attributes"].get(protocol.ATTR_OWNER, "")
                writes.setdefault(holder or f"v1-grant-{event['seq']}", []).append(0)
            elif event["op"] == "service_removed":
                assert holder is not None, f"MUTEX removed while free: {event}"
                holder = None
        elif event["alias"] == COUNTER_ALIAS and event["op"] == "service_attributes_set":
            writer = event["attributes"][ATTR_WRITER]
            assert holder is not None, f"counter written by {writer!r} while nobody held MUTEX"
            if holder:
                assert writer.split("|")[0] == holder, f"counter written by {writer!r} while {holder!r} held"
                writes[holder][-1] += 1
            else:
                assert writer.startswith("v1:"), f"counter written by {writer!r} while a v1 holder held MUTEX"
            count = int(event["attributes"][ATTR_COUNT])
            assert count == last_count + 1, f"lost update: {last_count} -> {count}"
            last_count = count
    return writes


def check_intervals(reports: List[Dict[str, Any]]) -> None:
    intervals = sorted(tuple(h["interval"]) for report in reports for h in report["holds"])
    for (_, previous_end), (start, _) in zip(intervals, intervals[1:]):
        assert start >= previous_end, "two processes were inside the critical section at once"


def prepare(emu) -> Tuple[str, Address]:
    api = emu.session()
    rid = emu.create_reservation("cohort")
    emu.add_service_model(COUNTER_MODEL, {ATTR_COUNT: "0", ATTR_WRITER: ""})
    api.AddServiceToReservation(rid, COUNTER_MODEL, COUNTER_ALIAS, [AttributeNameValue(ATTR_COUNT, "0")])
    emu.control.configure(latency=LATENCY)
    return rid, (emu.host, emu.port, emu.admin_user, emu.admin_password, emu.admin_domain)


def race(emu, rid, addr, plan: List[Tuple[str, str]], rounds: int, options=None) -> List[Dict[str, Any]]:
    """Run one process per (kind, cohort dir) in ``plan``; returns their reports after the checks."""
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(len(plan) + 1), ctx.Queue()
    processes = [
        ctx.Process(
            target=worker, args=(kind, i, addr, rid, directory, rounds, options or {}, barrier, results)
        )
        for i, (kind, directory) in enumerate(plan)
    ]
    for process in processes:
        process.start()
    try:
        barrier.wait(timeout=120)
        reports = [results.get(timeout=240) for _ in processes]
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    errors = [f"{r['kind']} {r['index']}: {r['error']}" for r in reports if r["error"]]
    assert not errors, errors
    check_intervals(reports)
    assert _read_count(emu.session(), rid) == len(plan) * rounds
    return reports


# ---------------------------------------------------------------- tests


def test_three_execution_servers_of_three_processes_exclude_each_other_and_pass_locally(
    cloudshell_emulator_factory, original_package_zip, tmp_path
):
    emu = cloudshell_emulator_factory(packages=[original_package_zip])
    rid, addr = prepare(emu)
    plan = [("cohort", str(tmp_path / f"exec-{server}")) for server in range(3) for _ in range(3)]
    reports = race(emu, rid, addr, plan, rounds=5)
    per_grant = check_history(emu.control.events(rid))
    holds = [h for r in reports for h in r["holds"]]
    passed = [h for h in holds if h["passed"]]
    print(
        f"\n3 cohorts x 3 processes x 5 holds: {len(per_grant)} server grants for {len(holds)} holds, "
        f"{len(passed)} passed locally"
    )
    assert sum(sum(counts) for counts in per_grant.values()) == len(holds)
    assert passed, "no hold was passed within a cohort"
    assert all(h["join_calls"] == 0 for h in passed)  # a trusted pass makes no server call
    assert len(per_grant) < len(holds)


def test_at_most_k_passes_per_server_grant_and_the_other_execution_server_gets_its_turns(
    cloudshell_emulator_factory, original_package_zip, tmp_path
):
    emu = cloudshell_emulator_factory(packages=[original_package_zip])
    rid, addr = prepare(emu)
    busy, other = str(tmp_path / "exec-busy"), str(tmp_path / "exec-other")
    plan = [("cohort", busy)] * 4 + [("cohort", other)]
    k = 2
    race(emu, rid, addr, plan, rounds=5, options={"max_passes": k, "yield_seconds": 0.3})
    per_grant = check_history(emu.control.events(rid))
    counts = [count for grants in per_grant.values() for count in grants]
    print(f"\nholds per server grant with K={k}: {counts}")
    # K passes while someone elsewhere is seen waiting (parked in the queue); up to BLIND_BOUNDS x K while
    # the other server's waiter still spins (it leaves no ticket to see). Every grant ends, so the other
    # execution server gets its turns (race() checks that every round of every process ran).
    assert max(counts) <= k * cohort_module.BLIND_BOUNDS + 1
    assert max(counts) > 1  # passes did happen


def test_kill_9_of_a_local_holder_mid_hold_the_next_local_waiter_carries_on_at_once(
    cloudshell_emulator_factory, tmp_path
):
    emu = cloudshell_emulator_factory(packages=[our_package()])
    rid, addr = prepare(emu)
    ctx = multiprocessing.get_context("spawn")
    here, elsewhere = str(tmp_path / "exec-1"), str(tmp_path / "exec-2")
    options = {"lease": LEASE}
    victim, held = _leased_holder(addr, rid, here)
    waiters_barrier, waiter_results = ctx.Barrier(2), ctx.Queue()
    waiters = [
        ctx.Process(
            target=worker, args=("cohort", i, addr, rid, d, 1, options, waiters_barrier, waiter_results)
        )
        for i, d in ((1, here), (2, elsewhere))
    ]
    try:
        for process in waiters:
            process.start()
        time.sleep(1.0)  # both wait: one on the local lock, one polling the server
        victim.kill()  # SIGKILL, mid-hold: no release, its heartbeat dies with it
        killed = time.monotonic()
        victim.join(10)
        reports = [waiter_results.get(timeout=120) for _ in waiters]
    finally:
        for process in (victim, *waiters):
            if process.is_alive():
                process.kill()
            process.join(10)
    assert all(r["error"] is None for r in reports), reports
    local = next(r for r in reports if r["index"] == 1)
    (hold,) = local["holds"]
    assert hold["predecessor"]["pid"] == held["pid"]  # it knew its predecessor died
    assert hold["token"] == held["held"] and hold["passed"]  # carried on under the same server grant
    later = hold["acquired_at"] - killed
    print(f"\nkill -9 of a local holder: the next local waiter held it {later:.2f} s later")
    per_grant = check_history(emu.control.events(rid))
    assert list(per_grant) == [held["held"], next(r for r in reports if r["index"] == 2)["holds"][0]["token"]]
    output = emu.control.output(rid)
    assert not any("broke the stale lock" in line for line in output)  # no lease break
    # ... but the people watching the sandbox are told of the death, as they are of a break.
    assert [line for line in output if f"(pid {held['pid']} on " in line and "died holding it" in line]
    check_intervals(reports)


def test_cohorts_plain_locks_and_the_original_snippet_exclude_each_other(
    cloudshell_emulator_factory, original_package_zip, tmp_path
):
    emu = cloudshell_emulator_factory(packages=[original_package_zip])
    rid, addr = prepare(emu)
    a, b = str(tmp_path / "exec-a"), str(tmp_path / "exec-b")
    plan = [("cohort", a), ("cohort", a), ("cohort", b), ("cohort", b), ("plain", a), ("v1", a)]
    reports = race(emu, rid, addr, plan, rounds=4)
    per_grant = check_history(emu.control.events(rid))
    assert sum(sum(c) for c in per_grant.values()) == len(plan) * 4 - 4  # v1 holds are not counted per token
    assert any(h["passed"] for r in reports for h in r["holds"])


def test_the_checks_catch_a_cohort_whose_local_lock_excludes_nobody(
    cloudshell_emulator_factory, original_package_zip, tmp_path
):
    """Negative control: without the local lock, processes of one cohort take over the cohort's server lock
    while another of them holds it; the checks must fail."""
    emu = cloudshell_emulator_factory(packages=[original_package_zip])
    rid, addr = prepare(emu)
    plan = [("no-local-lock", str(tmp_path / "exec-1"))] * 4
    with pytest.raises(AssertionError, match=r"at once|lost update|MUTEX"):
        race(emu, rid, addr, plan, rounds=6)
        check_history(emu.control.events(rid))


def releasing_victim(addr: Address, rid: str, cohort_dir: str, results, release) -> None:
    """Take the cohort lock, say so, then, once told (the test has set the fault that holds its remove on the
    wire), release it to the server and be killed while the remove is there."""
    api = CloudShellAPISession(addr[0], addr[2], addr[3], addr[4], port=addr[1])
    lock = CohortMutex(api, rid, owner="victim", cohort_dir=cohort_dir, lease=LEASE, timeout=60, **FAST)
    lock.acquire()
    results.put(("held", lock.token, os.getpid()))
    release.wait(60)  # sent before the fault is set, the remove would land at once: nothing held on the wire
    lock.release()  # hangs: its remove is held by the emulator until the test lands it
    results.put(("released", lock.token, os.getpid()))


def cohort_holder(addr: Address, rid: str, cohort_dir: str, options: Dict[str, Any], events, go) -> None:
    """Take the cohort lock (blocking), say so, wait for ``go``, write the counter under it, release."""
    try:
        api = CloudShellAPISession(addr[0], addr[2], addr[3], addr[4], port=addr[1])
        lock = CohortMutex(api, rid, owner="successor", cohort_dir=cohort_dir, timeout=60, **FAST, **options)
        with lock:
            events.put(("held", lock.token, lock.passed))
            go.wait(60)
            lock.ensure_held()
            _critical_section(api, rid, f"{lock.token}|successor")
        events.put(("released", lock.token, lock.passed))
    except BaseException as error:  # report, never hang the parent
        events.put(("error", f"{type(error).__name__}: {error}", False))


def _leased_holder(addr: Address, rid: str, folder: str) -> Tuple[multiprocessing.Process, Dict[str, Any]]:
    """A cohort member in ``folder`` that takes the lock with a lease and holds it until killed, and what it
    reported once it held."""
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(1), ctx.Queue()
    args = ("victim", 0, addr, rid, folder, 1, {"lease": LEASE}, barrier, results)
    holder = ctx.Process(target=worker, args=args)
    holder.start()
    try:
        return holder, results.get(timeout=120)
    except BaseException:
        holder.kill()
        raise


def _stop(*processes: Optional[multiprocessing.Process]) -> None:
    """Kill what still runs of ``processes`` (None: never started) and reap them."""
    for process in processes:
        if process is not None:
            if process.is_alive():
                process.kill()
            process.join(10)


def _spawn(target, *args) -> multiprocessing.Process:
    process = multiprocessing.get_context("spawn").Process(target=target, args=args, daemon=True)
    process.start()
    return process


def test_a_local_holder_killed_while_its_remove_is_on_the_wire_is_never_carried_on_under(
    cloudshell_emulator_factory, tmp_path
):
    """H releases to the server and its remove is slow; L, in the same cohort folder, waits; H is killed. L
    must not carry on under H's token (the remove lands later, and a plain lock elsewhere would then get
    MUTEX while L holds): it acquires from the server."""
    emu = cloudshell_emulator_factory(packages=[our_package()])
    rid, addr = prepare(emu)
    ctx = multiprocessing.get_context("spawn")
    here = str(tmp_path / "exec-1")
    victim_events, events, go, release = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Event()
    victim = _spawn(releasing_victim, addr, rid, here, victim_events, release)
    successor = None
    try:
        kind, token, _pid = victim_events.get(timeout=60)
        assert kind == "held"
        emu.control.inject_fault("RemoveServicesFromReservation", "apply_late", delay=None, reply="hang")
        release.set()
        deadline = time.monotonic() + 30
        while not emu.control.faults_injected():  # the victim's remove is on the wire, held by the server
            assert time.monotonic() < deadline, "the victim never sent its remove"
            time.sleep(0.02)
        successor = _spawn(cohort_holder, addr, rid, here, {"lease": LEASE}, events, go)
        time.sleep(0.5)  # the successor waits for the local lock
        victim.kill()
        victim.join(10)
        time.sleep(0.5)
        assert emu.control.land_late() == 1  # the dead holder's remove lands now
        kind, held_token, passed = events.get(timeout=60)
        assert kind == "held", held_token
        plain = ReservationMutex(emu.session(), rid, owner="plain elsewhere", **FAST)
        got_it = plain.acquire(blocking=False)
        if got_it:
            plain.release()
        go.set()
        assert events.get(timeout=60)[0] == "released"
    finally:
        go.set()
        _stop(victim, successor)
    assert not got_it, "a plain lock elsewhere got MUTEX while the successor held the cohort lock"
    assert held_token != token and not passed  # acquired from the server, not carried on under the victim's
    check_history(emu.control.events(rid))


def test_a_lease_0_member_that_carries_on_under_a_leased_lock_heartbeats_it(
    cloudshell_emulator_factory, tmp_path
):
    """A cohort member with lease=0 that carries on under a dead member's leased lock must heartbeat that
    lease, or a waiter elsewhere breaks the lock under it."""
    emu = cloudshell_emulator_factory(packages=[our_package()])
    rid, addr = prepare(emu)
    ctx = multiprocessing.get_context("spawn")
    here = str(tmp_path / "exec-1")
    victim, held = _leased_holder(addr, rid, here)
    events, go = ctx.Queue(), ctx.Event()
    successor = None
    try:
        successor = _spawn(cohort_holder, addr, rid, here, {"lease": 0}, events, go)
        time.sleep(0.5)
        victim.kill()  # mid-hold: the successor carries on under its lease
        victim.join(10)
        kind, token, passed = events.get(timeout=60)
        assert (kind, token, passed) == ("held", held["held"], True)
        waiter = ReservationMutex(
            emu.session(), rid, owner="waiter elsewhere", lease=LEASE, timeout=4 * LEASE, **FAST
        )
        with pytest.raises(MutexTimeout):
            waiter.acquire()  # the lease is kept alive: it is never judged stale
        go.set()
        kind, detail, _ = events.get(timeout=60)
        assert kind == "released", detail
    finally:
        go.set()
        _stop(victim, successor)
    check_history(emu.control.events(rid))


def test_a_transient_failure_of_the_read_that_checks_a_dead_holders_lock_does_not_fail_the_acquire(
    cloudshell_emulator_factory, tmp_path
):
    """The successor of a local holder that died checks the cohort's lock with one read. A transient failure
    of that read (HTTP 500, a reset) must be waited out within the acquire's timeout, as every other read of
    an acquire is, not end it with "CloudShell API unavailable while reading the lock to adopt it"."""
    emu = cloudshell_emulator_factory(packages=[our_package()])
    rid, addr = prepare(emu)
    here = str(tmp_path / "exec-1")
    victim, held = _leased_holder(addr, rid, here)
    try:
        victim.kill()  # mid-hold: its successor here verifies the lock with one read
        victim.join(10)
        emu.control.inject_fault("GetReservationDetails", "error_before_commit")
        lock = CohortMutex(emu.session(), rid, owner="successor", cohort_dir=here, timeout=10, **FAST)
        with lock:
            assert lock.token == held["held"] and lock.passed  # carried on under the dead holder's lock
            _critical_section(emu.session(), rid, f"{lock.token}|successor")
    finally:
        if victim.is_alive():
            victim.kill()
        victim.join(10)
    assert [f["kind"] for f in emu.control.faults_injected()] == ["error_before_commit"]
    check_history(emu.control.events(rid))
