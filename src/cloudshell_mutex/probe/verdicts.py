"""What a probe run's observations mean for the lock: one fact each, its verdict, the settings that fit.

A verdict is ``safe``, ``safe with a setting`` (the setting is named), ``not safe``, or ``not measured``.
Each fact also names the emulator setting that answers its question the same way, so that drivers can be
tested against an emulator that behaves like the site's server (``cloudshell-mutex emulator ...``). The words
here are the ones docs/protocol.md uses for each server behaviour.
"""

from __future__ import annotations

import math
import statistics
import textwrap
from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple

from ..lock.options import FRESH_READ_LAG
from ..lock.server.classify import CLIENT_RETRY_DELAY
from .run import DEFAULT_REQUEST_LIFETIME, Observations, ProbeSettings

SAFE, SETTING, NOT_SAFE, UNMEASURED = "safe", "safe with a setting", "not safe", "not measured"
#: The exit code of each verdict, and which one wins when facts differ (the first in this order).
EXIT_CODES = {NOT_SAFE: 1, UNMEASURED: 4, SETTING: 3, SAFE: 0}

#: A request may be held at least as long as the slowest call took: the lifetime covers it this many times
#: over, plus the client's own re-sends (3 s), and never less than the library's default.
LIFETIME_FACTOR = 4
#: A heartbeat (a read and a write) must fit into the lease's margin (lease/4) this many times over.
LEASE_FACTOR = 16


@dataclass(frozen=True)
class Fact:
    """One question about the server: what was seen, the verdict, what it means for the lock, and the lock
    setting (``settings``) and emulator setting (``emulator``) it leads to."""

    key: str
    name: str
    seen: str
    verdict: str
    meaning: str
    settings: Dict[str, str] = field(default_factory=dict)
    emulator: Dict[str, str] = field(default_factory=dict)


@dataclass
class ProbeReport:
    """The facts of one run, the settings they recommend, and what the run cost."""

    where: str
    observations: Observations
    facts: List[Fact]

    @property
    def verdict(self) -> str:
        """The verdict on the server as a whole: the worst of the facts' (see :data:`EXIT_CODES`)."""
        return next(v for v in EXIT_CODES if any(f.verdict == v for f in self.facts) or v == SAFE)

    @property
    def exit_code(self) -> int:
        """0 safe, 3 safe with the recommended settings, 4 not everything measured, 1 not safe."""
        return EXIT_CODES[self.verdict]

    def settings(self) -> Dict[str, str]:
        """The recommended lock settings (and actions), merged over the facts."""
        merged: Dict[str, str] = {}
        for fact in self.facts:
            merged.update(fact.settings)
        return merged

    def emulator(self) -> Dict[str, str]:
        """The emulator settings that answer like this server."""
        merged: Dict[str, str] = {}
        for fact in self.facts:
            merged.update(fact.emulator)
        return merged

    def emulator_command(self) -> str:
        """``cloudshell-mutex emulator`` with the options that make it answer like this server."""
        options = " ".join(
            f"--{name.replace('_', '-')} {value}" for name, value in sorted(self.emulator().items())
        )
        return f"cloudshell-mutex emulator {options}".strip()

    def as_dict(self) -> Dict[str, Any]:
        """The ``--json`` output."""
        seen = self.observations
        return {
            "where": self.where,
            "run": seen.run,
            "reservation_id": seen.reservation_id,
            "own_sandbox": seen.own_sandbox,
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "facts": [
                {"key": f.key, "fact": f.name, "seen": f.seen, "verdict": f.verdict, "meaning": f.meaning}
                for f in self.facts
            ],
            "settings": self.settings(),
            "emulator": self.emulator(),
            "calls": seen.log.count(),
            "seconds": round(seen.seconds, 2),
            "left_behind": list(seen.left_behind),
            "interrupted": seen.interrupted,
        }

    def lines(self, width: int = 110) -> List[str]:
        """The report as a table for people."""
        seen = self.observations
        sandbox = "a sandbox of its own" if seen.own_sandbox else "sandbox"
        lines = [
            f"cloudshell-mutex probe of {self.where}: run {seen.run}, {sandbox} {seen.reservation_id}, "
            f"{seen.log.count()} calls in {seen.seconds:.1f} s",
            "",
        ]
        columns = (22, 40, width - 22 - 40 - 4)
        lines += _row(("FACT", "SEEN", "FOR THE LOCK"), columns)
        for fact in self.facts:
            lines += _row((fact.name, fact.seen, f"{fact.verdict.upper()}: {fact.meaning}"), columns)
        settings = self.settings()
        lines.append("")
        lines.append(
            "Recommended settings: " + (", ".join(f"{k}={v}" for k, v in settings.items()) or "none")
        )
        lines.append(f"An emulator that answers like this server: {self.emulator_command()}")
        if seen.left_behind:
            lines.append("LEFT BEHIND: " + "; ".join(seen.left_behind))
        else:
            lines.append(
                "Nothing was left behind" + (" (the probe's sandbox is ended)." if seen.own_sandbox else ".")
            )
        lines.append(f"Verdict: {_VERDICT_LINES[self.verdict]}")
        return lines


