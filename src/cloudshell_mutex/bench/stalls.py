"""Stalls: what a dead, slow or unlucky party costs the others, the default lock against plain polling.

``python -m cloudshell_mutex.bench.stalls [--scenarios NAMES] [--repeats 2] [--seed 0] [--scale 1]``
``[--doc FILE]``

Each scenario runs once per repeat for each contender (the default lock, then ``fair=False``) on a fresh
embedded emulator (the main benchmark's latency, the Mutex Service model with the lease attributes), with
the same seed for both: every client is a spawned process with its own ``CloudShellAPISession``, and the
processes that die are killed for real (``Process.kill``). The scenarios (:data:`SCENARIOS`):

* ``dead-holder-and-head``: one execution server dies: the holder of a long hold and the first waiter in
  line (the lowest queue ticket; plain polling's first waiter) are killed together; lease 6 s. Figure: the
  seconds from the kill to the next grant (lower is better).
* ``dead-holder-hinted``: three clients hold 8 s each, back to back, so their waiters learn the hold time;
  the holder of the third grant is killed 0.5 s into its hold; lease 4 s. Figure: seconds to the next grant.
* ``dead-waiters``: 12 clients, holds of 0.1 s back to back; 4 of them are killed while they wait. Figure:
  the survivors' grants per minute in the 30 s after the kill (higher is better).
* ``dead-ticket``: 6 clients, holds of 0.1 s back to back; the queue ticket of a waiter that died lands at
  the head of the line (an add that arrived after its process exited). Figure: grants per minute in the
  30 s after.
* ``slow-client``: 8 clients, holds of 0.1 s back to back; every call of one of them takes 0.7 s longer (a
  slow link). Figure: grants per minute over 45 s.
* ``bimodal``: 6 clients back to back, holds of 2 s (70 %) or 10 ms. Figure: grants per minute over 60 s.

The verdict for each scenario holds the default to plain polling's figure of the same repeat: seconds at most
:data:`RECOVERY_SLACK` more, grants per minute at least :data:`THROUGHPUT_SHARE` of plain polling's. It is
"met" or "missed" when every repeat says so, else "not judged". With ``--doc``, the table replaces the
section between ``<!-- stalls:start -->`` markers in that file (or is appended).
"""

from __future__ import annotations

import argparse
import multiprocessing
import queue
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..emulator import Emulator
from ..lock import protocol
from . import sections
from .plans import LATENCY
from .worker import Address, admin_address

MARK_START, MARK_END = sections.STALLS
CONTENDERS = ("default", "plain")
STARTUP_TIMEOUT = 180.0
LEAD_SECONDS = 1.0
#: A request sent by a client just killed lands within this many seconds: many times the median of the
#: bench's LATENCY (a run with a slower latency needs a longer wait).
IN_FLIGHT_SECONDS = 1.0
#: The dead-ticket scenario tries this long to place its ticket ahead of every waiter (the run's windows
#: leave 5 s after the measured one).
PLACING_SECONDS = 3.0
#: The default may recover this many seconds later than plain polling and still meet the target ("a fraction
#: of a second more than a dead plain waiter"), and must keep this share of plain polling's grants/min.
RECOVERY_SLACK = 0.5
THROUGHPUT_SHARE = 0.95
#: The API methods the lock calls: the slow client's session delays each of them.
LOCK_METHODS = (
    "AddServiceToReservation",
    "GetReservationDetails",
    "RemoveServicesFromReservation",
    "SetServiceAttributesValues",
)
_CLIENT = re.compile(r"^stall-client-(\d+)@")


