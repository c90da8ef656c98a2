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
import contextlib
import io
import json
import multiprocessing
import os
import random
import signal
import sys
import tempfile
import threading
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from cloudshell.api.cloudshell_api import AttributeNameValue, CloudShellAPISession

HERE = Path(__file__).resolve().parent
for path in (HERE, HERE.parent):  # history.py, and original_protocol.py one level up
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import history  # noqa: E402

from cloudshell_mutex import MutexLostError, MutexReleaseError, ReservationMutex, protocol  # noqa: E402
from cloudshell_mutex.lock.lease.lease import lease_of  # noqa: E402
from cloudshell_mutex.lock.pacing import CallBudget, DefaultPacing  # noqa: E402
from cloudshell_mutex.lock.protocol import breaker_alias  # noqa: E402
from cloudshell_mutex.lock.server.late_adds import THREAD_NAME as LATE_ADDS_THREAD  # noqa: E402
from cloudshell_mutex.lock.server.late_adds import process_late_adds  # noqa: E402
from original_protocol import OriginalMutex  # noqa: E402

COUNTER_MODEL = "Stress Counter"
COUNTER = "COUNTER"
MUTEX = protocol.DEFAULT_ALIAS
LEGACY_USER = "legacy"
# The lock is told that no request lands later than this after its call ended (request_lifetime). The
# emulator's faults apply a request at most 1.3 s after it read it; the rest is how long a request can wait
# before the emulator reads it, which on a loaded 2-core machine is not bounded by anything: the run
# measures it (adds_past_lifetime must stay 0) instead of assuming it.
LIFETIME = 30.0
#: Our workers' lease: a killed or paused holder is broken after about lease + lease/4 (seconds).
LEASE = 10.0
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


def write_counter(api: Any, rid: str, count: int, writer: str) -> None:
    """Write the counter, naming the writer (the audit matches it to the holder)."""
    api.SetServiceAttributesValues(
        rid, COUNTER, [AttributeNameValue("Count", str(count)), AttributeNameValue("Writer", writer)]
    )


def critical_section(api: Any, rid: str, writer: str) -> None:
    """Read, pause, write: two holders at once would lose an update."""
    count = read_counter(api, rid)
    time.sleep(0.005)
    write_counter(api, rid, count + 1, writer)


class Journal:
    """One worker process's record of what it did, as JSON lines appended to its own file.

    A worker may be killed (SIGKILL) at any moment, so nothing is kept in memory for a final report: every
    line is one ``os.write`` on a file opened for appending, and a line cut short by the kill is skipped when
    the journals are read (:func:`read_journals`).
    """

    def __init__(self, path: Path) -> None:
        self.fd = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, **entry: Any) -> None:
        """Append one entry."""
        os.write(self.fd, (json.dumps(entry) + "\n").encode())


class RecordedSession:
    """A ``CloudShellAPISession`` whose adds are journaled (token, start, end on this machine's monotonic
    clock): the run checks from them that no add landed later than the lifetime the lock is told
    (``request_lifetime``) after its call ended. Every other call is journaled too (``call``), for the
    post-mortem of a failed run. Attributes, ``_attempts`` included (the lock turns the client's re-send off
    for removes through it), are the session's own."""

    def __init__(self, session: Any, journal: Journal) -> None:
        object.__setattr__(self, "_session", session)
        object.__setattr__(self, "_journal", journal)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._session, name)
        if not name[:1].isupper() or not callable(value):
            return value
        journal = self._journal

        def call(*args: Any, **kwargs: Any) -> Any:
            """The session's call, journaled with its thread and what a read showed of the lock (the evidence
            a failed run's post-mortem needs: which read made a waiter judge what, and when it answered)."""
            start, result = time.monotonic(), "ok"
            try:
                answer = value(*args, **kwargs)
                if name == "GetReservationDetails":
                    result = f"{MUTEX}={_owner_shown(answer)!r}"
                return answer
            except Exception as error:
                result = f"{type(error).__name__}: {error}"[:200]
                raise
            finally:
                aliases = args[1] if name != "GetReservationDetails" and len(args) > 1 else None
                journal.write(t="call", m=name, a=aliases, s=start, e=time.monotonic(), r=result,
                              th=threading.current_thread().name)  # fmt: skip

        return call

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._session, name, value)

    def AddServiceToReservation(
        self, reservationId: str, serviceName: str, alias: str, attributes: Any = None
    ):
        """The session's add, journaled."""
        owner = next((a.Value for a in attributes or [] if a.Name == protocol.ATTR_OWNER), "")
        start = time.monotonic()
        try:
            return self._session.AddServiceToReservation(reservationId, serviceName, alias, attributes)
        finally:
            if alias == MUTEX:
                self._journal.write(t="add", token=owner, start=start, end=time.monotonic())


