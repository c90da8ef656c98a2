"""Mutual exclusion across OS processes, against the emulator with the real client.

Each worker process opens its own CloudShellAPISession, and in every round takes the lock, reads a
counter kept in the reservation (a service attribute, read fresh), waits a moment, and writes the
counter + 1 together with its own owner name. Exclusion is then checked three ways:

* the emulator's ordered event log: every counter write happens while MUTEX is held, and by the
  process that holds it (its owner token, or "v1:..." for original v1 holders, who write no owner);
  each hold contains exactly one write;
* the lost-update counter: its final value equals the number of rounds, and each write is +1;
* the workers' own hold intervals (CLOCK_MONOTONIC is system-wide): none overlap.
"""

from __future__ import annotations

import multiprocessing
import time
from typing import Any, Dict, List, Tuple

import pytest
from cloudshell.api.cloudshell_api import AttributeNameValue, CloudShellAPISession

from cloudshell_mutex import ReservationMutex, protocol
from cloudshell_mutex.lock.pacing import CallBudget, DefaultPacing
from original_protocol import OriginalMutex

pytestmark = [pytest.mark.integration, pytest.mark.slow]

COUNTER_MODEL = "Lock Test Counter"
COUNTER_ALIAS = "COUNTER"
ATTR_COUNT = "Count"
ATTR_WRITER = "Last Writer"
HOLD_SECONDS = 0.005
LATENCY = {"distribution": "uniform", "low": 0.002, "high": 0.008, "commit_fraction": 0.5}


# ---------------------------------------------------------------- worker (runs in a spawned process)


def _read_count(api: Any, rid: str) -> int:
    services = api.GetReservationDetails(rid, disableCache=True).ReservationDescription.Services
    for service in services:
        if service.Alias == COUNTER_ALIAS:
            for attribute in service.Attributes:
                if attribute.Name == ATTR_COUNT:
                    return int(attribute.Value)
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
    kind: str, index: int, address: Tuple[str, int, str, str, str], rid: str, rounds: int, barrier, results
):
    """One process: ``rounds`` locked increments with ReservationMutex ("ours") or the original snippet."""
    host, port, user, password, domain = address
    report: Dict[str, Any] = {
        "kind": kind,
        "index": index,
        "intervals": [],
        "gave_up": 0,
        "calls": 0,
        "error": None,
    }
    try:
        api = CloudShellAPISession(host, user, password, domain, port=port)
        budget = CallBudget(rate=50, burst=10)
        barrier.wait(timeout=120)
        for round_ in range(rounds):
            if kind == "unlocked":  # negative control: the checks must catch work done without the lock
                report["intervals"].append(_critical_section(api, rid, f"unlocked:{index}:{round_}"))
            elif kind in ("ours", "fair", "parked", "plain"):
                # "ours": the defaults (spin, then park in the queue); "fair": the same, said; "parked": a
                # waiter that parks at its first busy add (this process's spin set to none); "plain": plain
                # polling.
                queue = {"ours": {}, "fair": {"fair": True}, "parked": {}, "plain": {"fair": False}}[kind]
                if kind == "parked":
                    from cloudshell_mutex.lock.queue import queue as fair_queue

                    fair_queue.SPIN_MIN = fair_queue.SPIN_MAX = 0.0
                lock = ReservationMutex(
                    api,
                    rid,
                    owner=f"worker {index}",
                    timeout=120,
                    pacing=DefaultPacing(first=0.01, base=0.02, cap=0.1),
                    budget=budget,
                    **queue,
                )
                with lock:
                    report["intervals"].append(_critical_section(api, rid, lock.token))
                report["calls"] += lock.calls
            else:
                name = f"{kind}:{index}:{round_}"
                original = OriginalMutex(
                    api, rid, variant=kind, my_unique_name=name, attempts=100_000, sleep_range=(0.005, 0.02)
                )
                with original:
                    report["intervals"].append(_critical_section(api, rid, name))
                report["gave_up"] += original.gave_up
    except BaseException as error:  # report, never hang the parent
        report["error"] = f"{type(error).__name__}: {error}"
    results.put(report)


# ---------------------------------------------------------------- checks


