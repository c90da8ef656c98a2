"""The cohort's files on this machine: the local lock, the state, the waiters' marks, the releasing record.

In the cohort directory (local disk; default: a per-user folder in the temp dir):

* ``<key>.lock``: the local lock; its holder is the only process of this machine that may hold the alias.
* ``<key>.json``: the cohort's state, read and written only under ``<key>.state.lock`` (held for a moment):
  the token of the server lock the cohort holds, its lease and last confirmation (this machine's monotonic
  clock: one clock for every process), the passes in a row and since when, the local holder (pid, start
  time, label) and the local waiters.
* ``<key>.w.<id>.lock``: one per waiting process, held while it waits: a waiter whose process died is
  found by its lock being free, without trusting pids (reused) or process tables (not OS-neutral).
* ``<key>.releasing.json``: the token of the server lock the local holder is releasing to the server,
  written *before* its first remove is sent: a remove of a holder that dies meanwhile may still land, so
  the next local holder never carries on under that token (it acquires from the server instead).

``key`` is a hash of the server, the reservation and the alias. Idle cohorts' files are swept now and then.
:mod:`.cohort` is the lock that uses them.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import inspect
import json
import logging
import math
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Optional, Tuple, Union

import filelock

from .. import diagnosis
from ..engine import Wait
from ..errors import MutexTimeout
from ..holder import proves_release, sanitize_label
from ..options import MutexOptions
from ..pacing import CANCEL_SLICE
from ..queue.waitrecord import WaitRecord
from ..server import catalog

#: How often the state lock is tried (it is held for a file read and write only).
STATE_POLL = 0.001
#: Seconds a step without a caller's deadline (a release, a status read) waits for the state lock. Longer, a
#: process is stopped or hung inside it (SIGSTOP, a debugger), and the step goes on without the state; each
#: such step says what that costs. An acquire waits only until its own deadline.
STATE_WAIT = 5.0
#: ... and a step after an acquire gave up (taking its registration back): the deadline has passed already.
STATE_GRACE = 0.1
#: Without a lease, a passed lock is taken without a read only while its last confirmation is this recent;
#: older, one read checks it (a party that breaks the protocol may have removed it meanwhile).
TRUST_WITHOUT_LEASE = 5.0
STATE_VERSION = 1
#: The suffix of a cohort's releasing record (``<key>.releasing.json``), apart from its state file.
_RELEASING = ".releasing"


def default_cohort_dir() -> Path:
    """A per-user folder in the system's temp dir (local disk on an execution server)."""
    try:
        user = getpass.getuser()
    except Exception:  # no user name in the environment (a service account on Windows): one shared folder
        user = "user"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in user) or "user"
    return Path(tempfile.gettempdir()) / f"cloudshell-mutex-{safe}"


def cohort_key(server: str, reservation_id: str, alias: str) -> str:
    """The file name stem of the cohort of one lock on one server."""
    raw = json.dumps([server, reservation_id, alias]).encode("utf-8")
    return hashlib.sha256(raw).hexdigest()[:24]


def trust_window(lease: float) -> float:
    """How recent a passed lock's last confirmation must be for the next holder to take it without a read.

    With a lease: half of it. A waiter on another machine breaks the lock only after seeing no heartbeat for
    lease + margin on its own clock, which cannot start before the confirmation was sent, so a holder that
    takes it within lease/2 and heartbeats from there cannot have been broken."""
    return lease / 2 if lease > 0 else TRUST_WITHOUT_LEASE


