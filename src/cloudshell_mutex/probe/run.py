"""One probe run: a sandbox (its own, or one given), the checks on aliases of its own, and the clean-up.

The run makes a bounded number of calls (:meth:`ProbeSettings.max_calls`) in bounded time. Everything it adds
carries its run's prefix, ``mutex-probe-<run>-``, a valid lock name that no lock user has (eight random hex
digits), with its token as ``Mutex Owner`` (label ``cloudshell-mutex probe``). The clean-up runs however the
run ends, Ctrl-C included (a further Ctrl-C during it is held until it is done): it reads the sandbox and
removes every service of the run, waits for an add that got no answer to land (removing it then) or to be
past its request lifetime, and ends the sandbox it created. A sandbox whose create got no answer is looked
for by its name and ended.
"""

from __future__ import annotations

import math
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from cloudshell.api.common_cloudshell_api import CloudShellAPIError

from ..lock import protocol
from ..lock.holder import make_token
from ..lock.options import DEFAULT_LEASE
from ..lock.server.classify import classify
from . import checks
from .calls import CallHook, CallLog, RecordingSession

#: Every alias a probe run adds starts with this and its run id: a lock name no lock user shares.
PROBE_PREFIX = "mutex-probe-"
#: The owner label of the probe's services, as ``status --all`` shows it.
PROBE_LABEL = "cloudshell-mutex probe"
#: The request lifetime the library assumes by default (MutexOptions.request_lifetime).
DEFAULT_REQUEST_LIFETIME = 120.0
#: At most this many reads while the clean-up waits for an unanswered add (spread over its lifetime).
WATCH_READS = 20
#: How often the clean-up tries to end its sandbox.
END_TRIES = 3


@dataclass(frozen=True)
class ProbeSettings:
    """What one run does, and what it compares with: the site's ``request_lifetime`` and ``lease``."""

    reservation_id: Optional[str] = None
    racers: int = 4
    rounds: int = 5
    max_wait: float = checks.DEFAULT_MAX_WAIT
    poll: float = checks.DEFAULT_POLL
    request_lifetime: float = DEFAULT_REQUEST_LIFETIME
    lease: float = DEFAULT_LEASE
    sandbox_minutes: int = 10

    def __post_init__(self) -> None:
        for name, low, high in (("racers", 2, 32), ("rounds", 1, 100), ("sandbox_minutes", 2, 1440)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"{name} must be a whole number from {low} to {high}, got {value!r}")
        for name, low, high in (("max_wait", 0.5, 300), ("poll", 0.05, 10), ("request_lifetime", 1, 86400)):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and low <= value <= high):
                raise ValueError(
                    f"{name} must be a number of seconds from {low:g} to {high:g}, got {value!r}"
                )
        if not (isinstance(self.lease, (int, float)) and math.isfinite(self.lease) and self.lease >= 0):
            raise ValueError(f"lease must be 0 or more seconds, got {self.lease!r}")
        if self.reservation_id is not None and not self.reservation_id.strip():
            raise ValueError("reservation_id must not be blank")

    def max_calls(self) -> int:
        """The most API calls one run makes (its sessions' logons included), whatever the server answers.

        A run that could not create its sandbox makes fewer: a logon, the create, and the search for it."""
        polls = checks.poll_count(self.max_wait, self.poll)
        aliases = len(RUN_ALIASES) + self.rounds  # every alias a run adds (the ended check's is not removed)
        checks_calls = (
            1  # the notice in the sandbox output
            + 4  # the model: up to three adds, a remove
            + 1 + 1 + 3 * polls + 1  # reads after a write: a cached read, the add, three polls, the remove
            + 4  # a taken alias: two adds, a read, a remove
            + 5  # removes: a missing alias, an add, the two together, a read, a remove
            + 4  # letter case: two adds, two removes
            + 2  # a tilde: an add, a remove
            + self.racers * self.rounds + 2  # the race: the adds, a read, a remove
            + 1  # the user's roles
        )  # fmt: skip
        clean_up = WATCH_READS + 2 * aliases  # reads; each alias removed at most twice
        if self.reservation_id is not None:
            clean_up += 1  # the status of the sandbox given
        else:
            ended = checks.poll_count(self.max_wait, 1.0) + 2  # status reads, an add, a remove
            clean_up += 1 + END_TRIES * 2 + ended  # the create; the end and its status read; the check
        return self.racers + checks_calls + clean_up