_VERDICT_LINES = {
    SAFE: "the lock is safe on this server as it is configured (exit 0).",
    SETTING: "the lock is safe on this server with the recommended settings (exit 3).",
    UNMEASURED: "not every fact could be measured: see the table, then run the probe again (exit 4).",
    NOT_SAFE: "the lock is NOT safe on this server: see the facts marked NOT SAFE (exit 1).",
}


def _row(cells: Tuple[str, str, str], widths: Tuple[int, int, int]) -> List[str]:
    wrapped = [textwrap.wrap(cell, width) or [""] for cell, width in zip(cells, widths)]
    height = max(len(column) for column in wrapped)
    return [
        "  ".join(
            (column[i] if i < len(column) else "").ljust(width) for column, width in zip(wrapped, widths)
        ).rstrip()
        for i in range(height)
    ]


def _seconds(value: float) -> str:
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.1f} s"


# ---------------------------------------------------------------- the facts


def judge(observations: Observations, settings: ProbeSettings, where: str) -> ProbeReport:
    """The report of one run."""
    seen = observations
    facts = [_model(seen)]
    if seen.model is not None and seen.model.has_owner:
        facts += [
            _contention(seen),
            _atomic(seen),
            _fresh_read(seen),
            _cached_read(seen),
            _case(seen),
            _remove(seen),
            _tilde(seen),
            _roles(seen),
        ]
    facts += [_lifetime(seen, settings), _latency(seen, settings)]
    if seen.own_sandbox:
        facts.append(_ended(seen))
    return ProbeReport(where, seen, facts)


def _unmeasured(seen: Observations, key: str, name: str, check: str = "") -> Fact:
    """The fact ``key`` whose check (``check``, default the same key) did not measure it."""
    why = seen.failures.get(check or key) or ("interrupted" if seen.interrupted else "not run")
    return Fact(key, name, f"not measured: {why}", UNMEASURED, "run the probe again")


def _model(seen: Observations) -> Fact:
    name = "Mutex Service model"
    model = seen.model
    if model is None:
        return _unmeasured(seen, "model", name)
    if model.kind == "lease":
        return Fact(
            "model",
            name,
            "our package: Mutex Owner, Mutex Label, the lease attributes",
            SAFE,
            "leases: waiters break a holder that crashed",
        )
    if model.kind == "owner":
        return Fact(
            "model",
            name,
            "the original package: Mutex Owner only",
            SETTING,
            "no leases: a holder that crashes keeps the lock until Force Release; import ours over it",
            settings={"package": "cloudshell-mutex install"},
        )
    refused = "; ".join(str(a) for a in model.refusals[-1:])
    if model.kind == "none":
        return Fact(
            "model",
            name,
            f"a Mutex Service without Mutex Owner ({refused})",
            NOT_SAFE,
            "the lock refuses to run (MutexNotInstalled); importing this package over it is safe",
            settings={"package": "cloudshell-mutex install"},
        )
    return Fact(
        "model",
        name,
        f"no Mutex Service model ({refused})",
        NOT_SAFE,
        "nothing can be locked: import Mutex_Package.zip (cloudshell-mutex install); the other facts need it",
        settings={"package": "cloudshell-mutex install"},
    )