@dataclass
class CohortState:
    """The cohort's shared state (``<key>.json``). Times: ``*_at``/``since`` are on this machine's monotonic
    clock (comparable between its processes); ``holder["started"]`` is wall time, for people."""

    server: str = ""
    reservation_id: str = ""
    alias: str = ""
    token: Optional[str] = None  # the server lock the cohort holds (None: it holds none)
    lease: float = 0.0
    confirmed_at: Optional[float] = None  # see Acquisition.confirmed_at
    since: Optional[float] = None  # when the cohort took it from the server
    passes: int = 0  # hand-offs within the cohort since then
    holder: Optional[Dict[str, Any]] = None  # the local holder: pid, started, owner
    waiters: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # waiter id -> pid, since
    yielded_at: Optional[float] = None  # when the cohort last gave the lock back because of a bound
    yielded_to_queue: bool = False  # ... to waiters a read showed in the queue: the next holder lines up
    version: int = STATE_VERSION
    #: The secret ``token`` commits to (hex; see Acquisition.secret), so that whoever holds it next may mark
    #: it ``~releasing``. On this machine's disk only: never shown (not in ``status``), never logged.
    secret: Optional[str] = field(default=None, repr=False)

    def keep(self, acquisition: Any) -> None:
        """Record the server lock the cohort holds now: ``acquisition``'s token, lease and secret."""
        self.token, self.lease = acquisition.token, acquisition.lease
        self.secret = acquisition.secret.hex() if acquisition.secret is not None else None

    def token_secret(self) -> Optional[bytes]:
        """The secret of the recorded token, when the state keeps the one the token commits to (else None: a
        successor then never marks the lock ``~releasing``)."""
        token, secret = self.token, self.secret
        if token is None or not isinstance(secret, str) or not proves_release(f"{token}#{secret}", token):
            return None
        return bytes.fromhex(secret)

    @classmethod
    def from_text(cls, text: str) -> CohortState:
        """Parse the file; a damaged or foreign one gives a fresh state (see :class:`CohortFiles`)."""
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
                return cls()
            known = {f for f in cls.__dataclass_fields__}
            return cls(**{k: v for k, v in data.items() if k in known})
        except (ValueError, TypeError):
            return cls()

    def to_text(self) -> str:
        """The file's text."""
        return json.dumps(asdict(self), sort_keys=True)


class CohortStateBusy(MutexTimeout):
    """The cohort's state file stayed locked by another process of this machine (one stopped or hung inside
    it: the lock is held for a file read and write only) for as long as the caller could wait."""