def _owner_shown(details: Any) -> Optional[str]:
    """The ``Mutex Owner`` of MUTEX in a ``GetReservationDetails`` answer (None: free)."""
    for service in details.ReservationDescription.Services or []:
        if service.Alias == MUTEX:
            return next((a.Value for a in service.Attributes or [] if a.Name == protocol.ATTR_OWNER), "")
    return None


def lease_safe_until(lock: ReservationMutex) -> Optional[float]:
    """Until when (monotonic) no waiter can have broken this holder's lease: its last confirmed heartbeat +
    the lease (``ensure_held`` checks the same bound). None: the hold has no lease."""
    beat = lock._held.heartbeat  # the harness reads the bound ensure_held() checks, to judge the holds by it
    return None if beat is None else beat.confirmed_at + beat.lease


def worker(
    kind: str,
    index: int,
    address: Tuple,
    rid: str,
    rounds: int,
    barrier: Any,
    journal_path: str,
    lifetime: float = LIFETIME,
    lease: float = LEASE,
) -> None:
    """One process: ``rounds`` locked increments, journaled for the checkers (``barrier`` None: a restart)."""
    host, port, user, password, domain = address
    journal = Journal(Path(journal_path))
    client = f"{kind}-{index}"
    error, unsettled, calls = None, 0, 0
    try:
        # The counter is read and written as the user the faults spare: a lagging read of the counter would
        # lose an update without any fault of the lock's, and that is not what is measured.
        counter = CloudShellAPISession(host, LEGACY_USER, password, domain, port=port)
        if kind == "ours":
            session = CloudShellAPISession(host, user, password, domain, port=port, timeout=1)
            api = RecordedSession(session, journal)
        else:
            api = counter
        budget = CallBudget(rate=20, burst=5)
        if barrier is not None:
            barrier.wait(timeout=120)
        for round_ in range(rounds):
            if kind == "ours":
                lock = ReservationMutex(
                    api, rid, owner=f"worker {index}", timeout=600, budget=budget, request_lifetime=lifetime,
                    lease=lease, pacing=DefaultPacing(first=0.02, base=0.05, cap=0.5),
                )  # fmt: skip
                invoked = time.monotonic()
                lock.acquire()
                token = lock.token
                journal.write(t="acq", client=client, token=token, ai=invoked, ac=time.monotonic(),
                              safe=lease_safe_until(lock))  # fmt: skip
                outcome = "released"
                try:
                    count = read_counter(counter, rid)
                    time.sleep(0.005)
                    # What the library asks of a holder: check the lock right before the side effect. A holder
                    # paused past its lease learns here that it may have lost it, and does not write.
                    lock.ensure_held()
                    journal.write(t="safe", token=token, safe=lease_safe_until(lock))
                    write_counter(counter, rid, count + 1, token)
                except MutexLostError as lost:
                    outcome = f"lost before the write: {lost}"[:200]
                finally:
                    release_invoked = time.monotonic()
                    # Before the release: a kill during it must end the hold here, where the client stopped
                    # believing it held, not at the kill.
                    journal.write(t="releasing", token=token, ri=release_invoked)
                    while True:
                        try:
                            lock.release()
                            break
                        except MutexReleaseError:
                            time.sleep(0.2)  # the next release() continues where this one stopped
                        except Exception as failure:  # MutexLostError: recorded, the checker judges it
                            if outcome == "released":
                                outcome = type(failure).__name__
                            break
                calls += lock.calls
                journal.write(t="rel", token=token, ri=release_invoked, rc=time.monotonic(), outcome=outcome)
            elif kind == "unlocked":  # a deliberately broken client: the checkers must catch it
                name = f"unlocked:{index}:{round_}"
                invoked = time.monotonic()
                journal.write(t="acq", client=client, token=name, ai=invoked, ac=invoked, safe=None)
                critical_section(counter, rid, name)
                now = time.monotonic()
                journal.write(t="rel", token=name, ri=now, rc=now, outcome="released")
            else:
                name = f"{kind}:{index}:{round_}"
                original = OriginalMutex(api, rid, variant=kind, my_unique_name=name, attempts=1_000_000,
                                         sleep_range=(0.02, 0.06))  # fmt: skip
                token = "" if kind == "v1" else name
                invoked = time.monotonic()
                with original:
                    journal.write(
                        t="acq", client=client, token=token, ai=invoked, ac=time.monotonic(), safe=None
                    )
                    critical_section(counter, rid, name)
                    release_invoked = time.monotonic()
                journal.write(
                    t="rel", token=token, ri=release_invoked, rc=time.monotonic(), outcome="released"
                )
        late = process_late_adds()
        unsettled = 0 if late.settle(3 * lifetime) else len(late.pending())
    except BaseException as failure:
        error = f"{type(failure).__name__}: {failure}"
    journal.write(t="end", error=error, unsettled=unsettled, calls=calls)


