"""What a chaos run (:mod:`chaos_harness`) shows: sections by outcome, safety, the lock's states over time,
what each lost section waited for, the stalls, and the timeline of the worst one.

Everything is read from the workers' journals (sections, API calls, lock events, the lock's log at DEBUG) and
the server's event log and fault records, all on this machine's monotonic clock.

**The lock's state** at any moment, from the server's grants of ``MUTEX`` and the journals:

* ``free``: no ``MUTEX``;
* ``granted, not yet known``: the server granted an acquisition whose ``acquire()`` has not returned (an add
  whose answer was lost, settled by a later read);
* ``held: body``: from the acquire's return to the release call;
* ``held: releasing``: from the release call to the server's removal (a release that waits for a remove of
  its own that got no answer);
* ``held: left by an ended acquisition``: a grant of an acquisition that had timed out (an add that landed
  after the acquire gave up), until its process's watcher removes it.

**A lost section's cause** is the state that covered most of its wait (a timeout's acquire call); a
``held: releasing`` one is named after the fault on the holder's remove (``reset_before_commit``: the remove
never lands, so the release waits out ``request_lifetime``).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import history

FREE = "free"
UNKNOWN_YET = "granted, not yet known"
BODY = "held: body"
RELEASING = "held: releasing"
LEFTOVER = "held: left by an ended acquisition"
FOREIGN = "held: token of no journaled acquisition"
#: A hold or a gap longer than this is a stall (a normal hold is a fraction of a second).
STALL_SECONDS = 5.0
#: Releases longer than this are listed.
SLOW_RELEASE = 5.0
#: A timeout while the lock was granted to others at least this many times lost the races (or its turn).
RACES = 3
OTHERS_WON = "others were granted the lock meanwhile"


@dataclass
class Worker:
    """One worker's journal, sorted by kind."""

    index: int
    sections: List[Dict[str, Any]] = field(default_factory=list)
    calls: List[Dict[str, Any]] = field(default_factory=list)
    events: List[Dict[str, Any]] = field(default_factory=list)
    logs: List[Dict[str, Any]] = field(default_factory=list)
    end: Optional[Dict[str, Any]] = None
    lock_src: str = ""


def read_workers(folder: Path, count: int) -> List[Worker]:
    """Every worker's journal."""
    workers = []
    for index in range(count):
        worker = Worker(index)
        path = folder / f"worker-{index}.jsonl"
        for line in path.read_text().splitlines() if path.exists() else []:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            kind = entry["t"]
            if kind == "sec":
                worker.sections.append(entry)
            elif kind == "call":
                worker.calls.append(entry)
            elif kind == "ev":
                worker.events.append(entry)
            elif kind == "log":
                worker.logs.append(entry)
            elif kind == "end":
                worker.end = entry
            elif kind == "start":
                worker.lock_src = entry.get("lock_src", "")
        workers.append(worker)
    return workers


@dataclass(frozen=True)
class Span:
    """The lock in one state from ``start`` to ``end``; ``grant`` is the index of the server's grant (None:
    free), ``worker``/``section`` the acquisition it belongs to."""

    start: float
    end: float
    state: str
    grant: Optional[int] = None
    worker: Optional[int] = None
    section: Optional[Dict[str, Any]] = None


def lock_states(grants: List[history.Grant], workers: List[Worker], until: float) -> List[Span]:
    """The lock's states from the first grant to ``until`` (see the module docstring)."""
    sections: Dict[str, Tuple[int, Dict[str, Any]]] = {}
    tried: Dict[str, int] = {}  # tokens of acquisitions that never returned (events carry them)
    for worker in workers:
        for section in worker.sections:
            if section.get("token"):
                sections[section["token"]] = (worker.index, section)
        for event in worker.events:
            if event.get("token"):
                tried.setdefault(event["token"], worker.index)
    spans: List[Span] = []
    previous_end: Optional[float] = None
    for number, (token, added, removed, _) in enumerate(grants):
        end = removed if removed is not None else until
        if previous_end is not None and added > previous_end:
            spans.append(Span(previous_end, added, FREE))
        previous_end = end
        if token in sections:
            index, section = sections[token]
            marks = [added, section["acquired"], section.get("releasing", end), end]
            states = [UNKNOWN_YET, BODY, RELEASING]
            for (a, b), state in zip(zip(marks, marks[1:]), states):
                a, b = max(a, added), min(b, end)
                if b > a:
                    spans.append(Span(a, b, state, number, index, section))
        else:
            spans.append(Span(added, end, LEFTOVER if token in tried else FOREIGN, number, tried.get(token)))
    if previous_end is not None and previous_end < until:
        spans.append(Span(previous_end, until, FREE))
    return spans


Faults = Dict[Tuple[int, int], List[Dict[str, Any]]]