class CohortFiles:
    """The files of one cohort: the local lock, the state (under its own short lock), the waiters' locks."""

    def __init__(self, directory: Union[str, Path], key: str) -> None:
        self.directory = Path(directory)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise diagnosis.cohort_dir_error(str(self.directory), str(error.strerror or error)) from None
        self.key = key
        self.lock_path = self.directory / f"{key}.lock"
        self.state_path = self.directory / f"{key}.json"
        self.releasing_path = self.directory / f"{key}{_RELEASING}.json"
        self._state_lock = new_file_lock(self.directory / f"{key}.state.lock")

    def local_lock(self) -> filelock.BaseFileLock:
        """A new handle on the local lock (one per lock object: OS file locks exclude handles)."""
        return new_file_lock(self.lock_path)

    def waiter_path(self, waiter: str) -> Path:
        """The lock file a waiter holds while it waits."""
        return self.directory / f"{self.key}.w.{waiter}.lock"

    @contextlib.contextmanager
    def state(self, timeout: float = STATE_WAIT) -> Iterator[CohortState]:
        """The state, under the state lock; written back (atomically) when the block ends without error.

        The lock is waited for at most ``timeout`` seconds (-1: forever), then :class:`CohortStateBusy`."""
        try:
            self._state_lock.acquire(timeout=timeout, poll_interval=STATE_POLL)
        except filelock.Timeout:
            raise CohortStateBusy(
                f"the cohort's state file {self.state_path} stayed locked by another process on this "
                f"machine for {max(timeout, 0.0):.1f} s (a process stopped or hung inside it: that lock is "
                "held for a file read and write only)",
                waited=max(timeout, 0.0),
            ) from None
        try:
            try:
                state = CohortState.from_text(self.state_path.read_text(encoding="utf-8"))
            except FileNotFoundError:
                state = CohortState()
            yield state
            _write_atomically(self.state_path, state.to_text())
        finally:
            self._state_lock.release()

    def mark_releasing(self, token: str) -> None:
        """Record, before the first remove is sent, that the local holder releases ``token`` to the server.
        Only the local lock's holder writes or reads it, so it needs no state lock."""
        _write_atomically(self.releasing_path, json.dumps({"token": token, "pid": os.getpid()}))

    def releasing(self) -> Optional[str]:
        """The token a local holder was releasing to the server when it last let go (None: none)."""
        try:
            record = json.loads(self.releasing_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        token = record.get("token") if isinstance(record, dict) else None
        return token if isinstance(token, str) else None

    def local_holder(self) -> str:
        """Who holds the local lock, as the state says (for an error message)."""
        try:
            with self.state(STATE_GRACE) as state:
                holder = state.holder
        except CohortStateBusy:
            holder = None
        if holder and holder.get("pid") == os.getpid():
            return f"another command of this process (pid {holder.get('pid')}, {holder.get('owner')})"
        return f"pid {holder.get('pid')} ({holder.get('owner')})" if holder else "another process"

    def live_waiters(self, state: CohortState) -> int:
        """How many registered waiters are alive (their lock is held); drops dead ones from ``state``."""
        alive = 0
        for waiter in list(state.waiters):
            probe = new_file_lock(self.waiter_path(waiter))
            try:
                probe.acquire(timeout=0)
            except filelock.Timeout:
                alive += 1
                continue
            # Free: its process died while waiting (a live waiter unregisters before it lets go).
            probe.release()
            state.waiters.pop(waiter, None)
            with contextlib.suppress(OSError):
                self.waiter_path(waiter).unlink()
        return alive


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def state_wait(deadline: Wait) -> float:
    """Seconds to wait for the state lock until ``deadline`` (-1: no deadline), at least STATE_GRACE."""
    left = deadline.left()
    return -1.0 if left is None else max(STATE_GRACE, left)


class _NamedFileLock(filelock.FileLock):  # type: ignore[misc,valid-type]
    """filelock's OS file lock, held only on the file its path names *now*.

    Cohort files are removed when idle (:func:`sweep_cohort_dir`), under their locks. A process that opened
    a file just before it was removed would then lock a file no path names, while the next one locks the new
    file at that path: both would hold. So after each lock attempt the locked file is compared with what the
    path names (device and inode), and an attempt on a removed file is let go and tried again, the way
    filelock 4 does for its own removals (filelock 3, for Python 3.9, does not). Windows refuses to remove a
    file that a process has open, so there the check is moot."""

    def _acquire(self) -> None:
        super()._acquire()
        fd = getattr(getattr(self, "_context", None), "lock_file_fd", None)
        if fd is not None and os.name != "nt" and not self._names_its_file(fd):
            self._release()  # not locked: filelock's loop tries again, opening the path anew

    def _names_its_file(self, fd: int) -> bool:
        try:
            held, named = os.fstat(fd), os.stat(self.lock_file)
        except OSError:
            return False
        return held.st_nlink > 0 and (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)


def new_file_lock(path: Path) -> filelock.BaseFileLock:
    """An OS file lock (fcntl.flock, or msvcrt.locking on Windows) on ``path``, usable from any thread.

    Never a lock file that only exists: the OS must free the lock when its process dies (filelock 4 falls
    back to such files on a file system without flock unless told not to; it then raises instead). Held
    only on the file the path names (:class:`_NamedFileLock`), so that idle cohort files can be removed."""
    return _NamedFileLock(str(path), thread_local=False, **_NO_SOFT_FALLBACK)


#: Cohort files untouched for this long, of a cohort that holds nothing and has no holder and no waiter, are
#: removed (reservations end; without this the folder grows by three files per lock used).
IDLE_FILES_SECONDS = 3600.0
#: A process sweeps the cohort folder at most this often (a stamp file in it says when it was last swept).
SWEEP_INTERVAL = 3600.0
_SWEEP_STAMP = ".swept"


def sweep_cohort_dir(directory: Union[str, Path], idle: float = IDLE_FILES_SECONDS) -> int:
    """Remove the files of every cohort in ``directory`` that has been idle ``idle`` seconds (its state file
    untouched, no server lock held, no local holder, no live waiter), and waiters' and temporary files left by
    processes that died; return how many files were removed. A cohort in use is left alone: its files are
    removed only under its local lock and its state lock, taken without waiting, and every process holds
    those only on the file their path names (:class:`_NamedFileLock`)."""
    folder, removed = Path(directory), 0
    cutoff = time.time() - idle
    for state_path in folder.glob("*.json"):
        key = state_path.stem
        if not key.endswith(_RELEASING) and _older(state_path, cutoff):
            removed += _sweep_key(folder, key)
    for leftover in [*folder.glob("*.w.*.lock"), *folder.glob("*.json.*.tmp")]:
        if _older(leftover, cutoff):
            removed += _remove_unlocked(leftover)
    return removed


def _older(path: Path, cutoff: float) -> bool:
    try:
        return path.stat().st_mtime < cutoff
    except OSError:
        return False


def _sweep_key(folder: Path, key: str) -> int:
    files = CohortFiles(folder, key)
    local, state_lock = files.local_lock(), new_file_lock(folder / f"{key}.state.lock")
    try:
        local.acquire(timeout=0)
    except filelock.Timeout:
        return 0  # held: in use
    try:
        try:
            state_lock.acquire(timeout=0)
        except filelock.Timeout:
            return 0
        try:
            try:
                state = CohortState.from_text(files.state_path.read_text(encoding="utf-8"))
            except OSError:
                return 0
            if state.token is not None or state.holder is not None or files.live_waiters(state):
                return 0
            count = 0
            # The releasing record matters only while the state names its token (it holds none here).
            for path in (
                files.state_path,
                files.releasing_path,
                files.lock_path,
                folder / f"{key}.state.lock",
            ):
                with contextlib.suppress(OSError):
                    path.unlink()
                    count += 1
            return count
        finally:
            state_lock.release()
    finally:
        local.release()


def _remove_unlocked(path: Path) -> int:
    if path.suffix == ".tmp":
        with contextlib.suppress(OSError):
            path.unlink()
            return 1
        return 0
    probe = new_file_lock(path)
    try:
        probe.acquire(timeout=0)
    except filelock.Timeout:
        return 0  # a live waiter's
    try:
        with contextlib.suppress(OSError):
            path.unlink()
            return 1
        return 0
    finally:
        probe.release()


def sweep_now_and_then(directory: Union[str, Path], logger: Optional[logging.Logger] = None) -> None:
    """Sweep ``directory`` (:func:`sweep_cohort_dir`) if no process did in the last :data:`SWEEP_INTERVAL`
    seconds. Never raises: tidying is a courtesy."""
    stamp = Path(directory) / _SWEEP_STAMP
    try:
        if time.time() - stamp.stat().st_mtime < SWEEP_INTERVAL:
            return
    except OSError:
        pass  # never swept
    try:
        stamp.touch()
        removed = sweep_cohort_dir(directory)
    except Exception as error:  # a folder we cannot tidy still works
        if logger is not None:
            logger.debug("cloudshell-mutex: could not sweep the cohort folder %s: %s", directory, error)
        return
    if removed and logger is not None:
        logger.debug("cloudshell-mutex: removed %d idle cohort files from %s", removed, directory)


_NO_SOFT_FALLBACK = (
    {"fallback_to_soft": False}
    if "fallback_to_soft" in inspect.signature(filelock.FileLock.__init__).parameters
    else {}
)


def cohort_available() -> bool:
    """True where cohort mode can work: filelock has an OS file lock here (fcntl or msvcrt). Elsewhere it
    falls back to lock files that the OS does not free when their process dies."""
    return not issubclass(filelock.FileLock, filelock.SoftFileLock)


def process_alive(pid: int) -> Optional[bool]:
    """Whether a process with this id runs on this machine now (None when it cannot be told). A dead one is
    certain; a live one may be another process that got the id since."""
    if pid <= 0:
        return False
    if os.name == "nt":  # os.kill(pid, 0) would end the process there: ask Windows instead
        import ctypes

        kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]
        handle = kernel32.OpenProcess(0x1000, False, pid)  # PROCESS_QUERY_LIMITED_INFORMATION
        if not handle:
            return ctypes.get_last_error() == 5  # type: ignore[attr-defined]  # access denied: it exists
        try:
            code = ctypes.c_ulong()
            if not kernel32.GetExitCodeProcess(handle, ctypes.byref(code)):
                return None
            return code.value == 259  # STILL_ACTIVE
        finally:
            kernel32.CloseHandle(handle)
    try:
        os.kill(pid, 0)  # signal 0: no signal, only the check that the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    except OSError:
        return None
    return True