def audit(events: List[Dict[str, Any]], safe_until: Optional[Dict[str, float]] = None) -> Dict[str, int]:
    """Count what went wrong, from the server's order of events alone.

    A hold begins when MUTEX is added and ends when it is removed. Its holder's counter write must fall
    inside it: a write by a token whose hold already ended means that hold was cut short by a remove
    that was not its holder's (a foreign remove); a write by anyone but the current holder is an
    overlap; a count that is not the previous one + 1 is a lost update. (v1 holders write no owner, so
    their writes are matched by the "v1:" prefix.)

    ``safe_until`` maps a leased holder's token to the lease-safe point it checked right before its write
    (:func:`lease_safe_until`). A write by a holder that is not the holder any more, applied *after* that
    point, is the one thing a lease cannot prevent (a holder paused between its check and its write, longer
    than its lease): it is counted as ``past_lease_writes``, not as an overlap, and so is the lost update it
    causes. Applied before that point, it is an overlap like any other.
    """
    safe_until = safe_until or {}
    found = {"foreign_removes": 0, "overlaps": 0, "lost_updates": 0, "grants": 0, "leaks": 0}
    found["past_lease_writes"] = 0
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
            is_holder = holder is not None and (
                writer == holder or (holder == "" and writer.startswith("v1:"))
            )
            if not is_holder and event["monotonic"] > safe_until.get(writer, float("inf")):
                found["past_lease_writes"] += 1
            else:
                if writer in ended and writer != holder:
                    found["foreign_removes"] += 1
                if not is_holder:
                    found["overlaps"] += 1
                if count != last + 1:
                    found["lost_updates"] += 1
            last = count
    found["leaks"] = int(holder is not None)
    return found


def add_lateness(events: List[Dict[str, Any]], adds: List[Tuple[str, float, float]]) -> List[float]:
    """For each add of ``MUTEX`` the server applied, how long after the end of the client's last add call of
    that token (started before it) it was applied: the lock assumes no more than ``request_lifetime``."""
    calls: Dict[str, List[Tuple[float, float]]] = {}
    for token, start, end in adds:
        calls.setdefault(token, []).append((start, end))
    lateness = []
    for event in events:
        if event["alias"] != MUTEX or event["op"] != "service_added":
            continue
        started = [end for start, end in calls.get(event["attributes"].get(protocol.ATTR_OWNER, ""), [])
                   if start <= event["monotonic"]]  # fmt: skip
        if started:
            lateness.append(event["monotonic"] - max(started))
    return lateness


