"""What ``CloudShellAPISession`` does behind the lock's back: it re-sends a failed request.

The client retries a request whose connection failed after 1 s, then 2 s
(``common_cloudshell_api.retry``, ``max_attempts=3``). For an add that is harmless but hides an
outcome; for the remove it is dangerous. This module has the two facts the lock needs.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any, Iterator

#: The client's first re-send comes this many seconds after a failed copy. A call that took this
#: long may hide such a re-send, so an earlier copy of it may have committed.
CLIENT_RETRY_DELAY = 1.0

_locks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_locks_guard = threading.Lock()


def may_have_resent(elapsed: float) -> bool:
    """True when a call that took ``elapsed`` seconds may include a re-send by the client."""
    return elapsed >= CLIENT_RETRY_DELAY


@contextlib.contextmanager
def sent_once(api: Any) -> Iterator[bool]:
    """Turn off the client's own re-send for one call (the remove); yield whether one may still happen.

    If a remove commits and its reply is lost, the client re-sends it 1 s later; by then a waiter
    may have added the alias, and the re-sent remove deletes the *waiter's* lock. So the remove goes
    out once, and the lock retries it itself, only after a fresh read shows the alias is still ours.
    ``_attempts`` is the session's private copy of ``max_attempts``; it is set back afterwards, under
    a per-session lock so that concurrent removes on one session cannot restore the wrong value.
    """
    if not isinstance(getattr(api, "_attempts", None), int):
        yield True  # not a CloudShellAPISession: whatever it does, it cannot be turned off
        return
    with _locks_guard:
        lock = _locks.setdefault(api, threading.Lock())
    with lock:
        saved, api._attempts = api._attempts, 1
        try:
            yield False
        finally:
            api._attempts = saved