@dataclass(frozen=True)
class ClientPlan:
    """What one client does: from ``offset`` seconds after the run opens, takes the lock (``fair`` or not,
    with a lease of ``lease`` s) for a hold drawn from ``holds`` ((share, seconds) pairs), again at once after
    each release, ``sections`` times (0: until the run ends); each of its calls ``slow`` seconds longer."""

    fair: bool
    lease: float
    holds: Tuple[Tuple[float, float], ...]
    offset: float = 0.0
    sections: int = 0
    slow: float = 0.0

    def hold(self, rng: random.Random) -> float:
        """The next hold, drawn from the shares."""
        pick, total = rng.random(), 0.0
        for share, seconds in self.holds:
            total += share
            if pick < total:
                return seconds
        return self.holds[-1][1]


@dataclass(frozen=True)
class Event:
    """A client's news: ``ready``, ``grant``, ``release``, ``done`` or ``error``, and when (monotonic)."""

    kind: str
    client: int
    at: float
    detail: str = ""


def _slowed(method: Callable[..., Any], seconds: float) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        time.sleep(seconds / 2)  # half on the way there, half on the way back: a slow link
        try:
            return method(*args, **kwargs)
        finally:
            time.sleep(seconds / 2)

    return call


def stall_client(
    address: Address, rid: str, client: int, plan: ClientPlan, seed: int, commands, events
) -> None:
    """One client process: warm up, say ready, then take and release the lock as ``plan`` says."""
    import logging

    from cloudshell.api.cloudshell_api import CloudShellAPISession

    from ..lock.errors import MutexTimeout
    from ..lock.mutex.mutex import ReservationMutex
    from ..lock.options import LOGGER_NAME

    # Breaks, timeouts and lost holds are what these runs provoke: not news on the console.
    logging.getLogger(LOGGER_NAME).addHandler(logging.NullHandler())
    logging.getLogger(LOGGER_NAME).propagate = False
    try:
        host, port, user, password, domain = address
        api = CloudShellAPISession(host, user, password, domain, port=port)
        with ReservationMutex(api, rid, owner="warm-up", name=f"WARMUP{client}", lease=plan.lease):
            pass  # the once-per-process catalog learning is not measured
        if plan.slow:
            for name in LOCK_METHODS:
                setattr(api, name, _slowed(getattr(api, name), plan.slow))
        events.put(Event("ready", client, time.monotonic()))
        start, end = commands.get(timeout=STARTUP_TIMEOUT)
        rng = random.Random(f"{seed}:{client}")
        time.sleep(max(0.0, start + plan.offset - time.monotonic()))
        done = 0
        while time.monotonic() < end and (not plan.sections or done < plan.sections):
            hold = plan.hold(rng)
            mutex = ReservationMutex(
                api,
                rid,
                owner=f"stall-client-{client}",
                timeout=max(0.0, end - time.monotonic()),
                lease=plan.lease,
                fair=plan.fair,
            )
            try:
                mutex.acquire()
            except MutexTimeout:
                break
            events.put(Event("grant", client, time.monotonic()))
            time.sleep(hold)
            mutex.release()
            events.put(Event("release", client, time.monotonic()))
            done += 1
        events.put(Event("done", client, time.monotonic()))
    except BaseException as error:  # report, never hang the parent
        events.put(Event("error", client, time.monotonic(), f"{type(error).__name__}: {error}"))