def _contention(seen: Observations) -> Fact:
    name = "Add of a taken alias"
    check = seen.duplicate
    if check is None:
        return _unmeasured(seen, "contention", name)
    if check.ok:
        return Fact(
            "contention",
            name,
            "code 100 'already exists'; the first service untouched",
            SAFE,
            "the lock tells 'busy' from a failure",
        )
    if not check.answer.contention:
        return Fact(
            "contention",
            name,
            f"{check.answer}",
            NOT_SAFE,
            "the lock takes only code 100 'already exists' for 'busy': it cannot wait for a holder",
        )
    return Fact(
        "contention",
        name,
        f"the loser's add changed the owner to {check.owner_after!r}",
        NOT_SAFE,
        "a refused add must change nothing",
    )


def _atomic(seen: Observations) -> Fact:
    name = "Concurrent adds of one alias"
    race = seen.race
    if race is None:
        return _unmeasured(seen, "atomic", name)
    shape = f"{race.rounds} rounds of {race.racers} adds at once"
    emulator = {"add_atomicity": "atomic" if race.atomic else "racy"}
    if not race.atomic:
        bad = len({r for r, _ in race.double_grants} | {r for r, _, _ in race.mismatches})
        return Fact(
            "atomic",
            name,
            f"{bad} of {shape} had more than one winner",
            NOT_SAFE,
            "two holders at once: the protocol rests on an atomic add, and no setting makes up for it",
            emulator=emulator,
        )
    if race.unjudged and len(race.unjudged) == race.rounds:
        return _unmeasured(seen, "atomic", name)
    note = f" ({len(race.unexpected)} other refusals)" if race.unexpected else ""
    return Fact(
        "atomic",
        name,
        f"one winner in each of {shape}{note}",
        SAFE,
        "one holder at a time (evidence for this load; `make test-live` races processes for longer)",
        emulator=emulator,
    )


def _fresh_read(seen: Observations) -> Fact:
    name = "Fresh reads (disableCache)"
    reads = seen.reads
    if reads is None:
        return _unmeasured(seen, "fresh_read", name)
    if reads.fresh_lag is None or reads.removal_lag is None:
        change = "an add" if reads.fresh_lag is None else "a remove"
        return Fact(
            "fresh_read",
            name,
            f"{change} not shown within {reads.max_wait:g} s",
            NOT_SAFE,
            f"the lock assumes a fresh read shows a change within {FRESH_READ_LAG:g} s",
            emulator={"disable_cache": "ignored"},
        )
    lag = max(reads.fresh_lag, reads.removal_lag)
    if reads.owner == "" or reads.model == "":
        return Fact(
            "fresh_read",
            name,
            "the add shown without its Mutex Owner",
            NOT_SAFE,
            "the lock reads the owner of a lock from its Mutex Owner",
        )
    if lag == 0:
        return Fact(
            "fresh_read",
            name,
            "each add and remove shown by the next read",
            SAFE,
            "the lock decides on fresh reads only",
            emulator={"disable_cache": "honored"},
        )
    if lag <= FRESH_READ_LAG:
        return Fact(
            "fresh_read",
            name,
            f"changes shown after {_seconds(lag)}",
            SAFE,
            f"within the {FRESH_READ_LAG:g} s the lock allows: it reads again before calling a lock lost",
            emulator={"disable_cache": "ignored"},
        )
    return Fact(
        "fresh_read",
        name,
        f"changes shown after {_seconds(lag)}",
        NOT_SAFE,
        f"more than the {FRESH_READ_LAG:g} s the lock allows: a release can call its lock lost and leave it "
        "behind, and an add the lock gave up on can land unseen",
        emulator={"disable_cache": "ignored"},
    )


