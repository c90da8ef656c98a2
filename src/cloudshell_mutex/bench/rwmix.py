"""A readers-and-writers mix: :class:`ReservationRWLock` against the plain :class:`ReservationMutex`.

``python -m cloudshell_mutex.bench.rwmix [--clients 8] [--reads 0.9,0.5] [--hold 0.5] [--window 30]``
``[--doc FILE]``

Every client is a spawned process with its own ``CloudShellAPISession`` on one embedded emulator (the same
latency as the main benchmark). In the window, each client takes a section after another: a read with
probability ``--reads``, else a write, each held ``--hold`` seconds. With ``rwlock`` reads take the shared
side and writes the exclusive one; with ``mutex`` every section takes the plain mutex, as code without a
read mode must. The figure is sections completed per second, and the lock's API calls per section. With
``--doc``, the table replaces the section between ``<!-- rwmix -->`` markers in that file (or is appended).
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..emulator import Emulator
from ..lock import protocol
from . import sections
from .plans import LATENCY
from .worker import Address, admin_address

#: The contenders: the RW lock, and the plain mutex for every section.
CONTENDERS = ("mutex", "rwlock")
MARK_START, MARK_END = sections.RWMIX
STARTUP_TIMEOUT = 180.0
LEAD_SECONDS = 1.0


@dataclass(frozen=True)
class MixResult:
    """One contender's run of the mix."""

    contender: str
    clients: int
    read_fraction: float
    hold: float
    window: float
    reads: int
    writes: int
    calls: int
    most_readers: int = 0

    @property
    def sections(self) -> int:
        """Sections completed in the window."""
        return self.reads + self.writes

    @property
    def per_second(self) -> float:
        """Sections completed per second."""
        return self.sections / self.window

    @property
    def calls_per_section(self) -> float:
        """The lock's API calls per section."""
        return self.calls / self.sections if self.sections else float("nan")


def mix_client(
    address: Address, rid: str, contender: str, client: int, mix: Tuple[float, float, int], commands, results
) -> None:
    """One client process: warm up, say ready, then run sections from the window's start to its end."""
    import logging

    from cloudshell.api.cloudshell_api import CloudShellAPISession

    from ..lock.errors import MutexTimeout
    from ..lock.mutex.mutex import ReservationMutex
    from ..lock.options import LOGGER_NAME
    from ..lock.rw.rwlock import ReservationRWLock

    # A timeout at the window's end is how a run ends, not news.
    logging.getLogger(LOGGER_NAME).addHandler(logging.NullHandler())
    logging.getLogger(LOGGER_NAME).propagate = False
    read_fraction, hold, seed = mix
    report: Dict[str, Any] = {"client": client, "reads": 0, "writes": 0, "calls": 0, "error": None}
    try:
        host, port, user, password, domain = address
        api = CloudShellAPISession(host, user, password, domain, port=port)
        with ReservationMutex(api, rid, owner="warm-up", name=f"WARMUP{client}"):
            pass  # the once-per-process catalog learning is not measured
        results.put(("ready", client))
        start, end = commands.get(timeout=STARTUP_TIMEOUT)
        rng = random.Random(f"{seed}:{client}")
        rw = ReservationRWLock(api, rid, owner=f"mix client {client}", timeout=None)
        time.sleep(max(0.0, start - time.monotonic()))
        while time.monotonic() < end:
            read = rng.random() < read_fraction
            remaining = end - time.monotonic()
            if contender == "rwlock":
                lock: Any = rw.read() if read else rw.write()
            else:
                lock = ReservationMutex(api, rid, owner=f"mix client {client}", timeout=None)
            try:
                lock.acquire(timeout=max(0.0, remaining))
            except MutexTimeout:
                break
            try:
                time.sleep(hold)
            finally:
                lock.release()
                if contender == "mutex":
                    report["calls"] += lock.calls
            if time.monotonic() <= end:
                report["reads" if read else "writes"] += 1
        if contender == "rwlock":
            report["calls"] = rw.calls
    except BaseException as error:  # report, never hang the parent
        report["error"] = f"{type(error).__name__}: {error}"
    results.put(("report", report))


