"""Who holds a lock: owner tokens, and the holder as one fresh read of the reservation shows it.

A token is the value one acquisition writes to ``Mutex Owner``. It is unique per acquisition (so a
process can tell its own add from anyone else's, even its own earlier acquisitions) and readable by
people who look at the sandbox: ``<label>@<host>:<pid>:<nonce>``, e.g.
``Router A driver@exec-02:4711:9f3a1c2b04d7e615``. A :class:`Holder` is the service that holds an alias.

The nonce is a commitment: the first 16 hex digits of ``sha256(secret)``, where ``secret`` is 16 random bytes
the acquisition keeps to itself (never logged, never in an exception). Anyone can read a token; only its
acquirer can show the secret behind it, which is how a waiter tells the holder's ``~releasing`` marker
(:func:`releasing_value`, ``<token>#<secret hex>``) from a forgery (:func:`proves_release`).
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import socket
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional

from . import protocol
from .text import one_line

#: Keep the attribute value short: CloudShell shows it in the UI and in the output pane.
MAX_LABEL_LENGTH = 48
MAX_HOST_LENGTH = 32

# Letters and digits of any script are kept (a label is for people); "@" and ":" never (token syntax).
_UNSAFE = re.compile(r"[^\w .+-]+")
_TOKEN = re.compile(r"^(?P<label>[^@]*)@(?P<host>[^:@]*):(?P<pid>\d+):(?P<nonce>[0-9a-f]{8,})$")


def sanitize_label(label: str, limit: int = MAX_LABEL_LENGTH) -> str:
    """Reduce a free-text label to characters that are safe in a token (no ``@`` or ``:``)."""
    cleaned = _UNSAFE.sub("_", str(label)).strip(" _")
    return cleaned[:limit] or "owner"


#: Random bytes of an acquisition's secret, and hex digits of its commitment (the token's nonce).
SECRET_BYTES = 16
NONCE_DIGITS = 16
#: A releasing marker's ``Mutex Owner``: the holder's token, ``#``, its secret (``#`` never ends a token).
_MARKER = re.compile(rf"^(?P<token>.+)#(?P<secret>[0-9a-f]{{{2 * SECRET_BYTES}}})$")


def make_secret() -> bytes:
    """A new secret for one acquisition: :func:`make_token` commits to it."""
    return secrets.token_bytes(SECRET_BYTES)


def commitment(secret: bytes) -> str:
    """The nonce that commits a token to ``secret``: the first 16 hex digits of its SHA-256."""
    return hashlib.sha256(secret).hexdigest()[:NONCE_DIGITS]


def this_host() -> str:
    """This machine's name as tokens carry it (the first label of the host name, made safe and short)."""
    return sanitize_label(socket.gethostname().split(".")[0], MAX_HOST_LENGTH)


def make_token(label: str, secret: Optional[bytes] = None) -> str:
    """Return a new owner token for one acquisition by ``label`` in this process, committed to ``secret``
    (None: a secret nobody keeps, for a service that never needs to prove whose it is)."""
    host = this_host()
    nonce = commitment(make_secret() if secret is None else secret)
    return f"{sanitize_label(label)}@{host}:{os.getpid()}:{nonce}"


def releasing_value(token: str, secret: bytes) -> str:
    """The ``Mutex Owner`` of the ``~releasing`` marker of the acquisition ``token``:
    ``<token>#<secret hex>``. Written only once the holder's remove got no answer; from then on the secret is
    in the sandbox, and proves nothing beyond "this holder began to release" (:func:`proves_release`)."""
    return f"{token}#{secret.hex()}"


def named_token(value: str) -> str:
    """The token a service's ``Mutex Owner`` names: a releasing marker's without its secret, any other value
    as it is. A marker that names our token is ours to remove, whoever added it."""
    match = _MARKER.match(value or "")
    return match["token"] if match is not None else value


def proves_release(value: str, token: str) -> bool:
    """True when ``value`` (a ``~releasing`` marker's ``Mutex Owner``) was written by the acquirer of
    ``token``: it shows the secret whose SHA-256 starts with the token's nonce. A marker with the token
    alone (a forgery, or an older release's) proves nothing, and nor does a token whose nonce is shorter
    than 16 hex digits (an older release's: short enough to search for a secret that fits)."""
    match = _MARKER.match(value or "")
    info = parse_token(token)
    if match is None or match["token"] != token or info is None or len(info.nonce) < NONCE_DIGITS:
        return False
    return hashlib.sha256(bytes.fromhex(match["secret"])).hexdigest().startswith(info.nonce)