@dataclass
class Chaos:
    """Kills and pauses of our lock processes at random moments of the run (never of the original peers:
    their MUTEX has no lease, and nothing but an administrator could remove it).

    Every ``gap`` seconds (uniform) one of our running workers is picked (a holder, with probability
    ``holder_share``, when one is found within 2 s) and, kills and pauses taking turns in proportion to how
    many of each are asked for (a kill first), killed (SIGKILL) and started again for its remaining rounds,
    or stopped (SIGSTOP) for ``pause`` seconds (uniform) and continued (SIGCONT). Nothing is done once half
    of the workers have finished, so that the last holders have waiters left to break them.
    """

    kills: int = 0
    pauses: int = 0
    gap: Tuple[float, float] = (2.0, 8.0)
    pause: Tuple[float, float] = (1.0, 25.0)
    holder_share: float = 0.5
    seed: int = 1


@dataclass
class Incarnation:
    """One process of one worker slot (a killed worker is started again as a new incarnation)."""

    slot: int
    kind: str
    number: int
    process: Any
    journal: Path
    killed_at: Optional[float] = None
    pauses: List[Tuple[float, float]] = field(default_factory=list)  # (stopped, continued), monotonic


def read_journals(incarnations: List[Incarnation]) -> Dict[str, Any]:
    """The holds (as the history checker takes them), adds, lease-safe points and end reports of every
    incarnation. A hold that a kill cut off ends, as its client believed it, at the kill."""
    holds: List[history.Hold] = []
    adds: List[Tuple[str, float, float]] = []
    safe: Dict[str, float] = {}
    ends: List[Dict[str, Any]] = []
    excused: set = set()  # tokens of incarnations that were killed or paused: their leftovers are the lease's
    # Each token's own late-add watcher's removes of MUTEX that answered ok: (start, end) of the call.
    own_removes: Dict[str, List[Tuple[float, float]]] = {}
    for inc in incarnations:
        entries = []
        for line in inc.journal.read_text().splitlines() if inc.journal.exists() else []:
            try:
                entries.append(json.loads(line))
            except ValueError:
                continue  # the line a kill cut short
        open_hold: Optional[Dict[str, Any]] = None
        tokens = {entry["token"] for entry in entries if entry["t"] == "add"}
        watcher_removes = [
            (entry["s"], entry["e"])
            for entry in entries
            if entry["t"] == "call"
            and entry.get("m") == "RemoveServicesFromReservation"
            and MUTEX in (entry.get("a") or ())
            and entry.get("th") == LATE_ADDS_THREAD
            and entry.get("r") == "ok"
        ]
        for token in tokens:
            own_removes.setdefault(token, []).extend(watcher_removes)
        for entry in entries:
            kind = entry["t"]
            if kind == "add":
                adds.append((entry["token"], entry["start"], entry["end"]))
                if inc.killed_at is not None or inc.pauses:
                    excused.add(entry["token"])
            elif kind == "acq":
                open_hold = entry
                if entry["safe"] is not None:
                    safe[entry["token"]] = entry["safe"]
            elif kind == "safe" and entry["safe"] is not None:
                safe[entry["token"]] = entry["safe"]
            elif kind == "releasing" and open_hold is not None:
                open_hold["releasing"] = entry["ri"]
            elif kind == "rel" and open_hold is not None:
                holds.append(
                    _hold(open_hold, safe.get(open_hold["token"]), entry["ri"], entry["rc"], entry["outcome"])
                )
                open_hold = None
            elif kind == "end":
                ends.append(dict(entry, client=f"{inc.kind}-{inc.slot}#{inc.number}"))
        if open_hold is not None:
            if inc.killed_at is None:
                ends.append(
                    {"client": f"{inc.kind}-{inc.slot}#{inc.number}", "error": "exited while holding"}
                )
            holds.append(
                # Believed until its release call, if it made one before the kill.
                _hold(
                    open_hold,
                    safe.get(open_hold["token"]),
                    open_hold.get("releasing", inc.killed_at),
                    inc.killed_at,
                    "killed",
                )
            )
        elif inc.killed_at is None and not any(
            e["client"] == f"{inc.kind}-{inc.slot}#{inc.number}" for e in ends
        ):
            ends.append({"client": f"{inc.kind}-{inc.slot}#{inc.number}", "error": "exited without a report"})
    return {
        "holds": holds,
        "adds": adds,
        "safe": safe,
        "ends": ends,
        "excused": excused,
        "own_removes": own_removes,
    }


