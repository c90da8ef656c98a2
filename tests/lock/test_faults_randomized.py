"""A seeded randomized run under faults, in separate OS processes (roadmap step 5).

Seven processes take the lock with ReservationMutex through ``CloudShellAPISession(..., timeout=1)``
while the emulator resets connections and applies those requests later, drops replies after commit,
answers HTTP 500, and delays calls past the client's 1 s timeout. An eighth process runs the original
protocol (v1) as another user that the faults spare: its own defects are not what is measured here.
Each holder increments a counter kept in the reservation (read, pause, write) inside the lock. The
server's ordered event log then counts foreign removes, overlaps, lost updates and leaked locks.
"""

from __future__ import annotations

import multiprocessing
import time
from typing import Any, Dict, List, Tuple

import pytest
from cloudshell.api.cloudshell_api import AttributeNameValue, CloudShellAPISession

from cloudshell_mutex import MutexReleaseError, ReservationMutex, protocol
from cloudshell_mutex.lock.late_adds import process_late_adds
from cloudshell_mutex.lock.pacing import CallBudget, DefaultPacing
from original_protocol import OriginalMutex

pytestmark = [pytest.mark.integration, pytest.mark.slow]

COUNTER_MODEL = "Fault Run Counter"
COUNTER = "COUNTER"
MUTEX = protocol.DEFAULT_ALIAS
LEGACY_USER = "legacy"
ROUNDS = 8
LIFETIME = 5.0  # no request lands later than this after it was sent (the emulator's faults: < 2 s)
FAULTS = {
    "seed": 20261123,
    "users": ["admin"],
    "methods": ["AddServiceToReservation", "RemoveServicesFromReservation", "GetReservationDetails"],
    "rates": {"apply_late": 0.03, "drop_after_commit": 0.015, "error_before_commit": 0.015, "spike": 0.02},
    "params": {"apply_late": {"delay": 1.2, "reset_after": 0.05}, "spike": {"seconds": 1.3}},
}


def read_counter(api: Any, rid: str) -> Tuple[int, str]:
    while True:  # reads may fail under the faults: try again (the lock is held meanwhile)
        try:
            services = api.GetReservationDetails(rid, disableCache=True).ReservationDescription.Services
        except Exception:
            time.sleep(0.05)
            continue
        for service in services:
            if service.Alias == COUNTER:
                values = {a.Name: a.Value for a in service.Attributes}
                return int(values["Count"]), values["Writer"]
        raise AssertionError("the counter service is missing")


def critical_section(api: Any, rid: str, writer: str) -> None:
    count, _ = read_counter(api, rid)
    time.sleep(0.005)
    api.SetServiceAttributesValues(
        rid, COUNTER, [AttributeNameValue("Count", str(count + 1)), AttributeNameValue("Writer", writer)]
    )


def worker(kind: str, index: int, address: Tuple, rid: str, barrier, results) -> None:
    host, port, user, password, domain = address
    report: Dict[str, Any] = {"kind": kind, "index": index, "writes": 0, "error": None, "unsettled": 0}
    try:
        if kind == "v1":
            api = CloudShellAPISession(host, LEGACY_USER, password, domain, port=port)
        else:
            api = CloudShellAPISession(host, user, password, domain, port=port, timeout=1)
        budget = CallBudget(rate=50, burst=10)
        barrier.wait(timeout=120)
        for round_ in range(ROUNDS):
            if kind == "v1":
                name = f"v1:{index}:{round_}"
                with OriginalMutex(api, rid, variant="v1", my_unique_name=name, attempts=100_000,
                                   sleep_range=(0.01, 0.03)):  # fmt: skip
                    critical_section(api, rid, name)
            else:
                lock = ReservationMutex(
                    api,
                    rid,
                    owner=f"worker {index}",
                    timeout=180,
                    pacing=DefaultPacing(first=0.01, base=0.02, cap=0.2),
                    budget=budget,
                    request_lifetime=LIFETIME,
                )
                lock.acquire()
                try:
                    critical_section(api, rid, lock.token)
                finally:
                    while True:
                        try:
                            lock.release()
                            break
                        except MutexReleaseError:
                            time.sleep(0.2)  # it continues where it stopped
            report["writes"] += 1
        report["unsettled"] = (
            0 if process_late_adds().settle(3 * LIFETIME) else len(process_late_adds().pending())
        )
    except BaseException as error:
        report["error"] = f"{type(error).__name__}: {error}"
    results.put(report)


