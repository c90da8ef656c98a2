"""Fencing: an advisory generation number that grows with every acquisition of a lock that asks for it.

The number lives in a counter service beside the lock (alias ``<lock alias>~generation``, the lock's model,
attribute ``Mutex Generation``), read and bumped by the holder *under the lock*, so no two holders bump it
at once. CloudShell itself checks nothing: a protected resource that wants fencing must remember the
largest generation it has seen and refuse requests that carry a smaller one (docs/protocol.md, "Fencing").
"""

from __future__ import annotations

from cloudshell.api.cloudshell_api import AttributeNameValue

from .. import protocol
from ..server.alias import LockAlias, Status
from ..server.classify import Classification


class CounterRefused(Exception):
    """The server refused the counter service: the model lacks ``Mutex Generation`` (the message says what
    to do)."""


class CounterFailed(Exception):
    """A call on the counter failed (``failure``) while ``doing``."""

    def __init__(self, failure: Classification, doing: str) -> None:
        super().__init__(f"{doing}: {failure.message}")
        self.failure = failure
        self.doing = doing


def bump_generation(counter: LockAlias, lock_alias: str) -> int:
    """Read the counter, add one, write it back; return the new generation. Call it only while holding the
    lock. 2 calls: the read and the write, or the first time in a reservation the read and the add that
    creates the counter (4 when that add finds it there or gets no answer: a read and the write follow)."""
    read = counter.read()
    if not read.ok:
        raise CounterFailed(read.failure, "reading the generation counter")
    if read.holder is None:
        attributes = [
            AttributeNameValue(protocol.ATTR_OWNER, f"generation counter of {lock_alias}"),
            AttributeNameValue(protocol.ATTR_GENERATION, "1"),
        ]
        created = counter.try_add(attributes)
        if created.ok:
            return 1
        if created.status is Status.FATAL and created.failure.code is not None:
            raise CounterRefused(
                f"mutex.generation needs the Mutex Service model with {protocol.ATTR_GENERATION!r} (the "
                "server refused it): import this project's Mutex_Package.zip (cloudshell-mutex install)"
            )
        read = counter.read()  # created meanwhile (or our add landed after all): read it
        if not read.ok or read.holder is None:
            raise CounterFailed(read.failure or created.failure, "creating the generation counter")
    raw = read.holder.attributes.get(protocol.ATTR_GENERATION, "0")
    try:
        current = int(float(raw))
    except ValueError:
        current = 0
    written = counter.set_attributes([(protocol.ATTR_GENERATION, str(current + 1))])
    if not written.ok:
        raise CounterFailed(written.failure, "writing the generation counter")
    return current + 1