def match_faults(workers: List[Worker], injected: List[Dict[str, Any]]) -> Faults:
    """The faults each call met: (worker, index of the call in its journal) -> fault records. A fault is the
    caller's (its record names the user), and its request arrived during the call (re-sends: several)."""
    by_user: Dict[str, List[Dict[str, Any]]] = defaultdict(list)
    for record in injected:
        by_user[record.get("user", "")].append(record)
    found: Faults = defaultdict(list)
    for worker in workers:
        pending = sorted(by_user.get(f"chaos{worker.index}", []), key=lambda r: r["monotonic"])
        for record in pending:
            at = record["monotonic"]
            near = [
                (
                    0.0 if call["s"] <= at <= call["e"] else min(abs(at - call["s"]), abs(at - call["e"])),
                    number,
                )
                for number, call in enumerate(worker.calls)
                if call["m"] == record["method"] and call["s"] - 0.05 <= at <= call["e"] + 0.05
            ]
            if near:  # the call it arrived during, else the nearest one
                found[(worker.index, min(near)[1])].append(record)
    return found


def remove_fault(worker: Worker, section: Dict[str, Any], faults: Faults) -> str:
    """What happened to the removes of the lock in ``section``'s release (not of its marker or ticket alone):
    the fault each met, or its answer, in order."""
    start, end = section.get("releasing", 0.0), section.get("end", float("inf"))
    kinds = []
    for number, call in enumerate(worker.calls):
        aliases = call.get("a") or []
        if (
            call["m"] == "RemoveServicesFromReservation"
            and aliases[:1] == ["MUTEX"]
            and start <= call["s"] <= end
        ):
            met = [f["kind"] for f in faults.get((worker.index, number), [])]
            kinds.append("+".join(met) if met else ("ok" if call["r"] == "ok" else call["r"].split(":")[0]))
    return ", then ".join(kinds) or "no remove"


def _overlap(a: float, b: float, c: float, d: float) -> float:
    return max(0.0, min(b, d) - max(a, c))


def causes(spans: List[Span], workers: List[Worker], faults: Faults) -> Dict[str, Any]:
    """Each lost section's cause: the state that covered most of its wait; a release named by its remove."""
    by_cause: Counter = Counter()
    named = unnamed = 0
    granted: Dict[int, float] = {}  # each grant's time
    for span in spans:
        if span.grant is not None:
            granted[span.grant] = min(span.start, granted.get(span.grant, span.start))
    details: List[str] = []
    for worker in workers:
        for section in worker.sections:
            if section["outcome"] == "ran":
                continue
            if section["outcome"] != "timeout":
                by_cause[f"{section['outcome']}: {section.get('error', '')[:80]}"] += 1
                continue
            a, b = section["start"], section["end"]
            share: Counter = Counter()
            for span in spans:
                share[_cause_of(span, workers, faults)] += _overlap(a, b, span.start, span.end)
            cause, longest = share.most_common(1)[0] if share else ("no grant seen", 0.0)
            moved = [grant for grant, at in granted.items() if a <= at <= b]
            if len(moved) >= RACES and longest < (b - a) / 2:
                cause = OTHERS_WON  # no state held it up: it lost the races, or waited its turn
            by_cause[cause] += 1
            # Whether it named the stall, for a timeout that came while a slow release still held the lock.
            stalled = any(
                s.state == RELEASING and s.start <= b <= s.end and s.end - s.start >= SLOW_RELEASE
                for s in spans
            )
            if stalled:
                if "is releasing it" in section.get("error", ""):
                    named += 1
                else:
                    unnamed += 1
                    details.append(
                        f"worker {worker.index} section {section['i']}: {section.get('error', '')[:300]}"
                    )
    return {
        "by_cause": dict(by_cause.most_common()),
        "timeouts_in_a_release_stall_naming_it": named,  # those that ended while a slow release held it
        "timeouts_in_a_release_stall_not_naming_it": unnamed,
        "unnamed_examples": details[:3],
    }


def _cause_of(span: Span, workers: List[Worker], faults: Faults) -> str:
    if span.state != RELEASING or span.worker is None or span.section is None:
        return span.state
    duration = span.end - span.start
    if duration < SLOW_RELEASE:
        return f"{RELEASING} (quick)"
    return f"{RELEASING} (remove: {remove_fault(workers[span.worker], span.section, faults)})"