def broken_grants(
    events: List[Dict[str, Any]],
    holds: List[history.Hold],
    excused: set,
    own_removes: Optional[Dict[str, List[Tuple[float, float]]]] = None,
) -> Dict[str, Any]:
    """Grants of MUTEX that a waiter broke: removed while a breaker alias was held, at least its lease
    after it was added (a waiter breaks only a service it has seen unchanged for lease + margin; without
    that rule, a late add that its own watcher removed a second after it landed counted as broken whenever
    some breaker alias happened to be there). Those of killed or paused workers are what leases are for.
    One whose acquisition had already been released (an add that landed after its release) of a worker that
    was neither killed nor paused is a lock its own process left behind and its late-add watcher missed:
    without a lease nobody could ever remove it, so it is counted as a leak (``of_live_workers``). Not a
    break at all: a remove that the holder's own late-add watcher made (``own_removes``: its process's
    journal shows the watcher's remove of MUTEX answered ok around that moment), late because a read of
    the watcher hung past the lease under a fault."""
    own_removes = own_removes or {}
    breaker = breaker_alias(MUTEX)
    released: Dict[str, float] = {}
    for hold in holds:
        if hold.release_completed is not None:
            released[hold.token] = max(released.get(hold.token, 0.0), hold.release_completed)
    breaking = False
    holder: Optional[str] = None
    added_at, lease = 0.0, LEASE
    broken: List[str] = []
    left: List[str] = []
    for event in sorted(events, key=lambda e: e["seq"]):
        if event["alias"] == breaker and event["op"] in ("service_added", "service_removed"):
            breaking = event["op"] == "service_added"
        elif event["alias"] == MUTEX and event["op"] == "service_added":
            holder = event["attributes"].get(protocol.ATTR_OWNER, "")
            added_at, lease = event["monotonic"], lease_of_attributes(event["attributes"])
        elif event["alias"] == MUTEX and event["op"] == "service_removed":
            old_enough = event["monotonic"] - added_at >= lease
            own = holder is not None and any(
                start <= event["monotonic"] <= end for start, end in own_removes.get(holder, ())
            )
            legacy = event.get("user") == LEGACY_USER
            if breaking and old_enough and not own and holder is not None and not legacy:
                broken.append(holder)
                if released.get(holder, float("inf")) < event["monotonic"] and holder not in excused:
                    left.append(holder)
            holder = None
    return {"total": len(broken), "of_live_workers": len(left), "tokens": left[:5]}


def lease_of_attributes(attributes: Dict[str, str]) -> float:
    """The lease a MUTEX service was added with (our workers': LEASE; none: never broken, so infinite)."""
    try:
        seconds = float(attributes.get(protocol.ATTR_LEASE_SECONDS, ""))
    except ValueError:
        return float("inf")
    return seconds if seconds > 0 else float("inf")


def _hold(acq: Dict[str, Any], safe: Optional[float], ri: Optional[float], rc: Optional[float], outcome: str):
    # A leased hold counts up to its lease-safe point at the latest: a holder paused past it is not promised
    # the lock any more (ensure_held tells it so), and a waiter may rightly have broken it.
    believed = ri if safe is None or ri is None else min(ri, safe)
    return history.Hold(acq["client"], acq["token"], acq["ai"], acq["ac"], believed, rc, outcome)


def our_package() -> bytes:
    """Our Mutex_Package (the model with the lease attributes), as the emulator imports it."""
    root = HERE.parent.parent
    package = io.BytesIO()
    with zipfile.ZipFile(package, "w") as archive:
        archive.write(root / "package" / "metadata.xml", "metadata.xml")
        archive.write(root / "DataModel" / "datamodel.xml", "DataModel/datamodel.xml")
    return package.getvalue()


