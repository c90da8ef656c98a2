"""The chaos run: liveness under faults. Separate processes take the lock through a faulty server; how many
critical sections ran, why the others did not, and where the lock stood still (docs/reliability.md,
"Liveness under faults").

``make chaos`` runs seeds 7, 8 and 9 with the default lock and with ``fair=False`` and prints a table;
one run is ``python tests/stress/chaos_harness.py --seed 7 --mode default`` (``--help`` for the rest; the
JSON result goes to stdout or ``--out``). Not part of ``make test`` (one run takes minutes);
``tests/stress/test_chaos_smoke.py`` runs a tiny round there and checks only safety and the harness.

**The run.** One emulator (this tree's), our Mutex_Package, latency lognormal with a 50 ms median (sigma
0.5, committing halfway). ``--workers`` (6) OS processes (``multiprocessing`` spawn), each logged on as its
own user through its own ``CloudShellAPISession(..., timeout=1)``, each running ``--sections`` (15)
sections: ``acquire(timeout=--acquire-timeout)`` (30 s), the body (a read-modify-write of a counter service,
with :data:`HOLD` seconds between the read and the write and ``ensure_held()`` before the write), and
``release()``. One lock object per worker, used for every section; no pause between sections.

**The faults** (:func:`faults`): the emulator's seeded random mode on every call of the workers' users but
their logons, at :data:`RATES` a call: a reset before the server commits (the request never applies:
``reset_before_commit``), a reset after it (``drop_after_commit``), a reset whose request the server applies
1-3 s after it arrived (``apply_late`` with ``delay_max``), and a spike of :data:`SPIKE_SECONDS` before the
commit, past the client's 1 s timeout (``spike``). The client re-sends a reset or timed-out request by
itself (1 s, then 2 s later; the lock turns that off for its removes), and each copy draws its own fault.
The counter is read and written as another user, whom the faults spare: a lost update is then the lock's.

**A section "ran"** when its body ran (the counter was written) and its ``release()`` did not raise. The
others are classed by what raised first: ``timeout`` (``MutexTimeout`` from the acquire), ``release_error``
(``MutexReleaseError``: the worker then calls ``release()`` again until it is settled, as the error asks),
``lost`` (``MutexLostError``, from ``ensure_held()`` or the release) and ``other`` (anything else, named).

**Safety** (must hold in every run): the audit of the server's event log (``stress_harness.audit``: no
overlap, no lost update, no foreign remove), the history checker (``history.check``), and nothing of the
lock's left in the reservation once every worker has exited (each settles its late-add watcher first).

**Records.** Each worker journals, as JSON lines, every API call it made (method, aliases, start, end,
result), every lock event (``on_event``), every log record of the ``cloudshell_mutex`` logger at DEBUG, and
each section's times and outcome; with the server's event log and fault records (each names the user whose
call it hit) they make the timeline (:mod:`chaos_timeline`): the stalls, what caused them, and what each
cost. ``--lock-src`` runs the workers on another tree's library (``src`` of an older commit) while the
emulator and the checkers stay this tree's, so that two versions meet the same faults.

Nothing here imports the library at module level: the workers import it only once ``--lock-src`` is first
on their path.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
for _path in (HERE, HERE.parent):  # the checkers beside this file
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

#: Fault rates per call of the workers' users (each call draws at most one).
RATES = {"reset_before_commit": 0.02, "drop_after_commit": 0.02, "apply_late": 0.02, "spike": 0.02}
#: An apply_late request lands this many seconds after it arrived (uniform), its connection reset at once.
LATE_DELAY = (1.0, 3.0)
#: A spike's extra time before the commit: past the client's 1 s socket timeout.
SPIKE_SECONDS = 1.5
#: The normal latency of every call (the counter's too).
LATENCY = {"distribution": "lognormal", "median": 0.05, "sigma": 0.5, "commit_fraction": 0.5}
#: Seconds between the counter's read and its write inside the lock.
HOLD = 0.2
#: The workers' socket timeout (the client's ``timeout=``).
SOCKET_TIMEOUT = 1.0
SEEDS = (7, 8, 9)
MODES = ("default", "plain")
COUNTER_USER = "counter"
PASSWORD = "chaos"


def faults(seed: int, users: Sequence[str]) -> Dict[str, Any]:
    """The random fault mode of a run (see the module docstring)."""
    return {
        "seed": seed,
        "users": list(users),
        "rates": dict(RATES),
        "params": {
            "apply_late": {"delay": LATE_DELAY[0], "delay_max": LATE_DELAY[1], "reset_after": 0.05},
            "spike": {"seconds": SPIKE_SECONDS},
        },
    }


# ---------------------------------------------------------------- the worker (its own process)


class Journal:
    """One worker's record as JSON lines, one ``os.write`` each (threads of the lock write to it too)."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, **entry: Any) -> None:
        """Append one entry, stamped with this machine's monotonic clock (the emulator's too)."""
        entry.setdefault("at", time.monotonic())
        os.write(self.fd, (json.dumps(entry, default=str) + "\n").encode())