@dataclass(frozen=True)
class TokenInfo:
    """The parts of a token written by this library."""

    label: str
    host: str
    pid: int
    nonce: str


def parse_token(value: str) -> Optional[TokenInfo]:
    """Split a token made by :func:`make_token`; None for other values (e.g. the original snippet's)."""
    match = _TOKEN.match(value or "")
    if match is None:
        return None
    return TokenInfo(match["label"], match["host"], int(match["pid"]), match["nonce"])


def is_read_group(holder: Optional[Holder]) -> bool:
    """True when ``holder`` (of a lock alias) is a read group of a read-write lock: its token carries
    :data:`~.protocol.READ_GROUP_MARK`. ``#`` never occurs in a token made from a label (labels are
    sanitized), so no writer's or plain mutex's token can look like a group's."""
    return (
        holder is not None
        and holder.token.startswith(protocol.READ_GROUP_MARK)
        and parse_token(holder.token) is not None
    )


def describe_owner(value: str) -> str:
    """A short human description of a ``Mutex Owner`` value, for logs and messages."""
    if not value:
        return "an owner that wrote no Mutex Owner (original protocol v1?)"
    info = parse_token(value)
    if info is None:
        shown = repr(value[:80])  # escapes can make it longer than the value: cut it again
        return shown if len(shown) <= 100 else shown[:97] + "..."
    return f"{info.label} (host {info.host}, pid {info.pid})"


@dataclass(frozen=True)
class Holder:
    """The service that holds a lock alias.

    ``token`` is the ``Mutex Owner`` value ("" when the holder wrote none, as the original v1
    snippet does); ``label`` is a short description for people; ``attributes`` holds every attribute
    value of the service.
    """

    alias: str
    token: str
    label: str
    model: str
    attributes: Dict[str, str] = field(default_factory=dict)

    @property
    def pid(self) -> Optional[int]:
        """The holder's process id, when the token was written by this library."""
        info = parse_token(self.token)
        return None if info is None else info.pid


def marker_holder(marker: Holder) -> Holder:
    """A ``~releasing`` marker as the holder it names: its token without the secret, described as a token
    (its attributes too: a report that shows them never shows the secret)."""
    token = named_token(marker.token)
    attributes = {**marker.attributes, protocol.ATTR_OWNER: token} if marker.attributes else {}
    return Holder(marker.alias, token, describe_owner(token), marker.model, attributes)


def shown_holder(holder: Optional[Holder]) -> Optional[Holder]:
    """``holder`` as a report for people may show it: a ``~releasing`` marker without its secret."""
    if holder is not None and protocol.alias_kind(holder.alias)[1] == "releasing":
        return marker_holder(holder)
    return holder


def holder_in(details: Any, alias: str) -> Optional[Holder]:
    """The holder of ``alias`` in a ``GetReservationDetails`` answer, or None when the alias is free."""
    return holders_in(details, alias).get(alias)


def holders_in(details: Any, alias: Optional[str] = None) -> Dict[str, Holder]:
    """Every service of a ``GetReservationDetails`` answer as a :class:`Holder`, by alias (only ``alias``
    when given). One read shows them all at the same moment (a snapshot): the queue's tickets
    and the read-write lock's slots come from the same read that shows the lock."""
    found: Dict[str, Holder] = {}
    for service in details.ReservationDescription.Services or []:
        if alias is None or service.Alias == alias:
            found.setdefault(service.Alias, _holder_of(service))
    return found


def namesake(services: Mapping[str, Holder], alias: str) -> Optional[str]:
    """An alias among ``services`` that differs from ``alias`` only in letter case (None: none, or ``alias``
    itself is there). A server that takes aliases alike whatever their case refuses ``alias`` for it."""
    if alias in services:
        return None
    wanted = alias.casefold()
    return next((other for other in sorted(services) if other.casefold() == wanted), None)


def _holder_of(service: Any) -> Holder:
    values = {_short_name(a.Name): "" if a.Value is None else str(a.Value) for a in service.Attributes or []}
    token = values.get(protocol.ATTR_OWNER, "")
    # Prefer the token (it names host and pid); a foreign token may come with our Label attribute.
    label = describe_owner(token)
    if parse_token(token) is None and one_line(values.get(protocol.ATTR_LABEL, "")):
        label = one_line(values[protocol.ATTR_LABEL])  # written by other code: one short, visible line
    return Holder(service.Alias, token, label, service.ServiceName or "", values)


def _short_name(name: str) -> str:
    # 2nd-gen style names carry the model as a prefix ("Mutex Service.Mutex Owner").
    return name.rsplit(".", 1)[-1] if name and name.startswith(protocol.SERVICE_MODEL + ".") else name