def run(
    emu: Any,
    kinds: Sequence[str],
    rounds: int,
    seed: int,
    scale: float = 1.0,
    chaos: Optional[Chaos] = None,
    lifetime: float = LIFETIME,
    lease: float = LEASE,
) -> Dict[str, Any]:
    """Run the stress on a started emulator that has a Mutex package; return the figures and verdicts."""
    chaos = chaos or Chaos()
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
    barrier = ctx.Barrier(len(kinds) + 1)
    folder = Path(tempfile.mkdtemp(prefix="cloudshell-mutex-stress-"))
    incarnations: List[Incarnation] = []

    def start(slot: int, kind: str, number: int, rounds_left: int, wait: Any) -> Incarnation:
        journal = folder / f"{kind}-{slot}-{number}.jsonl"
        args = (kind, slot, address, rid, rounds_left, wait, str(journal), lifetime, lease)
        inc = Incarnation(slot, kind, number, ctx.Process(target=worker, args=args), journal)
        inc.process.start()
        incarnations.append(inc)
        return inc

    current = {slot: start(slot, kind, 0, rounds, barrier) for slot, kind in enumerate(kinds)}
    rng = random.Random(chaos.seed)
    kills = pauses = 0
    stopped: Dict[int, float] = {}  # slot -> when to continue it
    try:
        barrier.wait(timeout=300)
        started = time.monotonic()
        next_act = started + rng.uniform(*chaos.gap)
        while any(inc.process.is_alive() for inc in current.values()):
            now = time.monotonic()
            if now > started + 3600:
                raise TimeoutError("the stress run did not end within an hour")
            for slot, until in list(stopped.items()):
                if now >= until:
                    os.kill(current[slot].process.pid, signal.SIGCONT)
                    current[slot].pauses[-1] = (current[slot].pauses[-1][0], time.monotonic())
                    del stopped[slot]
            running = [s for s, inc in current.items() if inc.process.is_alive()]
            ours = [s for s in running if kinds[s] == "ours" and s not in stopped]
            wanted = kills < chaos.kills or pauses < chaos.pauses
            if wanted and now >= next_act and ours and 2 * len(running) > len(kinds):
                # Half of the time the victim is a holder (a hold is short: a random moment would nearly
                # always find a worker waiting); otherwise anyone, at whatever it is doing.
                holders = (
                    _holding([current[s] for s in ours], 2.0) if rng.random() < chaos.holder_share else []
                )
                slot = rng.choice(holders or ours)
                inc = current[slot]
                kill = kills < chaos.kills and kills * chaos.pauses <= pauses * chaos.kills
                if kill:
                    inc.killed_at = time.monotonic()
                    inc.process.kill()
                    inc.process.join(10)
                    done = sum(
                        1 for inc_ in incarnations if inc_.slot == slot for _ in _released(inc_.journal)
                    )
                    current[slot] = start(slot, kinds[slot], inc.number + 1, max(0, rounds - done), None)
                    kills += 1
                else:
                    os.kill(inc.process.pid, signal.SIGSTOP)
                    inc.pauses.append((time.monotonic(), float("nan")))
                    stopped[slot] = time.monotonic() + rng.uniform(*chaos.pause)
                    pauses += 1
                next_act = time.monotonic() + rng.uniform(*chaos.gap)
            time.sleep(0.05)
        elapsed = time.monotonic() - started
    finally:
        for inc in incarnations:
            if inc.process.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(inc.process.pid, signal.SIGCONT)
                inc.process.kill()
            inc.process.join(10)
    emu.control.configure(random_faults=None)
    emu.control.land_late()
    journals = read_journals(incarnations)
    holds = journals["holds"]
    # The next user after the run: takes the lock (breaking a killed holder's leftover after its lease) and
    # releases it. A MUTEX without a lease that nobody holds would stop it: a leak.
    leftover = _final_acquire(emu, rid, lifetime, lease)
    events = emu.control.events(rid)
    # Kept for a post-mortem with the journals: what each client did, and the server's order.
    (folder / "events.json").write_text(json.dumps(events))
    if leftover.get("hold") is not None:
        holds.append(leftover.pop("hold"))
    verdict = history.check(holds, events)
    injected = emu.control.faults_injected()
    counts = emu.control.call_counts()
    lateness = add_lateness(events, journals["adds"])
    lock_calls = sum(counts.get(method, 0) for method in LOCK_METHODS)
    writes = sum(1 for e in events if e["alias"] == COUNTER and e["op"] == "service_attributes_set")
    return {
        "processes": len(kinds),
        "kinds": {kind: kinds.count(kind) for kind in sorted(set(kinds))},
        "rounds": rounds,
        "lease": lease,
        "request_lifetime": lifetime,
        "kills": _kills(incarnations, holds),
        "pauses": _pauses(incarnations, holds, lease),
        "errors": [f"{e['client']}: {e['error']}" for e in journals["ends"] if e.get("error")],
        "unsettled": sum(e.get("unsettled", 0) for e in journals["ends"]),
        "lost_reported": sum(1 for h in holds if h.release_outcome not in ("released", "killed")),
        "final_acquire": leftover,
        "broken": broken_grants(events, holds, journals["excused"], journals["own_removes"]),
        "audit": audit(events, journals["safe"]),
        "history": verdict.counts(),
        "history_problems": (
            verdict.fail_opens[:5] + verdict.cut_holds[:10] + verdict.overlaps[:5] + verdict.leaks[:5]
        ),
        # Adds applied after their call ended (lost replies, late applies) and the latest: the lock was told
        # none lands later than request_lifetime after its call ended; one that does breaks that assumption.
        "late_adds": sum(1 for late in lateness if late > 0),
        "latest_add_after_call_s": round(max(lateness, default=0.0), 3),
        "adds_past_lifetime": sum(1 for late in lateness if late > lifetime),
        "counter": read_counter(emu.session(), rid),
        "holds": len(holds),
        "writes": writes,
        "faults": {
            kind: sum(1 for f in injected if f["kind"] == kind)
            for kind in sorted({f["kind"] for f in injected})
        },
        "server_calls": sum(counts.values()),
        "lock_calls_per_acquisition": round(lock_calls / max(1, len(holds)), 2),
        "seconds": round(elapsed, 1),
        "journals": str(folder),
        "acquisitions_per_second": round(len(holds) / elapsed, 1) if elapsed else 0.0,
    }