def run_mix(
    contender: str,
    clients: int = 8,
    read_fraction: float = 0.9,
    hold: float = 0.5,
    window: float = 30.0,
    latency: Optional[Dict[str, Any]] = None,
    seed: int = 0,
) -> MixResult:
    """One run of ``contender`` on a fresh emulator (the original package's model: no lease)."""
    emulator = Emulator(host="127.0.0.1", port=0, quali_port=0)
    emulator.start()
    try:
        emulator.add_service_model(protocol.SERVICE_MODEL, {protocol.ATTR_OWNER: ""})
        rid = emulator.create_reservation(f"rw mix {contender}")
        address = admin_address(emulator)
        ctx = multiprocessing.get_context("spawn")
        results = ctx.Queue()
        commands = [ctx.Queue() for _ in range(clients)]
        processes = [
            ctx.Process(
                target=mix_client,
                args=(address, rid, contender, i, (read_fraction, hold, seed), commands[i], results),
                daemon=True,
            )
            for i in range(clients)
        ]
        for process in processes:
            process.start()
        try:
            ready = [results.get(timeout=STARTUP_TIMEOUT) for _ in processes]
            if any(kind != "ready" for kind, _ in ready):
                raise RuntimeError(f"a client failed to start: {ready}")
            emulator.control.configure(latency=dict(LATENCY if latency is None else latency))
            start = time.monotonic() + LEAD_SECONDS
            for queue in commands:
                queue.put((start, start + window))
            reports = [results.get(timeout=window + STARTUP_TIMEOUT)[1] for _ in processes]
        finally:
            for process in processes:
                process.join(timeout=30)
                if process.is_alive():
                    process.kill()
        errors = [f"client {r['client']}: {r['error']}" for r in reports if r["error"]]
        if errors:
            raise RuntimeError("; ".join(errors))
        return MixResult(
            contender,
            clients,
            read_fraction,
            hold,
            window,
            sum(r["reads"] for r in reports),
            sum(r["writes"] for r in reports),
            sum(r["calls"] for r in reports),
        )
    finally:
        emulator.stop()


def table(results: Sequence[MixResult]) -> List[str]:
    """The results as a markdown table, each against the plain mutex of the same mix."""
    base = {(r.clients, r.read_fraction, r.hold): r.per_second for r in results if r.contender == "mutex"}
    lines = [
        "| lock | clients | reads | hold | sections/s | reads | writes | calls/section | vs mutex |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        reference = base.get((r.clients, r.read_fraction, r.hold))
        ratio = f"{r.per_second / reference:.2f}x" if reference else "-"
        lines.append(
            f"| {r.contender} | {r.clients} | {r.read_fraction:.0%} | {r.hold:g} s | {r.per_second:.2f} | "
            f"{r.reads} | {r.writes} | {r.calls_per_section:.1f} | {ratio} |"
        )
    return lines


def write_section(doc: Path, results: Sequence[MixResult], window: float) -> None:
    """Replace (or append) the mix's section of ``doc``."""
    latency = ", ".join(f"{k} {v}" for k, v in LATENCY.items())
    body = [
        MARK_START,
        "## Readers and writers: ReservationRWLock against the plain mutex",
        "",
        "`python -m cloudshell_mutex.bench.rwmix`: each client process runs sections back to back for",
        f"{window:g} s (reads with the given probability, else writes, each held `hold`); `mutex` takes the",
        "plain mutex for every section, `rwlock` the shared or the exclusive side. Emulator latency:",
        f"{latency}. One run per lock; writes wait behind readers, and readers behind a waiting writer.",
        "",
        *table(results),
        MARK_END,
    ]
    sections.write_section(doc, sections.RWMIX, "\n".join(body))


def main(argv: Optional[List[str]] = None) -> int:
    """Run both contenders on the mix; print the table; write it to ``--doc`` when given."""
    parser = argparse.ArgumentParser(
        prog="python -m cloudshell_mutex.bench.rwmix", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--clients", type=int, default=8, help="client processes (default 8)")
    parser.add_argument(
        "--reads", default="0.9", help="the share of reads, 0..1; several separated by commas (default 0.9)"
    )
    parser.add_argument("--hold", type=float, default=0.5, help="seconds each section is held (default 0.5)")
    parser.add_argument("--window", type=float, default=30.0, help="seconds measured per lock (default 30)")
    parser.add_argument("--doc", type=Path, default=None, help="write the table into this markdown file")
    parser.add_argument("--seed", type=int, default=0, help="seed of the read/write choices")
    args = parser.parse_args(argv)
    try:
        shares = [float(value) for value in args.reads.split(",") if value.strip()]
    except ValueError:
        shares = []
    if (
        args.clients < 1
        or not shares
        or not all(0 <= r <= 1 for r in shares)
        or args.hold <= 0
        or args.window <= 0
    ):
        parser.error(
            "--clients >= 1, --reads numbers from 0 to 1 (e.g. 0.9,0.5), --hold > 0 and --window > 0"
        )
    results = []
    for reads in shares:
        for name in CONTENDERS:
            print(
                f"{name}: {args.clients} clients, {reads:.0%} reads, hold {args.hold:g} s, {args.window:g} s"
            )
            results.append(run_mix(name, args.clients, reads, args.hold, args.window, seed=args.seed))
    print("\n".join(table(results)))
    if args.doc is not None:
        write_section(args.doc, results, args.window)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