class JournalHandler(logging.Handler):
    """The lock's log records, into the journal."""

    def __init__(self, journal: Journal) -> None:
        super().__init__(logging.DEBUG)
        self.journal = journal

    def emit(self, record: logging.LogRecord) -> None:
        """One ``log`` entry."""
        try:
            message = record.getMessage()
        except Exception:  # a bad format string must not stop the worker
            message = str(record.msg)
        self.journal.write(t="log", level=record.levelname, thread=record.threadName, msg=message[:600])


def _aliases(method: str, args: tuple, kwargs: Dict[str, Any]) -> Any:
    if method == "AddServiceToReservation" and len(args) >= 3:
        return args[2]
    if method in ("RemoveServicesFromReservation", "SetServiceAttributesValues") and len(args) >= 2:
        return args[1]
    return None


class RecordedSession:
    """A ``CloudShellAPISession`` whose every API call is journaled (``call``: method, aliases, start, end,
    result). Attributes, ``_attempts`` included (the lock turns the client's re-send off for its removes
    through it), are the session's own."""

    def __init__(self, session: Any, journal: Journal) -> None:
        object.__setattr__(self, "_session", session)
        object.__setattr__(self, "_journal", journal)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._session, name)
        if not name[:1].isupper() or not callable(value):
            return value
        journal = self._journal

        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.monotonic()
            result = "ok"
            try:
                return value(*args, **kwargs)
            except Exception as error:
                result = f"{type(error).__name__}: {error}"[:200]
                raise
            finally:
                journal.write(
                    t="call",
                    m=name,
                    a=_aliases(name, args, kwargs),
                    s=start,
                    e=time.monotonic(),
                    r=result,
                    th=threading.current_thread().name,
                )

        return call

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._session, name, value)


def _queue_memory(lock: Any) -> Optional[Dict[str, Any]]:
    """What the fair queue of ``lock`` estimates (its period, hold time and their samples), for the
    timeline: how long a waiter in line sleeps follows from them. None without a queue (fair=False)."""
    memory = getattr(getattr(lock, "_queue", None), "memory", None)
    if memory is None:
        return None
    try:
        return {
            "period": round(memory.period, 3),
            "tenure": None if memory.tenure is None else round(memory.tenure, 3),
            "cadence": round(memory.cadence(), 3),
            "periods": [round(x, 2) for x in getattr(memory, "period_samples", [])],
            "tenures": [round(x, 2) for x in getattr(memory, "tenure_samples", [])],
        }
    except Exception as error:  # an older tree's memory: say what is missing
        return {"error": repr(error)}