class Harness:
    """One run: an emulator, a reservation and one spawned process per :class:`ClientPlan`, and the events
    they report, kept in :attr:`events` as they arrive."""

    def __init__(self, plans: Sequence[ClientPlan], seed: int, latency: Optional[Dict[str, Any]] = None):
        self.plans = list(plans)
        self.seed = seed
        self.latency = dict(LATENCY if latency is None else latency)
        self.events: List[Event] = []
        self.killed: Dict[int, float] = {}
        self.emulator = Emulator(host="127.0.0.1", port=0, quali_port=0)
        self._processes: List[Any] = []

    def __enter__(self) -> Harness:
        emulator = self.emulator
        emulator.start()
        try:
            attributes = {protocol.ATTR_OWNER: "", **{name: "" for name in protocol.LEASE_ATTRIBUTES}}
            emulator.add_service_model(protocol.SERVICE_MODEL, attributes)
            self.rid = emulator.create_reservation("stalls")
            self.api = emulator.session()
            address = admin_address(emulator)
            ctx = multiprocessing.get_context("spawn")
            self._events = ctx.Queue()
            self._commands = [ctx.Queue() for _ in self.plans]
            for index, plan in enumerate(self.plans):
                args = (address, self.rid, index, plan, self.seed, self._commands[index], self._events)
                self._processes.append(ctx.Process(target=stall_client, args=args, daemon=True))
            for process in self._processes:
                process.start()
            for _ in self._processes:
                event = self._events.get(timeout=STARTUP_TIMEOUT)
                if event.kind != "ready":
                    raise RuntimeError(f"stall client {event.client} failed to start: {event.detail}")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        for process in self._processes:
            if process.is_alive():
                process.kill()
            process.join(timeout=30)
        self.emulator.stop()

    def open(self, window: float) -> float:
        """Set the latency; open the run ``LEAD_SECONDS`` from now for ``window`` s; return its start."""
        self.emulator.control.configure(latency=self.latency)
        self.start = time.monotonic() + LEAD_SECONDS
        for commands in self._commands:
            commands.put((self.start, self.start + window))
        return self.start

    def wait_for(self, wanted: Callable[[Event], bool], until: float) -> Optional[Event]:
        """Take in events until one is ``wanted`` (returned) or ``until`` (monotonic) passes (None). A
        client's error ends the run."""
        while True:
            left = until - time.monotonic()
            if left <= 0:
                return None
            try:
                event = self._events.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if event.kind == "error":
                raise RuntimeError(f"stall client {event.client}: {event.detail}")
            self.events.append(event)
            if wanted(event):
                return event

    def drain(self, until: float) -> None:
        """Take in every event until ``until``."""
        self.wait_for(lambda event: False, until)

    def kill(self, *clients: int) -> float:
        """Kill these clients' processes at once; return when."""
        at = time.monotonic()
        for client in clients:
            self._processes[client].kill()
            self.killed[client] = at
        for client in clients:
            self._processes[client].join(timeout=10)
        return at

    def holding(self) -> Dict[int, bool]:
        """Each client's state by its last event: True while it holds the lock."""
        state: Dict[int, bool] = {}
        for event in self.events:
            if event.kind in ("grant", "release"):
                state[event.client] = event.kind == "grant"
        return state

    def services(self) -> Dict[str, str]:
        """The reservation's services now: alias -> ``Mutex Owner`` (one uncached read, as the lock's own: the
        server may answer a plain read from a view seconds old)."""
        details = self.api.GetReservationDetails(self.rid, disableCache=True).ReservationDescription
        found: Dict[str, str] = {}
        for service in details.Services or []:
            owner = next((a.Value for a in service.Attributes or [] if a.Name == protocol.ATTR_OWNER), "")
            found[service.Alias] = owner or ""
        return found

    def holder(self) -> Optional[int]:
        """The client whose token MUTEX shows now, if any."""
        return client_of(self.services().get(protocol.DEFAULT_ALIAS, ""))

    def line(self) -> List[Tuple[int, Optional[int]]]:
        """The queue tickets now, lowest first: (number, the client whose ticket it is)."""
        tickets = []
        for alias, owner in self.services().items():
            number = protocol.ticket_number(alias, protocol.DEFAULT_ALIAS)
            if number is not None:
                tickets.append((number, client_of(owner)))
        return sorted(tickets)

    def grants(self, since: float, until: float, excluded: Sequence[int] = ()) -> int:
        """Grants reported in [since, until), by clients not ``excluded``."""
        return sum(
            1
            for event in self.events
            if event.kind == "grant" and since <= event.at < until and event.client not in excluded
        )


def client_of(owner: str) -> Optional[int]:
    """The stall client whose token (or ticket) ``owner`` is, if any."""
    match = _CLIENT.match(owner or "")
    return int(match.group(1)) if match else None