def stalls(spans: List[Span], workers: List[Worker], faults: Faults) -> List[Dict]:
    """Holds and gaps longer than STALL_SECONDS, longest first: what each was."""
    merged: List[Dict[str, Any]] = []
    grants: Dict[int, List[Span]] = defaultdict(list)
    for span in spans:
        if span.grant is None:
            if span.end - span.start >= STALL_SECONDS:
                merged.append({"start": span.start, "end": span.end, "kind": FREE, "cause": FREE})
        else:
            grants[span.grant].append(span)
    for parts in grants.values():
        start, end = parts[0].start, parts[-1].end
        if end - start < STALL_SECONDS:
            continue
        longest = max(parts, key=lambda s: s.end - s.start)
        merged.append({"start": start, "end": end, "kind": "hold", "worker": parts[0].worker,
                       "cause": _cause_of(longest, workers, faults),
                       "states": {p.state: round(p.end - p.start, 1) for p in parts}})  # fmt: skip
    merged.sort(key=lambda s: s["end"] - s["start"], reverse=True)
    for stall in merged:
        stall["seconds"] = round(stall["end"] - stall["start"], 1)
    return merged


def timeline(stall: Dict[str, Any], workers: List[Worker], events: List[Dict[str, Any]],
             faults: Faults, origin: float) -> List[str]:  # fmt: skip
    """The worst stall, line by line: the server's changes to the lock's services, the holder's calls (with
    the faults they met, repeated reads folded), its lock's log, and what the others did meanwhile."""
    a, b = stall["start"] - 1.0, stall["end"] + 1.0
    rows: List[Tuple[float, str]] = []
    for event in events:
        if (
            event["alias"].startswith("MUTEX")
            and a <= event["monotonic"] <= b
            and "~q~" not in event["alias"]
        ):
            owner = event["attributes"].get("Mutex Owner", "")
            late = " (late)" if event.get("late") else ""
            rows.append((event["monotonic"], f"server: {event['op']} {event['alias']} {owner}{late}"))
    tickets = [e for e in events if "~q~" in e["alias"] and a <= e["monotonic"] <= b]
    if tickets:
        rows.append((a, f"server: {len(tickets)} queue ticket changes in this window (not listed)"))
    holder = stall.get("worker")
    for worker in workers:
        who = f"worker {worker.index}"
        if worker.index == holder:
            folded: Optional[Tuple[str, float, float, int]] = None
            # By thread (the release's own calls, the heartbeat's, the late-add watcher's), each in order.
            calls = sorted(enumerate(worker.calls), key=lambda item: (_thread(item[1]), item[1]["s"]))
            for number, call in calls:
                if not a <= call["s"] <= b:
                    continue
                met = [f"{f['kind']} (fault {f['id']})" for f in faults.get((worker.index, number), [])]
                text = f"[{_thread(call)}] {call['m']} {call.get('a') or ''} -> {call['r'][:80]}" + (
                    f" [{', '.join(met)}]" if met else ""
                )
                if folded is not None and folded[0] == text and not met:
                    folded = (text, folded[1], call["s"], folded[3] + 1)
                    continue
                if folded is not None:
                    rows.append(_fold(who, *folded))
                folded = (text, call["s"], call["s"], 1)
            if folded is not None:
                rows.append(_fold(who, *folded))
            for log in worker.logs:
                if a <= log["at"] <= b and (log["level"] != "DEBUG" or "releas" in log["msg"]):
                    rows.append((log["at"], f"{who} log {log['level']}: {log['msg'][:200]}"))
        for section in worker.sections:
            if a <= section["start"] <= b:
                rows.append((section["start"], f"{who}: acquire() of section {section['i']}"))
            if a <= section.get("end", -1) <= b:
                what = section["outcome"]
                note = f": {section.get('error', '')[:220]}" if what != "ran" else ""
                rows.append((section["end"], f"{who}: section {section['i']} ended, {what}{note}"))
            if worker.index == holder and a <= section.get("releasing", -1) <= b:
                rows.append((section["releasing"], f"{who}: release() of section {section['i']}"))
    rows.sort(key=lambda row: row[0])
    return [f"{at - origin:9.2f}  {text}" for at, text in rows]


def _thread(call: Dict[str, Any]) -> str:
    """The lock's thread that made ``call``: the caller's own (``caller``), or the lock's heartbeat or
    late-add watcher."""
    name = str(call.get("th", ""))
    return name.replace("cloudshell-mutex-", "") if name.startswith("cloudshell-mutex-") else "caller"


def _fold(who: str, text: str, first: float, last: float, count: int) -> Tuple[float, str]:
    if count == 1:
        return first, f"{who} call: {text}"
    return first, f"{who} call: {text} x{count} (until +{last - first:.1f} s)"