def check_history(events: List[Dict[str, Any]]) -> int:
    """Walk the ordered log; return the number of grants. Fails on any write outside its holder's hold."""
    holder = None  # Mutex Owner of the current MUTEX, or None while free
    writes_in_hold = 0
    grants = 0
    last_count = 0
    for event in events:
        if event["alias"] == protocol.DEFAULT_ALIAS:
            if event["op"] == "service_added":
                assert holder is None, f"MUTEX added while held: {event}"
                holder = event["attributes"].get(protocol.ATTR_OWNER, "")
                writes_in_hold = 0
                grants += 1
            elif event["op"] == "service_removed":
                assert holder is not None, f"MUTEX removed while free: {event}"
                assert writes_in_hold == 1, f"hold of {holder!r} made {writes_in_hold} writes"
                holder = None
        elif event["alias"] == COUNTER_ALIAS and event["op"] == "service_attributes_set":
            writer = event["attributes"][ATTR_WRITER]
            assert holder is not None, f"counter written by {writer!r} while nobody held MUTEX"
            if holder:
                assert writer == holder, f"counter written by {writer!r} while {holder!r} held MUTEX"
            else:
                assert writer.startswith("v1:"), f"counter written by {writer!r} while a v1 holder held MUTEX"
            count = int(event["attributes"][ATTR_COUNT])
            assert count == last_count + 1, f"lost update: {last_count} -> {count}"
            last_count = count
            writes_in_hold += 1
    assert holder is None, "MUTEX still held at the end"
    return grants


def check_intervals(reports: List[Dict[str, Any]]) -> None:
    intervals = sorted(tuple(i) for report in reports for i in report["intervals"])
    for (_, previous_end), (start, _) in zip(intervals, intervals[1:]):
        assert start >= previous_end, "two workers were inside the critical section at once"


def run_race(emu, kinds: List[str], rounds: int) -> Dict[str, Any]:
    api = emu.session()
    rid = emu.create_reservation("exclusion")
    emu.add_service_model(COUNTER_MODEL, {ATTR_COUNT: "0", ATTR_WRITER: ""})
    api.AddServiceToReservation(rid, COUNTER_MODEL, COUNTER_ALIAS, [AttributeNameValue(ATTR_COUNT, "0")])
    emu.control.configure(latency=LATENCY)
    address = (emu.host, emu.port, emu.admin_user, emu.admin_password, emu.admin_domain)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(kinds) + 1)
    results = ctx.Queue()
    processes = [
        ctx.Process(target=worker, args=(kind, index, address, rid, rounds, barrier, results))
        for index, kind in enumerate(kinds)
    ]
    for process in processes:
        process.start()
    try:
        barrier.wait(timeout=120)
        started = time.monotonic()
        reports = [results.get(timeout=150) for _ in processes]
        elapsed = time.monotonic() - started
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    errors = [f"{r['kind']} {r['index']}: {r['error']}" for r in reports if r["error"]]
    assert not errors, errors
    events = [e for e in emu.control.events(rid)]
    events.sort(key=lambda e: e["seq"])
    grants = check_history(events)
    check_intervals(reports)
    total = len(kinds) * rounds
    assert grants == total
    assert _read_count(api, rid) == total
    return {"reports": reports, "elapsed": elapsed, "rate": total / elapsed, "events": events}


# ---------------------------------------------------------------- tests


def test_exclusion_across_eight_processes(cloudshell_emulator_factory, original_package_zip):
    emu = cloudshell_emulator_factory(packages=[original_package_zip])
    outcome = run_race(emu, ["ours"] * 8, rounds=10)
    calls = sum(r["calls"] for r in outcome["reports"])
    print(
        f"\n8 processes x 10 acquisitions: {outcome['rate']:.1f} acquisitions/s, "
        f"{calls / 80:.1f} lock API calls per acquisition"
    )


def test_mutual_exclusion_with_the_original_protocol_v1_and_v2(
    cloudshell_emulator_factory, original_package_zip
):
    # details_cache_seconds=0: the original v2 reads *cached* details right after its add; with a stale
    # cache it sees the previous owner, decides it "lost the race" while holding MUTEX, and retries its
    # own alias until it gives up. That stall is a liveness defect of v2 (it keeps MUTEX, so exclusion
    # holds) that would only make this test slow. test_v2_stale_cache_stall_still_excludes (in
    # test_lock_emulator.py) shows that case.
    emu = cloudshell_emulator_factory(packages=[original_package_zip], details_cache_seconds=0)
    kinds = ["ours", "v1", "v2", "ours", "v1", "v2", "ours", "v1"]
    outcome = run_race(emu, kinds, rounds=6)
    assert sum(r["gave_up"] for r in outcome["reports"]) == 0, "an original peer ran without the lock"
    owners = {
        e["attributes"].get(protocol.ATTR_OWNER, "") for e in outcome["events"] if e["op"] == "service_added"
    }
    assert "" in owners  # v1 grants
    assert any(o.startswith("v2:") for o in owners)
    assert any(o.startswith("worker ") for o in owners)
    print(f"\nmixed 8 processes x 6 acquisitions: {outcome['rate']:.1f} acquisitions/s")


def test_the_checks_catch_work_done_without_the_lock(cloudshell_emulator_factory, original_package_zip):
    """Negative control: the same race without any lock must fail the history check."""
    emu = cloudshell_emulator_factory(packages=[original_package_zip])
    with pytest.raises(AssertionError, match=r"while nobody held MUTEX|lost update|at once"):
        run_race(emu, ["unlocked"] * 4, rounds=3)
