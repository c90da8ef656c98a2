"""Lock handles: ``mutex.export()`` and ``ReservationMutex.adopt(api, handle)``.

A handle names one held acquisition (reservation, alias, model, owner token, lease) so that another
process (a driver command called by an orchestration script) can join it. It is ``csmx1.<payload>.<check>``:
``payload`` is unpadded base64url of compact JSON, ``check`` the first 12 hex digits of its SHA-256. Only
letters, digits, ``-``, ``_`` and ``.`` appear, so it passes unchanged as a driver command's string input.

The check catches truncation and accidental damage; it is not a signature (there is no shared secret). A
forged handle gains nothing: :meth:`adopt` joins only a lock whose service carries that exact token, and the
token is no secret either (it is shown in the sandbox). A handle holds no credentials.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
from dataclasses import dataclass

from ..errors import MutexHandleError
from ..holder import parse_token

PREFIX = "csmx1"
CHECK_LENGTH = 12
#: Longer input is refused before any decoding.
MAX_HANDLE_LENGTH = 2048
_FIELDS = {"r", "a", "m", "t", "l"}
_ALPHABET = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.")


@dataclass(frozen=True)
class HandleInfo:
    """What a handle names."""

    reservation_id: str
    alias: str
    model: str
    token: str
    lease: float


def _check(payload: str) -> str:
    return hashlib.sha256(payload.encode("ascii")).hexdigest()[:CHECK_LENGTH]


def make_handle(info: HandleInfo) -> str:
    """The handle string of ``info``."""
    document = {"r": info.reservation_id, "a": info.alias, "m": info.model, "t": info.token, "l": info.lease}
    raw = json.dumps(document, separators=(",", ":"), sort_keys=True).encode("utf-8")
    payload = base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")
    return f"{PREFIX}.{payload}.{_check(payload)}"


def _bad(why: str) -> MutexHandleError:
    return MutexHandleError(
        f"not a valid lock handle: {why}. Pass the exact string that mutex.export() returned "
        "(it may have been cut off or altered on the way)"
    )


def parse_handle(handle: object) -> HandleInfo:
    """Parse a handle strictly; raise :class:`~.errors.MutexHandleError` saying what is wrong."""
    if not isinstance(handle, str):
        raise _bad(f"expected a string, got {type(handle).__name__}")
    if not handle:
        raise _bad("it is empty")
    if len(handle) > MAX_HANDLE_LENGTH:
        raise _bad(f"it is {len(handle)} characters long, more than {MAX_HANDLE_LENGTH}")
    if not set(handle) <= _ALPHABET:
        raise _bad("it contains characters a handle never has (spaces, quotes, line breaks, ...)")
    parts = handle.split(".")
    if len(parts) != 3 or parts[0] != PREFIX:
        raise _bad(f"it does not have the form {PREFIX}.<payload>.<check>")
    _, payload, check = parts
    if len(check) != CHECK_LENGTH or _check(payload) != check:
        raise _bad("its check does not match (truncated or altered)")
    try:
        raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
        document = json.loads(raw.decode("utf-8"))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise _bad("its payload cannot be decoded") from None
    if not isinstance(document, dict) or set(document) != _FIELDS:
        raise _bad("its payload has the wrong fields")
    for key in ("r", "a", "m", "t"):
        if not isinstance(document[key], str) or not document[key].strip():
            raise _bad(f"its field {key!r} is not a non-empty string")
    lease = document["l"]
    if (
        isinstance(lease, bool)
        or not isinstance(lease, (int, float))
        or not math.isfinite(lease)
        or lease < 0
    ):
        raise _bad("its lease is not a number of seconds")
    if parse_token(document["t"]) is None:
        raise _bad("its owner token was not made by this library")
    return HandleInfo(document["r"], document["a"], document["m"], document["t"], float(lease))
