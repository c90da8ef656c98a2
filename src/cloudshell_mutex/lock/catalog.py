"""Which ``Mutex Service`` model the server has: detected with one ``GetServices`` per process.

Sites that imported the original Mutex_Package have a model with only ``Mutex Owner``; ours adds
the lease attributes. The add call may only name attributes the model defines, so the lock asks the
catalog once per server and process, and writes the lease attributes only when they exist.

When the catalog does not list the model, the lock does not give up on that alone: how
``GetServices`` treats admin-only families without a category on a real server is not documented.
It writes only ``Mutex Owner`` and lets the add decide; if the add then fails, the missing model is
the diagnosis (:class:`~.errors.MutexNotInstalled`) and the cache entry is dropped.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Dict, FrozenSet, Optional, Tuple

from . import protocol
from .classify import ErrorKind, classify


@dataclass(frozen=True)
class ModelInfo:
    """What the catalog said about the lock's service model.

    ``listed`` is False when GetServices did not list the model (or could not be asked);
    ``attributes`` then holds only ``Mutex Owner``, which every version of the model has.
    """

    name: str
    listed: bool
    attributes: FrozenSet[str]

    def has(self, attribute: str) -> bool:
        """True when the installed model defines ``attribute``."""
        return attribute in self.attributes


_cache: Dict[Tuple[str, str], ModelInfo] = {}
_cache_lock = threading.Lock()


def server_key(api: Any) -> str:
    """Identify the server an API session talks to (host and port), for the per-process cache."""
    host = getattr(api, "host", None)
    port = getattr(api, "port", None)
    if host is None:
        return f"object:{id(api)}"
    return f"{host}:{port}"


def detect_model(
    api: Any,
    model: str = protocol.SERVICE_MODEL,
    logger: Optional[logging.Logger] = None,
) -> Tuple[ModelInfo, int]:
    """Return the installed model's info and how many API calls it took (0 when cached)."""
    key = (server_key(api), model)
    with _cache_lock:
        cached = _cache.get(key)
    if cached is not None:
        return cached, 0
    try:
        services = api.GetServices("", model).Services or []
    except Exception as exc:
        kind = classify(exc).kind
        if logger is not None:
            logger.debug(
                "cloudshell-mutex: GetServices failed (%s); writing only %r", exc, protocol.ATTR_OWNER
            )
        info = ModelInfo(model, False, frozenset({protocol.ATTR_OWNER}))
        if kind is not ErrorKind.TRANSIENT:  # e.g. an old server without the call: do not ask again
            _store(key, info)
        return info, 1
    for service in services:
        if getattr(service, "Name", None) == model:
            names = {attribute.Name for attribute in (service.Attributes or [])}
            info = ModelInfo(model, True, frozenset(names | {protocol.ATTR_OWNER}))
            break
    else:
        info = ModelInfo(model, False, frozenset({protocol.ATTR_OWNER}))
    _store(key, info)
    return info, 1


def forget(api: Any = None, model: Optional[str] = None) -> None:
    """Drop cached catalog entries: all of them, or those of one server (and model)."""
    with _cache_lock:
        if api is None:
            _cache.clear()
            return
        server = server_key(api)
        for key in [key for key in _cache if key[0] == server and (model is None or key[1] == model)]:
            del _cache[key]


def _store(key: Tuple[str, str], info: ModelInfo) -> None:
    with _cache_lock:
        _cache[key] = info