def _counter(api: Any, rid: str) -> int:
    services = api.GetReservationDetails(rid, disableCache=True).ReservationDescription.Services
    service = next(s for s in services if s.Alias == "COUNTER")
    return int({a.Name: a.Value for a in service.Attributes}["Count"])


def worker(
    index: int,
    address: Tuple[str, int, str],
    rid: str,
    settings: Dict[str, Any],
    barrier: Any,
    journal_path: str,
) -> None:
    """One worker process: ``settings["sections"]`` sections, journaled (see the module docstring)."""
    journal = Journal(journal_path)
    error = None
    try:
        from cloudshell.api.cloudshell_api import AttributeNameValue, CloudShellAPISession

        import cloudshell_mutex
        from cloudshell_mutex import MutexLostError, MutexReleaseError, MutexTimeout, ReservationMutex

        journal.write(t="start", lock_src=str(Path(cloudshell_mutex.__file__).parent.parent))
        logger = logging.getLogger("cloudshell_mutex")
        logger.setLevel(logging.DEBUG)
        logger.addHandler(JournalHandler(journal))
        host, port, domain = address
        session = CloudShellAPISession(
            host, f"chaos{index}", PASSWORD, domain, port=port, timeout=SOCKET_TIMEOUT
        )
        api = RecordedSession(session, journal)
        counter = CloudShellAPISession(host, COUNTER_USER, PASSWORD, domain, port=port)

        def on_event(event: Any) -> None:
            journal.write(t="ev", kind=event.kind, token=event.token, waited=round(event.waited, 3),
                          holder=event.holder, error=(event.error or "")[:400])  # fmt: skip

        options: Dict[str, Any] = {"timeout": settings["acquire_timeout"], "on_event": on_event}
        if settings["mode"] == "plain":
            options["fair"] = False
        if settings.get("request_lifetime") is not None:
            options["request_lifetime"] = settings["request_lifetime"]
        lock = ReservationMutex(api, rid, owner=f"worker {index}", **options)
        barrier.wait(timeout=120)
        barrier = None  # passed
        for number in range(settings["sections"]):
            section: Dict[str, Any] = {"t": "sec", "i": number, "start": time.monotonic()}
            journal.write(t="acquiring", i=number, memory=_queue_memory(lock))
            try:
                lock.acquire()
            except MutexTimeout as timeout:
                section.update(outcome="timeout", end=time.monotonic(), error=str(timeout)[:600])
                journal.write(**section)
                continue
            except Exception as failure:
                section.update(
                    outcome="other", end=time.monotonic(), error=f"{type(failure).__name__}: {failure}"[:600]
                )
                journal.write(**section)
                continue
            token = lock.token
            section.update(token=token, acquired=time.monotonic())
            journal.write(t="acquired", i=number, token=token)
            outcome = "ran"
            try:
                count = _counter(counter, rid)
                time.sleep(HOLD)
                lock.ensure_held()
                counter.SetServiceAttributesValues(
                    rid,
                    "COUNTER",
                    [AttributeNameValue("Count", str(count + 1)), AttributeNameValue("Writer", token)],
                )
                section["written"] = time.monotonic()
            except MutexLostError as lost:
                outcome, section["error"] = "lost", str(lost)[:600]
            except Exception as failure:
                outcome, section["error"] = "other", f"{type(failure).__name__}: {failure}"[:600]
            section["releasing"] = time.monotonic()
            journal.write(t="releasing", i=number, token=token)
            attempts = 0
            while True:
                attempts += 1
                try:
                    lock.release()
                    break
                except MutexReleaseError as failed:
                    if outcome == "ran":
                        outcome, section["error"] = "release_error", str(failed)[:600]
                    time.sleep(0.2)  # the next release() continues this one
                except MutexLostError as lost:
                    if outcome == "ran":
                        outcome, section["error"] = "lost", str(lost)[:600]
                    break
                except Exception as failure:
                    if outcome == "ran":
                        outcome, section["error"] = "other", f"{type(failure).__name__}: {failure}"[:600]
                    break
            section.update(outcome=outcome, end=time.monotonic(), release_calls=attempts)
            journal.write(**section)
        journal.write(t="settling")
        from cloudshell_mutex.lock.server.late_adds import process_late_adds

        late = process_late_adds()
        settled = late.settle(2 * settings["lifetime"] + 30)
        journal.write(t="settled", ok=settled, pending=len(late.pending()))
    except BaseException as failure:  # the run reports it
        error = f"{type(failure).__name__}: {failure}"[:600]
        if barrier is not None:
            barrier.abort()  # the run must not wait for a worker that never starts
    journal.write(t="end", error=error)