def local_status(
    api: Any, reservation_id: str, alias: str, cohort_dir: Optional[Union[str, Path]] = None
) -> Optional[CohortState]:
    """The cohort state of a lock on *this* machine, or None when no cohort here has used it. Another
    execution server's local holder is only visible there."""
    directory = Path(cohort_dir) if cohort_dir is not None else default_cohort_dir()
    key = cohort_key(catalog.server_key(api), reservation_id, alias)
    if not (directory / f"{key}.json").exists():
        return None
    files = CohortFiles(directory, key)
    with files.state() as state:
        files.live_waiters(state)
        return state


def describe_local(state: CohortState, token: Optional[str], now: Optional[float] = None) -> str:
    """One line for ``cloudshell-mutex status`` on this machine: whether this machine's cohort holds the lock
    (the server holder's token is the cohort's), its local holder, waiters and passes."""
    if state.token is None or state.token != token:
        return "cohort on this machine: does not hold it"
    now = time.monotonic() if now is None else now
    parts = [f"cohort on this machine: holds it ({state.passes} passes in a row"]
    if state.since is not None:
        parts[0] += f", for {max(0.0, now - state.since):.1f} s"
    parts[0] += ")"
    holder = state.holder
    if holder:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder.get("started", 0))))
        parts.append(f"local holder pid {holder.get('pid')} ({holder.get('owner')}) since {started}")
    else:
        parts.append("passed, not yet taken by a local waiter")
    parts.append(f"{len(state.waiters)} local waiters")
    return "; ".join(parts)