def _released(journal: Path) -> List[str]:
    """The journal's completed rounds (one ``rel`` line each)."""
    if not journal.exists():
        return []
    return [line for line in journal.read_text().splitlines() if line.startswith('{"t": "rel"')]


def _holding(candidates: List[Incarnation], wait: float) -> List[int]:
    """The slots whose journal ends in a hold (acquired, not yet released); polled for up to ``wait`` s."""
    deadline = time.monotonic() + wait
    while True:
        found = []
        for inc in candidates:
            try:
                with open(inc.journal, "rb") as journal:
                    journal.seek(max(0, os.path.getsize(inc.journal) - 600))
                    lines = journal.read().decode(errors="replace").splitlines()
            except OSError:
                continue
            complete = [line for line in lines if line.endswith("}")]
            if complete and complete[-1].startswith(('{"t": "acq"', '{"t": "safe"')):
                found.append(inc.slot)
        if found or time.monotonic() >= deadline:
            return found
        time.sleep(0.005)


def _kills(incarnations: List[Incarnation], holds: List[history.Hold]) -> Dict[str, int]:
    killed = [inc for inc in incarnations if inc.killed_at is not None]
    mid_hold = sum(1 for h in holds if h.release_outcome == "killed")
    return {"total": len(killed), "mid_hold": mid_hold, "mid_wait_or_between": len(killed) - mid_hold}