def _cached_read(seen: Observations) -> Fact:
    name = "Cached reads"
    reads = seen.reads
    if reads is None or not reads.cached_measured:
        return _unmeasured(seen, "cached_read", name, "fresh_read")
    if reads.cached_lag is None:
        shown = f"an add not shown within {reads.max_wait:g} s"
        cache = f"{reads.max_wait:g}"
    elif reads.cached_lag == 0:
        shown, cache = "each add shown by the next read", "0"
    else:
        shown, cache = f"an add shown after {_seconds(reads.cached_lag)}", f"{math.ceil(reads.cached_lag):g}"
    return Fact(
        "cached_read",
        name,
        shown,
        SAFE,
        "the lock never decides on a cached read (the original v2 snippet does, and stalls on it)",
        emulator={"details_cache_seconds": cache},
    )


def _case(seen: Observations) -> Fact:
    name = "Letter case of aliases"
    case = seen.case
    if case is None:
        return _unmeasured(seen, "case", name)
    if case.kind == "exact":
        return Fact(
            "case",
            name,
            "CONFIG and config are two aliases",
            SAFE,
            "two spellings are two locks: use one spelling of a lock's name everywhere",
            emulator={"alias_case": "exact"},
        )
    if case.kind == "insensitive":
        return Fact(
            "case",
            name,
            "CONFIG and config are one alias",
            SAFE,
            "a waiter refused while a read shows only another spelling raises MutexUsageError at once",
            emulator={"alias_case": "insensitive"},
        )
    return Fact(
        "case",
        name,
        f"the other spelling's add was {case.answer}",
        UNMEASURED,
        "neither answer the lock knows; run the probe again",
    )


def _remove(seen: Observations) -> Fact:
    name = "Remove of a missing alias"
    removes = seen.removes
    if removes is None:
        return _unmeasured(seen, "remove", name)
    kind = removes.kind
    alone = "fails" if not removes.missing_alone.ok else "succeeds"
    words = {
        "refuse_all": "next to one that is there: fails, removes nothing",
        "remove_found": "next to one that is there: removes that one, then fails",
        "ignore": "next to one that is there: removes that one, succeeds",
    }
    if kind == "other":
        return Fact(
            "remove",
            name,
            f"alone {alone}; next to one that is there: succeeds, removes nothing",
            NOT_SAFE,
            "a remove that removes nothing and says it did: a release cannot be trusted",
        )
    meaning = "the lock settles a failed remove with a fresh read, whatever it removed"
    if removes.missing_alone.ok:
        meaning += "; a lock taken from its holder just before its remove is not reported lost"
    return Fact(
        "remove", name, f"alone {alone}; {words[kind]}", SAFE, meaning, emulator={"remove_missing": kind}
    )


def _tilde(seen: Observations) -> Fact:
    name = "Aliases with ~"
    derived = seen.derived
    if derived is None:
        return _unmeasured(seen, "tilde", name)
    if derived.answer.ok:
        return Fact(
            "tilde",
            name,
            f"{derived.alias.rsplit('-', 1)[-1]} accepted",
            SAFE,
            "queue tickets, reader slots, breakers and markers work",
            emulator={"tilde_aliases": "accepted"},
        )
    return Fact(
        "tilde",
        name,
        f"refused ({derived.answer.code}: {derived.answer.message})",
        SETTING,
        "no queue (waiters poll), no deadlock detection, no stale-holder breaks, no read-write lock: set "
        "fair=False and lease=0 (a crashed holder then needs Force Release)",
        settings={"fair": "False", "lease": "0"},
        emulator={"tilde_aliases": "refused"},
    )


