"""A history checker for the lock, in the manner of Jepsen: clients' operations against the server's order.

Each client records every ``acquire`` and ``release`` it made: when it was invoked and when it completed
(its own ``time.monotonic()``; on one machine that clock is the emulator's too), the token, and how it ended.
The server (the emulator's event log) records when each ``MUTEX`` service with a token was added and
removed, in commit order. The history is consistent with a mutex when:

* every acquire that returned True was granted by the server *during* the call: an add of its token
  committed between invocation and completion (otherwise the client proceeded without the lock: a
  **fail-open**);
* the server held that grant for the whole time the client believed it held the lock, from the acquire's
  completion to the release's invocation (otherwise someone removed it under the client: a **cut hold**;
  counted even when the client's release reported it with ``MutexLostError``);
* no two clients believed they held the lock at the same moment (an **overlap**);
* a grant of a token whose client was done with it (an add that landed late) was removed again (else a
  **leak**), and the alias is free at the end.

The checker needs no clock of the clients but the machine's monotonic one, and no guess at the order of
concurrent events beyond what the server's log says.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple

MUTEX = "MUTEX"
OWNER = "Mutex Owner"


@dataclass(frozen=True)
class Hold:
    """One acquisition as its client saw it: the acquire call, and the release call (if it got there)."""

    client: str
    token: str
    acquire_invoked: float
    acquire_completed: float
    release_invoked: Optional[float] = None
    release_completed: Optional[float] = None
    release_outcome: str = "released"  # or "lost", "error"


@dataclass
class Verdict:
    """What the checker found; ``ok`` when it found nothing wrong."""

    holds: int = 0
    grants: int = 0
    fail_opens: List[str] = field(default_factory=list)
    cut_holds: List[str] = field(default_factory=list)
    overlaps: List[str] = field(default_factory=list)
    leaks: List[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the history is consistent with a mutex and nothing was left behind."""
        return not (self.fail_opens or self.cut_holds or self.overlaps or self.leaks)

    def counts(self) -> Dict[str, int]:
        """The figures, for reports."""
        return {
            "holds": self.holds,
            "grants": self.grants,
            "fail_opens": len(self.fail_opens),
            "cut_holds": len(self.cut_holds),
            "overlaps": len(self.overlaps),
            "leaks": len(self.leaks),
        }


#: A grant as the server's log shows it: the token, when it was added, when it was removed (None: held),
#: and the removal's event (who removed it: user, fault, late), for reports.
Grant = Tuple[str, float, Optional[float], Dict[str, Any]]


def server_grants(events: Iterable[Dict[str, Any]], alias: str = MUTEX) -> List[Grant]:
    """One :data:`Grant` for each grant of ``alias``, in the server's order."""
    grants: List[Grant] = []
    open_grant: Optional[int] = None
    for event in sorted(events, key=lambda e: e["seq"]):
        if event["alias"] != alias:
            continue
        if event["op"] == "service_added":
            grants.append((event["attributes"].get(OWNER, ""), event["monotonic"], None, {}))
            open_grant = len(grants) - 1
        elif event["op"] == "service_removed" and open_grant is not None:
            token, added, _, _ = grants[open_grant]
            grants[open_grant] = (token, added, event["monotonic"], event)
            open_grant = None
    return grants


def check(holds: List[Hold], events: Iterable[Dict[str, Any]], alias: str = MUTEX) -> Verdict:
    """Check the clients' ``holds`` against the server's ``events`` (the emulator's event log)."""
    grants = server_grants(events, alias)
    verdict = Verdict(holds=len(holds), grants=len(grants))
    used = set()
    for hold in holds:
        where = f"{hold.client} {hold.token}"
        # The grant of this acquisition: the last one of its token added during the call (several clients
        # of the original v1 share the empty token; the grant that ended a wait comes right before its end).
        candidates = [
            index
            for index, (token, added, _, _) in enumerate(grants)
            if token == hold.token
            and index not in used
            and hold.acquire_invoked <= added <= hold.acquire_completed
        ]
        if not candidates:
            verdict.fail_opens.append(f"{where}: acquire returned without a grant during the call")
            continue
        match = candidates[-1]
        used.add(match)
        _, added, removed, removal = grants[match]
        believed_until = hold.release_invoked if hold.release_invoked is not None else float("inf")
        if removed is not None and removed < believed_until:
            early = believed_until - removed
            by = {k: removal.get(k) for k in ("user", "fault", "late", "seq") if k in removal}
            verdict.cut_holds.append(f"{where}: the server removed the lock {early:.3f} s early ({by})")
    ordered = sorted(holds, key=lambda h: h.acquire_completed)
    for earlier, later in zip(ordered, ordered[1:]):
        end = earlier.release_invoked if earlier.release_invoked is not None else float("inf")
        if later.acquire_completed < end:
            verdict.overlaps.append(f"{earlier.client} and {later.client} believed they held at once")
    for index, (token, added, removed, _) in enumerate(grants):
        if index not in used and removed is None:
            verdict.leaks.append(f"a grant of {token!r} (added at {added:.3f}) was never removed")
    if grants and grants[-1][2] is None and (len(grants) - 1) in used:
        verdict.leaks.append(f"the alias is still held by {grants[-1][0]!r} at the end")
    return verdict
