"""The stress run: many OS processes take the lock under faults; the server's log and a history checker judge.

Used by ``make stress`` (32 processes x 200 acquisitions by default: ``python tests/stress/stress_harness.py
--help``) and, shortened, by ``tests/stress/test_stress_short.py`` in ``make test``.

Lock processes use ``ReservationMutex`` through ``CloudShellAPISession(..., timeout=1)``; processes running
the original protocol (v1, v2; ``tests/original_protocol.py``) log on as another user whom the faults spare
(their own defects are not what is measured). The emulator resets connections and applies those requests
later, drops replies after commit (adds *and* removes), answers HTTP 500 and ``Success="false"``
transients, lets fresh reads lag, and delays calls past the client's 1 s timeout. Each holder increments a
counter kept in the reservation (read, pause, write) inside the lock. Then:

* :func:`audit` reads the server's ordered event log: foreign removes, overlaps, lost updates, leaks;
* :func:`history.check` verifies the clients' acquire/release history against the server's order.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from cloudshell.api.cloudshell_api import AttributeNameValue, CloudShellAPISession

HERE = Path(__file__).resolve().parent
for path in (HERE, HERE.parent):  # history.py, and original_protocol.py one level up
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import history  # noqa: E402

from cloudshell_mutex import MutexReleaseError, ReservationMutex, protocol  # noqa: E402
from cloudshell_mutex.lock.late_adds import process_late_adds  # noqa: E402
from cloudshell_mutex.lock.pacing import CallBudget, DefaultPacing  # noqa: E402
from original_protocol import OriginalMutex  # noqa: E402

COUNTER_MODEL = "Stress Counter"
COUNTER = "COUNTER"
MUTEX = protocol.DEFAULT_ALIAS
LEGACY_USER = "legacy"
LIFETIME = 5.0  # no request lands later than this after it was sent (the emulator's faults: < 2 s)
LOCK_METHODS = ["AddServiceToReservation", "RemoveServicesFromReservation", "GetReservationDetails"]


def faults(seed: int, scale: float = 1.0) -> Dict[str, Any]:
    """Random faults of every kind the emulator has that a lock must survive, at about 1-3 % a call."""
    rates = {
        "apply_late": 0.015,
        "drop_after_commit": 0.01,
        "error_before_commit": 0.01,
        "transient_false": 0.005,
        "spike": 0.01,
        "stale_fresh_read": 0.005,
    }
    return {
        "seed": seed,
        "users": ["admin"],
        "methods": LOCK_METHODS,
        "rates": {kind: rate * scale for kind, rate in rates.items()},
        "params": {
            "apply_late": {"delay": 1.2, "reset_after": 0.05},
            "spike": {"seconds": 1.3},
            "stale_fresh_read": {"ms": 300},
        },
    }


def read_counter(api: Any, rid: str) -> int:
    """The counter, read fresh; reads that fail under the faults are tried again (the lock is held)."""
    while True:
        try:
            services = api.GetReservationDetails(rid, disableCache=True).ReservationDescription.Services
        except Exception:
            time.sleep(0.05)
            continue
        for service in services:
            if service.Alias == COUNTER:
                return int({a.Name: a.Value for a in service.Attributes}["Count"])
        raise AssertionError("the counter service is missing")


def critical_section(api: Any, rid: str, writer: str) -> None:
    """Read, pause, write: two holders at once would lose an update."""
    count = read_counter(api, rid)
    time.sleep(0.005)
    api.SetServiceAttributesValues(
        rid, COUNTER, [AttributeNameValue("Count", str(count + 1)), AttributeNameValue("Writer", writer)]
    )


def worker(kind: str, index: int, address: Tuple, rid: str, rounds: int, barrier, results) -> None:
    """One process: ``rounds`` locked increments; reports its holds for the history checker."""
    host, port, user, password, domain = address
    report: Dict[str, Any] = {
        "kind": kind,
        "index": index,
        "holds": [],
        "error": None,
        "unsettled": 0,
        "calls": 0,
    }
    client = f"{kind}-{index}"
    try:
        # The counter is read and written as the user the faults spare: a lagging read of the counter would
        # lose an update without any fault of the lock's, and that is not what is measured.
        counter = CloudShellAPISession(host, LEGACY_USER, password, domain, port=port)
        if kind == "ours":
            api = CloudShellAPISession(host, user, password, domain, port=port, timeout=1)
        else:
            api = counter
        budget = CallBudget(rate=20, burst=5)
        barrier.wait(timeout=120)
        for round_ in range(rounds):
            if kind == "ours":
                lock = ReservationMutex(
                    api, rid, owner=f"worker {index}", timeout=600, budget=budget, request_lifetime=LIFETIME,
                    pacing=DefaultPacing(first=0.02, base=0.05, cap=0.5),
                )  # fmt: skip
                invoked = time.monotonic()
                lock.acquire()
                acquired, token = time.monotonic(), lock.token
                try:
                    critical_section(counter, rid, token)
                finally:
                    release_invoked, outcome = time.monotonic(), "released"
                    while True:
                        try:
                            lock.release()
                            break
                        except MutexReleaseError:
                            time.sleep(0.2)  # the next release() continues where this one stopped
                        except Exception as error:  # MutexLostError: recorded, the checker judges it
                            outcome = type(error).__name__
                            break
                report["calls"] += lock.calls
                hold = (client, token, invoked, acquired, release_invoked, time.monotonic(), outcome)
                report["holds"].append(hold)
            elif kind == "unlocked":  # a deliberately broken client: the checkers must catch it
                name = f"unlocked:{index}:{round_}"
                invoked = time.monotonic()
                critical_section(counter, rid, name)
                report["holds"].append(
                    (client, name, invoked, invoked, time.monotonic(), time.monotonic(), "released")
                )
            else:
                name = f"{kind}:{index}:{round_}"
                original = OriginalMutex(api, rid, variant=kind, my_unique_name=name, attempts=1_000_000,
                                         sleep_range=(0.02, 0.06))  # fmt: skip
                invoked = time.monotonic()
                with original:
                    acquired = time.monotonic()
                    critical_section(counter, rid, name)
                    release_invoked = time.monotonic()
                token = "" if kind == "v1" else name
                report["holds"].append(
                    (client, token, invoked, acquired, release_invoked, time.monotonic(), "released")
                )
        late = process_late_adds()
        report["unsettled"] = 0 if late.settle(3 * LIFETIME) else len(late.pending())
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
    for event in sorted(events, key=lambda e: e["seq"]):
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


def run(emu: Any, kinds: Sequence[str], rounds: int, seed: int, scale: float = 1.0) -> Dict[str, Any]:
    """Run the stress on a started emulator that has a Mutex package; return the figures and verdicts."""
    emu.control.add_user(LEGACY_USER, emu.admin_password, admin=True)
    emu.add_service_model(COUNTER_MODEL, {"Count": "0", "Writer": ""})
    rid = emu.create_reservation("stress")
    emu.session().AddServiceToReservation(rid, COUNTER_MODEL, COUNTER, [AttributeNameValue("Count", "0")])
    emu.control.configure(
        latency={"distribution": "uniform", "low": 0.002, "high": 0.008},
        random_faults=faults(seed, scale),
        details_cache_seconds=0,  # the original v2 reads cached details: a stale cache only stalls it
    )
    emu.control.reset_counts()
    address = (emu.host, emu.port, emu.admin_user, emu.admin_password, emu.admin_domain)
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(len(kinds) + 1), ctx.Queue()
    processes = [
        ctx.Process(target=worker, args=(kind, i, address, rid, rounds, barrier, results))
        for i, kind in enumerate(kinds)
    ]
    for process in processes:
        process.start()
    try:
        barrier.wait(timeout=300)
        started = time.monotonic()
        reports = [results.get(timeout=3600) for _ in processes]
        elapsed = time.monotonic() - started
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    emu.control.configure(random_faults=None)
    emu.control.land_late()
    events = emu.control.events(rid)
    holds = [history.Hold(*hold) for report in reports for hold in report["holds"]]
    verdict = history.check(holds, events)
    injected = emu.control.faults_injected()
    counts = emu.control.call_counts()
    lock_calls = sum(counts.get(method, 0) for method in LOCK_METHODS)
    return {
        "processes": len(kinds),
        "kinds": {kind: kinds.count(kind) for kind in sorted(set(kinds))},
        "rounds": rounds,
        "errors": [f"{r['kind']}-{r['index']}: {r['error']}" for r in reports if r["error"]],
        "unsettled": sum(r["unsettled"] for r in reports),
        "lost_reported": sum(1 for h in holds if h.release_outcome != "released"),
        "audit": audit(events),
        "history": verdict.counts(),
        "history_problems": (
            verdict.fail_opens[:5] + verdict.cut_holds[:10] + verdict.overlaps[:5] + verdict.leaks[:5]
        ),
        "counter": read_counter(emu.session(), rid),
        "writes": len(holds),
        "faults": {
            kind: sum(1 for f in injected if f["kind"] == kind)
            for kind in sorted({f["kind"] for f in injected})
        },
        "server_calls": sum(counts.values()),
        "lock_calls_per_acquisition": round(lock_calls / max(1, len(holds)), 2),
        "seconds": round(elapsed, 1),
        "acquisitions_per_second": round(len(holds) / elapsed, 1) if elapsed else 0.0,
    }


def clean(result: Dict[str, Any]) -> bool:
    """True when the run found nothing wrong."""
    audit_ok = all(result["audit"][k] == 0 for k in ("foreign_removes", "overlaps", "lost_updates", "leaks"))
    return (
        not result["errors"]
        and audit_ok
        and all(result["history"][k] == 0 for k in ("fail_opens", "cut_holds", "overlaps", "leaks"))
        and result["counter"] == result["writes"]
        and result["unsettled"] == 0
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``make stress``: start an emulator with the original package, run, print the figures as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=32, help="lock and original-protocol processes")
    parser.add_argument("--original", type=int, default=4, help="how many of them run the original v1/v2")
    parser.add_argument("--rounds", type=int, default=200, help="acquisitions per process")
    parser.add_argument("--seed", type=int, default=20261123)
    parser.add_argument("--fault-scale", type=float, default=1.0, help="multiply every fault rate")
    args = parser.parse_args(argv)
    from cloudshell_mutex.emulator import Emulator

    package = HERE.parent / "assets" / "original_mutex_package"
    sys.path.insert(0, str(HERE.parent))
    from conftest import zip_folder

    originals = ["v1", "v2"] * args.original
    kinds = ["ours"] * (args.processes - args.original) + originals[: args.original]
    with Emulator(port=0, quali_port=0, packages=[zip_folder(package)]) as emu:
        result = run(emu, kinds, args.rounds, args.seed, args.fault_scale)
    result["clean"] = clean(result)
    print(json.dumps(result, indent=2))
    return 0 if result["clean"] else 1


if __name__ == "__main__":
    sys.exit(main())