def _roles(seen: Observations) -> Fact:
    name = "User roles (Force Release)"
    roles = seen.roles
    if roles is None:
        return _unmeasured(seen, "roles", name)
    allowed = "may" if roles.permission.allowed else "may not"
    if roles.roles:
        return Fact(
            "roles",
            name,
            f"{roles.groups} group(s) with roles; this user {allowed} force-release",
            SAFE,
            "Force Release: system administrators and domain administrators of the sandbox's domain",
            emulator={"user_groups": "listed"},
        )
    return Fact(
        "roles",
        name,
        f"no groups or roles listed; this user {allowed} force-release",
        SAFE,
        "Force Release: system administrators only (a domain administrator's role cannot be seen, so "
        "it is refused)",
        emulator={"user_groups": "omitted"},
    )


def _longest(seen: Observations) -> Tuple[float, str]:
    latencies = seen.log.latencies()
    longest = max(latencies, default=0.0)
    late = max(seen.late_landings, default=0.0)
    if late > longest:
        return late, f"an add that got no answer landed {_seconds(late)} after it was sent"
    return longest, f"the slowest of {len(latencies)} calls took {_seconds(longest)}"


def recommended_lifetime(longest: float) -> float:
    """The request lifetime that covers a request held ``longest`` seconds (never below the default)."""
    return max(DEFAULT_REQUEST_LIFETIME, float(math.ceil(LIFETIME_FACTOR * longest + 3)))


def _lifetime(seen: Observations, settings: ProbeSettings) -> Fact:
    name = "How long requests are held"
    longest, shown = _longest(seen)
    if seen.never_landed:
        shown += f"; {seen.never_landed} add(s) that got no answer never showed"
    wanted = recommended_lifetime(longest)
    if settings.request_lifetime >= wanted:
        return Fact(
            "lifetime",
            name,
            shown,
            SAFE,
            f"request_lifetime {settings.request_lifetime:g} s covers it (the lock waits that long for an "
            "unanswered request before it acts as if it never lands)",
        )
    return Fact(
        "lifetime",
        name,
        shown,
        SETTING,
        f"request_lifetime {settings.request_lifetime:g} s is too short: a remove the lock stopped waiting "
        "for could delete a successor's lock",
        settings={"request_lifetime": f"{wanted:g}"},
    )


def _latency(seen: Observations, settings: ProbeSettings) -> Fact:
    name = "Call latency"
    latencies = seen.log.latencies()
    if not latencies:
        return _unmeasured(seen, "latency", name)
    median, longest = statistics.median(latencies), max(latencies)
    shown = f"median {_seconds(median)}, slowest {_seconds(longest)} ({len(latencies)} calls)"
    meaning = []
    if median >= CLIENT_RETRY_DELAY:
        meaning.append(
            f"a call of {CLIENT_RETRY_DELAY:g} s or more may hide a re-send: a contended add is followed by "
            "a read (more calls, still safe)"
        )
    lease = float(math.ceil(LEASE_FACTOR * longest))
    if settings.lease > 0 and lease > settings.lease:
        return Fact(
            "latency",
            name,
            shown,
            SETTING,
            f"a heartbeat (a read and a write) must fit into the lease's margin (lease/4) with room: "
            f"lease {settings.lease:g} s is too short",
            settings={"lease": f"{lease:g}"},
        )
    meaning.append("the pacing's delays and the lease's heartbeats fit")
    return Fact("latency", name, shown, SAFE, "; ".join(meaning))


def _ended(seen: Observations) -> Fact:
    name = "An ended sandbox"
    ended = seen.ended
    if ended is None:
        return _unmeasured(seen, "ended", name)
    add = "refuses an add" if not ended.add.ok else "still takes an add"
    if ended.status_refused is not None:
        return Fact(
            "ended",
            name,
            f"refuses the status read; {add}",
            SAFE,
            "a lock on it fails at once: 'cannot be locked'",
            emulator={"ended_reservations": "closed"},
        )
    if ended.completed:
        return Fact(
            "ended",
            name,
            f"says Completed; {add}",
            SAFE,
            "a lock on it fails at once with ReservationNotActive",
            emulator={"ended_reservations": "readable"},
        )
    statuses = ", ".join(ended.statuses) or "nothing"
    return Fact(
        "ended",
        name,
        f"said {statuses}, not Completed; {add}",
        SAFE,
        "a lock on it fails, with a less precise message",
    )