# ---------------------------------------------------------------- the scenarios


@dataclass(frozen=True)
class Outcome:
    """One contender's run of one scenario: its ``figure`` (seconds or grants/min) and what else it saw."""

    figure: float
    note: str = ""
    valid: bool = True  # False: the run went off its script (said in ``note``); it is not judged


@dataclass(frozen=True)
class Scenario:
    """A stall: what happens, what is measured (``unit``: "s" lower is better, "grants/min" higher), and the
    run itself (``fair``, ``seed``, ``scale`` of its windows) -> :class:`Outcome`."""

    name: str
    description: str
    unit: str
    run: Callable[[bool, int, float], Outcome]


def _survivor_grant(h: Harness, after: float, cap: float) -> Outcome:
    event = h.wait_for(
        lambda e: e.kind == "grant" and e.client not in h.killed and e.at >= after, after + cap
    )
    if event is None:
        return Outcome(cap, f"no grant within {cap:g} s", valid=False)
    return Outcome(event.at - after)


def dead_holder_and_head(fair: bool, seed: int, scale: float) -> Outcome:
    """The holder of a long hold and the first waiter in line die together (lease 6 s)."""
    lease = 6.0
    plans = [ClientPlan(fair, lease, ((1.0, 600.0),), sections=1)]
    plans += [ClientPlan(fair, lease, ((1.0, 0.5),), offset=0.5 * i, sections=1) for i in range(1, 5)]
    with Harness(plans, seed) as h:
        h.open(window=120.0)
        granted = h.wait_for(lambda e: e.kind == "grant" and e.client == 0, time.monotonic() + 30)
        if granted is None:
            return Outcome(0.0, "the job was not granted", valid=False)
        h.drain(granted.at + 8.0)  # every waiter has spun and, with the default, parked
        line = [client for _, client in h.line() if client is not None and client != 0]
        head = line[0] if line else 1
        killed_at = h.kill(0, head)
        outcome = _survivor_grant(h, killed_at, 60.0 * max(scale, 0.5))
        where = f"the head (client {head})" if line else "the first waiter"
        return Outcome(
            outcome.figure, f"{where} killed with the holder; {outcome.note}".strip("; "), outcome.valid
        )


def dead_holder_hinted(fair: bool, seed: int, scale: float) -> Outcome:
    """Holds of 8 s back to back are learned; the third grant's holder dies 0.5 s in (lease 4 s)."""
    lease, hold = 4.0, 8.0
    plans = [ClientPlan(fair, lease, ((1.0, hold),), offset=0.3 * i) for i in range(3)]
    with Harness(plans, seed) as h:
        h.open(window=90.0)
        grants: List[Event] = []

        def third(event: Event) -> bool:
            if event.kind == "grant":
                grants.append(event)
            return len(grants) >= 3

        victim = h.wait_for(third, time.monotonic() + 60)
        if victim is None:
            return Outcome(0.0, "fewer than 3 grants", valid=False)
        h.drain(victim.at + 0.5)
        killed_at = h.kill(victim.client)
        outcome = _survivor_grant(h, killed_at, 40.0)
        return Outcome(outcome.figure, outcome.note, outcome.valid)


def _throughput_after(h: Harness, event_at: float, window: float, note: str = "") -> Outcome:
    h.drain(event_at + window)
    excluded = tuple(h.killed)
    per_minute = h.grants(event_at, event_at + window, excluded) * 60.0 / window
    before = h.grants(h.start, event_at) * 60.0 / max(event_at - h.start, 1e-9)
    return Outcome(per_minute, f"{before:.0f}/min before{'; ' + note if note else ''}")


