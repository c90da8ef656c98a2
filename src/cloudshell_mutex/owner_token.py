"""Owner tokens: the value written to ``Mutex Owner`` by one acquisition.

A token is unique per acquisition (so a process can tell its own add from anyone else's, even
its own earlier acquisitions) and readable by people who look at the sandbox:
``<label>@<host>:<pid>:<random>``, e.g. ``Router A driver@exec-02:4711:9f3a1c2b``.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
from dataclasses import dataclass
from typing import Optional

#: Keep the attribute value short: CloudShell shows it in the UI and in the output pane.
MAX_LABEL_LENGTH = 48
MAX_HOST_LENGTH = 32

_UNSAFE = re.compile(r"[^A-Za-z0-9 ._+-]+")
_TOKEN = re.compile(r"^(?P<label>[^@]*)@(?P<host>[^:@]*):(?P<pid>\d+):(?P<nonce>[0-9a-f]{8,})$")


def sanitize_label(label: str, limit: int = MAX_LABEL_LENGTH) -> str:
    """Reduce a free-text label to characters that are safe in a token (no ``@`` or ``:``)."""
    cleaned = _UNSAFE.sub("_", str(label)).strip(" _")
    return cleaned[:limit] or "owner"


def make_token(label: str) -> str:
    """Return a new owner token for one acquisition by ``label`` in this process."""
    host = sanitize_label(socket.gethostname().split(".")[0], MAX_HOST_LENGTH)
    return f"{sanitize_label(label)}@{host}:{os.getpid()}:{secrets.token_hex(4)}"


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


def describe_owner(value: str) -> str:
    """A short human description of a ``Mutex Owner`` value, for logs and messages."""
    if not value:
        return "an owner that wrote no Mutex Owner (original protocol v1?)"
    info = parse_token(value)
    if info is None:
        return repr(value[:80])
    return f"{info.label} (host {info.host}, pid {info.pid})"