#: The aliases of a run besides the race's (``<prefix><what>``; the case check adds two spellings of one).
RUN_ALIASES = ("model", "dup", "read", "found", "case", "CASE", "slot~r1")


@dataclass
class Observations:
    """What one run saw: each check's result (None: not run), why a check was not measured, the calls."""

    run: str
    reservation_id: str = ""
    own_sandbox: bool = True
    model: Optional[checks.ModelCheck] = None
    duplicate: Optional[checks.DuplicateCheck] = None
    reads: Optional[checks.ReadCheck] = None
    removes: Optional[checks.RemoveCheck] = None
    case: Optional[checks.CaseCheck] = None
    derived: Optional[checks.DerivedAliasCheck] = None
    race: Optional[checks.RaceCheck] = None
    roles: Optional[checks.RolesCheck] = None
    ended: Optional[checks.EndedCheck] = None
    output: Optional[checks.Answer] = None
    #: Why a fact was not measured, by fact key.
    failures: Dict[str, str] = field(default_factory=dict)
    #: Seconds from sending to landing of adds that got no answer and were then seen.
    late_landings: List[float] = field(default_factory=list)
    #: Adds that got no answer and were not seen by the end of the clean-up's wait.
    never_landed: int = 0
    #: What the clean-up could not remove or end (empty: nothing left behind).
    left_behind: List[str] = field(default_factory=list)
    interrupted: bool = False
    seconds: float = 0.0
    log: CallLog = field(default_factory=CallLog)


class ProbeAborted(Exception):
    """The run could not start (no sandbox); the message says why."""