def _after_a_death(
    fair: bool, seed: int, scale: float, clients: int, death: Callable[[Harness], Tuple[float, str, bool]]
) -> Outcome:
    """``clients`` taking holds of 0.1 s back to back; 10 s in, ``death`` kills or leaves something dead
    (returning when, what, and whether the run went by its script); the grants/min in the 30 s after."""
    plans = [ClientPlan(fair, 6.0, ((1.0, 0.1),)) for _ in range(clients)]
    window = 30.0 * scale
    with Harness(plans, seed) as h:
        start = h.open(window=10.0 * scale + window + 5.0)
        h.drain(start + 10.0 * scale)
        at, note, valid = death(h)
        if not valid:
            return Outcome(0.0, note, valid=False)
        return _throughput_after(h, at, window, note)


def kill_waiters(h: Harness, seed: int, count: int = 4) -> Tuple[float, str, bool]:
    """Kill ``count`` clients that wait (drawn by ``seed``): when, what, and whether none was the holder."""
    # The clients' reports lag a grant: the server's holder, read last, narrows the window in which a
    # client granted a moment ago is taken for a waiter (the check after the kill still catches it).
    holding, holder_before = h.holding(), h.holder()
    waiting = [c for c in range(len(h.plans)) if not holding.get(c, False) and c != holder_before]
    victims = random.Random(seed).sample(waiting, count)
    killed_at = h.kill(*victims)
    # A request a victim sent before it died still lands (the server commits what it received): an add
    # on its way makes a dead holder, so the holder is read once such a request has landed.
    h.drain(killed_at + IN_FLIGHT_SECONDS)
    holder = h.holder()
    if holder in victims:
        return killed_at, f"the kill hit the holder (client {holder})", False
    return killed_at, f"killed clients {', '.join(map(str, sorted(victims)))}", True


def dead_waiters(fair: bool, seed: int, scale: float) -> Outcome:
    """12 clients, holds of 0.1 s back to back; 4 killed while they wait, 10 s in."""
    return _after_a_death(fair, seed, scale, 12, lambda h: kill_waiters(h, seed))


def dead_ticket(fair: bool, seed: int, scale: float) -> Outcome:
    """6 clients, holds of 0.1 s back to back; a dead waiter's ticket lands at the head, 10 s in."""
    from cloudshell.api.cloudshell_api import AttributeNameValue

    from ..lock.holder import make_token
    from ..lock.lease.lease import ticket_value
    from ..lock.queue.tickets import TICKET_LEASE

    def land_a_dead_ticket(h: Harness) -> Tuple[float, str, bool]:
        owner = ticket_value(make_token("a waiter that exited"), TICKET_LEASE, 0)
        until, error = time.monotonic() + PLACING_SECONDS, ""
        while time.monotonic() < until:
            # Below the lowest ticket, or the first number (0) of an empty line. With ticket 0 in line
            # there is no number below it yet; and a waiter may take the number first: look again.
            numbers = [number for number, _ in h.line()]
            if numbers and min(numbers) == 0:
                time.sleep(0.05)
                continue
            number = min(numbers) - 1 if numbers else 0
            alias = protocol.ticket_alias(protocol.DEFAULT_ALIAS, number)
            landed_at = time.monotonic()
            try:
                h.api.AddServiceToReservation(
                    h.rid, protocol.SERVICE_MODEL, alias, [AttributeNameValue(protocol.ATTR_OWNER, owner)]
                )
            except Exception as failure:
                error = f": {failure}"
                time.sleep(0.05)
                continue
            return landed_at, f"ticket {number} added before {len(numbers)} waiting", True
        note = f"the dead ticket found no place at the head in {PLACING_SECONDS:g} s{error}"
        return time.monotonic(), note, False

    return _after_a_death(fair, seed, scale, 6, land_a_dead_ticket)


def slow_client(fair: bool, seed: int, scale: float) -> Outcome:
    """8 clients, holds of 0.1 s back to back; each call of client 0 takes 0.7 s longer."""
    plans = [ClientPlan(fair, 6.0, ((1.0, 0.1),), slow=0.7 if i == 0 else 0.0) for i in range(8)]
    window = 45.0 * scale
    with Harness(plans, seed) as h:
        start = h.open(window=window + 5.0)
        h.drain(start + window)
        mine = h.grants(start, start + window) - h.grants(start, start + window, excluded=(0,))
        return Outcome(h.grants(start, start + window) * 60.0 / window, f"the slow client {mine}")