# ---------------------------------------------------------------- the run (the harness's process)


def run(
    seed: int,
    mode: str,
    workers: int = 6,
    sections: int = 15,
    acquire_timeout: float = 30.0,
    request_lifetime: Optional[float] = None,
    lock_src: Optional[str] = None,
    journals: Optional[str] = None,
    rates_scale: float = 1.0,
) -> Dict[str, Any]:
    """One chaos run on a fresh emulator; returns the figures (see :func:`summarize`)."""
    from cloudshell.api.cloudshell_api import AttributeNameValue
    from stress_harness import COUNTER, COUNTER_MODEL, our_package

    from cloudshell_mutex.emulator import Emulator

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    lifetime = request_lifetime if request_lifetime is not None else 120.0
    folder = Path(journals or tempfile.mkdtemp(prefix="cloudshell-mutex-chaos-"))
    folder.mkdir(parents=True, exist_ok=True)
    users = [f"chaos{i}" for i in range(workers)]
    settings = {"mode": mode, "sections": sections, "acquire_timeout": acquire_timeout,
                "request_lifetime": request_lifetime, "lifetime": lifetime}  # fmt: skip
    with Emulator(port=0, quali_port=0, packages=[our_package()]) as emu:
        for user in [*users, COUNTER_USER]:
            emu.control.add_user(user, PASSWORD, admin=True)
        emu.add_service_model(COUNTER_MODEL, {"Count": "0", "Writer": ""})
        rid = emu.create_reservation("chaos")
        emu.session().AddServiceToReservation(rid, COUNTER_MODEL, COUNTER, [AttributeNameValue("Count", "0")])
        chosen = faults(seed, users)
        chosen["rates"] = {kind: rate * rates_scale for kind, rate in chosen["rates"].items()}
        emu.control.configure(latency=dict(LATENCY, seed=seed), random_faults=chosen, details_cache_seconds=0)
        address = (emu.host, emu.port, emu.admin_domain)
        ctx = multiprocessing.get_context("spawn")
        barrier = ctx.Barrier(workers + 1)
        processes = []
        # A spawned process takes this process's sys.path: with --lock-src first, the workers import that
        # tree's library (this process has imported its own already, for the emulator and the checkers).
        if lock_src:
            sys.path.insert(0, str(Path(lock_src).resolve()))
        try:
            for index in range(workers):
                journal = str(folder / f"worker-{index}.jsonl")
                process = ctx.Process(target=worker, args=(index, address, rid, settings, barrier, journal))
                process.start()
                processes.append(process)
        finally:
            if lock_src:
                sys.path.pop(0)
        barrier.wait(timeout=300)
        started = time.monotonic()
        # A bound on the run: every section timing out after a stalled release, and the late adds settled.
        limit = sections * (acquire_timeout + 2 * lifetime) + 4 * lifetime + 120
        hung = []
        for index, process in enumerate(processes):
            process.join(max(1.0, started + limit - time.monotonic()))
            if process.is_alive():
                hung.append(index)
                process.kill()
                process.join(10)
        elapsed = time.monotonic() - started
        emu.control.configure(random_faults=None)
        landed = emu.control.land_late()
        final = emu.control.reservation(rid)["services"]
        result = {
            "seed": seed,
            "mode": mode,
            "workers": workers,
            "sections_per_worker": sections,
            "acquire_timeout": acquire_timeout,
            "request_lifetime": lifetime,
            "lock_src": lock_src or "this tree",
            "rates": chosen["rates"],
            "seconds": round(elapsed, 1),
            "started": started,
            "hung_workers": hung,
            "late_calls_pending_at_end": landed,
            "left_in_reservation": sorted(s["alias"] for s in final if s["alias"] != COUNTER),
            "journals": str(folder),
        }
        events = emu.control.events(rid)
        injected = emu.control.faults_injected()
        calls = emu.control.call_counts()
    (folder / "events.json").write_text(json.dumps(events))
    (folder / "faults.json").write_text(json.dumps(injected))
    from chaos_timeline import summarize

    result.update(summarize(folder, events, injected, calls, started, workers, sections))
    (folder / "result.json").write_text(json.dumps(result, indent=2))
    return result


