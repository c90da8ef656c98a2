"""Which attributes the server's ``Mutex Service`` model accepts: learned from the adds themselves.

Sites that imported the original Mutex_Package have a model with only ``Mutex Owner`` (or, built from
the original repository's current source, with no attribute at all); ours adds ``Mutex Label`` and the
lease attributes. An add may only name attributes the model defines. The services catalog
(``GetServices``) cannot tell: on a real server it most likely lists only families linked to a
category and hides admin-only families from non-admin users, and both Mutex packages have neither.
So the lock does not ask it. The first add writes our attributes; if the server refuses it, the lock
adds once more with ``Mutex Owner`` alone, and remembers per server and process what was accepted.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, FrozenSet, Optional, Tuple

from .. import protocol

#: What an add writes when the model has it: the owner token, a label for people, the lease ("0": none)
#: and the first heartbeat.
FULL = frozenset(
    {protocol.ATTR_OWNER, protocol.ATTR_LABEL, protocol.ATTR_LEASE_SECONDS, protocol.ATTR_HEARTBEAT}
)
#: What every model with owner verification has (the original 2017 package).
OWNER_ONLY = frozenset({protocol.ATTR_OWNER})

_accepted: Dict[Tuple[str, str], FrozenSet[str]] = {}
_lock = threading.Lock()


def server_key(api: Any) -> str:
    """Identify the server an API session talks to (host and port), for the per-process memory."""
    host = getattr(api, "host", None)
    port = getattr(api, "port", None)
    if host is None:
        return f"object:{id(api)}"
    return f"{host}:{port}"


def accepted(api: Any, model: str) -> Optional[FrozenSet[str]]:
    """The attributes an add of ``model`` was accepted with on this server, or None when not learned yet."""
    with _lock:
        return _accepted.get((server_key(api), model))


def learn(api: Any, model: str, names: FrozenSet[str]) -> None:
    """Remember that the server accepted an add of ``model`` with these attributes."""
    with _lock:
        _accepted[(server_key(api), model)] = frozenset(names)


def forget(api: Any = None, model: Optional[str] = None) -> None:
    """Forget what was learned: everything, or about one server (and model)."""
    with _lock:
        if api is None:
            _accepted.clear()
            return
        server = server_key(api)
        for key in [key for key in _accepted if key[0] == server and (model is None or key[1] == model)]:
            del _accepted[key]