def bimodal(fair: bool, seed: int, scale: float) -> Outcome:
    """6 clients back to back, holds of 2 s (70 %) or 10 ms (30 %)."""
    plans = [ClientPlan(fair, 6.0, ((0.7, 2.0), (0.3, 0.01))) for _ in range(6)]
    window = 60.0 * scale
    with Harness(plans, seed) as h:
        start = h.open(window=window + 5.0)
        h.drain(start + window)
        return Outcome(h.grants(start, start + window) * 60.0 / window)


SECONDS, PER_MINUTE = "s", "grants/min"
SCENARIOS: Dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "dead-holder-and-head",
            "the holder of a long hold and the first waiter in line killed together (lease 6 s): "
            "seconds to the next grant",
            SECONDS,
            dead_holder_and_head,
        ),
        Scenario(
            "dead-holder-hinted",
            "3 clients hold 8 s back to back; the third grant's holder killed 0.5 s in (lease 4 s): "
            "seconds to the next grant",
            SECONDS,
            dead_holder_hinted,
        ),
        Scenario(
            "dead-waiters",
            "12 clients, holds of 0.1 s back to back; 4 killed while waiting: the survivors' grants/min "
            "in the 30 s after",
            PER_MINUTE,
            dead_waiters,
        ),
        Scenario(
            "dead-ticket",
            "6 clients, holds of 0.1 s back to back; a dead waiter's ticket lands at the head of the "
            "line: grants/min in the 30 s after",
            PER_MINUTE,
            dead_ticket,
        ),
        Scenario(
            "slow-client",
            "8 clients, holds of 0.1 s back to back; every call of one takes 0.7 s longer: grants/min",
            PER_MINUTE,
            slow_client,
        ),
        Scenario(
            "bimodal",
            "6 clients back to back, holds of 2 s (70 %) or 10 ms (30 %): grants/min",
            PER_MINUTE,
            bimodal,
        ),
    )
}


# ---------------------------------------------------------------- verdicts and the report


@dataclass
class ScenarioResult:
    """Every repeat of one scenario: the default's and plain polling's outcomes, repeat by repeat."""

    scenario: Scenario
    default: List[Outcome] = field(default_factory=list)
    plain: List[Outcome] = field(default_factory=list)

    def pairs(self) -> List[Tuple[Outcome, Outcome]]:
        """The repeats where both runs went by their script."""
        return [(d, p) for d, p in zip(self.default, self.plain) if d.valid and p.valid]

    def meets(self, default: Outcome, plain: Outcome) -> bool:
        """True when the default's figure meets the target against plain polling's of the same repeat."""
        if self.scenario.unit == SECONDS:
            return default.figure <= plain.figure + RECOVERY_SLACK
        return default.figure >= THROUGHPUT_SHARE * plain.figure

    def verdict(self) -> str:
        """ "met" or "missed" when every valid repeat says so, else "not judged"."""
        said = {self.meets(d, p) for d, p in self.pairs()}
        if said == {True}:
            return "met"
        if said == {False}:
            return "missed"
        return "not judged"


def _figures(outcomes: Sequence[Outcome], unit: str) -> str:
    shown = [f"{o.figure:.1f}" if o.valid else f"({o.note})" for o in outcomes]
    return ", ".join(shown) + (f" {unit}" if any(o.valid for o in outcomes) else "")