def audit(events: List[Dict[str, Any]]) -> Dict[str, int]:
    """Count what went wrong, from the server's order of events alone.

    A hold begins when MUTEX is added and ends when it is removed. Its holder's counter write must fall
    inside it: a write by a token whose hold already ended means that hold was cut short by a remove
    that was not its holder's (a foreign remove); a write by anyone but the current holder is an
    overlap; a count that is not the previous one + 1 is a lost update. (v1 holders write no owner, so
    their writes are matched by the "v1:" prefix.)
    """
    found = {"foreign_removes": 0, "overlaps": 0, "lost_updates": 0, "grants": 0, "leaks": 0}
    holder = None
    ended = set()
    last = 0
    for event in events:
        if event["alias"] == MUTEX:
            owner = event["attributes"].get(protocol.ATTR_OWNER, "")
            if event["op"] == "service_added":
                holder = owner
                found["grants"] += 1
            elif event["op"] == "service_removed":
                ended.add(owner)
                holder = None
        elif event["alias"] == COUNTER and event["op"] == "service_attributes_set":
            writer = event["attributes"]["Writer"]
            count = int(event["attributes"]["Count"])
            if writer in ended and writer != holder:
                found["foreign_removes"] += 1
            is_holder = holder is not None and (
                writer == holder or (holder == "" and writer.startswith("v1:"))
            )
            if not is_holder:
                found["overlaps"] += 1
            if count != last + 1:
                found["lost_updates"] += 1
            last = count
    found["leaks"] = int(holder is not None)
    return found


def test_audit_counts_what_it_is_there_to_count():
    def ev(alias, op, **attributes):
        return {"alias": alias, "op": op, "attributes": attributes}

    w = {"Mutex Owner": "a"}
    clean = [ev(MUTEX, "service_added", **w), ev(COUNTER, "service_attributes_set", Count="1", Writer="a"),
             ev(MUTEX, "service_removed", **w)]  # fmt: skip
    assert audit(clean) == {"foreign_removes": 0, "overlaps": 0, "lost_updates": 0, "grants": 1, "leaks": 0}
    cut_short = [ev(MUTEX, "service_added", **w), ev(MUTEX, "service_removed", **w),
                 ev(MUTEX, "service_added", **{"Mutex Owner": "b"}),
                 ev(COUNTER, "service_attributes_set", Count="1", Writer="a")]  # fmt: skip
    found = audit(cut_short)
    assert found["foreign_removes"] == 1 and found["overlaps"] == 1 and found["leaks"] == 1
    assert audit([ev(COUNTER, "service_attributes_set", Count="2", Writer="x")])["lost_updates"] == 1


@pytest.mark.client_timeout
def test_randomized_faults_with_the_original_protocol_beside(
    cloudshell_emulator_factory, original_package_zip
):
    emu = cloudshell_emulator_factory(packages=[original_package_zip], details_cache_seconds=0)
    emu.control.add_user(LEGACY_USER, emu.admin_password, admin=True)
    emu.add_service_model(COUNTER_MODEL, {"Count": "0", "Writer": ""})
    rid = emu.create_reservation("randomized faults")
    emu.session().AddServiceToReservation(rid, COUNTER_MODEL, COUNTER, [AttributeNameValue("Count", "0")])
    emu.control.configure(
        latency={"distribution": "uniform", "low": 0.002, "high": 0.008}, random_faults=FAULTS
    )
    kinds = ["ours"] * 7 + ["v1"]
    address = (emu.host, emu.port, emu.admin_user, emu.admin_password, emu.admin_domain)
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(len(kinds) + 1), ctx.Queue()
    processes = [
        ctx.Process(target=worker, args=(k, i, address, rid, barrier, results)) for i, k in enumerate(kinds)
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
    assert not [r["error"] for r in reports if r["error"]]
    emu.control.configure(random_faults=None)
    emu.control.land_late()
    injected = emu.control.faults_injected()
    found = audit(sorted(emu.control.events(rid), key=lambda e: e["seq"]))
    writes = sum(r["writes"] for r in reports)
    kinds_injected = sorted({f["kind"] for f in injected})
    print(f"\nrandomized run: {writes} holds, {len(injected)} faults {kinds_injected}, {found}")
    assert len(injected) >= 10 and {"apply_late", "spike"} <= set(kinds_injected)  # faults did happen
    assert found == {
        "foreign_removes": 0,
        "overlaps": 0,
        "lost_updates": 0,
        "grants": found["grants"],
        "leaks": 0,
    }
    assert writes == len(kinds) * ROUNDS and read_counter(emu.session(), rid)[0] == writes
    assert sum(r["unsettled"] for r in reports) == 0