def _pauses(incarnations: List[Incarnation], holds: List[history.Hold], lease: float) -> Dict[str, int]:
    by_client: Dict[str, List[history.Hold]] = {}
    for hold in holds:
        by_client.setdefault(hold.client, []).append(hold)
    total = mid_hold = past_lease = 0
    for inc in incarnations:
        for stopped, continued in inc.pauses:
            total += 1
            past_lease += int(continued - stopped > lease)
            client = f"{inc.kind}-{inc.slot}"
            mid_hold += any(
                h.acquire_completed <= stopped <= (h.release_completed or float("inf"))
                for h in by_client.get(client, [])
            )
    return {"total": total, "mid_hold": mid_hold, "longer_than_lease": past_lease}


def _final_acquire(emu: Any, rid: str, lifetime: float, lease: float) -> Dict[str, Any]:
    """One acquire + release after the run, fault-free; what it found in the way."""
    api = CloudShellAPISession(emu.host, emu.admin_user, emu.admin_password, emu.admin_domain, port=emu.port)
    lock = ReservationMutex(api, rid, owner="after the run", timeout=3 * lease + lifetime, lease=lease)
    holder = lock.holder()
    found: Dict[str, Any] = {"held_by": None if holder is None else holder.label, "leased": None}
    if holder is not None:
        found["leased"] = lease_of(holder) is not None
    invoked = time.monotonic()
    try:
        lock.acquire()
    except Exception as error:
        found["error"] = f"{type(error).__name__}: {error}"[:300]
        return found
    acquired, token = time.monotonic(), lock.token
    release_invoked = time.monotonic()
    lock.release()
    found["hold"] = history.Hold("final", token, invoked, acquired, release_invoked, time.monotonic())
    return found


def clean(result: Dict[str, Any]) -> bool:
    """True when the run found nothing wrong."""
    audit_ok = all(result["audit"][k] == 0 for k in ("foreign_removes", "overlaps", "lost_updates", "leaks"))
    final = result.get("final_acquire", {})
    return (
        not result["errors"]
        and audit_ok
        and all(result["history"][k] == 0 for k in ("fail_opens", "cut_holds", "overlaps", "leaks"))
        and result["counter"] == result["writes"] - result["audit"].get("past_lease_writes", 0)
        and result["unsettled"] == 0
        and result.get("adds_past_lifetime", 0) == 0
        and "error" not in final
        and final.get("leased") is not False  # a MUTEX left without a lease: nobody could break it
        and result.get("broken", {}).get("of_live_workers", 0) == 0
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``make stress``: start an emulator with our package, run, print the figures as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=32, help="lock and original-protocol processes")
    parser.add_argument("--original", type=int, default=4, help="how many of them run the original v1/v2")
    parser.add_argument("--rounds", type=int, default=200, help="acquisitions per process")
    parser.add_argument("--seed", type=int, default=20261123)
    parser.add_argument("--fault-scale", type=float, default=1.0, help="multiply every fault rate")
    parser.add_argument("--kills", type=int, default=12, help="lock processes killed (SIGKILL) and restarted")
    parser.add_argument("--pauses", type=int, default=12, help="lock processes stopped (SIGSTOP) for a while")
    parser.add_argument("--lease", type=float, default=LEASE, help="our workers' lease (seconds)")
    parser.add_argument("--lifetime", type=float, default=LIFETIME, help="request_lifetime (seconds)")
    args = parser.parse_args(argv)
    from cloudshell_mutex.emulator import Emulator

    originals = ["v1", "v2"] * args.original
    kinds = ["ours"] * (args.processes - args.original) + originals[: args.original]
    # Spread over the run (about 15-25 minutes on 2 cores): one kill or pause every 15-60 s.
    chaos = Chaos(kills=args.kills, pauses=args.pauses, gap=(15.0, 60.0), seed=args.seed)
    with Emulator(port=0, quali_port=0, packages=[our_package()]) as emu:
        result = run(emu, kinds, args.rounds, args.seed, args.fault_scale, chaos, args.lifetime, args.lease)
    result["clean"] = clean(result)
    print(json.dumps(result, indent=2))
    return 0 if result["clean"] else 1


if __name__ == "__main__":
    sys.exit(main())