def table(results: Sequence[ScenarioResult]) -> List[str]:
    """The results as a markdown table: each repeat's figures, the default against plain polling."""
    lines = [
        "| stall | default (each repeat) | `fair=False` (each repeat) | target | verdict |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        unit = r.scenario.unit
        target = (
            f"<= `fair=False` + {RECOVERY_SLACK:g} s"
            if unit == SECONDS
            else f">= {THROUGHPUT_SHARE:g} x `fair=False`"
        )
        lines.append(
            f"| **{r.scenario.name}**: {r.scenario.description} | {_figures(r.default, unit)} | "
            f"{_figures(r.plain, unit)} | {target} | **{r.verdict()}** |"
        )
    return lines


def notes(results: Sequence[ScenarioResult]) -> List[str]:
    """What each run saw beside its figure."""
    lines = []
    for r in results:
        for name, outcomes in (("default", r.default), ("fair=False", r.plain)):
            for repeat, outcome in enumerate(outcomes, 1):
                if outcome.note:
                    lines.append(f"* {r.scenario.name}, {name}, repeat {repeat}: {outcome.note}")
    return lines


def write_section(doc: Path, results: Sequence[ScenarioResult], seed: int, scale: float) -> None:
    """Replace (or append) the stalls' section of ``doc``."""
    latency = ", ".join(f"{k} {v}" for k, v in LATENCY.items())
    repeats = max((len(r.default) for r in results), default=0)
    body = [
        MARK_START,
        "## Stalls: dead, slow and unlucky parties",
        "",
        "`python -m cloudshell_mutex.bench.stalls`: each scenario on a fresh emulator (latency: "
        f"{latency}; the Mutex Service model with the lease attributes), with the default lock and with "
        f"`fair=False`, the same seed for both (seed {seed}, {repeats} repeats"
        + (f", windows x {scale:g}" if scale != 1 else "")
        + "). Every client is its own process; the ones that die are killed. A verdict needs every repeat "
        "to agree.",
        "",
        *table(results),
        "",
        *notes(results),
        MARK_END,
    ]
    sections.write_section(doc, sections.STALLS, "\n".join(body))


def run(names: Sequence[str], repeats: int, seed: int, scale: float) -> List[ScenarioResult]:
    """Run each named scenario ``repeats`` times with both contenders (seed + repeat for both)."""
    results = []
    for name in names:
        result = ScenarioResult(SCENARIOS[name])
        for repeat in range(repeats):
            for contender, outcomes in (("default", result.default), ("plain", result.plain)):
                print(f"{name}, {contender}, repeat {repeat + 1} of {repeats}", flush=True)
                outcome = result.scenario.run(contender == "default", seed + repeat, scale)
                print(f"  {outcome.figure:.2f} {result.scenario.unit} {outcome.note}", flush=True)
                outcomes.append(outcome)
        results.append(result)
    return results


def main(argv: Optional[List[str]] = None) -> int:
    """Run the scenarios; print the table; write it to ``--doc`` when given."""
    parser = argparse.ArgumentParser(
        prog="python -m cloudshell_mutex.bench.stalls", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--scenarios",
        default=",".join(SCENARIOS),
        help=f"comma-separated (default all: {', '.join(SCENARIOS)})",
    )
    parser.add_argument("--repeats", type=int, default=2, help="runs per contender and scenario (default 2)")
    parser.add_argument("--seed", type=int, default=0, help="the first repeat's seed (default 0)")
    parser.add_argument(
        "--scale", type=float, default=1.0, help="multiplies the measuring windows (default 1)"
    )
    parser.add_argument("--doc", type=Path, default=None, help="write the table into this markdown file")
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.scenarios.split(",") if name.strip()]
    unknown = [name for name in names if name not in SCENARIOS]
    if unknown or not names or args.repeats < 1 or not 0 < args.scale <= 10:
        parser.error(
            f"--scenarios names from: {', '.join(SCENARIOS)} (unknown: {', '.join(unknown) or 'none'}); "
            "--repeats >= 1; --scale in (0, 10]"
        )
    results = run(names, args.repeats, args.seed, args.scale)
    print("\n".join(table(results)))
    if args.doc is not None:
        write_section(args.doc, results, args.seed, args.scale)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