def summarize(
    folder: Path,
    events: List[Dict[str, Any]],
    injected: List[Dict[str, Any]],
    calls: Dict[str, int],
    started: float,
    count: int,
    sections: int,
) -> Dict[str, Any]:
    """The figures of a run from its records (written beside them: timeline.txt)."""
    from stress_harness import audit

    workers = read_workers(folder, count)
    outcomes = Counter(s["outcome"] for w in workers for s in w.sections)
    total = count * sections
    holds = [
        history.Hold(
            f"worker {w.index}",
            s["token"],
            s["start"],
            s["acquired"],
            s.get("releasing"),
            s.get("end"),
            s["outcome"],
        )
        for w in workers
        for s in w.sections
        if s.get("token")
    ]
    verdict = history.check(holds, events)
    found = audit(events)
    grants = history.server_grants(events)
    # Until the sections' end: each worker then waits for its late adds to settle, which is no stall.
    sections_end = max([s["end"] for w in workers for s in w.sections] + [started])
    spans = [
        dataclasses.replace(span, end=min(span.end, sections_end))
        for span in lock_states([g for g in grants if g[1] < sections_end], workers, sections_end)
    ]
    faults = match_faults(workers, injected)
    found_stalls = stalls(spans, workers, faults)
    releases = sorted(
        (round(s["end"] - s["releasing"], 1), w.index, s["i"], remove_fault(w, s, faults))
        for w in workers
        for s in w.sections
        if "releasing" in s and s["end"] - s["releasing"] >= SLOW_RELEASE
    )[::-1]
    minutes = max(1e-9, (sections_end - started) / 60)
    mine = [
        r for r in injected if str(r.get("user", "")).startswith("chaos") and r["monotonic"] <= sections_end
    ]
    errors = [
        f"worker {w.index}: {w.end.get('error')}" for w in workers if w.end is None or w.end.get("error")
    ]
    worst = found_stalls[0] if found_stalls else None
    lines = timeline(worst, workers, events, faults, started) if worst else []
    (folder / "timeline.txt").write_text("\n".join(lines) + "\n")
    safety = {
        "overlaps": found["overlaps"] + verdict.counts()["overlaps"],
        "lost_updates": found["lost_updates"],
        "foreign_removes": found["foreign_removes"],
        "history": verdict.counts(),
        "history_problems": (verdict.fail_opens + verdict.cut_holds + verdict.overlaps + verdict.leaks)[:5],
    }
    safety["ok"] = (
        not (safety["overlaps"] or safety["lost_updates"] or safety["foreign_removes"]) and verdict.ok
    )
    return {
        "lock_src_seen": sorted({w.lock_src for w in workers}),
        "sections": {
            "total": total,
            "ran": outcomes.get("ran", 0),
            "timeout": outcomes.get("timeout", 0),
            "release_error": outcomes.get("release_error", 0),
            "lost": outcomes.get("lost", 0),
            "other": outcomes.get("other", 0),
            "not_started": total - sum(outcomes.values()),
            "ran_per_worker": [sum(1 for s in w.sections if s["outcome"] == "ran") for w in workers],
        },
        "worker_errors": errors,
        "safety": safety,
        "faults": {
            "by_kind": dict(Counter(r["kind"] for r in mine).most_common()),
            "on_removes": dict(
                Counter(r["kind"] for r in mine if r["method"] == "RemoveServicesFromReservation")
            ),
            "per_worker_per_minute": round(len(mine) / count / minutes, 1),
        },
        "server_calls": sum(calls.values()),
        "causes": causes(spans, workers, faults),
        "slow_releases": [
            {"seconds": s, "worker": w, "section": i, "removes": r} for s, w, i, r in releases[:10]
        ],
        "stalls": {
            "count": len(found_stalls),
            "worst_s": worst["seconds"] if worst else 0.0,
            "total_s": round(sum(s["seconds"] for s in found_stalls), 1),
            "longest": [
                {k: v for k, v in s.items() if k not in ("start", "end")}
                | {"at": round(s["start"] - started, 1)}
                for s in found_stalls[:8]
            ],
        },
        "state_seconds": {
            state: round(sum(s.end - s.start for s in spans if s.state == state), 1)
            for state in (FREE, UNKNOWN_YET, BODY, RELEASING, LEFTOVER, FOREIGN)
        },
        "timeline_of_worst_stall": lines[:120],
    }


def main(argv: List[str]) -> int:
    """``python tests/stress/chaos_timeline.py FOLDER``: the figures of a kept run (a run's ``--journals``
    folder) again, from its records, as JSON (and its timeline.txt written anew)."""
    if len(argv) != 1:
        print("usage: chaos_timeline.py FOLDER (one run's journals, events.json, faults.json, result.json)")
        return 2
    folder = Path(argv[0])
    result = json.loads((folder / "result.json").read_text())
    events = json.loads((folder / "events.json").read_text())
    injected = json.loads((folder / "faults.json").read_text())
    workers = read_workers(folder, result["workers"])
    started = result.get("started") or min(s["start"] for w in workers for s in w.sections)
    calls = {"all": result.get("server_calls", 0)}
    result.update(
        summarize(folder, events, injected, calls, started, result["workers"], result["sections_per_worker"])
    )
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