class LocalWait:
    """A cohort member's wait for the local lock, as the engine's attempt: one try waits for the local file
    lock until the next progress line, the next cancellation check, the next look for a deadlock (``record``:
    the member's :class:`~.waitrecord.WaitRecord` when it holds other locks) or the deadline, whichever comes
    first."""

    def __init__(
        self,
        member: Tuple[str, str, MutexOptions],
        try_local: Callable[[float], bool],
        write_progress: Callable[[str, Optional[Wait]], None],
        deadline: Wait,
        holder: Optional[Dict[str, Any]],
        record: Optional[WaitRecord] = None,
    ) -> None:
        # The member that waits: its alias, its label and its options; how it tries the local lock (for up
        # to some seconds, -1: until free) and how it writes a line to the reservation output.
        self.name, self.owner, options = member
        self.try_local, self.write_progress = try_local, write_progress
        self.record = record
        self.holder = holder
        self.deadline = deadline
        self.who = "another process"
        if holder:
            here = "this process" if holder.get("pid") == os.getpid() else f"pid {holder.get('pid')}"
            self.who = f"{holder.get('owner')} ({here} on this execution server)"
        self.start = time.monotonic()
        #: The caller's wait on real time (the local lock's waits are real), with its cancellation.
        self.end = deadline.on_real_time()
        self.interval = options.progress_interval if options.progress else math.inf
        self.next_progress = self.start + self.interval

    def try_once(self) -> Optional[float]:
        """Wait for the local lock until the next thing to do; None once this process has it."""
        now = time.monotonic()
        until = min(math.inf if self.end.at is None else self.end.at, self.next_progress)
        if self.end.cancelled is not None:
            until = min(until, now + CANCEL_SLICE)
        if self.record is not None:
            until = min(until, now + self.record.due_in())
        return None if self.try_local(-1.0 if math.isinf(until) else max(0.0, until - now)) else 0.0

    def waiting(self) -> None:
        """A look for a deadlock when due (raises MutexDeadlock for its victim), and the progress line."""
        if self.record is not None:
            self.record.step(self.deadline)
        now = time.monotonic()
        if now < self.next_progress:
            return
        self.next_progress = now + self.interval
        started = float(self.holder.get("started", 0)) if self.holder else 0.0
        held = time.time() - started if started else now - self.start
        message = f"{sanitize_label(self.owner)}: waiting for {self.name} held by {self.who} for {held:.0f} s"
        self.write_progress(message, self.deadline)

    def give_up(self) -> bool:
        """The deadline came: not taken (the caller tidies up and raises the timeout)."""
        return False