class Probe:
    """One run against a server: ``open_session()`` makes a logged-on session (the racers get their own)."""

    def __init__(
        self,
        open_session: Callable[[], Any],
        settings: ProbeSettings,
        user: str,
        domain: str,
        hook: Optional[CallHook] = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.open_session = open_session
        self.settings = settings
        self.user = user
        self.domain = domain
        self.sleep = sleep
        self.seen = Observations(run=secrets.token_hex(4), log=CallLog(hook))
        self.token = make_token(PROBE_LABEL)
        self.prefix = f"{PROBE_PREFIX}{self.seen.run}-"
        protocol.check_lock_name(self.prefix + "x")  # a valid lock name, as promised
        self.api: Any = None
        #: Seconds a read that judges waits after a change (:meth:`_settle_time`); the most until measured.
        self.settle = settings.max_wait
        self._created_name = f"cloudshell-mutex probe {self.seen.run}"
        #: How often the clean-up removed each alias (twice at most: a lagging read may show a removed one).
        self._removes: Dict[str, int] = {}

    def alias(self, what: str) -> str:
        """The run's alias for ``what``."""
        return f"{self.prefix}{what}"

    # ---------------------------------------------------------------- the run

    def run(self) -> Observations:
        """Run every check, then clean up (also after Ctrl-C, which is re-raised afterwards)."""
        started = time.monotonic()
        interrupt: Optional[BaseException] = None
        try:
            self._checks()
        except KeyboardInterrupt as error:
            self.seen.interrupted, interrupt = True, error
        finally:
            held = self._clean_up()
            self.seen.seconds = time.monotonic() - started
        if interrupt is not None or held is not None:
            self.seen.interrupted = True
            raise interrupt or held  # type: ignore[misc]
        return self.seen

    def _open(self) -> Any:
        """A logged-on session whose calls are recorded (its logon counts as a call)."""
        session = self.seen.log.call("Logon", self.open_session, (), {})
        return RecordingSession(session, self.seen.log)

    def _checks(self) -> None:
        seen, api = self.seen, None
        self.api = api = self._open()
        if self.settings.reservation_id is None:
            seen.reservation_id = self._create()
        else:
            seen.reservation_id, seen.own_sandbox = self.settings.reservation_id, False
            self._check_given(seen.reservation_id)
        rid, token = seen.reservation_id, self.token
        seen.output = self._measure(
            "output",
            lambda: checks.check_output(
                api,
                rid,
                f"cloudshell-mutex probe {seen.run} by {self.user}: checking what the lock relies on "
                f"(services {self.prefix}*, removed when it ends)",
            ),
        )
        seen.model = self._measure("model", lambda: checks.check_model(api, rid, self.alias("model"), token))
        if seen.model is None or not seen.model.has_owner:
            return  # nothing else can be judged without Mutex Owner: the report says to install the package
        seen.reads = self._measure(
            "fresh_read",
            lambda: checks.check_read_after_write(
                api,
                rid,
                self.alias("read"),
                token,
                cached=True,
                max_wait=self.settings.max_wait,
                poll=self.settings.poll,
                sleep=self.sleep,
            ),
        )
        self.settle = self._settle_time(seen.reads)
        settle = (self.settle, self.sleep)
        seen.duplicate = self._measure(
            "contention",
            lambda: checks.check_duplicate_add(api, rid, self.alias("dup"), token, token + "-2", settle),
        )
        seen.removes = self._measure(
            "remove",
            lambda: checks.check_removes(api, rid, self.alias("found"), self.alias("missing"), token, settle),
        )
        seen.case = self._measure(
            "case", lambda: checks.check_alias_case(api, rid, self.alias("case"), token)
        )
        seen.derived = self._measure(
            "tilde", lambda: checks.check_derived_alias(api, rid, self.alias("slot"), token)
        )
        seen.race = self._measure("atomic", self._race)
        seen.roles = self._measure("roles", lambda: checks.check_user_details(api, self.user, self.domain))

    def _race(self) -> checks.RaceCheck:
        sessions = [self.api] + [self._open() for _ in range(self.settings.racers - 1)]
        aliases = [self.alias(f"race{n}") for n in range(1, self.settings.rounds + 1)]
        owners = [f"{self.token}-racer{n}" for n in range(1, self.settings.racers + 1)]
        return checks.check_add_race(
            sessions, self.seen.reservation_id, aliases, owners, (self.settle, self.sleep)
        )

    def _settle_time(self, reads: Optional[checks.ReadCheck]) -> float:
        """How long after a change the checks wait before a read that judges it: 0 when fresh reads showed
        each change at once, else the lag seen plus a second (``max_wait`` when unmeasured or never shown)."""
        if reads is None or reads.fresh_lag is None or reads.removal_lag is None:
            return self.settings.max_wait
        lag = max(reads.fresh_lag, reads.removal_lag)
        return 0.0 if lag == 0 else min(self.settings.max_wait, lag + 1.0)

    def _measure(self, fact: str, check: Callable[[], Any]) -> Any:
        """Run one check; a call that fails otherwise than the question expects leaves the fact unmeasured."""
        try:
            return check()
        except KeyboardInterrupt:
            raise
        except Exception as error:
            self.seen.failures[fact] = classify(error).message[:300] or type(error).__name__
            return None

    def _check_given(self, reservation_id: str) -> None:
        """The sandbox given must be active: the checks would fail one by one in an ended or unknown one."""
        try:
            status = str(self.api.GetReservationStatus(reservation_id).ReservationSlimStatus.Status)
        except KeyboardInterrupt:
            raise
        except Exception as error:
            raise ProbeAborted(
                f"sandbox {reservation_id} cannot be probed ({classify(error).message[:300]}): give the id "
                "of an active sandbox the user may reach (its domain: --domain), or leave --reservation out"
            ) from None
        if status == checks.COMPLETED:
            raise ProbeAborted(
                f"sandbox {reservation_id} has ended: give an active one, or leave --reservation out"
            )

    def _create(self) -> str:
        try:
            created = self.api.CreateImmediateReservation(
                self._created_name, self.user, self.settings.sandbox_minutes
            )
        except KeyboardInterrupt:
            raise
        except Exception as error:
            raise ProbeAborted(
                f"could not create a sandbox for the probe ({classify(error).message[:300]}): the user must "
                "be allowed to create sandboxes, or give one with --reservation"
            ) from None
        return str(created.Reservation.Id)

    # ---------------------------------------------------------------- the clean-up

    def _clean_up(self) -> Optional[BaseException]:
        """Leave nothing behind; return a Ctrl-C that came meanwhile (it waits until the clean-up is done)."""
        held: Optional[BaseException] = None
        for step in (self._find_unsure_sandbox, self._remove_ours, self._end_sandbox):
            while True:
                try:
                    step()
                    break
                except KeyboardInterrupt as error:
                    held = error  # the clean-up goes on: a half-done one would leave services behind
                except Exception as error:
                    self.seen.left_behind.append(
                        f"{step.__name__.strip('_')}: {classify(error).message[:200]}"
                    )
                    break
        return held

    def _main_session(self) -> Any:
        if self.api is None:
            self.api = self._open()
        return self.api

    def _find_unsure_sandbox(self) -> None:
        """A create that got no answer (or whose answer an interrupt cut off): find its sandbox by name."""
        seen, log = self.seen, self.seen.log
        if self.settings.reservation_id is not None or seen.reservation_id:
            return
        if not any(c.method == "CreateImmediateReservation" for c in log.calls):
            return
        api = self._main_session()
        lands_by = max(log.unsure_creates, default=0.0) + self.settings.request_lifetime
        for _ in range(WATCH_READS):
            current = api.GetCurrentReservations(self.user).Reservations or []
            found = [r for r in current if getattr(r, "Name", "") == self._created_name]
            if found:
                seen.reservation_id = str(found[0].Id)
                return
            if not log.unsure_creates or log.clock() >= lands_by:
                return
            self.sleep(self.settings.request_lifetime / WATCH_READS)

    def _remove_ours(self) -> None:
        """Remove every service of this run until a read shows none, and wait for each unanswered add to land
        (then remove it) or to be past its lifetime. In a sandbox of its own the end makes a late add
        harmless, so there the run waits only ``max_wait``, to see when it lands."""
        seen, log = self.seen, self.seen.log
        if not seen.reservation_id:
            return
        api, rid = self._main_session(), seen.reservation_id
        horizon = self.settings.max_wait if seen.own_sandbox else self.settings.request_lifetime
        interval = max(self.settings.poll, horizon / WATCH_READS)
        pause, removes = 0.0, self._removes
        for _ in range(WATCH_READS):
            self.sleep(pause)
            found = checks.services(api, rid)
            ours = [alias for alias in found if alias.upper().startswith(self.prefix.upper())]
            now = log.clock()
            for key, add in list(log.unsure.items()):
                if key[0] != rid:
                    continue
                if add.alias in found:
                    seen.late_landings.append(now - add.sent)
                    del log.unsure[key]
                elif now >= add.sent + horizon:
                    seen.never_landed += 1
                    del log.unsure[key]
            waiting = any(key[0] == rid for key in log.unsure)
            if not ours and not waiting:
                return
            for alias in ours:
                if removes.get(alias, 0) < 2:  # a read that lags may show it after its remove: not a third
                    removes[alias] = removes.get(alias, 0) + 1
                    checks.remove(api, rid, [alias])  # ours alone: a second remove of it harms no one
            # After a remove, a read that lags would still show it: wait as long as reads were seen to lag.
            pause = max(interval if waiting else self.settings.poll, self.settle if ours else 0.0)
        seen.left_behind.append(f"services of {self.prefix}* in sandbox {rid} (remove them by hand)")

    def _end_sandbox(self) -> None:
        seen = self.seen
        if not seen.own_sandbox or not seen.reservation_id:
            return
        api, rid = self._main_session(), seen.reservation_id
        for _ in range(END_TRIES):
            try:
                api.EndReservation(rid)
            except KeyboardInterrupt:
                raise
            except Exception:
                pass  # ended already (an earlier end landed), or no answer: the status says
            try:
                status = str(api.GetReservationStatus(rid).ReservationSlimStatus.Status)
            except CloudShellAPIError:
                status = checks.COMPLETED  # a server that refuses every call on an ended sandbox
            if status == checks.COMPLETED:
                break
        else:
            seen.left_behind.append(
                f"sandbox {rid} is not ended: it ends by itself {self.settings.sandbox_minutes} minutes "
                "after the probe created it"
            )
            return
        seen.ended = self._measure(
            "ended",
            lambda: checks.check_ended_sandbox(
                api, rid, self.alias("ended"), max_wait=self.settings.max_wait, sleep=self.sleep
            ),
        )