def table(results: List[Dict[str, Any]]) -> str:
    """The runs as a table: sections that ran, the others by class, safety, the worst stall."""
    lines = [
        f"{'seed':>4} {'mode':<8} {'ran':>7} {'timeout':>7} {'rel.err':>7} {'lost':>4} {'other':>5} "
        f"{'overlaps':>8} {'lost upd':>8} {'left':>4} {'worst stall':>11} {'seconds':>7}"
    ]
    for r in results:
        counts = r["sections"]
        lines.append(
            f"{r['seed']:>4} {r['mode']:<8} {counts['ran']:>3}/{counts['total']:<3} {counts['timeout']:>7} "
            f"{counts['release_error']:>7} {counts['lost']:>4} {counts['other']:>5} "
            f"{r['safety']['overlaps']:>8} {r['safety']['lost_updates']:>8} "
            f"{len(r['left_in_reservation']):>4} {r['stalls']['worst_s']:>10.1f}s {r['seconds']:>7.0f}"
        )
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """One run (``--seed``, ``--mode``), or with ``--all`` the seeds x modes of ``make chaos`` and a table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=SEEDS[0])
    parser.add_argument(
        "--mode", choices=MODES, default="default", help="default: the default lock; plain: fair=False"
    )
    parser.add_argument("--all", action="store_true", help=f"seeds {SEEDS} x modes {MODES}, then a table")
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--sections", type=int, default=15, help="sections per worker")
    parser.add_argument("--acquire-timeout", type=float, default=30.0)
    parser.add_argument(
        "--request-lifetime",
        type=float,
        default=None,
        help="the lock's request_lifetime (default: the lock's own)",
    )
    parser.add_argument(
        "--lock-src", default=None, help="run the workers on this tree's library (a src folder)"
    )
    parser.add_argument("--fault-scale", type=float, default=1.0, help="multiply every fault rate")
    parser.add_argument(
        "--journals", default=None, help="keep the journals here (default: a new temporary folder)"
    )
    parser.add_argument("--out", default=None, help="write the JSON result(s) here too")
    args = parser.parse_args(argv)
    runs = [(s, m) for s in SEEDS for m in MODES] if args.all else [(args.seed, args.mode)]
    results = []
    for seed, mode in runs:
        journals = None if args.journals is None else os.path.join(args.journals, f"{seed}-{mode}")
        result = run(seed, mode, args.workers, args.sections, args.acquire_timeout, args.request_lifetime,
                     args.lock_src, journals, args.fault_scale)  # fmt: skip
        results.append(result)
        print(json.dumps(result, indent=2) if not args.all else table([result]).splitlines()[-1], flush=True)
    if args.all:
        print(table(results))
    if args.out:
        Path(args.out).write_text(json.dumps(results if args.all else results[0], indent=2))
    safe = all(r["safety"]["ok"] for r in results)
    return 0 if safe else 1


if __name__ == "__main__":
    sys.exit(main())
